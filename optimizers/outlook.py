"""What the pilots of each configured queue could run: the resource description a pilot of the
queue presents (its parameters and SubmitPools) matched against the task queues, ClassAd
expressions included, as the matcher would. For the dashboard's queue snapshot and pages and
the watchdog's search for jobs no queue can run; all queues are matched in one pass
(taskqueue.matching.reach)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from optimizers.classads import expression_check
from optimizers.queueresources import resource_for_queue
from optimizers.resources import ResourcesConfig, serves_vo
from taskqueue.core.resources import Resource
from taskqueue.db.database import Session
from taskqueue.matching.claim import ExpressionCheck
from taskqueue.matching.reach import Reach, reach
from taskqueue.pilots.sitestatus import VoQueueKey
from taskqueue.queues.submitpools import submit_pools_by_queue


def described_queues(session: Session, config: ResourcesConfig, vos: Iterable[str]
                     ) -> list[tuple[VoQueueKey, Resource, ExpressionCheck]]:
    """Each queue of the resources file that serves one of ``vos``, per VO, with the
    resource description its pilots present and the check of ClassAd expressions against
    it."""
    pools = submit_pools_by_queue(session)
    out = []
    for vo in vos:
        serves = serves_vo(vo)
        for q in config.queues():
            if serves(q):
                resource = resource_for_queue(config, q.site, q.ce, q.name, vo,
                                              submit_pools=pools.get((q.site, q.ce, q.name), ()))
                out.append(((vo, q.site, q.ce, q.name), resource, expression_check(resource)))
    return out


def queue_reach(session: Session, config: ResourcesConfig, vos: Iterable[str], *,
                only: int | None = None) -> dict[VoQueueKey, Reach]:
    """Per VO and configured queue serving it: the task queues its pilots could be served
    from (task queue ``only``, when given)."""
    return reach(session, described_queues(session, config, vos), only=only)


def queue_outlook(session: Session, config: ResourcesConfig, vos: Iterable[str],
                  waiting: Mapping[int, int]) -> dict[VoQueueKey, tuple[int, int]]:
    """Per VO and configured queue: the waiting jobs its pilots could run and the number of
    non-empty task queues they wait in (``waiting``: the waiting jobs per task queue)."""
    shared: dict[int, tuple[int, int]] = {}  # by id(): one tuple is shared by many queues

    def count(ids: Iterable[int]) -> tuple[int, int]:
        found = [waiting[i] for i in ids if waiting.get(i)]
        return sum(found), len(found)

    out: dict[VoQueueKey, tuple[int, int]] = {}
    for key, r in queue_reach(session, config, vos).items():
        if id(r.shared) not in shared:
            shared[id(r.shared)] = count(r.shared)
        (n, queues), (own_n, own_queues) = shared[id(r.shared)], count(r.own)
        out[key] = (n + own_n, queues + own_queues)
    return out


def runnable_task_queues(session: Session, config: ResourcesConfig, vos: Iterable[str]
                         ) -> tuple[set[int], set[int]]:
    """The task queues that the pilots of at least one configured queue could run jobs of,
    and those of them that the pilots of a queue with an ``Executor`` (one the site director
    starts pilots for) could."""
    queues = {(q.site, q.ce, q.name): q for q in config.queues()}
    runnable: set[int] = set()
    directed: set[int] = set()
    seen: set[tuple[int, bool]] = set()  # (id() of a shared set, of a directed queue)
    for (vo, site, ce, name), r in queue_reach(session, config, vos).items():
        started = bool(queues[(site, ce, name)].parameter("Executor", vo))
        for into, wanted in ((runnable, True), (directed, started)):
            if wanted:
                if (id(r.shared), into is directed) not in seen:
                    seen.add((id(r.shared), into is directed))
                    into.update(r.shared)
                into.update(r.own)
    return runnable, directed
