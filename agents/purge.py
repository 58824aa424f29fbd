"""The purge loop (DIRAC's JobCleaningAgent): jobs that ended longer ago than their status's
retention (``[purge]``) leave the database, batch after batch, each batch its own short
transaction (taskqueue.queues.purge); the sandboxes they alone referenced leave too, records then
bytes, once the sandbox retention has passed since their upload (the sandbox cleanup's rule)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from functools import partial

from agents.context import AgentContext
from agents.sandboxcleanup import remove_expired_sandboxes
from taskqueue.files.sandboxstore import SandboxStore, open_store
from taskqueue.queues.purge import purge_batch


def purge_ended_jobs(ctx: AgentContext, store: SandboxStore | None = None, *,
                     sleep: Callable[[float], None] = time.sleep) -> str:
    settings = ctx.settings.purge
    purged: Counter[str] = Counter()
    skipped = removed = freed = 0
    for status, days in settings.retentions().items():
        before = ctx.now() - timedelta(days=days)
        while True:
            batch = ctx.transaction(partial(purge_batch, status=status, before=before,
                                            limit=settings.batch))
            purged[status] += batch.jobs
            skipped += batch.candidates - batch.jobs
            if batch.sandboxes:
                store = store or open_store(ctx.settings)
                n, size = remove_expired_sandboxes(ctx, store, among=batch.sandboxes)
                removed += n
                freed += size
            # A short batch is the last; so is one whose jobs all changed meanwhile (the
            # same candidates would come back).
            if batch.candidates < settings.batch or not batch.jobs:
                break
            if settings.pause:
                sleep(settings.pause)
    detail = ", ".join(f"{status} {n}" for status, n in purged.items() if n)
    return (f"{sum(purged.values())} ended job(s) purged{f' ({detail})' if detail else ''}, "
            f"{skipped} skipped as changed meanwhile, {removed} sandbox(es) removed, "
            f"{freed} bytes freed")
