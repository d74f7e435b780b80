"""A coding session with thinking through compactstore, against the strict fake of the
Messages API (tests/fake_messages_api.py: prefix checks, the continuation rule, pairing,
server-side edits, prompt caching on a simulated clock, the window).

    python -m benchmarks.providers                        # claude-opus-5-5 and claude-sonnet-4-5
    python -m benchmarks.providers --model claude-opus-5-5 --calls 300 --window 60000
    python -m benchmarks.providers --model claude-opus-5-5 --compactor --pattern
    python -m benchmarks.providers --cost                 # and the cost comparison
    python -m benchmarks.providers --responses            # the Responses API (gpt-5)

The loop is the README's: ``process_request()``, ``client.messages.create(...,
**sess.request_params(cache_control=True, thinking=..., extra_headers=...))``,
``append_response()``, ``append_tool_result()`` for each call; a new task once the agent
answers. The clock is simulated: 300 s per call by default (``--step-seconds``), so
time-based microcompact (hourly) falls inside tool loops as it does for a slow agent. A request the
API refuses is retried once (after ``reactive_recover()`` when the prompt is too long); a
step whose retry fails too is lost. Figures: API errors by rule, calls, steps lost, thinking
blocks the API dropped (its ``input_transformations``), server-side edits applied, the
compactions compactstore recorded by strategy and trigger, the cache's share of input and
the session's cost from the ledger (``Session.cost()``, compactstore.pricing's prices).

``--compactor`` gives the session an ``AnthropicCompactor`` (provider compaction as the
summary of auto-compact); the session's cost is the ledger's (``Session.cost()``, the
compactions' own calls included). ``--pattern`` also runs the provider's recommended loop
without compactstore: append-only, on-demand compaction once the last call's input reached
85% of the window (keeping the turn in progress after the block), priced the same way.

``--responses`` runs the session on the Responses API instead (the strict fake of
tests/fake_responses_api.py): once with an ``OpenAICompactor`` (``responses.compact``),
once with server-side compaction (``context_management`` at 70% of the window); it counts
the requests made after a compaction item was issued and those that sent the newest one
byte-identical (:func:`responses_run`).

``--cost`` runs the same session again with ``cache_aware=False`` (in-place clears
regardless of the cache), then both append-only loops without compactstore (:func:`pattern`,
and :func:`clear_pattern`: the window kept by the server-side clear instead), and prints the
ratios of the costs.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from sqlalchemy import text

from compactstore import CompactionConfig, CompactStore
from compactstore._ledger import response_usage, usage_cost
from compactstore.pricing import price_table
from compactstore.providers import AnthropicCompactor

TOOLS = [
    {
        "name": name,
        "description": f"{name} in the repository",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
    for name in ("read_file", "grep", "run_tests", "edit_file")
]
SYSTEM = "You are a coding agent working in a Python repository. Be careful and brief."
TASKS = [
    "Fix the failing tests in payments/.",
    "Make the retry logic of the HTTP client typed.",
    "Find why the nightly import is slow and fix it.",
    "Refactor the error handling of the CLI.",
]


def _tool_output(name: str, path: str, rng: random.Random) -> str:
    lines = rng.choice((40, 80, 120, 200, 400))
    if name == "run_tests":
        return "\n".join(f"tests/test_{path[4:-3]}.py::test_{i} PASSED" for i in range(lines))
    return "\n".join(f"def handler_{i}(request):  # {path} line {i}" for i in range(lines))


def run(
    *,
    model: str = "claude-opus-5-5",
    calls: int = 300,
    window: int = 60_000,
    config: CompactionConfig | None = None,
    db: str | None = None,
    seed: int = 7,
    thinking: dict[str, Any] | None = None,
    step_seconds: float = 300.0,
    pause_seconds: float = 0.0,
    compactor: bool = False,
) -> dict[str, Any]:
    """One session of ``calls`` model calls, ``step_seconds`` apart on the simulated clock
    (``pause_seconds`` more before each new task); returns the figures."""
    import anthropic

    from tests.fake_messages_api import fake_client

    client, api = fake_client(anthropic, default_window=window)
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        store = CompactStore.open(db or str(Path(tmp) / "providers.db"))
        now = api.now
        sess = store.session(
            "bench",
            context_window=window,
            format="anthropic",
            config=config,
            now=now,
            model=model,
            compactor=AnthropicCompactor(client, tools=TOOLS) if compactor else None,
        )
        sess.append({"role": "system", "content": SYSTEM}, timestamp=now)
        sess.append({"role": "user", "content": TASKS[0]}, timestamp=now)
        steps = lost = tasks = 0
        errors: Counter[str] = Counter()
        while api.calls < calls:
            steps += 1
            sess.process_request(now=api.now)
            reply = None
            for attempt in range(2):
                try:
                    reply = client.messages.create(
                        model=model,
                        max_tokens=4_096,
                        tools=TOOLS,
                        **sess.request_params(cache_control=True, thinking=thinking),
                    )
                    break
                except anthropic.BadRequestError as error:
                    errors[api.errors[-1]["rule"]] += 1
                    if "prompt is too long" in str(error) and attempt == 0:
                        sess.reactive_recover(str(error), now=api.now)
                if api.calls >= calls:
                    break
            api.advance(step_seconds)
            if reply is None:
                lost += 1
                continue
            sess.append_response(reply, timestamp=api.now, now=api.now)
            used = [block for block in reply.content if block.type == "tool_use"]
            for call in used:
                path = str(call.input.get("path", "x.py"))
                sess.append_tool_result(
                    call.id,
                    _tool_output(call.name, path, rng),
                    tool_name=call.name,
                    file_path=path if call.name == "read_file" else None,
                    timestamp=api.now,
                )
            if not used:
                tasks += 1
                api.advance(pause_seconds)
                task = TASKS[tasks % len(TASKS)]
                sess.append({"role": "user", "content": task}, timestamp=api.now)
        history = sess.compactions()
        with store.engine.connect() as connection:
            binding = connection.execute(
                text("SELECT thinking_binding FROM sessions WHERE id = 'bench'")
            ).scalar_one()
        compactions = Counter(f"{row.strategy}/{row.trigger}" for row in history if row.success)
        fallbacks = sum(1 for row in history if row.summary is not None and row.summary.fallback)
        deferred = sum("deferred:" in step.detail for row in history for step in row.steps or ())
        cost = sess.cost()
        store.close()
    return {
        "model": model,
        "calls": api.calls,
        "steps": steps,
        "steps_lost": lost,
        "tasks_done": tasks,
        "api_errors": sum(errors.values()),
        "errors_by_rule": dict(errors),
        "thinking_dropped": api.dropped,
        "drop_block_set": binding is not None,
        "server_edits": len(api.applied_edits),
        "compactions": dict(compactions),
        "edits_deferred": deferred,
        "cache_read_share": round(api.cache_read / max(1, api.input_total), 3),
        "summary_fallbacks": fallbacks,
        "cost_usd": None if cost.cost_usd is None else round(cost.cost_usd, 4),
        "uncached_input": cost.input_tokens,
        "cache_write": cost.cache_write_tokens,
    }


def pattern(
    *,
    model: str = "claude-opus-5-5",
    calls: int = 300,
    window: int = 60_000,
    seed: int = 7,
    step_seconds: float = 300.0,
    share: float = 0.85,
) -> dict[str, Any]:
    """The provider's recommended loop, without compactstore: messages appended as
    returned, never edited; once the last call's input reached ``share`` of the window,
    an on-demand compaction of the history before the turn in progress (all but the last
    exchange in the first task), the block sent first in its place. Sizes are the last
    call's reported input and output plus what was appended since."""
    import anthropic

    from tests.fake_messages_api import COMPACTION_BETA, fake_client

    client, api = fake_client(anthropic, default_window=window)
    rng = random.Random(seed)
    prices = price_table(None)
    messages: list[dict[str, Any]] = [{"role": "user", "content": TASKS[0]}]
    cost, tasks, compactions, errors, last_input = 0.0, 0, 0, 0, 0
    options: dict[str, Any] = {"model": model, "max_tokens": 4_096, "system": SYSTEM}
    while api.calls < calls:
        if last_input >= share * window:
            starts = [
                i
                for i, m in enumerate(messages)
                if m["role"] == "user" and isinstance(m["content"], str)
            ]
            cut = starts[-1] if starts and starts[-1] > 0 else len(messages) - 2
            reply = client.beta.messages.create(
                **options,
                tools=TOOLS,
                messages=messages[:cut],
                compaction={"type": "summarize"},
                betas=[COMPACTION_BETA],
            )
            usage = response_usage("anthropic", reply)
            cost += (usage_cost(prices, usage) or 0.0) if usage else 0.0
            block = reply.content[0].model_dump(exclude_none=True)
            messages = [{"role": "assistant", "content": [block]}, *messages[cut:]]
            compactions += 1
            last_input = 0
            continue
        try:
            reply = client.beta.messages.create(
                **options, tools=TOOLS, messages=messages, betas=[COMPACTION_BETA]
            )
        except anthropic.BadRequestError:
            errors += 1
            break
        api.advance(step_seconds)
        usage = response_usage("anthropic", reply)
        cost += (usage_cost(prices, usage) or 0.0) if usage else 0.0
        # The next request's size: this one's input and output, and what is appended (as
        # a count_tokens call would give it; the fake counts 3.5 characters a token).
        last_input = (usage.prompt_tokens + usage.output_tokens) if usage else 0
        content = [block.model_dump(exclude_none=True) for block in reply.content]
        messages.append({"role": "assistant", "content": content})
        used = [b for b in content if b["type"] == "tool_use"]
        if used:
            results = [
                {
                    "type": "tool_result",
                    "tool_use_id": b["id"],
                    "content": _tool_output(b["name"], str(b["input"].get("path", "x.py")), rng),
                }
                for b in used
            ]
            messages.append({"role": "user", "content": results})
            last_input += sum(len(r["content"]) for r in results) * 2 // 7
        else:
            tasks += 1
            messages.append({"role": "user", "content": TASKS[tasks % len(TASKS)]})
    return {
        "model": model,
        "pattern": f"append-only, on-demand compaction at {share:.0%}",
        "calls": api.calls,
        "tasks_done": tasks,
        "api_errors": errors + len(api.errors),
        "thinking_dropped": api.dropped,
        "compactions": compactions,
        "cache_read_share": round(api.cache_read / max(1, api.input_total), 3),
        "cost_usd": round(cost, 4),
    }


