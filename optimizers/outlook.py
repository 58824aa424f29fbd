"""What the pilots of each configured queue could run: the resource description a pilot of the
queue presents (its parameters and SubmitPools) matched against the task queues, ClassAd
expressions included, as the matcher would. For the dashboard's queue snapshot and pages."""

from __future__ import annotations

from collections.abc import Iterable

from optimizers.classads import expression_check
from optimizers.queueresources import resource_for_queue
from optimizers.resources import ResourcesConfig, serves_vo
from taskqueue.database import Session
from taskqueue.matching import ExpressionCheck
from taskqueue.resources import Resource
from taskqueue.sitestatus import (
    VoQueueKey,
    matching_task_queues,
    waiting_for,
    waiting_per_task_queue,
)
from taskqueue.submitpools import get_submit_pools_for_queue


def described_queues(session: Session, config: ResourcesConfig, vo: str
                     ) -> list[tuple[VoQueueKey, Resource, ExpressionCheck]]:
    """Each queue of the resources file that serves ``vo``, with the resource description
    its pilots present and the check of ClassAd expressions against it."""
    serves = serves_vo(vo)
    out = []
    for q in config.queues():
        if not serves(q):
            continue
        pools = get_submit_pools_for_queue(session, q.site, q.ce, q.name)
        resource = resource_for_queue(config, q.site, q.ce, q.name, vo, submit_pools=pools)
        out.append(((vo, q.site, q.ce, q.name), resource, expression_check(resource)))
    return out


def queue_outlook(session: Session, config: ResourcesConfig, vos: Iterable[str]
                  ) -> dict[VoQueueKey, tuple[int, int]]:
    """Per VO and configured queue: the waiting jobs its pilots could run and the number of
    task queues they wait in."""
    waiting = waiting_per_task_queue(session)
    out: dict[VoQueueKey, tuple[int, int]] = {}
    for vo in vos:
        out.update(waiting_for(session, described_queues(session, config, vo), waiting))
    return out


def runnable_task_queues(session: Session, config: ResourcesConfig, vos: Iterable[str]
                         ) -> set[int]:
    """The task queues that the pilots of at least one configured queue could run jobs of."""
    out: set[int] = set()
    for vo in vos:
        for _, resource, check in described_queues(session, config, vo):
            out.update(matching_task_queues(session, resource, check))
    return out
