"""Claude Code subagents, imported as child sessions linked to the call that started them."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from compactstore._importers import claude_code
from compactstore._importers.builder import NoMessagesError, to_imported
from compactstore._importers.claude_records import subagents
from compactstore._importers.files import TranscriptFile
from compactstore._store.store import CompactStore
from compactstore.db import repository as repo
from compactstore.db.engine import write_tx

__all__ = ["Child", "children", "import_child"]


@dataclass(frozen=True)
class Child:
    """A subagent of a Claude Code transcript to import as a session of its own."""

    agent: str  # its agentId: the child session is "<parent>/<agentId>"
    tool_use_id: str | None  # the parent's tool call that started it, when known
    file: TranscriptFile  # the file holding its records
    own_file: bool  # a file of its own (else: the parent's, its records picked by agentId)
    parent_agent: str | None = None  # a subagent's subagent: the agentId that started it


def children(file: TranscriptFile, path: str | os.PathLike[str] | IO[bytes]) -> list[Child]:
    """The subagents of a Claude Code transcript: those whose records the file holds, and
    those with a file of their own beside it (``<session>/subagents/agent-<agentId>.jsonl``,
    Claude Code's layout; the file wins over records of the same subagent). A
    ``agent-<agentId>.meta.json`` beside the file names the spawning call (``toolUseId``)
    and, for a subagent's subagent, the agent that started it (``parentAgentId``). Claude
    Code's own compaction calls (``agent-acompact-*``) are not subagents."""
    found = subagents(file)
    by_agent = {
        agent: Child(agent, found.calls.get(agent), file, own_file=False) for agent in found.inline
    }
    if isinstance(path, str | os.PathLike):
        folder = Path(path).parent / file.stem / "subagents"
        if folder.is_dir():
            for own in sorted(folder.iterdir()):
                name = own.name.removesuffix(".gz")
                if not (name.startswith("agent-") and name.endswith(".jsonl")):
                    continue
                agent = name.removeprefix("agent-").removesuffix(".jsonl")
                if agent.startswith("acompact") or not own.is_file():
                    continue
                call, parent_agent = _subagent_meta(folder / f"agent-{agent}.meta.json")
                child_file = TranscriptFile(own, strict=file.strict)
                by_agent[agent] = Child(
                    agent,
                    call or found.calls.get(agent),
                    child_file,
                    own_file=True,
                    parent_agent=parent_agent,
                )
    return list(by_agent.values())


def _subagent_meta(path: Path) -> tuple[str | None, str | None]:
    """(the spawning tool call, the parent agent) a subagent's ``.meta.json`` names; None
    for what it does not say (or when there is no such file, or it is not JSON)."""
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, None
    if not isinstance(meta, dict):
        return None, None
    call, parent = meta.get("toolUseId"), meta.get("parentAgentId")
    return (
        call if isinstance(call, str) and call else None,
        parent if isinstance(parent, str) and parent else None,
    )


def import_child(
    stage: CompactStore, session: str, parent: str, child: Child, context_window: int | None
) -> None:
    """Import one subagent into the staging store as ``<session>/<agentId>``, linked to
    ``parent`` and the tool call that started it; a subagent with no conversation to import
    is left out."""
    sid = f"{session}/{child.agent}"
    agent = None if child.own_file else child.agent
    items = claude_code.convert(child.file, None, stage.allow_block_types, agent=agent)
    try:
        stage.import_session(
            sid,
            (to_imported(child.file.name, item) for item in items),
            format="anthropic",
            context_window=context_window,
        )
    except NoMessagesError:
        return
    with write_tx(stage.engine) as connection:
        repo.link_subagent(connection, sid, parent, child.tool_use_id)