def clear_pattern(
    *,
    model: str = "claude-opus-5-5",
    calls: int = 300,
    window: int = 60_000,
    seed: int = 7,
    thinking: dict[str, Any] | None = None,
    step_seconds: float = 300.0,
    pause_seconds: float = 0.0,
) -> dict[str, Any]:
    """The providers' append-only pattern, without compactstore: the same agent and clock;
    a message list that only grows, each message sent byte-identical ever after; cache
    breakpoints on the system prompt, the newest block and the previous request's last
    block (the fake has no 20-block lookback), 1-hour writes when calls are 5 minutes or
    more apart; the window kept by the provider's server-side ``clear_tool_uses`` edit
    (from 70% of the window, keeping 5), as compactstore's append_only policy sends it.
    Cost from each response's usage at compactstore.pricing's prices."""
    import anthropic

    from compactstore._ledger import response_usage, usage_cost
    from compactstore.pricing import price_table
    from tests.fake_messages_api import CONTEXT_MANAGEMENT_BETA, fake_client

    client, api = fake_client(anthropic, default_window=window)
    prices = price_table(None)
    rng = random.Random(seed)
    control: dict[str, str] = {"type": "ephemeral"}
    if 300.0 <= step_seconds < 3_600.0:
        control["ttl"] = "1h"
    edits = [
        {
            "type": "clear_tool_uses_20250919",
            "trigger": {"type": "input_tokens", "value": int(window * 0.7)},
            "keep": {"type": "tool_uses", "value": 5},
        }
    ]
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": TASKS[0]}]}
    ]
    previous_tail: tuple[int, int] | None = None
    tasks = lost = 0
    total = 0.0
    errors: Counter[str] = Counter()
    while api.calls < calls:
        marks = {(len(messages) - 1, len(messages[-1]["content"]) - 1)}
        if previous_tail is not None:
            marks.add(previous_tail)
        sent = [
            {
                "role": m["role"],
                "content": [
                    {**b, "cache_control": control} if (i, j) in marks else b
                    for j, b in enumerate(m["content"])
                ],
            }
            for i, m in enumerate(messages)
        ]
        extra: dict[str, Any] = {} if thinking is None else {"thinking": thinking}
        try:
            reply = client.messages.create(
                model=model,
                max_tokens=4_096,
                tools=TOOLS,
                system=[{"type": "text", "text": SYSTEM, "cache_control": control}],
                messages=sent,
                extra_body={"context_management": {"edits": edits}},
                extra_headers={"anthropic-beta": CONTEXT_MANAGEMENT_BETA},
                **extra,
            )
        except anthropic.BadRequestError:
            errors[api.errors[-1]["rule"]] += 1
            lost += 1
            api.advance(step_seconds)
            continue
        api.advance(step_seconds)
        usage = response_usage("anthropic", reply)
        if usage is not None:
            total += usage_cost(prices, usage) or 0.0
        previous_tail = (len(messages) - 1, len(messages[-1]["content"]) - 1)
        content = [block.model_dump(exclude_none=True) for block in reply.content]
        messages.append({"role": "assistant", "content": content})
        used = [block for block in reply.content if block.type == "tool_use"]
        if used:
            results = []
            for call in used:
                path = str(call.input.get("path", "x.py"))
                results.append(
                    {
                        "type": "tool_result",
                        "tool_use_id": call.id,
                        "content": _tool_output(call.name, path, rng),
                    }
                )
            messages.append({"role": "user", "content": results})
        else:
            tasks += 1
            api.advance(pause_seconds)
            task = TASKS[tasks % len(TASKS)]
            messages.append({"role": "user", "content": [{"type": "text", "text": task}]})
    return {
        "model": model,
        "calls": api.calls,
        "steps_lost": lost,
        "tasks_done": tasks,
        "api_errors": sum(errors.values()),
        "errors_by_rule": dict(errors),
        "server_edits": len(api.applied_edits),
        "cache_read_share": round(api.cache_read / max(1, api.input_total), 3),
        "cost_usd": round(total, 2),
    }


