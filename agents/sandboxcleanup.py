"""The sandbox cleanup loop: sandboxes no live job references are removed once the retention
period has passed since the last referencing job ended (or since the upload, for a sandbox no
job ever used), records first and bytes after, in either store; stored objects that no record
names are swept too."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from functools import partial
from itertools import islice

from agents.context import AgentContext
from taskqueue.db.database import Session
from taskqueue.db.models import Sandbox
from taskqueue.files.sandboxes import (
    expired_sandboxes,
    find_sandbox,
    forget_sandboxes,
    recorded_sandboxes,
)
from taskqueue.files.sandboxstore import SandboxStore, open_store

BATCH = 500


class SweepClock:
    """When this process last swept the whole store: the sweep lists every stored object, so
    it runs at most once per ``interval`` seconds (the first turn always sweeps)."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.last: datetime | None = None

    def due(self, now: datetime) -> bool:
        if self.last is not None and (now - self.last).total_seconds() < self.interval:
            return False
        self.last = now
        return True


def clean_up_sandboxes(ctx: AgentContext, store: SandboxStore | None = None, *,
                       batch: int = BATCH, sweeps: SweepClock | None = None) -> str:
    """One turn: expired sandboxes removed, and the store swept for unrecorded objects when
    ``sweeps`` says a sweep is due (always without one)."""
    store = store or open_store(ctx.settings)
    removed, freed = remove_expired_sandboxes(ctx, store, batch=batch)
    line = f"{removed} sandbox(es) removed, {freed} bytes freed"
    if sweeps is not None and not sweeps.due(ctx.now()):
        return f"{line}, no store sweep due"
    swept = _sweep_unrecorded(ctx, store, batch)
    return f"{line}, {swept} unrecorded object(s) swept"


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

        gone = ctx.transaction(work)
        for sandbox_id, size in gone:
            # The bytes go once the record has: a sandbox uploaded again in between keeps
            # them (its new record is there).
            if not ctx.transaction(partial(_recorded, sid=sandbox_id)):
                store.delete(sandbox_id)
                removed += 1
                freed += size
        if len(gone) < batch:
            break
    return removed, freed


def _sweep_unrecorded(ctx: AgentContext, store: SandboxStore, batch: int) -> int:
    """Remove stored objects that no record names (a failed upload, a presigned upload never
    registered) once they are older than the retention period, and than a presigned URL's
    lifetime (an upload through one is recorded after it ends)."""
    settings = ctx.settings.sandboxes
    before = ctx.now() - timedelta(seconds=max(settings.retention, settings.url_lifetime))
    swept = 0
    keys = store.keys()
    while chunk := list(islice(keys, batch)):
        known = ctx.transaction(partial(recorded_sandboxes, sandbox_ids=chunk))
        for sandbox_id in chunk:
            if sandbox_id in known:
                continue
            stored = store.modified_at(sandbox_id)
            if stored is not None and stored < before \
                    and not ctx.transaction(partial(_recorded, sid=sandbox_id)):
                store.delete(sandbox_id)
                swept += 1
    return swept


def _recorded(session: Session, sid: str) -> bool:
    return find_sandbox(session, sid) is not None
