"""Copying a large session between databases: time and peak memory.

Builds one session of about ``--mb`` megabytes of messages (4 KB each) in a SQLite file, then
copies it, in a fresh process, into a new SQLite file (or ``--target URL``, e.g. an empty
PostgreSQL database) with compactstore.transfer.copy_sessions, the path that backup,
restore, staged imports and demo/simulate staging take. Prints the copy's seconds and the
copying process's peak RSS (``ru_maxrss``) next to its RSS before the copy.

Usage: python -m benchmarks.transfer [--mb 200] [--target URL]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from compactstore import CompactStore
from compactstore.transfer import copy_sessions

MESSAGE_CHARS = 4_000
CHUNK = 1_000


def build(path: Path, megabytes: int) -> int:
    """A session 'big' of about ``megabytes`` MB; returns its message count."""
    count = megabytes * 1_000_000 // MESSAGE_CHARS
    text = ("lorem ipsum dolor sit amet " * (MESSAGE_CHARS // 27 + 1))[:MESSAGE_CHARS]
    with CompactStore.open(path) as store:
        sess = store.session("big", now=1_700_000_000.0)
        for start in range(0, count, CHUNK):
            size = min(CHUNK, count - start)
            roles = ["user" if (start + i) % 2 == 0 else "assistant" for i in range(size)]
            sess.extend([{"role": role, "content": text} for role in roles])
    return count


def copy(source: str, target: str) -> None:
    """Run in the child: copy and print seconds, RSS before and peak RSS (MB)."""
    with CompactStore.open(source) as src, CompactStore.open(target) as dst:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        began = time.perf_counter()
        report = copy_sessions(src, dst)
        seconds = time.perf_counter() - began
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{report.rows['messages']} {seconds:.2f} {before:.0f} {peak:.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--target", help="an empty database URL (default: a new SQLite file)")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        copy(*args.child)
        return
    with tempfile.TemporaryDirectory(prefix="compactstore-bench-") as tmp:
        source = Path(tmp) / "source.db"
        began = time.perf_counter()
        count = build(source, args.mb)
        print(f"built {count:,} messages ({args.mb} MB) in {time.perf_counter() - began:.1f} s")
        target = args.target or str(Path(tmp) / "target.db")
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.transfer", "--child", str(source), target],
            capture_output=True,
            text=True,
            check=True,
        )
        messages, seconds, before, peak = out.stdout.split()
        print(
            f"copied {int(messages):,} messages in {float(seconds):.1f} s; "
            f"RSS {before} MB before the copy, peak {peak} MB"
        )


if __name__ == "__main__":
    main()
