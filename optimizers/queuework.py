"""The work a queue of the resources configuration could run now: the waiting jobs of the
task queues that a pilot of it, as the site director starts it, would match. The director
sizes its submissions by it; the matcher judges by it a pilot it answered "no job" (work
was there that the pilot's own description missed, or none was: an overshoot)."""

from __future__ import annotations

from optimizers.classads import expression_check
from optimizers.queueresources import resource_for_queue
from optimizers.resources import ResourcesConfig
from taskqueue.db.database import Session
from taskqueue.matching.claim import matching_queues
from taskqueue.queues.submitpools import get_submit_pools_for_queue


def queue_pools_and_waiting(session: Session, config: ResourcesConfig, site: str, ce: str,
                            queue: str, vo: str) -> tuple[list[str], int]:
    """The queue's SubmitPools and the waiting jobs its pilots could run."""
    pools = get_submit_pools_for_queue(session, site, ce, queue)
    resource = resource_for_queue(config, site, ce, queue, vo, submit_pools=pools)
    return pools, sum(q.waiting for q in matching_queues(session, resource,
                                                         expression_check(resource)))
