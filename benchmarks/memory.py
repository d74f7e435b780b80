"""Peak memory of `compactstore import`, `export` and `show` (`show --all` too) on a large
Claude Code transcript.

Generates a Claude Code transcript JSONL of the requested size (a coding session: a request,
then turns of an assistant message with a tool call and its result, with Claude Code's own
compaction — a compact_boundary and its summary — every ~600 KB of conversation, as it
compacts at ~160k tokens), then runs each command in a child process and reports the child's
peak resident set size (``ru_maxrss``) and its wall time. The target is the import staying
under 200 MB on a 200 MB file: memory must not grow with the transcript.

Usage: python -m benchmarks.memory [--size-mb 200] [--dir DIR] [--keep] [--transcript FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

_WORDS = [
    "def",
    "class",
    "return",
    "import",
    "self",
    "value",
    "result",
    "error",
    "test",
    "file",
    "path",
    "line",
    "token",
    "context",
    "session",
    "store",
    "message",
    "tool",
    "call",
    "read",
    "write",
    "edit",
    "config",
    "index",
    "query",
    "commit",
    "rollback",
    "boundary",
    "summary",
    "compaction",
    "window",
    "budget",
    "usage",
    "format",
    "anthropic",
    "openai",
    "request",
]
_TOOLS = ("Read", "Bash", "Edit", "Grep")
_COMPACT_EVERY = 600_000  # bytes of conversation between Claude Code's own compactions


def _text(rng: random.Random, size: int) -> str:
    words: list[str] = []
    length = 0
    while length < size:
        word = rng.choice(_WORDS)
        words.append(word)
        length += len(word) + 1
        if rng.random() < 0.08:
            words.append("\n")
    return " ".join(words)


def generate(path: Path, size: int, *, seed: int = 7) -> int:
    """Write a Claude Code transcript of about ``size`` bytes; returns its number of lines."""
    rng = random.Random(seed)
    session = str(uuid.UUID(int=rng.getrandbits(128)))
    clock = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
    parent: str | None = None
    lines = 0
    since_compaction = 0

    def record(kind: str, **fields: Any) -> dict[str, Any]:
        nonlocal parent, clock
        clock += timedelta(seconds=rng.randint(1, 20))
        uid = str(uuid.UUID(int=rng.getrandbits(128)))
        out = {
            "parentUuid": parent,
            "isSidechain": False,
            "userType": "external",
            "cwd": "/home/user/project",
            "sessionId": session,
            "version": "2.1.39",
            "gitBranch": "main",
            "type": kind,
            "uuid": uid,
            "timestamp": clock.isoformat().replace("+00:00", "Z"),
            **fields,
        }
        parent = uid
        return out

    with path.open("w", encoding="utf-8") as out:

        def emit(item: dict[str, Any]) -> None:
            nonlocal lines, since_compaction
            line = json.dumps(item, separators=(",", ":")) + "\n"
            out.write(line)
            lines += 1
            since_compaction += len(line)

        emit(
            record(
                "user",
                message={"role": "user", "content": "Refactor the store: " + _text(rng, 400)},
            )
        )
        turn = 0
        while out.tell() < size:
            turn += 1
            tool = rng.choice(_TOOLS)
            call_id = f"toolu_{turn:08d}"
            tool_input: dict[str, Any] = (
                {"file_path": f"/home/user/project/src/mod{rng.randint(1, 400)}.py"}
                if tool in ("Read", "Edit")
                else {"command": _text(rng, 60)}
            )
            if tool == "Edit":
                tool_input |= {"old_string": _text(rng, 300), "new_string": _text(rng, 300)}
            usage = {"input_tokens": 3, "cache_read_input_tokens": 20_000 + since_compaction // 4}
            emit(
                record(
                    "assistant",
                    message={
                        "id": f"msg_{turn:08d}",
                        "type": "message",
                        "role": "assistant",
                        "model": "claude-sonnet-4-5",
                        "content": [
                            {"type": "text", "text": _text(rng, rng.randint(50, 600))},
                            {"type": "tool_use", "id": call_id, "name": tool, "input": tool_input},
                        ],
                        "usage": usage,
                    },
                )
            )
            result = _text(rng, rng.randint(200, 8_000))
            emit(
                record(
                    "user",
                    message={
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": call_id, "content": result}
                        ],
                    },
                )
            )
            if since_compaction > _COMPACT_EVERY:
                emit(
                    record(
                        "system",
                        subtype="compact_boundary",
                        content="Conversation compacted",
                        compactMetadata={"trigger": "auto", "preTokens": since_compaction // 4},
                    )
                )
                summary = "This session is being continued from a previous conversation. "
                emit(
                    record(
                        "user",
                        isCompactSummary=True,
                        message={"role": "user", "content": summary + _text(rng, 6_000)},
                    )
                )
                since_compaction = 0
    return lines


def measure(argv: list[str]) -> tuple[float, float, str]:
    """Run a command; (wall seconds, peak RSS in MB, last stderr line)."""
    began = time.perf_counter()
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert child.stderr is not None
    err = child.stderr.read()
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - began
    if child.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({child.returncode}): {err.strip()}")
    last = err.strip().splitlines()[-1] if err.strip() else ""
    return seconds, usage.ru_maxrss / 1024, last  # ru_maxrss is in KB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mb", type=float, default=200.0)
    parser.add_argument("--dir", type=Path, help="Work here (default: a temporary directory).")
    parser.add_argument("--keep", action="store_true", help="Keep the files.")
    parser.add_argument(
        "--transcript", type=Path, help="Measure on this transcript instead of generating one."
    )
    args = parser.parse_args()
    work = args.dir or Path(tempfile.mkdtemp(prefix="compactstore-memory-"))
    work.mkdir(parents=True, exist_ok=True)
    transcript, db = args.transcript or work / "big.jsonl", work / "big.db"
    db.unlink(missing_ok=True)
    if args.transcript is None:
        began = time.perf_counter()
        generate(transcript, int(args.size_mb * 1e6))
        print(f"generated in {time.perf_counter() - began:.0f} s")
    with transcript.open("rb") as file:
        lines = sum(chunk.count(b"\n") for chunk in iter(lambda: file.read(1 << 20), b""))
    print(f"{transcript}: {transcript.stat().st_size / 1e6:.0f} MB, {lines:,} lines\n")
    cli = [sys.executable, "-m", "compactstore"]
    commands = {
        "baseline (sessions of an empty db)": [*cli, "sessions", "--db", str(work / "empty.db")],
        "import": [*cli, "import", str(transcript), "--session", "big", "--db", str(db)],
        "export -o": [*cli, "export", "big", "--db", str(db), "-o", str(work / "out.jsonl")],
        "show": [*cli, "show", "big", "--db", str(db)],
        "show --all": [*cli, "show", "big", "--all", "--db", str(db)],
    }
    empty = work / "empty.db"
    empty.unlink(missing_ok=True)
    # The baseline reads an empty database; reading never creates one, so create it first.
    subprocess.run([*cli, "db", "upgrade", "--db", str(empty)], check=True, capture_output=True)
    print("| command | peak RSS (MB) | wall (s) |\n|---|---|---|")
    for label, argv in commands.items():
        seconds, peak, _ = measure(argv)
        print(f"| {label} | {peak:.0f} | {seconds:.0f} |", flush=True)
    if not args.keep and args.dir is None:
        for leftover in work.iterdir():
            leftover.unlink()
        work.rmdir()


if __name__ == "__main__":
    main()
