"""What every part of a :class:`~compactstore._store.session.Session` shares: its store, its
row's settings, and the helpers its transactions start with.

The session's methods are grouped by what they do: appending, reading and compacting in
:mod:`compactstore._store.session`, undoing and re-running compactions in
:mod:`compactstore._store.session_history`, memory and recall in
:mod:`compactstore._store.session_memory`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from compactstore._core import compaction
from compactstore._core.handle import Store
from compactstore._core.summarizing import summarizer_name
from compactstore._engines.base import Summarizer
from compactstore.db import repository as repo
from compactstore.formats import MessageFormat, get_format
from compactstore.models import CompactionConfig

__all__ = ["SessionBase"]

# context_view()'s last view: (the context's wire tuple, the config, the view, the context's
# lineage), so a step that only appended extends it.
_View = tuple[Any, CompactionConfig, tuple[Mapping[str, Any], ...], object]


class SessionBase:
    """A session handle: the store it belongs to and its stored settings."""

    def __init__(
        self,
        store: Store,
        row: repo.SessionRow,
        summarizer: Summarizer | None = None,
        compactor: Any = None,
    ) -> None:
        self.store = store
        # This handle's summarizer (store.session(..., summarizer=)); the store's otherwise.
        self._summarizer = summarizer
        # This handle's provider compactor (store.session(..., compactor=)); likewise.
        self._compactor = compactor
        self.id = row.id
        store.cache.pin(self, row.id)  # its context stays cached while this handle lives
        self.format = row.format
        self.context_window = row.context_window
        self.config = row.config
        self.created_at = row.created_at
        # The model the session talks to, as last recorded (session(model=), append_response).
        self.model = row.model
        # A subagent's session (an imported Claude Code sidechain): the session whose tool
        # call started it and that call's id; None for a top-level session.
        self.parent_session_id = row.parent_session_id
        self.parent_tool_use_id = row.parent_tool_use_id
        # "drop_block" once set for the session (sessions.thinking_binding): sticky; as this
        # handle last read it.
        self.thinking_binding = row.thinking_binding
        # The format's adapter: how this session's messages spell calls and results.
        self.adapter: MessageFormat = get_format(row.format)
        # The context version this handle last handed out (context(), active_context()): a
        # real count measured on an older one is not used for calibration.
        self._handed_version: int | None = None
        # The newest finished background job this handle has reported (None: not looked).
        self._seen_job: int | None = None
        self._view: _View | None = None

    def subagents(self) -> list[tuple[str, str | None]]:
        """The sessions of the subagents this session's tool calls started (an imported
        Claude Code transcript's sidechains), and theirs: (session id, the id of the tool
        call that started it, None when the transcript does not say): its own in id order,
        then theirs."""
        return self.store.read(lambda connection: repo.subagents_of(connection, [self.id]))

    def __repr__(self) -> str:
        return f"Session({self.id!r}, format={self.format!r}, context_window={self.context_window})"

    def _plugins(self) -> compaction.Plugins:
        """The store's plug-ins, with this handle's own summarizer when it was given one."""
        plugins = self.store.plugins
        if self._compactor is not None:
            plugins = replace(plugins, compactor=self._compactor)
        if self._summarizer is None:
            return plugins
        return replace(
            plugins, summarizer=self._summarizer, summarizer_name=summarizer_name(self._summarizer)
        )
