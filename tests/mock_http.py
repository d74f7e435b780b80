"""The official SDK clients over a mocked HTTP transport: their real code paths, no network.

``sdk_client(sdk, handler)`` builds ``anthropic.Anthropic`` or ``openai.OpenAI`` with an
``http_client`` whose transport is the HTTP library's own ``MockTransport`` (the library the
SDK itself is built on: ``httpx``, or its successor ``httpx2`` in newer SDK releases).
Handlers answer with recorded-shape JSON and keep the request bodies they saw.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from types import ModuleType
from typing import Any

__all__ = ["Recorder", "anthropic_message", "chat_completion", "http_module", "sdk_client"]


def http_module(sdk: ModuleType) -> ModuleType:
    """The HTTP library an SDK's client is built on (httpx or httpx2)."""
    base = sdk.DefaultHttpxClient.__mro__[1]
    return importlib.import_module(base.__module__.split(".")[0])


class Recorder:
    """A mock handler: answers each request with ``respond(body)`` and keeps the bodies."""

    def __init__(self, http: ModuleType, respond: Callable[[dict[str, Any]], dict[str, Any]]):
        self.http = http
        self.respond = respond
        self.bodies: list[dict[str, Any]] = []
        self.raw: list[str] = []
        self.paths: list[str] = []

    def __call__(self, request: Any) -> Any:
        text = request.content.decode("utf-8")
        body = json.loads(text)
        self.raw.append(text)
        self.bodies.append(body)
        self.paths.append(request.url.path)
        return self.http.Response(200, json=self.respond(body))


def sdk_client(
    sdk: ModuleType,
    respond: Callable[[dict[str, Any]], dict[str, Any]],
    *,
    asynchronous: bool = False,
) -> Any:
    """(client, recorder): the SDK's client class (``AsyncAnthropic``/``AsyncOpenAI`` with
    ``asynchronous``) over a MockTransport."""
    http = http_module(sdk)
    recorder = Recorder(http, respond)
    name = "Anthropic" if sdk.__name__ == "anthropic" else "OpenAI"
    transport = http.MockTransport(recorder)
    if asynchronous:
        async_client = http.AsyncClient(transport=transport)
        return getattr(sdk, f"Async{name}")(api_key="x", http_client=async_client), recorder
    client = getattr(sdk, name)(api_key="x", http_client=http.Client(transport=transport))
    return client, recorder


def anthropic_message(
    content: list[dict[str, Any]],
    *,
    model: str = "claude-haiku-4-5-20251001",
    input_tokens: int = 1_200,
    output_tokens: int = 300,
    cache_read: int = 0,
    stop_reason: str = "end_turn",
) -> dict[str, Any]:
    """A Messages API response as the API sends it."""
    return {
        "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cache_read,
        },
    }


def chat_completion(
    text: str, *, model: str = "gpt-4.1-mini-2025-04-14", prompt: int = 900, completion: int = 250
) -> dict[str, Any]:
    """A Chat Completions response as the API sends it."""
    return {
        "id": "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT",
        "object": "chat.completion",
        "created": 1_741_569_952,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
        "service_tier": "default",
        "system_fingerprint": "fp_44709d6fcb",
    }
