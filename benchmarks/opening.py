"""Opening a store: creating a new database, and opening an existing one again and again.

1. A new SQLite database: ``CompactStore.open`` on an empty file, which creates the schema at
   head from db/schema.py and stamps it, against running every migration on an empty file
   (how a database was created before; how one is upgraded). Median of ``--runs``.
2. Open, a small task, close, ``--runs`` times in one process on ``--db`` (default: a SQLite
   file): one session, 11 appends, ``process_request``, the active context. Each open after
   the first takes the engine the previous store closed (no connection, statements
   compiled); "new engine" opens the same database under a URL spelled differently each
   time (PostgreSQL: another ``application_name``; SQLite: ``/./`` repeated in the path),
   so that no engine is reused. Median wall time and this process's CPU time per task (a
   server's CPU is not counted).

Usage: python -m benchmarks.opening [--db URL] [--runs 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from compactstore import CompactStore
from compactstore.db.engine import create_engine_for
from compactstore.db.migrate import alembic_config


def _timed(fn: Callable[[], object], runs: int) -> tuple[float, float]:
    """Median wall and CPU milliseconds of ``fn`` over ``runs`` calls."""
    walls, cpus = [], []
    for _ in range(runs):
        cpu, wall = time.process_time(), time.perf_counter()
        fn()
        walls.append((time.perf_counter() - wall) * 1000)
        cpus.append((time.process_time() - cpu) * 1000)
    return statistics.median(walls), statistics.median(cpus)


def _migrate(path: Path) -> None:
    from alembic import command

    engine = create_engine_for(f"sqlite:///{path}")
    try:
        with engine.begin() as connection:
            config = alembic_config()
            config.attributes["connection"] = connection
            command.upgrade(config, "head")
    finally:
        engine.dispose()


def new_databases(directory: Path, runs: int) -> None:
    paths = iter(directory / f"new{i}.db" for i in range(2 * runs))
    created = _timed(lambda: CompactStore.open(next(paths)).close(), runs)
    migrated = _timed(lambda: _migrate(next(paths)), runs)
    print("new SQLite database        wall ms  cpu ms")
    print(f"  created at head            {created[0]:6.1f}  {created[1]:6.1f}")
    print(f"  every migration run        {migrated[0]:6.1f}  {migrated[1]:6.1f}")


def _task(url: str, sid: str) -> None:
    with CompactStore.open(url) as store:
        sess = store.session(sid, now=1_700_000_000.0)
        sess.append({"role": "user", "content": "hello"})
        for i in range(5):
            sess.extend(
                [
                    {"role": "assistant", "content": f"answer {i}"},
                    {"role": "user", "content": f"question {i}"},
                ]
            )
        sess.process_request()
        sess.active_context()


def reopening(url: str, runs: int) -> None:
    CompactStore.open(url).close()  # imports and first-time costs are not counted
    names = (f"task-{os.getpid()}-{i}-{time.time_ns()}" for i in range(4 * runs))
    print(f"open, task, close on {url.split('://')[0]}   wall ms  cpu ms")
    reused = _timed(lambda: _task(url, next(names)), runs)
    print(f"  reopened                   {reused[0]:6.1f}  {reused[1]:6.1f}")
    if url.startswith("postgresql"):
        spellings = (f"{url}{'&' if '?' in url else '?'}application_name=b{i}" for i in range(runs))
    else:
        folder, name = url.rsplit("/", 1)
        spellings = (f"{folder}/{'./' * (i + 1)}{name}" for i in range(runs))
    fresh = _timed(lambda: _task(next(spellings), next(names)), runs)
    print(f"  new engine each time       {fresh[0]:6.1f}  {fresh[1]:6.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", help="a database URL (default: a new SQLite file)")
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        new_databases(Path(directory), args.runs)
        reopening(args.db or f"sqlite:///{directory}/reopened.db", args.runs)


if __name__ == "__main__":
    main()
