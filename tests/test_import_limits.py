"""Hostile transcripts: a line too long to be one (a gzip bomb), a number too long to read,
and content that is no transcript of the format given. Each is refused with one line naming
the file and the line, before memory grows with the input, and nothing is stored."""

from __future__ import annotations

import gzip
import tracemalloc
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from compactstore import CompactStore
from compactstore._cli import cli
from compactstore._importers import import_file, read_transcript
from compactstore._importers.files import MAX_LINE_BYTES, TranscriptFile
from compactstore.errors import InvalidInputError
from tests.conftest import fresh_database
from tests.helpers import opened

HELLO = '{"role": "user", "content": "hello"}\n'
HUGE_NUMBER = '{"role": "user", "content": "hi", "n": ' + "9" * 5_000 + "}"


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), env={"COMPACTSTORE_DB": None})


def new_database(tmp_path: Path) -> str:
    """An empty compactstore database file (a copy of the test template: no migrations run)."""
    with fresh_database("sqlite", tmp_path) as path:
        return path


def spaces_gzip(path: Path, mib: int) -> Path:
    """A gzip of ``mib`` MiB of spaces and no line end: one gzip member of 1 MiB, repeated
    (a multi-member gzip reads as their concatenation), about 1 KB per MiB."""
    member = gzip.compress(b" " * (1 << 20), compresslevel=9)
    with path.open("wb") as out:
        for _ in range(mib):
            out.write(member)
    return path


def test_a_line_over_the_limit_stops_the_reading_with_its_line_number(tmp_path: Path) -> None:
    limit = 1_024
    path = tmp_path / "t.jsonl.gz"
    long_line = '{"role": "user", "content": "' + "x" * 2_000 + '"}\n'
    path.write_bytes(gzip.compress((HELLO + long_line).encode()))
    file = TranscriptFile(path, max_line_bytes=limit)
    with pytest.raises(InvalidInputError, match=r"t\.jsonl\.gz line 2 is over 1,024 bytes"):
        list(file.records())
    # The limit counts the line without its line end: a line of exactly the limit is read.
    exact = '{"role": "user", "content": "' + "x" * (limit - 31) + '"}'
    assert len(exact) == limit
    path.write_text(HELLO + exact + "\n" + exact)
    assert [number for number, _ in TranscriptFile(path, max_line_bytes=limit).records()] == [
        1,
        2,
        3,
    ]


@pytest.mark.slow
def test_a_gzip_bomb_without_a_line_end_is_refused_in_bounded_memory(tmp_path: Path) -> None:
    bomb = spaces_gzip(tmp_path / "bomb.jsonl", 256)  # 256 MiB of spaces in a 270 KB file
    assert bomb.stat().st_size < 400_000
    with opened(tmp_path / "agent.db") as store:
        tracemalloc.start()
        try:
            with pytest.raises(InvalidInputError, match=r"bomb\.jsonl line 1 is over"):
                import_file(store, bomb)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        # Reading stopped at the limit: memory is bounded by it, not by the 256 MiB line.
        assert peak < 2.5 * MAX_LINE_BYTES < 256 << 20
        assert store.sessions() == []
    result = invoke("import", str(bomb), "--db", str(tmp_path / "agent.db"))
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: bomb.jsonl line 1 is over 67,108,864 bytes")


@pytest.mark.parametrize("where", ["first line", "later line", "last line, no line end"])
def test_a_number_too_long_to_read_is_a_line_numbered_error(tmp_path: Path, where: str) -> None:
    lines = {
        "first line": HUGE_NUMBER + "\n",
        "later line": HELLO + HUGE_NUMBER + "\n",
        "last line, no line end": HELLO + HUGE_NUMBER,
    }[where]
    path = tmp_path / "t.jsonl"
    path.write_text(lines)
    line = 1 if where == "first line" else 2
    expected = f"t.jsonl line {line}: a number with more than 4,300 digits"
    with pytest.raises(InvalidInputError, match=expected):
        read_transcript(path)
    database = new_database(tmp_path)
    result = invoke("import", str(path), "--db", database)
    assert (result.exit_code, result.stderr) == (
        1,
        f"Error: {expected}, which compactstore does not read\n",
    )
    with opened(database) as store:
        assert store.sessions() == []


@pytest.mark.slow
def test_a_message_format_given_is_taken_as_plain_jsonl(tmp_path: Path) -> None:
    # gzip named .jsonl whose records are no transcript: with --format, the error is about
    # its lines as messages of that format, never "cannot tell ... give the format".
    path = tmp_path / "notes.jsonl"
    path.write_bytes(gzip.compress(b'{"title": "a note"}\n{"title": "another"}\n'))
    database = new_database(tmp_path)
    for fmt in ("anthropic", "openai", "jsonl"):
        result = invoke("import", str(path), "--format", fmt, "--db", database)
        assert result.exit_code == 1
        assert "cannot tell" not in result.stderr and "give the format" not in result.stderr
        assert result.stderr.startswith("Error: notes.jsonl line 1:"), result.stderr
    # Without a format, detection still says it cannot tell.
    result = invoke("import", str(path), "--db", database)
    assert "give the format" in result.stderr
    with CompactStore.open(database, create=False) as store:
        assert store.sessions() == []
