"""Compactions the agent's provider did, imported as boundaries: Codex ``compacted`` records
with a server-side ``replacement_history`` (and its encrypted ``compaction`` item), and
Claude Code boundaries that keep a preserved segment (``compactMetadata.preservedSegment``).

Synthetic transcripts first (no corpus needed), then every dev file of the kind.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from compactstore import CompactStore
from compactstore._cli import cli
from compactstore._importers import import_file, read_transcript
from compactstore.models import CompactStrategy, CompactTrigger
from tests.conftest import CORPUS_DEV, corpus_params
from tests.helpers import claude_code_record
from tests.test_import import check_pairing, check_sdk, raw_records, write_lines

Message = dict[str, Any]


def _rollout(kind: str, payload: Message, second: int = 0) -> Message:
    return {"timestamp": f"2026-07-15T20:40:{second:02d}.000Z", "type": kind, "payload": payload}


def _text_message(role: str, text: str, second: int = 0) -> Message:
    kind = "output_text" if role == "assistant" else "input_text"
    payload = {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}
    return _rollout("response_item", payload, second)


def _call(call_id: str, cmd: str, second: int = 0) -> list[Message]:
    arguments = json.dumps({"cmd": cmd})
    return [
        _rollout(
            "response_item",
            {
                "type": "function_call",
                "call_id": call_id,
                "name": "exec_command",
                "arguments": arguments,
            },
            second,
        ),
        _rollout(
            "response_item",
            {"type": "function_call_output", "call_id": call_id, "output": f"ran {cmd}"},
            second,
        ),
    ]


def _compacted(history: list[Message], message: str = "", **extra: Any) -> Message:
    payload = {"message": message, "replacement_history": history, "window_number": 1, **extra}
    return _rollout("compacted", payload, 30)


def _history_message(role: str, text: str) -> Message:
    return {"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}


ENCRYPTED = "gAAAAB" + "x" * 500


def _codex_rollout(path: Path, compactions: list[Message]) -> Path:
    """A rollout: a user request, a tool loop, then each compaction followed by more work."""
    lines: list[Message] = [
        _rollout("session_meta", {"id": "s", "cwd": "/w"}),
        _text_message("developer", "<permissions instructions>sandboxed</permissions>"),
        _text_message("user", "fix the failing build", 1),
        _text_message("assistant", "looking", 2),
        *_call("c1", "cargo build", 3),
        *_call("c2", "cargo build --verbose " + "error[E0308] mismatched types " * 300, 4),
    ]
    for number, record in enumerate(compactions):
        lines.append(record)
        lines.append(_text_message("assistant", f"continuing after compaction {number}", 40))
        lines.extend(_call(f"after{number}", "cargo test", 41))
    return write_lines(path, lines)


def test_codex_server_compaction_is_a_provider_boundary(
    tmp_path: Path, store: CompactStore
) -> None:
    """A ``compacted`` record with a replacement history and no ``message`` (what Codex
    writes for a server-side compaction) is a boundary: strategy ``provider``, trigger
    ``auto``, the summary the history it kept with roles (not the leading instructions,
    which the store keeps pinned), a note for the encrypted item."""
    history = [
        _history_message("user", "fix the failing build"),
        _history_message("developer", "<permissions instructions>sandboxed</permissions>"),
        _history_message("developer", "<collaboration_mode>plan</collaboration_mode>"),
        {"type": "compaction", "encrypted_content": ENCRYPTED},
    ]
    path = _codex_rollout(tmp_path / "rollout.jsonl", [_compacted(history)])
    transcript = read_transcript(path)
    assert len(transcript.boundaries) == 1
    boundary = transcript.boundaries[0]
    assert boundary.strategy is CompactStrategy.PROVIDER
    assert boundary.trigger is CompactTrigger.AUTO
    assert transcript.messages[boundary.first_kept_index]["content"] == (
        "continuing after compaction 0"
    )
    text = boundary.summary_text
    assert "[user]\nfix the failing build" in text
    assert "[developer]\n<collaboration_mode>plan" in text
    assert "permissions instructions" not in text  # pinned: still in the context
    assert f"[compaction item: {len(ENCRYPTED):,} characters of encrypted content" in text
    assert ENCRYPTED not in text

    session = import_file(store, path)
    [stored] = session.boundaries()
    assert stored.strategy is CompactStrategy.PROVIDER
    assert stored.trigger is CompactTrigger.AUTO
    assert stored.summary_text == text
    [compaction] = session.compactions()
    assert compaction.strategy is CompactStrategy.PROVIDER
    assert compaction.created_at == datetime.fromisoformat("2026-07-15T20:40:30Z").timestamp()
    active = session.active_context()
    check_pairing(session.format, active)
    check_sdk(session.format, active)
    assert "cargo build" not in json.dumps(active)  # compacted away
    assert active[-1]["content"] == "ran cargo test"


def test_codex_compactions_each_a_boundary_with_their_trigger(tmp_path: Path) -> None:
    """N ``compacted`` records, N boundaries; a trigger the record names is kept; a
    client-side compaction (only ``message``) stays a ``full`` boundary with that text."""
    records = [
        _compacted([_history_message("user", "fix the failing build")]),
        _compacted([_history_message("user", "and the tests")], trigger="manual"),
        _compacted([], message="Summary: the build is fixed, tests remain."),
    ]
    transcript = read_transcript(_codex_rollout(tmp_path / "rollout.jsonl", records))
    assert [(b.strategy, b.trigger) for b in transcript.boundaries] == [
        (CompactStrategy.PROVIDER, CompactTrigger.AUTO),
        (CompactStrategy.PROVIDER, CompactTrigger.MANUAL),
        (CompactStrategy.FULL, CompactTrigger.AUTO),
    ]
    assert transcript.boundaries[2].summary_text == "Summary: the build is fixed, tests remain."
    check_pairing(transcript.format, transcript.messages)


def test_codex_bad_replacement_history_names_its_line(tmp_path: Path) -> None:
    from compactstore.errors import InvalidInputError

    bad = _rollout("compacted", {"message": "", "replacement_history": "oops"}, 30)
    path = _codex_rollout(tmp_path / "rollout.jsonl", [bad])
    with pytest.raises(InvalidInputError, match=r"rollout\.jsonl line 9: compacted record: "):
        read_transcript(path)
    bad = _rollout("compacted", {"message": "", "replacement_history": ["x"]}, 30)
    path = _codex_rollout(tmp_path / "rollout2.jsonl", [bad])
    with pytest.raises(InvalidInputError, match=r"replacement_history\[0\] must be an object"):
        read_transcript(path)


# -- Claude Code: the preserved segment ----------------------------------------------------


def _claude_transcript(path: Path, *, head: str, summary: bool = True) -> Path:
    """A conversation whose last two messages before a manual compaction (an assistant
    reply with a tool call and its result) are preserved from ``head`` on."""
    boundary = {
        "type": "system",
        "subtype": "compact_boundary",
        "uuid": "b",
        "isSidechain": False,
        "timestamp": "2026-01-01T00:01:00.000Z",
        "compactMetadata": {
            "trigger": "manual",
            "preTokens": 1000,
            "postTokens": 300,
            "preservedSegment": {"headUuid": head, "anchorUuid": "b", "tailUuid": "u3"},
        },
    }
    use = {"type": "tool_use", "id": "t2", "name": "Read", "input": {"file_path": "/w/b.py"}}
    lines = [
        claude_code_record("user", "fix the bug", uuid="u0"),
        claude_code_record(
            "assistant",
            [{"type": "tool_use", "id": "t1", "name": "Read", "input": {"file_path": "/w/a.py"}}],
            uuid="a1",
            message_id="m1",
        ),
        claude_code_record(
            "user", [{"type": "tool_result", "tool_use_id": "t1", "content": "a"}], uuid="u1"
        ),
        claude_code_record(
            "assistant", [{"type": "text", "text": "now b"}], uuid="a2", message_id="m2"
        ),
        claude_code_record("assistant", [use], uuid="a2b", message_id="m2"),
        claude_code_record(
            "user", [{"type": "tool_result", "tool_use_id": "t2", "content": "b"}], uuid="u3"
        ),
        boundary,
    ]
    if summary:
        lines.append(
            claude_code_record("user", "Summary of the session", uuid="s", isCompactSummary=True)
        )
    lines.append(
        claude_code_record(
            "assistant", [{"type": "text", "text": "b is fine"}], uuid="a4", message_id="m4"
        )
    )
    return write_lines(path, lines)


def test_claude_code_preserved_segment_stays_after_the_boundary(
    tmp_path: Path, store: CompactStore
) -> None:
    """The boundary cuts before the preserved segment's first message (here the second
    block of an API message, so the whole message): the segment follows the summary."""
    path = _claude_transcript(tmp_path / "cc.jsonl", head="a2b")
    transcript = read_transcript(path)
    [boundary] = transcript.boundaries
    assert boundary.first_kept_index == 3  # the assistant message "now b" + its call
    assert boundary.trigger is CompactTrigger.MANUAL
    assert boundary.strategy is CompactStrategy.FULL
    assert boundary.tokens_before == 1000
    session = import_file(store, path)
    active = session.active_context()
    check_pairing(session.format, active)
    check_sdk(session.format, active)
    text = json.dumps(active)
    assert "Summary of the session" in text
    assert '"t2"' in text and '"t1"' not in text  # preserved; compacted away
    assert active[-1]["content"][0]["text"] == "b is fine"


def test_claude_code_preserved_segment_that_would_break_pairing_is_cut_after(
    tmp_path: Path,
) -> None:
    """A segment starting at a tool result whose call came before it cannot be kept on its
    own: the boundary cuts after everything, as for an older boundary."""
    transcript = read_transcript(_claude_transcript(tmp_path / "cc.jsonl", head="u1"))
    [boundary] = transcript.boundaries
    assert boundary.first_kept_index == 5
    unknown = read_transcript(_claude_transcript(tmp_path / "cc2.jsonl", head="nowhere"))
    assert unknown.boundaries[0].first_kept_index == 5


# -- the dev corpus -------------------------------------------------------------------------


def _corpus(kind: str, pattern: str) -> list[Any]:
    """The ``kind`` transcripts whose name matches ``pattern`` (without any, one parameter
    skipped saying so)."""
    folder = CORPUS_DEV / kind
    found = sorted(p for p in folder.glob("*.jsonl") if re.search(pattern, p.name))
    return corpus_params(found, folder, f"transcripts named like {pattern!r}")


CODEX_COMPACTED = _corpus("codex", r"compact")
CLAUDE_COMPACTED = _corpus("claude-code", r"compact(ed|ions)")


def _usage_line(db: Path, path: Path) -> tuple[int, int]:
    result = CliRunner().invoke(cli, ["--db", str(db), "import", str(path), "--json"])
    assert result.exit_code == 0, result.output
    found = json.loads(result.output[result.output.index("{") :])
    return found["usage"], found["last_real_count"]


@pytest.mark.corpus
@pytest.mark.slow
@pytest.mark.parametrize("path", CODEX_COMPACTED, ids=lambda p: p.name)
def test_codex_rollout_imports_each_compacted_record(path: Path, tmp_path: Path) -> None:
    """A rollout with N ``compacted`` records imports with N boundaries, a valid active
    context, and a usage within 2x of the provider's last count (all the compacted
    history counted before)."""
    records = [r for r in raw_records(path) if r.get("type") == "compacted"]
    assert records
    transcript = read_transcript(path)
    assert len(transcript.boundaries) == len(records)
    with_history = sum(bool(r["payload"].get("replacement_history")) for r in records)
    assert (
        sum(b.strategy is CompactStrategy.PROVIDER for b in transcript.boundaries) == with_history
    )
    usage, real = _usage_line(tmp_path / "s.db", path)
    assert real / 2 <= usage <= 2 * real
    with CompactStore.open(f"sqlite:///{tmp_path / 's.db'}") as opened:
        session = opened.get_session(path.stem)
        assert len(session.boundaries()) == len(records)
        active = session.active_context()
        check_pairing(session.format, active)
        check_sdk(session.format, active)


@pytest.mark.corpus
@pytest.mark.slow
@pytest.mark.parametrize("path", CLAUDE_COMPACTED, ids=lambda p: p.name)
def test_claude_code_preserved_segments_kept(path: Path, tmp_path: Path) -> None:
    """Each boundary with a preserved segment whose messages the file holds cuts before
    them: the preserved messages' text is in the active context after the last one."""
    records = raw_records(path)
    by_uuid = {r.get("uuid"): r for r in records}
    transcript = read_transcript(path)
    session_path = tmp_path / "s.db"
    _usage_line(session_path, path)
    with CompactStore.open(f"sqlite:///{session_path}") as opened:
        session = opened.get_session(path.stem)
        active = session.active_context()
        check_pairing(session.format, active)
        check_sdk(session.format, active)
        assert len(session.boundaries()) == len(transcript.boundaries)
    metas = [r["compactMetadata"] for r in records if r.get("subtype") == "compact_boundary"]
    last = metas[-1] if metas else {}
    head = by_uuid.get((last.get("preservedSegment") or {}).get("headUuid"))
    if head is None or not transcript.boundaries:
        pytest.skip(f"{path.name}: its last boundary preserves nothing the file holds")
    cut = transcript.boundaries[-1].first_kept_index
    kept = json.dumps(transcript.messages[cut:])
    content = head.get("message", {}).get("content")
    for block in content if isinstance(content, list) else []:
        if block.get("type") == "text" and block["text"].strip():
            assert json.dumps(block["text"])[1:-1] in kept
