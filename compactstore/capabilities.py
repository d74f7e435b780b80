"""What each model's API does with a conversation, as of a date: whether it checks the
prefix of every thinking block sent back (preserved thinking), which compaction the
provider offers for it, and its context window.

The table ships with the package (:data:`MODEL_CAPABILITIES`, as of :data:`AS_OF`);
``CompactStore.open(..., model_capabilities=)`` extends or overrides it, one entry per
model id. A dated id matches the entry of its undated id (``claude-opus-5-5-20261015`` that
of ``claude-opus-5-5``, never ``claude-opus-5``); an unknown model has no prefix checks and
no provider compaction, so its sessions keep the ``rewrite`` policy.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

__all__ = [
    "AS_OF",
    "BINDING_BETA",
    "COMPACTION_BETA",
    "CONTEXT_MANAGEMENT_BETA",
    "MODEL_CAPABILITIES",
    "EditPolicy",
    "ModelCapabilities",
    "capabilities_for",
    "merged_capabilities",
    "resolve_policy",
]

AS_OF = "2026-12-01"

# Beta headers of the request fields compactstore sets for a session.
BINDING_BETA = "thinking-binding-controls-2026-08-01"
CONTEXT_MANAGEMENT_BETA = "context-management-2025-06-27"
COMPACTION_BETA = "compact-2026-09-04"  # on-demand compaction, and requests sending its block

# anthropic_on_demand / anthropic_threshold: on-demand and threshold compaction (Messages
# API); openai_compact / openai_server: ``responses.compact`` and server-side compaction
# (``context_management`` with a ``compact_threshold``) on the Responses API.
ProviderCompaction = Literal[
    "anthropic_on_demand", "anthropic_threshold", "openai_compact", "openai_server"
]


@dataclass(frozen=True)
class ModelCapabilities:
    """One model's entry: ``prefix_checks`` (a thinking block sent back is checked against
    its prefix: an edit before it makes the request fail or the block be dropped),
    ``compaction`` (the provider compactions it offers), ``context_window`` (tokens; None
    when not known) and ``context_editing`` (the server-side clear_tool_uses and
    clear_thinking edits)."""

    prefix_checks: bool = False
    compaction: tuple[ProviderCompaction, ...] = ()
    context_window: int | None = None
    context_editing: bool = False


_ON_DEMAND: tuple[ProviderCompaction, ...] = ("anthropic_on_demand", "anthropic_threshold")
_CHECKED = ModelCapabilities(
    prefix_checks=True, compaction=_ON_DEMAND, context_window=1_000_000, context_editing=True
)

# As of AS_OF: the models the provider documents as running the prefix check, those that
# offer compaction without it, and older ones with context editing only.
MODEL_CAPABILITIES: Mapping[str, ModelCapabilities] = MappingProxyType(
    {
        "claude-fable-5-2": _CHECKED,
        "claude-mythos-5-2": _CHECKED,
        "claude-fable-5-1": _CHECKED,
        "claude-mythos-5-1": _CHECKED,
        "claude-opus-5-5": _CHECKED,
        "claude-sonnet-5-5": _CHECKED,
        "claude-haiku-5-5": ModelCapabilities(
            prefix_checks=True, compaction=_ON_DEMAND, context_window=200_000, context_editing=True
        ),
        "claude-fable-5": ModelCapabilities(
            compaction=_ON_DEMAND, context_window=1_000_000, context_editing=True
        ),
        "claude-mythos-5": ModelCapabilities(
            compaction=_ON_DEMAND, context_window=1_000_000, context_editing=True
        ),
        "claude-opus-5": ModelCapabilities(
            compaction=_ON_DEMAND, context_window=1_000_000, context_editing=True
        ),
        "claude-sonnet-5": ModelCapabilities(
            compaction=_ON_DEMAND, context_window=1_000_000, context_editing=True
        ),
        "claude-opus-4-8": ModelCapabilities(
            compaction=_ON_DEMAND, context_window=1_000_000, context_editing=True
        ),
        "claude-opus-4-7": ModelCapabilities(
            compaction=_ON_DEMAND, context_window=1_000_000, context_editing=True
        ),
        "claude-opus-4-6": ModelCapabilities(
            compaction=_ON_DEMAND, context_window=1_000_000, context_editing=True
        ),
        "claude-sonnet-4-6": ModelCapabilities(
            compaction=_ON_DEMAND, context_window=1_000_000, context_editing=True
        ),
        "claude-opus-4-1": ModelCapabilities(context_window=200_000, context_editing=True),
        "claude-opus-4": ModelCapabilities(context_window=200_000, context_editing=True),
        "claude-sonnet-4-5": ModelCapabilities(context_window=200_000, context_editing=True),
        "claude-sonnet-4": ModelCapabilities(context_window=200_000, context_editing=True),
        "claude-haiku-4-5": ModelCapabilities(context_window=200_000, context_editing=True),
        "gpt-5": ModelCapabilities(
            compaction=("openai_compact", "openai_server"), context_window=400_000
        ),
    }
)

_NONE = ModelCapabilities()


def merged_capabilities(
    extra: Mapping[str, ModelCapabilities] | None,
) -> Mapping[str, ModelCapabilities]:
    """The shipped table with ``extra``'s entries added or replacing the shipped ones."""
    if not extra:
        return MODEL_CAPABILITIES
    return MappingProxyType({**MODEL_CAPABILITIES, **extra})


def capabilities_for(
    model: str | None, table: Mapping[str, ModelCapabilities] = MODEL_CAPABILITIES
) -> ModelCapabilities:
    """The entry of ``model`` in ``table``: the model id itself, or its id without a date
    (``claude-opus-5-5-20261015``, ``gpt-5-2025-08-07``) or channel tag (``-latest``,
    ``-preview``); so ``claude-opus-5`` never stands for ``claude-opus-5-5``. No
    capabilities for an unknown model or None."""
    if not model:
        return _NONE
    if model in table:
        return table[model]
    dated = _DATED.fullmatch(model)
    if dated is not None and dated.group(1) in table:
        return table[dated.group(1)]
    return _NONE


# The edit policy a session's compactions run under, resolved from its configured one.
EditPolicy = Literal["rewrite", "append_only"]

# A dated id (Anthropic's -20261015, OpenAI's -2025-08-07) or one with a channel tag.
_DATED = re.compile(r"(.+?)-(\d{8}|\d{4}-\d{2}-\d{2}|latest|preview)")


def resolve_policy(
    edit_policy: str, model: str | None, table: Mapping[str, ModelCapabilities] = MODEL_CAPABILITIES
) -> tuple[EditPolicy, bool]:
    """(the policy a session's compactions run under, whether its model checks thinking
    prefixes): ``auto`` is ``append_only`` for a model with prefix checks, else ``rewrite``."""
    checks = capabilities_for(model, table).prefix_checks
    if edit_policy == "append_only" or (edit_policy == "auto" and checks):
        return "append_only", checks
    return "rewrite", checks
