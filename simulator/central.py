"""The central queue of a simulation: where the simulated jobs wait and how a pilot's match
request draws one. :class:`ModelQueue` is the model the simulator runs by default (fast, in
memory); :mod:`simulator.realqueue` puts the same jobs in the real task queues instead."""

from __future__ import annotations

import math
import random
from collections import Counter, deque
from dataclasses import dataclass
from typing import Protocol

from simulator.config import Scenario
from taskqueue.core.buckets import cpu_time_bucket, significant_bits_bucket


@dataclass(slots=True)
class Job:
    id: int
    cores: int
    #: Normalised CPU seconds in the job's description (wall time asked * cores * factor).
    cpu_time: int
    #: Real run time on the site's nodes, seconds (the estimate error included).
    run_seconds: float
    #: Memory it asks for (MaxRAM), MB.
    memory: int = 0
    vo: str = "vo"
    #: GPUs it asks for (NumberOfGPUs); only on nodes with GPUs.
    gpus: int = 0
    #: Its class in the scenario's mix (an index; -1: a job given apart from the mix), and
    #: when it last entered the queue (seconds; set by the simulation).
    job_class: int = -1
    queued: float = 0.0


class CentralQueue(Protocol):
    """What the simulation needs of the central queue."""

    #: Jobs waiting, and per VO.
    waiting: int
    waiting_by_vo: Counter[str]

    def enqueue(self, job: Job, *, front: bool, now: float) -> None:
        """Add a job (``front``: a job handed back, served before the others of its queue)."""

    def match(self, vo: str, pilot_reference: str, processors: int,
              cpu_time_left: int | None, memory: int | None, now: float, *,
              gpus: int = 0, gpu_jobs_only: bool = False,
              memory_per_core: int | None = None) -> Job | None:
        """The job a pilot's match request gets, or None (``memory``: free MB, None: not
        limited; ``gpus``: free GPUs; ``gpu_jobs_only``: a job that needs a GPU, the
        ``gpu_first`` what-if; ``memory_per_core``: the most memory a job may need per core,
        the ``memory_per_core_rule`` what-if; the real matcher has a rule for neither)."""

    def fits(self, vo: str, free: int, memory: int | None, gpus: int = 0
             ) -> tuple[bool, bool, bool]:
        """Whether some waiting job needs at most ``free`` cores; whether one of those needs
        at most ``memory`` MB too; and whether one of those needs at most ``gpus`` GPUs."""


class ModelQueue:
    """The matcher as a model, for several VOs: each VO's task queues and draw apart
    (:class:`VoQueues`), as the matcher keeps them."""

    def __init__(self, scenario: Scenario, rng: random.Random) -> None:
        self.s = scenario
        self.rng = rng
        self.vos: dict[str, VoQueues] = {}
        self.waiting = 0
        self.waiting_by_vo: Counter[str] = Counter()

    def _vo(self, vo: str) -> VoQueues:
        q = self.vos.get(vo)
        if q is None:
            q = self.vos[vo] = VoQueues(self.s, self.rng)
        return q

    def enqueue(self, job: Job, *, front: bool, now: float) -> None:
        self._vo(job.vo).enqueue(job, front=front)
        self.waiting += 1
        self.waiting_by_vo[job.vo] += 1

    def match(self, vo: str, pilot_reference: str, processors: int,
              cpu_time_left: int | None, memory: int | None, now: float, *,
              gpus: int = 0, gpu_jobs_only: bool = False,
              memory_per_core: int | None = None) -> Job | None:
        queues = self.vos.get(vo)
        job = None if queues is None else queues.match(processors, cpu_time_left, memory,
                                                       gpus, gpu_jobs_only, memory_per_core)
        if job is not None:
            self.waiting -= 1
            self.waiting_by_vo[vo] -= 1
        return job

    def fits(self, vo: str, free: int, memory: int | None, gpus: int = 0
             ) -> tuple[bool, bool, bool]:
        queues = self.vos.get(vo)
        return (False, False, False) if queues is None else queues.fits(free, memory, gpus)


class VoQueues:
    """The matcher as a model (``taskqueue.matching.claim``): task queues keyed by cores, CPU-time
    bucket (of the CPU time per core, ``taskqueue.core.definitions``), memory bucket and GPUs
    bucket; a request matches the non-empty queues whose cores, CPU time, memory and GPUs it
    can hold (the rules of ``taskqueue.matching.rules``); the draw is the
    matcher's race of exponential clocks (the matching queue with the smallest key is drawn,
    and its key advances by an Exp(priority) step, all priorities equal; a queue that becomes
    non-empty starts from the clock, the key of the last draw), and the drawn queue's oldest
    job is given. The what-if ``memory_per_core`` (no rule of the matcher) also leaves out
    the queues whose memory bucket is above that times their cores."""

    def __init__(self, scenario: Scenario, rng: random.Random) -> None:
        self.s = scenario
        self.rng = rng
        self.queues: dict[tuple[int, int, int, int], deque[Job]] = {}
        self.nonempty: list[tuple[int, int, int, int]] = []
        self.draw_keys: dict[tuple[int, int, int, int], float] = {}
        self.draw_clock = 0.0

    def enqueue(self, job: Job, *, front: bool) -> None:
        s = self.s
        seconds = -(-job.cpu_time // job.cores) if s.cpu_time_per_core else job.cpu_time
        key = (job.cores, cpu_time_bucket(seconds, s.cpu_time_segments),
               significant_bits_bucket(job.memory, s.significant_bits),
               significant_bits_bucket(job.gpus, s.significant_bits))
        q = self.queues.get(key)
        if q is None:
            q = self.queues[key] = deque()
        if not q:
            self.nonempty.append(key)
            self.draw_keys[key] = max(self.draw_keys.get(key, -math.inf), self.draw_clock) + \
                self.rng.expovariate(1.0)
        if front:
            q.appendleft(job)
        else:
            q.append(job)

    def match(self, processors: int, cpu_time_left: int | None, memory: int | None,
              gpus: int = 0, gpu_jobs_only: bool = False,
              memory_per_core: int | None = None) -> Job | None:
        keys = self.draw_keys
        best: tuple[int, int, int, int] | None = None
        best_key = math.inf
        for k in self.nonempty:
            if k[0] <= processors and (cpu_time_left is None or k[1] <= cpu_time_left) and (
                    memory is None or k[2] <= memory) and k[3] <= gpus and (
                    k[3] > 0 or not gpu_jobs_only) and (
                    memory_per_core is None or k[2] <= memory_per_core * k[0]):
                d = keys[k]
                if d < best_key or (d == best_key and best is not None and k < best):
                    best, best_key = k, d
        if best is None:
            return None
        self.draw_clock = best_key
        keys[best] = best_key + self.rng.expovariate(1.0)
        q = self.queues[best]
        job = q.popleft()
        if not q:
            self.nonempty.remove(best)
        return job

    def fits(self, free: int, memory: int | None, gpus: int = 0) -> tuple[bool, bool, bool]:
        cores = [k for k in self.nonempty if k[0] <= free]
        held = [k for k in cores if memory is None or k[2] <= memory]
        return bool(cores), bool(held), any(k[3] <= gpus for k in held)
