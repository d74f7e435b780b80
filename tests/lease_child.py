"""Child process of the lease tests (tests/test_leases.py): killed while its summary is in flight.

Usage::

    python -m tests.lease_child DB_URL SESSION NOW [background]   (from the repository root)

It opens the store with a summarizer that prints ``summarizing`` on stdout (flushed) and
then blocks, and calls ``process_request(now=NOW)`` on the session, which is over its
auto-compact threshold. The parent kills it with SIGKILL once it read the line: the child
holds the session's compaction lease and has recorded nothing. With ``background`` the call
is ``process_request(now=NOW, background=True)`` on a session over its background threshold:
the child dies while its worker runs the job it started (the job's lease and the compaction
lease are the child's; the starting call's row is recorded).
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from compactstore import CompactStore


def main() -> None:
    url, session_id, now = sys.argv[1], sys.argv[2], float(sys.argv[3])
    in_background = sys.argv[4:] == ["background"]
    never = threading.Event()

    def summarizer(messages: Any, previous: str | None, instructions: str | None) -> str:
        print("summarizing", flush=True)
        never.wait()  # until SIGKILL
        return "never written"

    store = CompactStore.open(url, summarizer=summarizer)
    result = store.session(session_id).process_request(now=now, background=in_background)
    if in_background and result.background == "started":
        never.wait()  # the worker summarises until SIGKILL
    print("returned", flush=True)  # the parent fails the test if it sees this


if __name__ == "__main__":
    main()
