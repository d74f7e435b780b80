"""Replay a real transcript through compactstore as a live agent would, and measure it.

The transcript's raw log is appended message by message into a fresh session (compactions
already recorded in the file are ignored): ``process_request(now=<timestamp>)`` before every
assistant turn (each one is a model call), ``reactive_recover`` whenever the context would
not fit the window, reads routed through ``append_tool_result(file_path=...)`` so read dedup
applies, and writes invalidating their path. Every model call is measured: is the context
one a real API accepts, how full is it, is the original request still there, and what
happened to the files that compaction removed.

Real prompt sizes. Where the transcript reports the provider's prompt size for its calls
(Claude Code ``usage``, Codex ``token_count``), the real tokens of each message are learnt
from it: the growth between two consecutive calls is shared among the messages appended in
between, in proportion to their estimates, and the first call's excess over its messages is
the fixed overhead (system prompt and tool definitions). The real size of *our* context at a
call is then overhead + the real tokens of the messages in it (the summary counted at the
transcript's average ratio). The simulator calls ``record_usage`` with it after each call, as
a live agent would with the API's answer, and compares what the store predicted before it.
"""

from compactstore._simulate.replay import Progress, simulate, simulate_transcript
from compactstore._simulate.report import (
    CompactionEvent,
    SimulationReport,
    stage_rows,
    summary_lines,
)

__all__ = [
    "CompactionEvent",
    "Progress",
    "SimulationReport",
    "simulate",
    "simulate_transcript",
    "stage_rows",
    "summary_lines",
]