RESPONSES_TOOLS = [
    {
        "type": "function",
        "name": name,
        "description": f"{name} in the repository",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
    for name in ("read_file", "grep", "run_tests", "edit_file")
]


def responses_run(
    mode: str,
    *,
    model: str = "gpt-5",
    calls: int = 300,
    window: int = 60_000,
    seed: int = 7,
    step_seconds: float = 300.0,
) -> dict[str, Any]:
    """One coding session on the Responses API through compactstore, against the strict
    fake of the Responses API (tests/fake_responses_api.py). ``mode`` ``compactor``: an
    OpenAICompactor (``responses.compact``) summarises each auto-compact's range;
    ``server``: every request carries ``context_management`` with a ``compact_threshold``
    of 70% of the window and the server compacts on its own. Figures: API errors by rule,
    steps lost, compactions by strategy/trigger, the compaction items issued and whether
    every later request sent the newest one byte-identical."""
    import openai

    from compactstore.providers import OpenAICompactor
    from tests.fake_responses_api import fake_client

    client, api = fake_client(openai, window=window)
    rng = random.Random(seed)
    extra: dict[str, Any] = {}
    if mode == "server":
        extra["context_management"] = [
            {"type": "compaction", "compact_threshold": int(window * 0.7)}
        ]
    with tempfile.TemporaryDirectory() as tmp:
        store = CompactStore.open(str(Path(tmp) / "responses.db"))
        sess = store.session(
            "bench",
            context_window=window,
            format="responses",
            now=api.now,
            model=model,
            compactor=OpenAICompactor(client, model=model) if mode == "compactor" else None,
        )
        sess.append({"role": "developer", "content": SYSTEM}, timestamp=api.now)
        sess.append({"role": "user", "content": TASKS[0]}, timestamp=api.now)
        steps = lost = tasks = 0
        errors: Counter[str] = Counter()
        while api.calls < calls:
            steps += 1
            sess.process_request(now=api.now)
            response = None
            for attempt in range(2):
                try:
                    response = client.responses.create(
                        model=model,
                        tools=RESPONSES_TOOLS,
                        include=["reasoning.encrypted_content"],
                        store=False,
                        **sess.request_params(now=api.now),
                        **extra,
                    )
                    break
                except openai.BadRequestError as error:
                    errors[api.errors[-1]["rule"]] += 1
                    if attempt == 0:
                        sess.reactive_recover(str(error), now=api.now)
                if api.calls >= calls:
                    break
            api.advance(step_seconds)
            if response is None:
                lost += 1
                continue
            sess.append_response(response, timestamp=api.now, now=api.now)
            used = [item for item in response.output if item.type == "function_call"]
            for call in used:
                path = str(json.loads(call.arguments).get("path", "x.py"))
                sess.append_tool_result(
                    call.call_id,
                    _tool_output(call.name, path, rng),
                    tool_name=call.name,
                    file_path=path if call.name == "read_file" else None,
                    timestamp=api.now,
                )
            if not used:
                tasks += 1
                sess.append(
                    {"role": "user", "content": TASKS[tasks % len(TASKS)]}, timestamp=api.now
                )
        history = sess.compactions()
        compactions = Counter(f"{row.strategy}/{row.trigger}" for row in history if row.success)
        fallbacks = sum(1 for row in history if row.summary is not None and row.summary.fallback)
        logged = len(sess.messages())
        store.close()
    carried, intact = _items_carried(api)
    return {
        "api": "responses",
        "mode": mode,
        "model": model,
        "calls": api.calls,
        "steps": steps,
        "steps_lost": lost,
        "tasks_done": tasks,
        "api_errors": sum(errors.values()),
        "errors_by_rule": dict(errors),
        "compactions": dict(compactions),
        "compaction_items": len(api.compactions),
        "requests_after_an_item": carried,
        "item_byte_identical": intact,
        "summary_fallbacks": fallbacks,
        "items_logged": logged,
        "items_last_sent": len(api.bodies[-1].get("input", [])),
        "cache_read_share": round(api.cache_read / max(1, api.input_total), 3),
    }


def _items_carried(api: Any) -> tuple[int, int]:
    """(requests made after the first compaction item was issued, those that sent the
    newest item issued before them, byte for byte, and no other compaction item)."""
    carried = intact = 0
    for index, body in enumerate(api.bodies):
        if not api.paths[index].endswith("/responses"):
            continue
        before = [
            item for item, at in zip(api.compactions, api.issued_at, strict=True) if at < index
        ]
        if not before:
            continue
        carried += 1
        sent = [item for item in body.get("input", []) if item.get("type") == "compaction"]
        newest = json.dumps(before[-1], sort_keys=True)
        intact += [json.dumps(item, sort_keys=True) for item in sent] == [newest]
    return carried, intact


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--window", type=int, default=60_000)
    parser.add_argument("--policy", choices=("auto", "rewrite", "append_only"), default="auto")
    parser.add_argument("--step-seconds", type=float, default=300.0)
    parser.add_argument("--compactor", action="store_true", help="an AnthropicCompactor")
    parser.add_argument("--pattern", action="store_true", help="the provider's own loop too")
    parser.add_argument(
        "--cost",
        action="store_true",
        help="compare the cost: compactstore's default, cache_aware=False and the "
        "providers' append-only pattern without compactstore",
    )
    parser.add_argument(
        "--responses",
        action="store_true",
        help="the Responses API instead: an OpenAICompactor, then server-side compaction",
    )
    args = parser.parse_args()
    if args.responses:
        for mode in ("compactor", "server"):
            figures = responses_run(
                mode,
                model=(args.model or ["gpt-5"])[0],
                calls=args.calls,
                window=args.window,
                step_seconds=args.step_seconds,
            )
            print(json.dumps(figures))
        return
    models = args.model or ["claude-opus-5-5", "claude-sonnet-4-5"]
    for model in models:
        thinking = None
        if not model.startswith(("claude-opus-5-5", "claude-sonnet-5-5", "claude-haiku-5-5")):
            thinking = {"type": "enabled", "budget_tokens": 2_000}
        common: dict[str, Any] = {
            "model": model,
            "calls": args.calls,
            "window": args.window,
            "thinking": thinking,
            "step_seconds": args.step_seconds,
        }
        figures = run(
            config=CompactionConfig(edit_policy=args.policy), compactor=args.compactor, **common
        )
        print(json.dumps(figures))
        if args.pattern and not args.cost:
            print(
                json.dumps(
                    pattern(
                        model=model,
                        calls=args.calls,
                        window=args.window,
                        step_seconds=args.step_seconds,
                    )
                )
            )
        if not args.cost:
            continue
        blind = run(config=CompactionConfig(edit_policy=args.policy, cache_aware=False), **common)
        print(json.dumps({"variant": "cache_aware=False", **blind}))
        own = pattern(
            model=model, calls=args.calls, window=args.window, step_seconds=args.step_seconds
        )
        print(json.dumps({"variant": "on-demand compaction pattern", **own}))
        cleared = clear_pattern(**common)
        print(json.dumps({"variant": "server-side clear pattern", **cleared}))
        print(
            json.dumps(
                {
                    "model": model,
                    "default_vs_pattern": _ratio(figures["cost_usd"], own["cost_usd"]),
                    "default_vs_clear_pattern": _ratio(figures["cost_usd"], cleared["cost_usd"]),
                    "default_vs_cache_aware_off": _ratio(figures["cost_usd"], blind["cost_usd"]),
                }
            )
        )


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 3)


if __name__ == "__main__":
    main()
