"""The real task queues as a simulation's central queue: each simulated job is stored and
queued by the task-queue package on an SQLite file, and each match request of a simulated
pilot is the resource description the real pilot builds (:class:`pilot.resource.NodeDescription`)
claimed with :func:`taskqueue.matching.claim.claim_jobs`, as the matcher's Python path does. Slow (a
transaction per request) and meant for small scenarios: it is what the model of
:class:`simulator.central.ModelQueue` is checked against."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine

from pilot.resource import NodeDescription
from simulator.central import Job
from simulator.config import Scenario
from taskqueue.core.buckets import significant_bits_bucket
from taskqueue.core.definitions import JobRequirements
from taskqueue.core.resources import parse_resource
from taskqueue.core.settings import Settings, TaskQueueSettings
from taskqueue.core.states import JobStatus
from taskqueue.db.database import make_session_factory
from taskqueue.matching.claim import claim_jobs
from taskqueue.queues.jobs import NewJob, add_jobs, apply_transition
from taskqueue.queues.taskqueues import QueueEntry, enqueue_jobs

#: The simulated time 0.
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


class TaskQueueCentral:
    """Simulated jobs in the real task queues of the database behind ``engine``, whose schema
    the caller has created (``gridpilot db upgrade``; the simulator does not hold the
    migrations)."""

    def __init__(self, scenario: Scenario, engine: Engine, rng: random.Random) -> None:
        self.engine = engine
        self.sessions = make_session_factory(self.engine)
        self.settings = replace(Settings(), taskqueue=TaskQueueSettings(
            cpu_time_segments=scenario.cpu_time_segments))
        self.rng = rng
        self.jobs: dict[int, Job] = {}
        self.cores_waiting: Counter[tuple[str, int, int, int]] = Counter()
        self.waiting = 0
        self.waiting_by_vo: Counter[str] = Counter()

    def enqueue(self, job: Job, *, front: bool, now: float) -> None:
        """Store and queue ``job`` (a job handed back comes back as a new one, at the end of
        its queue: the real reschedule keeps its id, which changes nothing here)."""
        when = EPOCH + timedelta(seconds=now)
        req = JobRequirements(vo=job.vo, owner="sim", owner_group=f"{job.vo}_user",
                              cpu_time=job.cpu_time, processors=job.cores,
                              memory=job.memory, gpus=job.gpus)
        with self.sessions.begin() as s:
            [job_id] = add_jobs(s, [NewJob('[Executable = "sim"]', req)], now=when)
            apply_transition(s, [job_id], JobStatus.RECEIVED, JobStatus.CHECKING,
                             minor_status="checks", source="simulator", now=when)
            enqueue_jobs(s, [QueueEntry(job_id, req, 1)], self.settings, now=when,
                         rng=self.rng)
        self.jobs[job_id] = job
        self.cores_waiting[job.vo, job.cores, job.memory, job.gpus] += 1
        self.waiting += 1
        self.waiting_by_vo[job.vo] += 1

    def match(self, vo: str, pilot_reference: str, processors: int,
              cpu_time_left: int | None, memory: int | None, now: float, *,
              gpus: int = 0, gpu_jobs_only: bool = False,
              memory_per_core: int | None = None) -> Job | None:
        if gpu_jobs_only:
            raise ValueError("the matcher has no rule for 'jobs that need a GPU only': "
                             "gpu_first is a what-if of the model queue")
        if memory_per_core is not None:
            raise ValueError("the matcher has no rule for memory per core: "
                             "memory_per_core_rule is a what-if of the model queue")
        node = NodeDescription(vo=vo, reference=pilot_reference)
        resource = parse_resource(node.resource(free_cores=processors, free_memory_mb=memory,
                                                cpu_time_left=cpu_time_left,
                                                free_gpus=gpus))
        with self.sessions.begin() as s:
            claims = claim_jobs(s, resource, now=EPOCH + timedelta(seconds=now), rng=self.rng)
        if not claims:
            return None
        job = self.jobs.pop(claims[0].job_id)
        self.cores_waiting[job.vo, job.cores, job.memory, job.gpus] -= 1
        self.waiting -= 1
        self.waiting_by_vo[job.vo] -= 1
        return job

    def fits(self, vo: str, free: int, memory: int | None, gpus: int = 0
             ) -> tuple[bool, bool, bool]:
        # Memory and GPUs as the matcher buckets them (a job fits when its bucket does).
        held = [(mem, g) for (v, cores, mem, g), n in self.cores_waiting.items()
                if n > 0 and v == vo and cores <= free]
        roomy = [g for mem, g in held if memory is None or significant_bits_bucket(mem) <= memory]
        return bool(held), bool(roomy), any(significant_bits_bucket(g) <= gpus for g in roomy)
