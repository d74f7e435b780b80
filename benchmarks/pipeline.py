"""Cost of the pipeline on a large active context.

Measures, on a SQLite file with an active context of about 200k estimated tokens:
- active_context(): rebuilding the context from the rows;
- process_request() when nothing needs doing (it must cost about one context read);
- compact(): a full compact of that context (each trial on a fresh copy of the file).

Usage: python -m benchmarks.pipeline [--tokens 200000] [--trials 15]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from compactstore import CompactionConfig, CompactStore

START = 1_767_225_600.0


def build(path: Path, tokens: int) -> int:
    """A coding-agent log of about ``tokens`` estimated tokens; returns its message count."""
    config = CompactionConfig(tool_result_max_chars=1_000_000)
    with CompactStore.open(path) as store:
        sess = store.session("bench", context_window=tokens * 4, config=config, now=START)
        sess.append({"role": "user", "content": "Refactor the error handling of payments/"})
        step = 0
        while sess.token_usage() < tokens:
            batch = []
            for _ in range(25):
                call = f"toolu_{step:06d}"
                batch.append(
                    {
                        "role": "assistant",
                        "content": [
                            {"type": "text", "text": f"Reading module {step}."},
                            {
                                "type": "tool_use",
                                "id": call,
                                "name": "Read",
                                "input": {"file_path": f"src/payments/mod_{step}.py"},
                            },
                        ],
                    }
                )
                body = "\n".join(
                    f"    line {i} of module {step}: value = compute({i})" for i in range(40)
                )
                batch.append(
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": call, "content": body}],
                    }
                )
                step += 1
            sess.extend(batch, timestamps=[START + step + i * 0.01 for i in range(len(batch))])
        return len(sess.messages())


def timed(fn: object, trials: int) -> list[float]:
    out = []
    for _ in range(trials):
        began = time.perf_counter()
        fn()  # type: ignore[operator]
        out.append((time.perf_counter() - began) * 1000)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=200_000)
    parser.add_argument("--trials", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base.db"
        count = build(base, args.tokens)
        with CompactStore.open(base) as store:
            sess = store.session("bench")
            usage = sess.token_usage()
            read = timed(sess.active_context, args.trials)
            noop = timed(lambda: sess.process_request(now=START + 60), args.trials)
        compact = []
        for trial in range(args.trials):
            copy = Path(tmp) / f"copy{trial}.db"
            shutil.copy(base, copy)
            with CompactStore.open(copy) as store:
                sess = store.session("bench")
                began = time.perf_counter()
                result = sess.compact(now=START + 120)
                compact.append((time.perf_counter() - began) * 1000)
                assert result.effective
    print(f"active context: {count} messages, {usage} estimated tokens")
    for name, values in (
        ("active_context()", read),
        ("process_request() with nothing to do", noop),
        ("compact() full compact", compact),
    ):
        print(f"{name:<40} median {statistics.median(values):7.1f} ms   max {max(values):7.1f} ms")


if __name__ == "__main__":
    main()
