"""Task-queue definitions: what a job needs, rounded into the key that groups identical jobs.

A :class:`JobRequirements` is what the optimizer chain derives from a job description; a
:class:`TaskQueueDefinition` is its bucketed form, and its :meth:`digest` is the unique key of a
task queue (the same definition always lands in the same queue, across processes).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from taskqueue.core.buckets import cpu_time_bucket, significant_bits_bucket
from taskqueue.core.errors import InvalidInputError
from taskqueue.core.settings import Settings

DEFAULT_JOB_TYPE = "User"


@dataclass(frozen=True)
class JobRequirements:
    """The exact scheduling requirements of one job."""

    vo: str
    owner: str
    owner_group: str
    cpu_time: int = 0
    processors: int = 1
    memory: int = 0
    job_type: str = DEFAULT_JOB_TYPE
    submit_pool: str | None = None
    #: A ClassAd ``Requirements`` expression (canonical text) the resource must satisfy.
    expression: str | None = None
    sites: frozenset[str] = field(default_factory=frozenset)
    banned_sites: frozenset[str] = field(default_factory=frozenset)
    platforms: frozenset[str] = field(default_factory=frozenset)
    tags: frozenset[str] = field(default_factory=frozenset)
    #: Computing elements the job may run on (JDL GridCE); empty: any.
    ces: frozenset[str] = field(default_factory=frozenset)
    #: GPUs the job needs (JDL NumberOfGPUs); 0: none.
    gpus: int = 0

    def __post_init__(self) -> None:
        for name in ("vo", "owner", "owner_group", "job_type"):
            if not getattr(self, name):
                raise InvalidInputError(f"{name} must not be empty")
        for name in ("cpu_time", "memory", "gpus"):
            if getattr(self, name) < 0:
                raise InvalidInputError(f"{name} must not be negative, got {getattr(self, name)}")
        if self.processors < 1:
            raise InvalidInputError(f"processors must be at least 1, got {self.processors}")


def cpu_time_per_core(req: JobRequirements) -> int:
    """The normalised CPU seconds a job needs per core (its CPU time over the processors it
    asks for, rounded up): what a task queue's CPU-time bucket holds, compared with the CPU
    time per core a pilot offers (the time it has left, which each of its cores has)."""
    return -(-req.cpu_time // req.processors)


@dataclass(frozen=True)
class TaskQueueDefinition:
    vo: str
    owner_group: str
    owner: str | None
    cpu_time: int
    processors: int
    memory: int
    job_type: str
    submit_pool: str | None
    expression: str | None
    sites: frozenset[str]
    banned_sites: frozenset[str]
    platforms: frozenset[str]
    tags: frozenset[str]
    ces: frozenset[str] = frozenset()
    #: The bucket of the GPUs the jobs need (0: none).
    gpus: int = 0

    @classmethod
    def for_job(cls, req: JobRequirements, settings: Settings) -> TaskQueueDefinition:
        tq = settings.taskqueue
        return cls(
            vo=req.vo,
            owner_group=req.owner_group,
            owner=None if settings.group_shares_jobs(req.owner_group) else req.owner,
            cpu_time=cpu_time_bucket(cpu_time_per_core(req), tq.cpu_time_segments),
            processors=significant_bits_bucket(req.processors, tq.significant_bits),
            memory=significant_bits_bucket(req.memory, tq.significant_bits),
            job_type=req.job_type,
            submit_pool=req.submit_pool,
            expression=req.expression,
            sites=req.sites,
            banned_sites=req.banned_sites,
            platforms=req.platforms,
            tags=req.tags,
            ces=req.ces,
            gpus=significant_bits_bucket(req.gpus, tq.significant_bits),
        )

    def digest(self) -> str:
        canonical = {
            "vo": self.vo,
            "owner_group": self.owner_group,
            "owner": self.owner,
            "cpu_time": self.cpu_time,
            "processors": self.processors,
            "memory": self.memory,
            "job_type": self.job_type,
            "submit_pool": self.submit_pool,
            "expression": self.expression,
            "sites": sorted(self.sites),
            "banned_sites": sorted(self.banned_sites),
            "platforms": sorted(self.platforms),
            "tags": sorted(self.tags),
        }
        if self.ces:  # only when given: the digests of queues without CEs stay as they were
            canonical["ces"] = sorted(self.ces)
        if self.gpus:  # likewise: the digests of queues of jobs without GPUs stay
            canonical["gpus"] = self.gpus
        text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        return hashlib.sha256(text.encode("ascii")).hexdigest()
