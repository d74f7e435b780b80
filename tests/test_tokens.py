"""Token estimation and calibration against the provider's real counts."""

from __future__ import annotations

import pytest

from compactstore import CompactionConfig, CompactStore, estimate_tokens
from compactstore._context.tokens import MIN_CALIBRATION_GROWTH, PRIOR_WEIGHT, learn_factor


def test_the_estimate_keeps_the_articles_formula() -> None:
    assert estimate_tokens("abcd" * 10) == 10
    assert estimate_tokens("你好吗") == 2  # 3 / 1.5
    assert estimate_tokens("ab你好") == 2  # ceil(2 / 4 + 2 / 1.5)


def test_a_large_interval_outweighs_a_small_noisy_one() -> None:
    factor, weight = learn_factor(1.6, PRIOR_WEIGHT, 14_000, 10_000) or (0.0, 0.0)
    assert 1.40 < factor < 1.45
    noisy = learn_factor(factor, weight, 700, 200)  # a 3.5x ratio on 200 tokens
    assert noisy is not None and noisy[0] < 1.55


@pytest.mark.parametrize(
    ("grown_real", "grown_estimate"),
    [(500, MIN_CALIBRATION_GROWTH - 1), (-300, 1_000), (14_000, 1_000), (100, 1_000)],
    ids=["too-small", "shrank", "hidden-content-added", "hidden-content-dropped"],
)
def test_intervals_that_say_nothing_about_density_are_not_learnt(
    grown_real: int, grown_estimate: int
) -> None:
    assert learn_factor(1.6, PRIOR_WEIGHT, grown_real, grown_estimate) is None


def test_usage_follows_real_counts_and_predicts_the_next_one(store: CompactStore) -> None:
    sess = store.session("calibrated", config=CompactionConfig(fixed_overhead_tokens=0), now=0.0)
    sess.append({"role": "user", "content": "Fix the bug in parser.py"})
    real = 20_000  # a system prompt and tools the messages do not show
    sess.record_usage(real)
    for step in range(20):
        added = f"def f{step}(x):\n    return x * {step}\n" * 40
        sess.append({"role": "assistant", "content": added})
        real += round(1.45 * estimate_tokens(added))  # the provider's density
        if step >= 2:
            assert abs(sess.token_usage() - real) / real < 0.01
        sess.record_usage(real)
    assert sess.context().factor == pytest.approx(1.45, abs=0.02)
