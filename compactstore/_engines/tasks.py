"""The agent's own task list, as the summary's pending tasks.

Agents keep their tasks in one of two ways, both read from their tool calls (those named in
``CompactionConfig.plan_tool_names``, and the same calls made from a code-mode program):

- the whole list in each call: ``update_plan{plan: [{step, status}]}`` (Codex),
  ``TodoWrite{todos: [{content, status}]}`` (older Claude Code), ``write_todos``,
  ``task_tracker{command: "plan", task_list: [{title, notes, status}]}`` (OpenHands): the
  latest call is the list;
- one task per call: ``TaskCreate{subject, description}`` adds a task, numbered from 1 in
  the order they are created (as Claude Code numbers them), and ``TaskUpdate{taskId, status,
  subject, description}`` changes one (status ``deleted`` removes it).

The plan keeps every task, closed ones included (a later update may name any of them);
:func:`open_items` are the tasks still to do at the cut: the summary lists those and leaves
out the completed, cancelled and deleted ones. Pure functions of their inputs.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from compactstore._context.code_mode import CODE_MODE_TOOLS, inner_calls
from compactstore.formats import ToolCall
from compactstore.models import Plan, PlanItem

__all__ = ["CLOSED", "next_plan", "open_items", "plan_items", "task_line"]

# Statuses of a task that is no longer to do.
CLOSED = frozenset(
    {"completed", "complete", "done", "cancelled", "canceled", "deleted", "skipped", "removed"}
)
# Tools that add or change one task of the list.
_CREATE = "TaskCreate"
_UPDATE = "TaskUpdate"
# Where a whole-list call keeps its items, and each item its text.
_LIST_KEYS = ("plan", "todos", "items", "tasks", "task_list")
_TEXT_KEYS = ("step", "content", "title", "task", "description", "text", "subject")
# How much of a created task's description its line keeps.
_DESCRIPTION_CHARS = 160


def _arguments(call: ToolCall) -> Any:
    arguments = call.input
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return None
    return arguments


def _inner(call: ToolCall) -> list[ToolCall] | None:
    """The tool calls a code-mode program (Codex's ``exec``) makes, None for other calls."""
    if call.name not in CODE_MODE_TOOLS or not isinstance(call.input, str):
        return None
    return [
        ToolCall(call.id, name, arguments)
        for name, arguments in inner_calls(call.input)
        if isinstance(arguments, dict)
    ]


def _words(text: str) -> str:
    return " ".join(text.split())


def plan_items(call: ToolCall, tool_names: Iterable[str]) -> tuple[PlanItem, ...] | None:
    """The items of a whole-list plan/todo call, None for other calls (a code-mode program:
    the items of the last such call it makes)."""
    inner = _inner(call)
    if inner is not None:
        plans = [plan_items(each, tool_names) for each in inner]
        return next((plan for plan in reversed(plans) if plan is not None), None)
    if call.name not in tool_names or call.name in (_CREATE, _UPDATE):
        return None
    arguments = _arguments(call)
    if not isinstance(arguments, dict):
        return None
    entries = next((arguments[key] for key in _LIST_KEYS if key in arguments), None)
    if not isinstance(entries, list):
        return None
    items: list[PlanItem] = []
    for entry in entries:
        if isinstance(entry, str):
            items.append(PlanItem(text=_words(entry)))
        elif isinstance(entry, dict):
            text = next((entry[key] for key in _TEXT_KEYS if isinstance(entry.get(key), str)), "")
            status = entry.get("status")
            items.append(PlanItem(text=_words(text), status=str(status) if status else "pending"))
    return tuple(items)


def _created_text(arguments: dict[str, Any]) -> str:
    subject = arguments.get("subject")
    description = arguments.get("description")
    text = _words(subject) if isinstance(subject, str) else ""
    if isinstance(description, str) and description.strip():
        said = _words(description)
        if len(said) > _DESCRIPTION_CHARS:
            said = said[: _DESCRIPTION_CHARS - 1].rstrip() + "…"
        text = f"{text} — {said}" if text else said
    return text


def _task_call(plan: Plan | None, call: ToolCall, seq: int | None) -> Plan | None:
    """The plan after one TaskCreate or TaskUpdate call (``plan`` when it changes nothing)."""
    arguments = _arguments(call)
    if not isinstance(arguments, dict):
        return plan
    # A list of whole-list items is replaced by the task list the agent now keeps.
    tasks = [item for item in plan.items if item.id is not None] if plan else []
    if call.name == _CREATE:
        text = _created_text(arguments)
        if not text:
            return plan
        number = max((int(t.id) for t in tasks if t.id is not None and t.id.isdigit()), default=0)
        tasks.append(PlanItem(id=str(number + 1), text=text))
        return Plan(seq=seq, tool=call.name, items=tuple(tasks))
    task_id = arguments.get("taskId", arguments.get("id"))
    if not isinstance(task_id, str | int) or isinstance(task_id, bool):
        return plan
    changed = False
    for index, item in enumerate(tasks):
        if item.id != str(task_id):
            continue
        update: dict[str, Any] = {}
        if isinstance(arguments.get("status"), str) and arguments["status"]:
            update["status"] = arguments["status"]
        if isinstance(arguments.get("subject"), str) and arguments["subject"].strip():
            update["text"] = _created_text(arguments)
        if update:
            tasks[index] = item.model_copy(update=update)
            changed = True
    if not changed:
        return plan
    return Plan(seq=seq, tool=call.name, items=tuple(tasks))


def next_plan(
    plan: Plan | None, call: ToolCall, seq: int | None, tool_names: Iterable[str]
) -> Plan | None:
    """The plan after ``call``: the items of a whole-list call, the task list changed by a
    TaskCreate/TaskUpdate call, else ``plan`` as it was."""
    names = tuple(tool_names)
    inner = _inner(call)
    if inner is not None:
        for each in inner:
            plan = next_plan(plan, each, seq, names)
        return plan
    if call.name in (_CREATE, _UPDATE):
        return _task_call(plan, call, seq) if call.name in names else plan
    items = plan_items(call, names)
    if items is None:
        return plan
    return Plan(seq=seq, tool=call.name, items=items)


def open_items(plan: Plan | None) -> list[PlanItem]:
    """The tasks still to do: those whose status is not a closed one."""
    if plan is None:
        return []
    return [item for item in plan.items if item.status.lower() not in CLOSED]


def task_line(item: PlanItem) -> str:
    """One task as the summary lists it: ``- [status] #id text``."""
    label = f"#{item.id} " if item.id is not None else ""
    return f"- [{item.status}] {label}{item.text}"
