"""The summary's pending tasks: the agent's open tasks at the cut, from a whole list per
call (update_plan, TodoWrite, OpenHands' task_tracker, a code-mode program's update_plan)
or one task per call (Claude Code's TaskCreate/TaskUpdate); completed ones left out."""

from __future__ import annotations

import json

from compactstore import CompactStore
from compactstore._engines import tasks
from compactstore.formats import ToolCall
from compactstore.models import CompactionConfig, Plan, PlanItem
from tests.engines.test_summary import filler, section
from tests.helpers import T0, new_session

NAMES = CompactionConfig().plan_tool_names


def _apply(calls: list[tuple[str, object]]) -> Plan | None:
    plan: Plan | None = None
    for seq, (name, arguments) in enumerate(calls):
        plan = tasks.next_plan(plan, ToolCall(f"c{seq}", name, arguments), seq, NAMES)
    return plan


def test_task_create_numbers_tasks_and_task_update_changes_them() -> None:
    plan = _apply(
        [
            ("TaskCreate", {"subject": "Fix the parser", "description": "It drops  the tail."}),
            ("TaskCreate", {"subject": "Write the docs", "activeForm": "Writing"}),
            ("TaskCreate", {"subject": "Release"}),
            ("TaskUpdate", {"taskId": "3", "addBlockedBy": ["1", "2"]}),
            ("TaskUpdate", {"taskId": "1", "status": "in_progress"}),
            ("TaskUpdate", {"taskId": "1", "status": "completed"}),
            ("TaskUpdate", {"taskId": "2", "status": "in_progress"}),
            ("TaskUpdate", {"taskId": "3", "status": "deleted"}),
            ("TaskUpdate", {"taskId": "9", "status": "completed"}),  # unknown: nothing changes
        ]
    )

    assert plan is not None and plan.tool == "TaskUpdate" and plan.seq == 7
    assert [(i.id, i.status) for i in plan.items] == [
        ("1", "completed"),
        ("2", "in_progress"),
        ("3", "deleted"),
    ]
    assert [tasks.task_line(i) for i in tasks.open_items(plan)] == [
        "- [in_progress] #2 Write the docs"
    ]
    assert plan.items[0].text == "Fix the parser — It drops the tail."


def test_a_whole_list_replaces_the_plan_and_its_closed_items_are_not_open() -> None:
    plan = _apply(
        [
            ("TaskCreate", {"subject": "old"}),
            (
                "task_tracker",
                json.dumps(
                    {
                        "command": "plan",
                        "task_list": [
                            {"title": "Reproduce", "notes": "n", "status": "done"},
                            {"title": "Fix", "status": "in_progress"},
                            {"title": "Test", "status": "todo"},
                        ],
                    }
                ),
            ),
            ("task_tracker", json.dumps({"command": "view"})),  # no list: the plan stays
        ]
    )

    assert plan is not None and plan.tool == "task_tracker" and plan.seq == 1
    assert [tasks.task_line(i) for i in tasks.open_items(plan)] == [
        "- [in_progress] Fix",
        "- [todo] Test",
    ]


def test_a_code_mode_program_plans_through_its_inner_calls() -> None:
    program = (
        'await tools.update_plan({plan: [{step: "Build", status: "completed"}, '
        '{step: "Ship", status: "pending"}]});\n'
        'const out = await tools.exec_command({cmd: "ls"});'
    )

    plan = _apply([("exec", program)])

    assert plan is not None and plan.tool == "update_plan"
    assert tasks.open_items(plan) == [PlanItem(text="Ship")]


def test_calls_not_named_in_the_config_leave_the_plan_alone() -> None:
    plan = Plan(seq=1, tool="TodoWrite", items=(PlanItem(text="Keep"),))
    call = ToolCall("c", "TaskCreate", {"subject": "ignored"})

    assert tasks.next_plan(plan, call, 2, ("TodoWrite",)) is plan
    assert tasks.next_plan(plan, ToolCall("d", "Read", {"path": "a"}), 2, NAMES) is plan


def test_the_summary_lists_the_open_claude_code_tasks_across_cuts(store: CompactStore) -> None:
    chat = new_session(store, "anthropic", sid="tasks")
    chat.request("Fix the review findings")
    chat.tool_turns(
        [
            ("TaskCreate", {"subject": f"Finding {n}", "description": f"fix {n}"}, f"#{n}", False)
            for n in (1, 2, 3)
        ]
    )
    chat.tool_turns([("TaskUpdate", {"taskId": "1", "status": "in_progress"}, "ok", False)])
    filler(chat, 30)
    cut = chat.say("Working on the first finding.")
    filler(chat, 30)
    first = chat.sess.compact(up_to_seq=cut, now=T0 + 1_000).summary_text
    chat.tool_turns(
        [
            ("TaskUpdate", {"taskId": "1", "status": "completed"}, "ok", False),
            ("TaskUpdate", {"taskId": "2", "status": "in_progress"}, "ok", False),
        ]
    )
    filler(chat, 60)

    second = chat.sess.compact(now=T0 + 2_000).summary_text

    assert section(first, "Pending tasks").splitlines() == [
        "- [in_progress] #1 Finding 1 — fix 1",
        "- [pending] #2 Finding 2 — fix 2",
        "- [pending] #3 Finding 3 — fix 3",
    ]
    # The tasks created before the first cut are updated after it: task 1 is done.
    assert section(second, "Pending tasks").splitlines() == [
        "- [in_progress] #2 Finding 2 — fix 2",
        "- [pending] #3 Finding 3 — fix 3",
    ]


def test_no_pending_tasks_section_when_every_task_is_done(store: CompactStore) -> None:
    chat = new_session(store, "openai", sid="done")
    chat.request("Ship it")
    plan = {"plan": [{"step": "Build", "status": "completed"}]}
    chat.tool_turns([("update_plan", plan, "Plan updated", False)])
    filler(chat, 60)

    text = chat.sess.compact(now=T0 + 1_000).summary_text

    assert "## Pending tasks" not in text
