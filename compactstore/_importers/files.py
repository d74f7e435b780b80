"""Reading transcript files line by line: plain or gzip, a path or standard input.

A file is never read whole (except a SWE-agent trajectory, which is one JSON document):
lines are decoded and parsed one at a time, so memory does not grow with the file, and a
line is read only up to :data:`MAX_LINE_BYTES` (a longer one is refused unread). A
:class:`TranscriptFile` can be read more than once (detection looks at the start; some
sources need a first pass); standard input is therefore spooled to a temporary file first.

A last line with no line end that is not valid JSON is a record still being written: it is
left out and reported (:attr:`TranscriptFile.cut_line`), or refused with ``strict``. Every
other unparsable line is an error naming it.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import sys
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from compactstore._scratch import scratch_dir
from compactstore.errors import InvalidInputError
from compactstore.models import CompactionConfig

__all__ = [
    "MAX_LINE_BYTES",
    "STDIN_NAME",
    "Progress",
    "Record",
    "TranscriptFile",
    "json_kind",
    "open_transcript",
    "parse_json",
]

Progress = Callable[[int, int], None]

# One parsed JSONL line: (1-based line number, the object on it).
Record = tuple[int, dict[str, Any]]

# How standard input is named in messages.
STDIN_NAME = "stdin"

_GZIP_MAGIC = b"\x1f\x8b"
_BOM = b"\xef\xbb\xbf"
_SPOOL_CHUNK = 1 << 20

# The longest JSONL line read. A line holds one message and what the agent recorded beside
# it: Claude Code keeps a tool result's content twice (the message and toolUseResult), and
# JSON escapes may make the line longer than the message as stored, so a line may be twice
# the largest message the store accepts (CompactionConfig.max_message_bytes). A longer one
# (a gzip of a gigabyte of spaces) is refused after reading this much, not all of it.
MAX_LINE_BYTES = 2 * CompactionConfig.model_fields["max_message_bytes"].get_default()


def parse_json(name: str, text: str, line: int | None = None) -> Any:
    """Parse one JSON value: a whole document, or line ``line`` of a JSONL file."""
    where = f"{name} line {line}" if line is not None else name
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        # json's messages may end in "at" ("Unterminated string starting at"): one "at" here.
        problem = f"{exc.msg.removesuffix(' at')} at column {exc.colno}"
        where = f"{name} line {line or exc.lineno}"
        ends_early = exc.pos >= len(text.rstrip()) or exc.msg.startswith("Unterminated string")
        if ends_early and line is None:
            # A whole document that stops before its value does was cut short, not mistyped.
            raise InvalidInputError(
                f"{where}: not valid JSON ({problem}): the file ends before its JSON does, so "
                f"it looks truncated (cut short while being written or copied)"
            ) from None
        if ends_early:
            problem += "; the line ends before its JSON does"
        raise InvalidInputError(f"{where}: not valid JSON ({problem})") from None
    except RecursionError:
        raise InvalidInputError(f"{where}: JSON nested too deeply") from None
    except ValueError:
        # Python refuses to turn a very long run of digits into an int (a guard against
        # quadratic conversion): the only ValueError json.loads raises besides the above.
        raise InvalidInputError(
            f"{where}: a number with more than {sys.get_int_max_str_digits():,} digits, "
            f"which compactstore does not read"
        ) from None


def json_kind(value: Any) -> str:
    """What a JSON value is, for messages ("an array", "a number", ...)."""
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return "null"


class TranscriptFile:
    """A transcript on disk, read line by line (gzip is recognised by its content).

    Args:
        path: the file.
        name: how messages name it (default: the file's name).
        strict: refuse a cut last line instead of leaving it out.
    """

    def __init__(
        self,
        path: Path,
        name: str | None = None,
        *,
        strict: bool = False,
        max_line_bytes: int = MAX_LINE_BYTES,
    ) -> None:
        self.path = path
        self.name = name if name is not None else path.name
        self.strict = strict
        self.max_line_bytes = max_line_bytes
        # The number of a last line left out because it was cut short; None when complete.
        self.cut_line: int | None = None
        # The agent's working directory, as the converter found it in the records.
        self.cwd: str | None = None

    @property
    def suffix(self) -> str:
        """The name's suffix, looking through a ``.gz``: ``run.traj.gz`` -> ``.traj``."""
        name = self.name.removesuffix(".gz") if self.name.lower().endswith(".gz") else self.name
        return Path(name).suffix.lower()

    @property
    def stem(self) -> str:
        """The name without its suffix (and without ``.gz``): the default session id."""
        name = self.name[:-3] if self.name.lower().endswith(".gz") else self.name
        return Path(name).stem

    @contextmanager
    def _open(self) -> Iterator[Any]:
        """The stream of the file's content (unzipped)."""
        try:
            raw = self.path.open("rb")
        except OSError as exc:
            raise InvalidInputError(f"cannot read {self.path}: {exc.strerror or exc}") from None
        try:
            with raw:
                if raw.read(2) == _GZIP_MAGIC:
                    raw.seek(0)
                    with gzip.GzipFile(fileobj=raw, mode="rb") as unzipped:
                        yield unzipped
                else:
                    raw.seek(0)
                    yield raw
        except (OSError, EOFError, zlib.error) as exc:
            # gzip.BadGzipFile is an OSError; EOFError: the gzip stream ends early.
            raise InvalidInputError(
                f"cannot read {self.name} as gzip: {getattr(exc, 'strerror', None) or exc}"
            ) from None

    def _count_lines(self) -> int:
        count = 0
        last = b"\n"
        run = 0  # bytes since the last line end
        with self._open() as stream:
            while chunk := stream.read(_SPOOL_CHUNK):
                first = chunk.find(b"\n")
                if run + (len(chunk) if first < 0 else first) > self.max_line_bytes:
                    break  # a line too long: the reading pass refuses it, unread
                if first >= 0:
                    run = len(chunk) - chunk.rfind(b"\n") - 1
                else:
                    run += len(chunk)
                count += chunk.count(b"\n")
                last = chunk[-1:]
        return count + (last != b"\n")

    def lines(
        self, progress: Progress | None = None, *, whole: bool = False
    ) -> Iterator[tuple[int, str, bool]]:
        """(line number, text, whether it ended with a line end) for every line.

        ``progress(lines read, lines in the file)`` is called as the file is read (the lines
        are counted first, a quick pass). A line is read only up to ``max_line_bytes``:
        a longer one is an error, raised before the rest of it is read (``whole``: no
        limit, for a one-document format).

        Raises:
            InvalidInputError: unreadable, not UTF-8, a damaged gzip stream, a line over
                ``max_line_bytes``, or empty.
        """
        total = self._count_lines() if progress is not None else 0
        step = max(1, total // 100)
        with self._open() as stream:
            offset = 0
            content = False
            for number, line in enumerate(self._bounded(stream, whole), start=1):
                data = line
                if number == 1 and data.startswith(_BOM):
                    data, offset = data[len(_BOM) :], len(_BOM)  # not content
                try:
                    text = data.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise InvalidInputError(
                        f"{self.name} is not UTF-8 text (byte 0x{data[exc.start]:02x} at "
                        f"offset {offset + exc.start})"
                    ) from None
                offset += len(data)
                content = content or bool(text.strip())
                yield number, text, text.endswith("\n")
                if progress is not None and (number % step == 0 or number == total):
                    progress(number, total)
        if not content:
            raise InvalidInputError(f"{self.name} is empty: there is nothing to import")

    def _bounded(self, stream: Any, whole: bool) -> Iterator[bytes]:
        """The stream's lines, each read only up to ``max_line_bytes`` (+ its line end)."""
        if whole:
            yield from stream
            return
        limit = self.max_line_bytes
        number = 0
        while line := stream.readline(limit + 1):
            number += 1
            if len(line) > limit and not (len(line) == limit + 1 and line.endswith(b"\n")):
                raise InvalidInputError(
                    f"{self.name} line {number} is over {limit:,} bytes, longer than a line "
                    f"holding a message the store accepts can be (twice "
                    f"CompactionConfig.max_message_bytes); reading stopped there"
                )
            yield line

    def records(self, progress: Progress | None = None) -> Iterator[Record]:
        """Parse the file as JSONL: every non-blank line must be one JSON object.

        A cut last line (see the module docstring) sets :attr:`cut_line` and ends the
        records; with ``strict`` it is an error.
        """
        for number, text, ended in self.lines(progress):
            if not text.strip():
                continue
            if not ended:
                try:
                    json.loads(text)
                except json.JSONDecodeError as exc:
                    if self.strict:
                        raise InvalidInputError(
                            f"{self.name} line {number}: the last line is cut short ({exc}); "
                            f"the file may still be being written"
                        ) from None
                    self.cut_line = number
                    return
                except (RecursionError, ValueError):
                    pass  # whole but nested too deeply or a huge number: parse_json says so
            value = parse_json(self.name, text, number)
            if not isinstance(value, dict):
                raise InvalidInputError(
                    f"{self.name} line {number}: expected a JSON object, got {json_kind(value)}"
                )
            yield number, value

    def text(self) -> str:
        """The whole content as text (for one-document formats: no line limit)."""
        return "".join(text for _, text, _ in self.lines(whole=True))


@contextmanager
def open_transcript(
    source: str | os.PathLike[str] | IO[bytes], *, strict: bool = False
) -> Iterator[TranscriptFile]:
    """A :class:`TranscriptFile` for a path, or for a binary stream such as standard input
    (copied to a temporary file, removed afterwards, and named ``stdin``).

    Raises:
        InvalidInputError: the path is not a readable file.
    """
    if isinstance(source, str | os.PathLike):
        path = Path(source)
        if not path.is_file():
            reason = "it is a directory" if path.is_dir() else "No such file or directory"
            raise InvalidInputError(f"cannot read {path}: {reason}")
        yield TranscriptFile(path, strict=strict)
        return
    stream: Any = source
    name = getattr(stream, "name", None)
    label = name if isinstance(name, str) and not name.startswith("<") else STDIN_NAME
    with scratch_dir("compactstore-import-") as tmp:
        spooled = Path(tmp) / "input"
        with spooled.open("wb") as out:
            shutil.copyfileobj(stream, out, _SPOOL_CHUNK)
        yield TranscriptFile(spooled, Path(label).name, strict=strict)
