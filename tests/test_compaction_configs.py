"""Each distinct config a session's compactions ran under is stored once, in
``compaction_configs``; a compactions row names it by hash. Replay reads it back, and the
revision that introduced the table moves the configs older rows carried."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from sqlalchemy import create_engine, inspect, text

from compactstore import CompactionConfig, CompactStore
from compactstore.db.migrate import head_revision
from compactstore.models import CompactionResult
from tests.helpers import T0, Chat, busy_log, migrate_to, new_session, plain

PREVIOUS_HEAD = "6aa8b67dd6bf"


def _rows(url: str, sql: str) -> list[tuple[Any, ...]]:
    engine = create_engine(url if "://" in url else f"sqlite:///{url}")
    try:
        with engine.connect() as connection:
            return [tuple(row) for row in connection.execute(text(sql))]
    finally:
        engine.dispose()


def _compacted(store: CompactStore, sid: str, config: CompactionConfig) -> Chat:
    """A session with tool-budget, microcompact and full compactions under ``config``."""
    chat = new_session(store, sid=sid, config=config)
    busy_log(chat)
    sess = chat.sess
    sess.process_request(now=T0 + 10, enable_microcompact=False, enable_auto_compact=False)
    sess.process_request(now=T0 + 3_600, enable_auto_compact=False)
    chat.chatter(6, tag="more", chars=400)
    sess.compact(now=T0 + 3_700)
    return chat


def _replays(store: CompactStore, sid: str) -> list[str]:
    sess = store.get_session(sid)
    return [
        sess.replay(boundary.id).model_dump_json()
        for boundary in sess.boundaries()
        if boundary.id is not None
    ]


@pytest.mark.slow
def test_a_config_is_stored_once_per_session_and_each_row_names_it(
    store: CompactStore, db_url: str
) -> None:
    first = plain()
    chat = _compacted(store, "s", first)
    count = len(chat.sess.compactions())
    assert count >= 3
    digest = hashlib.sha256(first.model_dump_json().encode()).hexdigest()
    assert _rows(db_url, "SELECT session_id, hash, config FROM compaction_configs") == [
        ("s", digest, first.model_dump_json())
    ]
    assert _rows(db_url, "SELECT DISTINCT config, config_hash FROM compactions") == [("", digest)]

    # A config change adds one row; the earlier compactions keep naming theirs, and
    # replaying one of them runs it under the config it ran under.
    boundary = chat.sess.boundaries()[-1]
    assert boundary.id is not None
    replayed = chat.sess.replay(boundary.id)
    second = plain(auto_compact_threshold=0.6)
    sess = store.session("s", config=second)
    chat.chatter(6, tag="late", chars=400)
    sess.compact(now=T0 + 3_800)
    assert len(_rows(db_url, "SELECT hash FROM compaction_configs")) == 2
    assert sess.replay(boundary.id) == replayed
    per_hash = dict(
        _rows(db_url, "SELECT config_hash, COUNT(*) FROM compactions GROUP BY config_hash")
    )
    assert per_hash[digest] == count

    # Deleting the session removes its configs with it.
    store.delete_session("s")
    assert _rows(db_url, "SELECT COUNT(*) FROM compaction_configs") == [(0,)]


@pytest.mark.slow
def _without_later_revisions(compactions: list[CompactionResult]) -> list[dict[str, Any]]:
    """Compactions as dicts without what revisions after this one record (the edit policy,
    each step's result counts): going down past them and up again leaves those unknown."""
    dumped = [c.model_dump(exclude={"edit_policy"}) for c in compactions]
    for compaction in dumped:
        for step in compaction["steps"]:
            step.pop("results_cleared", None)
            step.pop("results_persisted", None)
    return dumped


@pytest.mark.slow
def test_the_revision_moves_the_configs_of_existing_rows_and_back(db_url: str) -> None:
    with CompactStore.open(db_url) as store:
        _compacted(store, "a", plain())
        _compacted(store, "b", plain(tool_result_max_chars=3_000))
        before = {sid: store.get_session(sid).compactions() for sid in ("a", "b")}
        replays = {sid: _replays(store, sid) for sid in ("a", "b")}

    # The schema before the revision, with the data it held: every row carries its config.
    migrate_to(db_url, PREVIOUS_HEAD, down=True)
    engine = create_engine(db_url if "://" in db_url else f"sqlite:///{db_url}")
    try:
        assert "compaction_configs" not in inspect(engine).get_table_names()
        assert "config_hash" not in {c["name"] for c in inspect(engine).get_columns("compactions")}
    finally:
        engine.dispose()
    old = _rows(db_url, "SELECT session_id, config FROM compactions ORDER BY id")
    assert {sid for sid, _ in old} == {"a", "b"}
    assert all(CompactionConfig.model_validate_json(config) for _, config in old)
    assert len({config for _, config in old}) == 2

    migrate_to(db_url, head_revision(), down=False)
    stored = _rows(db_url, "SELECT session_id, hash, config FROM compaction_configs")
    assert sorted((sid, config) for sid, _, config in stored) == sorted(set(old))
    assert all(hashlib.sha256(c.encode()).hexdigest() == h for _, h, c in stored)
    assert (
        _rows(
            db_url,
            "SELECT c.session_id, k.config FROM compactions AS c JOIN compaction_configs AS k "
            "ON k.session_id = c.session_id AND k.hash = c.config_hash WHERE c.config = '' "
            "ORDER BY c.id",
        )
        == old
    )
    with CompactStore.open(db_url, auto_migrate=True) as store:
        for sid in ("a", "b"):
            assert _without_later_revisions(
                store.get_session(sid).compactions()
            ) == _without_later_revisions(before[sid])
            assert _replays(store, sid) == replays[sid]
