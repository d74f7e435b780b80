"""What the built-in LLM summarizers send, on real transcripts (no network).

Every transcript of the corpus's ``dev/`` half is replayed (``simulate_transcript``) into a
store whose summarizer is ``AnthropicSummarizer`` or ``OpenAISummarizer`` over the official
client on a mocked HTTP transport. The mock keeps every request body and answers with a
fixed summary. Per transcript: summarizer calls, the largest prompt (compactstore's estimate)
against the input cap, messages left out by the cap, and what was kept out: media notes,
thinking notes, and any base64 run, ``data:`` URL or thinking signature found in a body (must
be 0).

    python -m benchmarks.summarizers [--corpus DIR] [--window 64000] [--sdk anthropic|openai]
                                     [--max-input-tokens 60000]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from compactstore import CompactStore
from compactstore._context.tokens import estimate_tokens
from compactstore._importers import read_transcript
from compactstore._simulate import simulate_transcript
from compactstore.summarizers import (
    DEFAULT_MAX_INPUT_TOKENS,
    AnthropicSummarizer,
    OpenAISummarizer,
)

SUMMARY = "## Original request\n(summary written by the mock)\n\n## Current work\nNext step: go on."
_BASE64 = re.compile(r"[A-Za-z0-9+/]{200,}={0,2}")


def _mixed(run: str) -> bool:
    return (
        any(c.isupper() for c in run)
        and any(c.islower() for c in run)
        and any(c.isdigit() for c in run)
    )


def _client(sdk_name: str, bodies: list[str]) -> Any:
    sdk = importlib.import_module(sdk_name)
    http = importlib.import_module(sdk.DefaultHttpxClient.__mro__[1].__module__.split(".")[0])

    def handler(request: Any) -> Any:
        bodies.append(request.content.decode("utf-8"))
        if sdk_name == "anthropic":
            return http.Response(
                200,
                json={
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "model": "claude-haiku-4-5",
                    "content": [{"type": "text", "text": SUMMARY}],
                    "stop_reason": "end_turn",
                    "stop_sequence": None,
                    "usage": {"input_tokens": 1, "output_tokens": 1},
                },
            )
        return http.Response(
            200,
            json={
                "id": "c1",
                "object": "chat.completion",
                "created": 1,
                "model": "gpt-4.1-mini",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": SUMMARY},
                    }
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            },
        )

    client_class = sdk.Anthropic if sdk_name == "anthropic" else sdk.OpenAI
    return client_class(api_key="x", http_client=http.Client(transport=http.MockTransport(handler)))


def measure(path: Path, sdk_name: str, window: int, cap: int) -> dict[str, Any]:
    bodies: list[str] = []
    summarizer_class = AnthropicSummarizer if sdk_name == "anthropic" else OpenAISummarizer
    summarizer = summarizer_class(_client(sdk_name, bodies), model="m", max_input_tokens=cap)
    transcript = read_transcript(path)
    with (
        tempfile.TemporaryDirectory() as tmp,
        CompactStore.open(Path(tmp) / "s.db", summarizer=summarizer) as store,
    ):
        simulate_transcript(transcript, name=path.name, window=window, store=store)
    prompts = []
    for raw in bodies:
        body = json.loads(raw)
        if sdk_name == "anthropic":
            prompts.append(body["system"] + body["messages"][0]["content"])
        else:
            prompts.append("".join(m["content"] for m in body["messages"]))
    dropped = sum(
        int(m.group(1)) for p in prompts for m in re.finditer(r"\[(\d+) older messages left", p)
    )
    return {
        "transcript": f"{path.parent.name}/{path.name}",
        "format": transcript.format,
        "messages": len(transcript.messages),
        "summarizer_calls": len(bodies),
        "largest_prompt_tokens": max((estimate_tokens(p) for p in prompts), default=0),
        "input_cap": summarizer.max_input_tokens,
        "messages_left_out_by_cap": dropped,
        "media_notes": sum(
            p.count(f"[{k} left out]") for p in prompts for k in ("image", "document", "file")
        ),
        "thinking_notes": sum(p.count("[thinking left out]") for p in prompts),
        "base64_runs_sent": sum(1 for raw in bodies for run in _BASE64.findall(raw) if _mixed(run)),
        "data_urls_sent": sum(raw.count(";base64,") for raw in bodies),
        "signatures_sent": sum(raw.count('\\"signature\\"') for raw in bodies),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default = os.environ.get("COMPACTSTORE_CORPUS", "../shared/corpus")
    parser.add_argument("--corpus", default=default, help="corpus root (its dev/ half is read)")
    parser.add_argument("--window", type=int, default=64_000)
    parser.add_argument("--sdk", choices=("anthropic", "openai"), default="anthropic")
    parser.add_argument("--max-input-tokens", type=int, default=DEFAULT_MAX_INPUT_TOKENS)
    args = parser.parse_args()
    files = sorted(
        p for p in (Path(args.corpus) / "dev").rglob("*") if p.suffix in (".jsonl", ".traj")
    )
    rows = [measure(path, args.sdk, args.window, args.max_input_tokens) for path in files]
    keys = list(rows[0]) if rows else []
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(str(row[k]) for k in keys) + " |")


if __name__ == "__main__":
    main()
