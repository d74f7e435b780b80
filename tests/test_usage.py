"""record_usage and a window the agent's own overhead fills."""

from __future__ import annotations

import warnings

import pytest

from compactstore import (
    CompactionConfig,
    CompactStore,
    CompactStoreWarning,
    InvalidInputError,
)
from compactstore.db import repository as repo
from compactstore.models import ImportedMessage
from tests.helpers import T0, new_session, user, words

CONFIG = CompactionConfig(token_factor=1.0)


def _warnings(fn: object) -> tuple[object, list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = fn()  # type: ignore[operator]
    return value, [w for w in caught if issubclass(w.category, CompactStoreWarning)]


def test_a_real_count_is_used_and_says_so(store: CompactStore) -> None:
    chat = new_session(store, config=CONFIG)
    chat.request(words(4_000))
    raw = chat.sess.context().raw_tokens
    used, caught = _warnings(lambda: chat.sess.record_usage(raw + 500))
    assert used is True and caught == []
    assert chat.sess.token_usage() == raw + 500


def test_a_count_below_half_the_estimate_is_not_used_and_warns_once(store: CompactStore) -> None:
    chat = new_session(store, config=CONFIG)
    chat.request(words(4_000))
    chat.chatter(6, chars=2_000)
    sess = chat.sess
    raw = sess.context().raw_tokens
    # Two recovery attempts made, so the count's reset of the attempt counter shows.
    store.write(lambda c: repo.set_breaker(c, sess.id, reactive_attempts=2))
    usage = sess.token_usage()
    used, caught = _warnings(lambda: sess.record_usage(raw // 2 - 1))  # input_tokens alone
    assert used is False
    assert len(caught) == 1 and "cache_read_input_tokens" in str(caught[0].message)
    assert sess.token_usage() == usage  # calibration unchanged
    assert sess.breaker().reactive_attempts == 0  # the call went through all the same
    used, caught = _warnings(lambda: sess.record_usage(1))
    assert used is False and caught == []  # once per session
    # Half the estimate exactly is a plausible count: used.
    raw = sess.context().raw_tokens
    assert sess.record_usage((raw + 1) // 2) is True


def test_a_window_no_larger_than_the_fixed_overhead_is_refused(store: CompactStore) -> None:
    config = CompactionConfig(fixed_overhead_tokens=8_000)
    with pytest.raises(InvalidInputError, match="fixed_overhead_tokens"):
        store.session("tiny", context_window=8_000, config=config)
    with pytest.raises(InvalidInputError, match="fixed_overhead_tokens"):
        store.import_session(
            "tiny", [ImportedMessage(user("hi"))], context_window=8_000, config=config
        )
    assert store.sessions() == []
    store.session("tiny", context_window=8_001, config=config)
    with pytest.raises(InvalidInputError, match="fixed_overhead_tokens"):
        store.session("tiny", config=CompactionConfig(fixed_overhead_tokens=9_000))


def test_a_measured_overhead_that_fills_the_window_trips_the_breaker_once(
    store: CompactStore,
) -> None:
    chat = new_session(store, config=CONFIG, context_window=10_000)
    chat.request("Summarise the repository.")
    chat.chatter(4, chars=200)
    sess = chat.sess
    raw = sess.context().raw_tokens
    real = raw + 8_600  # the system prompt and tools take 8,600 of 10,000 tokens
    used, caught = _warnings(lambda: sess.record_usage(real, now=T0 + 50))
    assert used is True
    assert len(caught) == 1 and "8,600" in str(caught[0].message)
    (failed,) = sess.compactions()
    assert (failed.trigger, failed.strategy, failed.success) == ("auto", None, False)
    assert failed.error is not None and "8,600" in failed.error and "10,000" in failed.error
    assert failed.created_at == T0 + 50
    assert sess.breaker().tripped
    # Tripped: auto-compaction no longer runs, and the next counts record nothing more.
    assert sess.process_request(now=T0 + 60).success is False
    _, caught = _warnings(lambda: sess.record_usage(real, now=T0 + 70))
    assert caught == [] and len(sess.compactions()) == 1
    # reset_breaker() re-arms the check.
    sess.reset_breaker()
    _, caught = _warnings(lambda: sess.record_usage(real, now=T0 + 80))
    assert len(caught) == 1 and len(sess.compactions()) == 2 and sess.breaker().tripped


def test_an_overhead_below_the_threshold_records_nothing(store: CompactStore) -> None:
    chat = new_session(store, config=CONFIG, context_window=10_000)
    chat.request("Summarise the repository.")
    raw = chat.sess.context().raw_tokens
    _, caught = _warnings(lambda: chat.sess.record_usage(raw + 8_000))
    assert caught == [] and chat.sess.compactions() == [] and not chat.sess.breaker().tripped
