"""The sandbox cleanup loop: sandboxes no live job references are removed once the retention
period has passed since the last referencing job ended (or since the upload, for a sandbox no
job ever used), records first and bytes after, in either store."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from agents.context import AgentContext
from taskqueue.database import Session
from taskqueue.models import Sandbox
from taskqueue.sandboxes import expired_sandboxes, find_sandbox, forget_sandboxes
from taskqueue.sandboxstore import SandboxStore, open_store

BATCH = 500


def clean_up_sandboxes(ctx: AgentContext, store: SandboxStore | None = None, *,
                       batch: int = BATCH) -> str:
    removed, freed = remove_expired_sandboxes(ctx, store or open_store(ctx.settings),
                                              batch=batch)
    return f"{removed} sandbox(es) removed, {freed} bytes freed"


def remove_expired_sandboxes(ctx: AgentContext, store: SandboxStore, *, batch: int = BATCH,
                             among: Sequence[str] | None = None) -> tuple[int, int]:
    """Remove the expired sandboxes (only those of ``among`` when given): records, then bytes.
    Returns the sandboxes removed and the bytes freed."""
    retention = ctx.settings.sandboxes.retention
    removed = freed = 0
    while True:
        def work(session: Session) -> list[tuple[str, int]]:
            ids = expired_sandboxes(session, now=ctx.now(), retention=retention, limit=batch,
                                    among=among)
            sizes = []
            for sid in ids:
                row = session.get(Sandbox, sid)
                sizes.append((sid, row.size if row is not None else 0))
            forget_sandboxes(session, ids)
            return sizes

        def recorded(session: Session, sid: str) -> bool:
            return find_sandbox(session, sid) is not None

        gone = ctx.transaction(work)
        for sandbox_id, size in gone:
            # The bytes go once the record has: a sandbox uploaded again in between keeps
            # them (its new record is there).
            if not ctx.transaction(partial(recorded, sid=sandbox_id)):
                store.delete(sandbox_id)
                removed += 1
                freed += size
        if len(gone) < batch:
            break
    return removed, freed
