"""What one session handle keeps between its calls: its own plug-ins and the views it
extends step by step."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from compactstore._context.request_view import RequestView
from compactstore._core.calls import Plugins
from compactstore._core.handle import Handle, Store
from compactstore._core.summarizing import summarizer_name
from compactstore._engines.base import Summarizer
from compactstore.models import CompactionConfig

__all__ = ["HandleState", "SessionHandle", "View"]

# context_view()'s last view: (the context's wire tuple, the config, the view, the context's
# lineage), so a step that only appended extends it.
View = tuple[Any, CompactionConfig, tuple[Mapping[str, Any], ...], object]


class SessionHandle(Handle, Protocol):
    """A session handle as the functions of this package read it."""

    context_window: int


@dataclass(slots=True)
class HandleState:
    """One handle's own plug-ins (``store.session(..., summarizer=, compactor=)``; the
    store's otherwise) and what it remembers between calls."""

    summarizer: Summarizer | None = None
    compactor: Any = None
    # The context version this handle last handed out (context(), active_context()): a
    # real count measured on an older one is not used for calibration.
    handed_version: int | None = None
    # The newest finished background job this handle has reported (None: not looked).
    seen_job: int | None = None
    view: View | None = None  # context_view()'s last view
    requests: RequestView | None = None  # request_params()'s messages, extended step by step

    def plugins(self, store: Store) -> Plugins:
        """The store's plug-ins, with this handle's own summarizer and compactor when it
        was given them."""
        plugins = store.plugins
        if self.compactor is not None:
            plugins = replace(plugins, compactor=self.compactor)
        if self.summarizer is None:
            return plugins
        return replace(
            plugins, summarizer=self.summarizer, summarizer_name=summarizer_name(self.summarizer)
        )
