"""Tool calls made from inside a code-mode script.

Current Codex versions give the model one ``exec`` tool whose input is a JavaScript
program; the program calls the real tools as ``await tools.exec_command({cmd: "…",
workdir: "…"})``, ``tools.apply_patch("*** Begin Patch…")``, ``tools.update_plan({plan:
[…]})`` (``wait`` collects a long-running cell's output). What a call reads, writes or
plans is in those inner calls: :func:`inner_calls` finds them and reads their argument when
it is a literal (an object literal with quoted or bare keys, strings in any of the three
quotes, numbers, booleans, null, arrays) or a constant the program bound to one
(``const patch = "…"; tools.apply_patch(patch)``). An argument built at run time (a
template with ``${…}``, a computed value) is left out: nothing here runs the program.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["CODE_MODE_TOOLS", "inner_calls"]

# Tools whose input is a program calling the other tools.
CODE_MODE_TOOLS = frozenset({"exec"})

_CALL = re.compile(r"\btools\.([A-Za-z_$][\w$]*)\s*\(\s*")
_BINDING = re.compile(r"\b(?:const|let|var)\s+([A-Za-z_$][\w$]*)\s*=\s*")
_WORD = re.compile(r"[A-Za-z_$][\w$]*")
_NUMBER = re.compile(r"-?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f", "v": "\v", "0": "\0"}


class _NotLiteral(Exception):
    """The argument is not a literal (built when the program runs)."""


def inner_calls(script: str) -> list[tuple[str, Any]]:
    """``(tool name, argument)`` of each ``tools.NAME(literal)`` call in ``script``, in order;
    a string argument (``apply_patch``'s patch) is given as ``{"input": text}``."""
    bound: dict[str, Any] = {}
    for match in _BINDING.finditer(script):
        try:
            bound[match.group(1)], _ = _value(script, match.end(), bound)
        except (_NotLiteral, IndexError):
            continue
    found: list[tuple[str, Any]] = []
    for match in _CALL.finditer(script):
        try:
            value, _ = _value(script, match.end(), bound)
        except (_NotLiteral, IndexError):
            continue
        found.append((match.group(1), {"input": value} if isinstance(value, str) else value))
    return found


def _skip(text: str, at: int) -> int:
    while at < len(text) and text[at] in " \t\r\n":
        at += 1
    return at


def _value(text: str, at: int, bound: dict[str, Any]) -> tuple[Any, int]:
    at = _skip(text, at)
    char = text[at]
    if char in "\"'`":
        return _string(text, at)
    if char == "{":
        return _object(text, at, bound)
    if char == "[":
        return _array(text, at, bound)
    number = _NUMBER.match(text, at)
    if number:
        return json.loads(number.group(0).rstrip(".")), number.end()
    word = _WORD.match(text, at)
    if word and word.group(0) in ("true", "false", "null"):
        return {"true": True, "false": False, "null": None}[word.group(0)], word.end()
    if word and word.group(0) in bound and text[_skip(text, word.end())] in ",)}]":
        return bound[word.group(0)], word.end()
    raise _NotLiteral


def _string(text: str, at: int) -> tuple[str, int]:
    quote, at, out = text[at], at + 1, []
    while text[at] != quote:
        char = text[at]
        if quote == "`" and text.startswith("${", at):
            raise _NotLiteral
        if char == "\\":
            at += 1
            escaped = text[at]
            if escaped == "u" and text[at + 1 : at + 5].isalnum():
                out.append(chr(int(text[at + 1 : at + 5], 16)))
                at += 5
                continue
            out.append(_ESCAPES.get(escaped, escaped))
        else:
            out.append(char)
        at += 1
    return "".join(out), at + 1


def _object(text: str, at: int, bound: dict[str, Any]) -> tuple[dict[str, Any], int]:
    out: dict[str, Any] = {}
    at = _skip(text, at + 1)
    while text[at] != "}":
        if text[at] in "\"'":
            key, at = _string(text, at)
        else:
            word = _WORD.match(text, at)
            if word is None:
                raise _NotLiteral
            key, at = word.group(0), word.end()
        at = _skip(text, at)
        if text[at] != ":":
            raise _NotLiteral  # shorthand {cmd}: a variable
        out[key], at = _value(text, at + 1, bound)
        at = _skip(text, at)
        if text[at] == ",":
            at = _skip(text, at + 1)
        elif text[at] != "}":
            raise _NotLiteral
    return out, at + 1


def _array(text: str, at: int, bound: dict[str, Any]) -> tuple[list[Any], int]:
    out: list[Any] = []
    at = _skip(text, at + 1)
    while text[at] != "]":
        item, at = _value(text, at, bound)
        out.append(item)
        at = _skip(text, at)
        if text[at] == ",":
            at = _skip(text, at + 1)
        elif text[at] != "]":
            raise _NotLiteral
    return out, at + 1
