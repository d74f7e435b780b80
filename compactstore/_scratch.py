"""Scratch directories: where work that may be stopped half way keeps its temporary files,
and how a later run removes what a stopped one left.

An import builds its session in a staging database, ``simulate`` and ``restore`` work in
temporary databases, standard input is spooled to a file and a backup is written beside its
output before it is renamed into place. Each of these lives in a directory of its own, named
by its purpose (``compactstore-staging-*`` in the system's temporary directory,
``.NAME.*.partial`` beside a backup's output), removed when the work ends. A process killed
meanwhile (``kill -9``, a crash, a power cut) cannot remove it: the next run does.

A run in progress is never taken for a leftover, in this process or another: its process
holds an exclusive ``flock`` on the directory's ``owner.lock`` for as long as it works, and
the kernel lets go of it however the process ends. The lock file is locked before it gets
its name, so a directory whose ``owner.lock`` nobody holds is a leftover. A directory or file
of these names without one (left by an older compactstore, or just being made) counts as a
leftover only when nothing in it changed for :data:`STALE_SECONDS`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from compactstore.errors import CompactStoreWarning, DatabaseError

try:
    import fcntl
except ImportError:  # Windows: leftovers are recognised by their age alone
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "LOCK_NAME",
    "STALE_SECONDS",
    "TEMP_PREFIXES",
    "Leftover",
    "remove_leftovers",
    "scratch_dir",
]

LOCK_NAME = "owner.lock"
# A directory or file without an owner lock, untouched this long, is a leftover: every kind
# of work that makes one writes to it continually while it runs.
STALE_SECONDS = 3_600.0
# The scratch directories compactstore makes in the system's temporary directory.
TEMP_PREFIXES = (
    "compactstore-staging-",
    "compactstore-import-",
    "compactstore-restore-",
    "compactstore-sim-",
    "compactstore-reference-",
)


@dataclass(frozen=True)
class Leftover:
    """A directory or file a stopped run left, and the bytes it held."""

    path: Path
    bytes: int


@contextmanager
def scratch_dir(prefix: str, parent: Path | None = None, suffix: str = "") -> Iterator[Path]:
    """A new directory ``parent/prefix*suffix`` (default parent: the system's temporary
    directory), owned by this process while the block runs and removed afterwards.

    Leftovers of the same kind in ``parent`` (every compactstore kind, in the temporary
    directory) are removed first, with a :class:`CompactStoreWarning` saying so.
    """
    where = Path(tempfile.gettempdir()) if parent is None else parent
    kinds = TEMP_PREFIXES if parent is None else (prefix,)
    removed = remove_leftovers(where, kinds, suffix=suffix)
    if removed:
        total = sum(item.bytes for item in removed)
        names = ", ".join(str(item.path) for item in removed[:3])
        more = f" and {len(removed) - 3} more" if len(removed) > 3 else ""
        warnings.warn(
            f"removed {len(removed)} temporary {'file' if len(removed) == 1 else 'files'} "
            f"({total:,} bytes) left by an earlier compactstore run that was stopped: "
            f"{names}{more}",
            CompactStoreWarning,
            stacklevel=3,
        )
    try:
        directory = Path(tempfile.mkdtemp(prefix=prefix, suffix=suffix, dir=where))
        fd = _own(directory)
    except OSError as exc:
        hint = " (or set TMPDIR to a directory you may write)" if parent is None else ""
        raise DatabaseError(
            f"cannot create a working directory in {where}: {exc.strerror or exc}; check "
            f"that it exists and that you may write there{hint}"
        ) from None
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        if fd is not None:
            os.close(fd)


def _own(directory: Path) -> int | None:
    """Lock the directory's owner file (locked under a temporary name, then renamed, so
    no other process ever sees it unlocked)."""
    if fcntl is None:
        return None
    staged = directory / f".{LOCK_NAME}.{uuid.uuid4().hex[:8]}"
    try:
        fd = os.open(staged, os.O_CREAT | os.O_RDWR, 0o600)
    except OSError:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(staged, directory / LOCK_NAME)
    except BaseException:
        os.close(fd)
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return fd


def remove_leftovers(
    parent: Path, prefixes: Iterable[str], *, suffix: str = "", now: float | None = None
) -> list[Leftover]:
    """Remove the scratch directories (and an older compactstore's backup files) in
    ``parent`` named ``prefix*suffix`` that no run owns any more; return what was removed.

    A directory whose ``owner.lock`` another process holds is in use and stays; so does
    anything without an owner lock that changed in the last :data:`STALE_SECONDS`.
    """
    moment = time.time() if now is None else now
    wanted = tuple(prefixes)
    removed: list[Leftover] = []
    try:
        entries = [entry for entry in os.scandir(parent) if entry.name.startswith(wanted)]
    except OSError:
        return removed
    # An older compactstore's backup in progress: .NAME.<hex>.partial and its side files.
    partials: dict[str, list[Path]] = {}
    for entry in entries:
        with suppress(OSError):  # gone meanwhile, or not ours to remove
            if entry.is_dir(follow_symlinks=False) and entry.name.endswith(suffix):
                size = _remove_dir(Path(entry.path), moment)
                if size is not None:
                    removed.append(Leftover(Path(entry.path), size))
            elif suffix and entry.is_file(follow_symlinks=False):
                base = _partial_base(entry.name, suffix)
                if base is not None:
                    partials.setdefault(base, []).append(Path(entry.path))
    for base, files in sorted(partials.items()):
        with suppress(OSError):
            stats = [path.stat() for path in files]
            if moment - max(stat.st_mtime for stat in stats) < STALE_SECONDS:
                continue
            for path in files:
                path.unlink(missing_ok=True)
            removed.append(Leftover(parent / base, sum(stat.st_size for stat in stats)))
    return removed


# The files SQLite (and compactstore's writer turns) keep beside a database.
_SIDE = ("-wal", "-shm", "-journal", "-writer")


def _partial_base(name: str, suffix: str) -> str | None:
    """The database file an older compactstore's backup file belongs to, or None."""
    for side in ("", *_SIDE):
        if name.endswith(suffix + side):
            return name[: len(name) - len(side)] if side else name
    return None


def _remove_dir(directory: Path, now: float) -> int | None:
    """Remove a scratch directory no run owns; its size, or None when it stays."""
    files = [path for path in directory.iterdir() if path.is_file()]
    size = sum(path.stat().st_size for path in files)
    lock = directory / LOCK_NAME
    if fcntl is not None and lock.exists():
        fd = os.open(lock, os.O_RDWR)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return None  # its run is still working
            shutil.rmtree(directory)  # holding the lock: no one else removes it meanwhile
        finally:
            os.close(fd)
        return size
    newest = max([directory.stat().st_mtime, *(path.stat().st_mtime for path in files)])
    if now - newest < STALE_SECONDS:
        return None
    shutil.rmtree(directory)
    return size
