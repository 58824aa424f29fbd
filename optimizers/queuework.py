"""The work a queue of the resources configuration could run now: the waiting jobs of the
task queues that a pilot of it, as the site director starts it, would match. The director
sizes its submissions by it; the matcher judges by it a pilot it answered "no job" (work
was there that the pilot's own description missed, or none was: an overshoot)."""

from __future__ import annotations

import time
from collections.abc import Callable

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


class QueueWork:
    """Whether work a queue could run is waiting, per VO and queue, as last found: idle
    pilots of one queue ask again and again, and finding it walks every matching task queue,
    so an answer serves this process for ``ttl`` seconds."""

    def __init__(self, ttl: float = 15.0, size: int = 4096,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl, self.size, self._clock = ttl, size, clock
        self._found: dict[tuple[str, str, str, str], tuple[float, bool]] = {}
        #: How many times it was found (not taken from memory): for the tests.
        self.lookups = 0

    def get(self, key: tuple[str, str, str, str], find: Callable[[], bool]) -> bool:
        now = self._clock()
        known = self._found.get(key)
        if known is not None and known[0] > now:
            return known[1]
        value = find()
        self.lookups += 1
        if len(self._found) >= self.size:
            self._found.clear()
        self._found[key] = (now + self.ttl, value)
        return value
