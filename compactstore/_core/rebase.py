"""Rebasing a compaction decided on a snapshot onto what other writers committed since: the
commit step's rule for edits and blob ids."""

from __future__ import annotations

from dataclasses import replace

from sqlalchemy import Connection

from compactstore._context.active import ActiveContext
from compactstore._context.media import USER_MEDIA, user_media, without_user_media
from compactstore._engines import microcompact
from compactstore._engines.base import NewBlob, StageResult
from compactstore._engines.pipeline import Outcome
from compactstore._engines.tool_budget import stub
from compactstore.db import repository as repo

__all__ = ["rebase"]


def rebase(
    connection: Connection,
    session_id: str,
    context: ActiveContext,
    max_compaction_id: int,
    outcome: Outcome,
) -> Outcome:
    """The outcome decided on ``context`` (the snapshot, whose highest compaction id was
    ``max_compaction_id``) on top of what was written since: edits of seqs another
    compaction edited meanwhile are dropped (theirs stay live), and the blobs left get the
    next free ids, their previews rewritten to name them. Token figures stay the
    snapshot's."""
    taken = repo.edited_since(connection, session_id, max_compaction_id)
    stages = [
        replace(
            stage,
            edits=tuple(edit for edit in stage.edits if edit.seq not in taken),
            blobs=tuple(blob for blob in stage.blobs if blob.seq not in taken),
        )
        if stage.effective and (stage.edits or stage.blobs)
        else stage
        for stage in outcome.stages
    ]
    next_id = repo.next_blob_id(connection, session_id)
    blobs = [blob for stage in stages if stage.effective for blob in stage.blobs]
    if blobs and blobs[0].id != next_id:
        stages = _renumber(context, stages, next_id)
    return replace(outcome, stages=stages)


def _renumber(context: ActiveContext, stages: list[StageResult], next_id: int) -> list[StageResult]:
    """Blobs numbered from ``next_id`` in order, each preview naming its new id."""
    new_ids: dict[tuple[int, str], NewBlob] = {}
    for stage in stages:
        if stage.effective:
            for blob in stage.blobs:
                new_ids[(blob.seq, blob.tool_use_id)] = replace(blob, id=next_id)
                next_id += 1
    messages = {item.seq: item.message for item in context.kept if item.seq is not None}
    out: list[StageResult] = []
    for stage in stages:
        if not stage.effective or not stage.edits:
            out.append(stage)
            continue
        edits = []
        for edit in stage.edits:
            replacements: dict[str, str] = {}
            for tool_use_id in edit.tool_use_ids:
                renumbered = new_ids.get((edit.seq, tool_use_id))
                replacements[tool_use_id] = (
                    stub(renumbered, context.config)  # a preview, or a media note
                    if renumbered is not None and edit.state == "persisted"
                    else microcompact.CLEARED_TEXT
                )
            message = context.fmt.replace_tool_results(messages[edit.seq], replacements)
            user_blob = new_ids.get((edit.seq, USER_MEDIA))
            if user_blob is not None and edit.state == "persisted" and user_media(message):
                message = without_user_media(message, stub(user_blob, context.config))
            messages[edit.seq] = message
            edits.append(replace(edit, message=message))
        blobs = tuple(new_ids[(blob.seq, blob.tool_use_id)] for blob in stage.blobs)
        out.append(replace(stage, edits=tuple(edits), blobs=blobs))
    return out
