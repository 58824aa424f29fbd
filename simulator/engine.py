"""The discrete-event simulation of one site under one policy and one seed.

Only time is simulated. The decisions are the project's own code, called as the real pilot and
the real drain-cost tool call them:

- what a pilot asks for: :func:`pilot.planning.what_to_ask` with the seconds left before the
  wall limit and the shutdown time (:meth:`pilot.features.Limits.seconds_left`), or with none
  (blind asks); the cores, enforced end and expected end of each payload:
  :func:`pilot.planning.payload_cores`, :func:`~pilot.planning.payload_max_end`,
  :func:`~pilot.planning.expected_end`;
- a pilot's ``$JOBSTATUS`` values: :func:`pilot.jobstatus.compute_status`; the wastes:
  :mod:`pilot.waste` through :func:`pilot.draincost.assess`;
- the choice of drain victims: the order of ``gridpilot-drain-cost --pick drain``
  (:func:`pilot.draincost.drain_order`) or ``--pick kill`` (:func:`~pilot.draincost.kill_order`).

The central queue is :class:`simulator.central.ModelQueue` (the matcher as a model), or any
:class:`~simulator.central.CentralQueue` given, such as :mod:`simulator.realqueue` (the real
task queues on an SQLite file).

Events at the same time are handled in order of kind (shutdowns first, as the real pilot stops
everything before it enforces wall limits), then in the order they were scheduled.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import random
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pilot.draincost import PilotCost, assess, drain_order, kill_order
from pilot.features import Limits
from pilot.jobstatus import RunningPayload, compute_status
from pilot.planning import (
    MEMORY_BUCKET_SLACK,
    Ask,
    expected_end,
    memory_first,
    payload_cores,
    payload_max_end,
    what_to_ask,
)
from simulator.central import CentralQueue, Job, ModelQueue
from simulator.config import HOUR, Policy, Scenario

# Event kinds, in the order they are handled at equal times.
_SHUTDOWN, _DRAIN_DEADLINE, _END, _WALL, _PILOT_WALL, _IDLE, _ARRIVAL, _PILOT_START, \
    _NODE_BACK, _ANNOUNCE, _DRAIN, _SAMPLE, _DIRECTOR = range(13)

#: Why cores are idle while work waits: the node is being drained (or shut down); no pilot
#: holds them (between two pilots); the pilot has free cores but no waiting job fits them (too
#: few cores free for the jobs that would fit in time, or too little time left for any job);
#: the pilot is too close to its end to ask, and waits for its payloads.
IDLE_REASONS = ("draining", "no pilot", "too few free cores", "too little time left",
                "end of the pilot's life", "too little free memory", "too few free GPUs")

#: Node states.
UP, DRAINING, OUT = "up", "draining", "out"


@dataclass(slots=True)
class Running:
    job: Job
    cores: int
    start: float
    expected_end: float
    max_end: float


@dataclass(slots=True, eq=False)
class Pilot:
    id: int
    node: Node
    cores: int
    start: float
    wall_end: float
    multi: bool
    payloads: dict[int, Running] = field(default_factory=dict)
    used: int = 0
    #: Memory the pilot holds (its cores' share of the node's; None: not simulated) and what
    #: its payloads use, MB.
    memory: int | None = None
    memory_used: int = 0
    #: GPUs the pilot holds (its cores' share of the node's) and what its payloads use.
    gpus: int = 0
    gpus_used: int = 0
    vo: str = "vo"
    retiring: bool = False
    alive: bool = True
    asked_once: bool = False
    #: When the pilot exits for want of a job (None: it runs or is not idle), and whether an
    #: idle event is in the queue (it moves on to a later end when it comes early).
    idle_end: float | None = None
    idle_pending: bool = False
    #: Whether the batch system's end at the wall limit is in the event queue (only pilots
    #: that run a payload, or idle past their wall limit, need it).
    wall_pending: bool = False
    limits: Limits | None = None
    reference: str = ""


@dataclass(slots=True, eq=False)
class Node:
    id: int
    cores: int
    gpus: int = 0
    state: str = UP
    shutdown: float | None = None
    pilots: list[Pilot] = field(default_factory=list)
    #: Cores no pilot holds.
    unheld: int = 0
    used: int = 0
    #: A pilot start is pending (the batch system has scheduled one).
    starting: bool = False
    #: The drain under way: its record and the idle core-seconds counted so far.
    drain: DrainRecord | None = None
    drain_idle: float = 0.0
    drain_since: float = 0.0
    started_once: bool = False


@dataclass
class DrainRecord:
    """One drain event: when, what kind (``free``: the site frees K nodes chosen by the victim
    policy; ``shutdown``: a node announced its shutdown time), the nodes, and the wastes in
    core-seconds: as the nodes' ``$JOBSTATUS`` predicted them at the start (free events only)
    and as they happened."""

    time: float
    kind: str
    nodes: list[int]
    deadline: float
    predicted_draining_waste: float = 0.0
    predicted_kill_waste: float = 0.0
    draining_waste: float = 0.0
    kill_waste: float = 0.0
    open_nodes: int = 0


@dataclass
class RunResult:
    """What one run measured (wastes in core-seconds; occupancy as a fraction)."""

    policy: str
    seed: int
    occupancy: float
    draining_waste: float
    kill_waste: float
    killed_at_wall_limit: int
    rescheduled: int
    jobs_done: int
    jobs_started: int
    #: Pilots started in the measured period.
    pilots_started: int
    drains: list[DrainRecord]
    #: (hours since the start of the measured period, used cores / cores in service).
    occupancy_series: list[tuple[float, float]]
    events: int
    #: Mean share of the cores in service idle for each reason (sampled while work waits).
    idle: dict[str, float] = field(default_factory=dict)
    #: GPU-seconds used / GPU-seconds in service while work waits (None: no GPUs simulated).
    gpu_occupancy: float | None = None
    #: Jobs started in the measured period, per VO.
    started_by_vo: dict[str, int] = field(default_factory=dict)
    #: Memory used / memory in service while work waits (None: memory not simulated).
    memory_occupancy: float | None = None
    #: Per job class (by name; "other" for jobs given apart from the mix): jobs started in
    #: the measured period, the seconds they had waited in the queue (since they last
    #: entered it), and the jobs still waiting at the end.
    started_by_class: dict[str, int] = field(default_factory=dict)
    wait_by_class: dict[str, float] = field(default_factory=dict)
    waiting_by_class: dict[str, int] = field(default_factory=dict)

    def mean_wait_hours(self, job_class: str) -> float | None:
        """The mean time the class's jobs started in the measured period waited, hours."""
        n = self.started_by_class.get(job_class, 0)
        return self.wait_by_class.get(job_class, 0.0) / n / HOUR if n else None


class Simulation:
    """One site, one policy, one seed. :meth:`run` returns the :class:`RunResult`."""

    def __init__(self, scenario: Scenario, policy: Policy, seed: int, *,
                 workload: Sequence[tuple[float, Job]] | None = None,
                 drain_times: Sequence[float] | None = None,
                 central: CentralQueue | None = None) -> None:
        """``workload``: the jobs and their submission times (default: drawn from the
        scenario's mix); ``drain_times``: when the site frees nodes (default: spread over
        the measured period); ``central``: the central queue (default: the model)."""
        self.s = scenario
        self.workload = workload
        self.drain_times = drain_times
        self.policy = policy
        self.seed = seed
        # Separate random streams, so that every policy sees the same jobs and events.
        self.rng_jobs = random.Random(f"{seed}/jobs")
        self.rng_events = random.Random(f"{seed}/events")
        self.rng_match = random.Random(f"{seed}/match")
        self.rng_victims = random.Random(f"{seed}/victims")
        self.rng_pilots = random.Random(f"{seed}/pilots")
        self.rng_samples = random.Random(f"{seed}/samples")
        self.heap: list[tuple[float, int, int, object]] = []
        self.seq = 0
        self.now = 0.0
        self.start = scenario.warmup_hours * HOUR
        self.end = self.start + scenario.days * 86400.0
        self.central: CentralQueue = central or ModelQueue(scenario, self.rng_match)
        self.hungry: set[Pilot] = set()
        self.idle_nodes: set[Node] = set()
        self.nodes = [Node(i, scenario.cores_per_node,
                           scenario.gpus_per_node if _has_gpus(i, scenario) else 0)
                      for i in range(scenario.nodes)]
        self.class_cumulative = list(itertools.accumulate(c.weight for c in
                                                          scenario.job_classes))
        self.class_total = self.class_cumulative[-1]
        self.sizes_by_free: dict[int, tuple[list[int], list[float]]] = {}
        #: Cores held by each VO's pilots (the batch system's fair share).
        self.vo_cores: Counter[str] = Counter()
        self.started_by_vo: Counter[str] = Counter()
        #: Director pacing: per site, the nodes waiting for a pilot, in order.
        self.paced = scenario.director_cycle_seconds > 0
        self.wanting: list[deque[Node]] = [
            deque() for _ in range(max(1, len(scenario.site_wall_limits_hours)))]
        self.class_logs = [(math.log(c.hours_min), math.log(c.hours_max))
                           for c in scenario.job_classes]
        self.pilot_count = 0
        self.job_count = 0
        # Accounting.
        self.used = 0
        self.in_service = scenario.nodes * scenario.cores_per_node
        self.last = 0.0
        self.used_integral = 0.0
        self.service_integral = 0.0
        #: GPUs: in use, in service (on nodes not out), and their integrals likewise.
        self.gpus_used = 0
        self.gpus_in_service = sum(node.gpus for node in self.nodes)
        self.gpu_used_integral = 0.0
        self.gpu_service_integral = 0.0
        #: Memory (MB) used by running payloads, and its integral while work waits.
        self.memory_used = 0
        self.memory_used_integral = 0.0
        self.started_by_class: Counter[str] = Counter()
        self.wait_by_class: dict[str, float] = {}
        self.waiting_by_class: Counter[str] = Counter()
        self.draining_waste = 0.0
        self.kill_waste = 0.0
        self.killed_at_wall = 0
        self.rescheduled = 0
        self.done = 0
        self.started = 0
        self.pilots_started = 0
        self.drains: list[DrainRecord] = []
        self.series: list[tuple[float, float]] = []
        self.idle_samples = dict.fromkeys(IDLE_REASONS, 0.0)
        self.idle_sample_count = 0
        self.events = 0

    # -- events ------------------------------------------------------------------------------

    def push(self, time: float, kind: int, obj: object = None) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (time, kind, self.seq, obj))

    def run(self) -> RunResult:
        s = self.s
        if self.workload is None:
            self._arrivals(0.0, s.backlog_hours + s.arrival_seconds / HOUR)
            step = s.arrival_seconds
            for i in range(1, math.ceil(self.end / step) + 1):
                self.push(i * step, _ARRIVAL)
        else:
            for when, job in sorted(self.workload, key=lambda w: w[0]):
                self.push(when, _ARRIVAL, job)
        for node in self.nodes:
            node.unheld = node.cores
            node.starting = True
            if self.paced:
                self.wanting[node.id % len(self.wanting)].append(node)
            else:
                self.push(self.rng_pilots.uniform(0, s.pilot_start_delay), _PILOT_START, node)
        if self.paced:
            self.push(0.0, _DIRECTOR, None)
        self._schedule_drain_events()
        # One sample at a random time in each interval: no aliasing with the arrivals.
        t = self.start
        while t < self.end:
            self.push(t + self.rng_samples.uniform(0, s.sample_seconds), _SAMPLE)
            t += s.sample_seconds
        handlers = {
            _SHUTDOWN: self._on_shutdown, _DRAIN_DEADLINE: self._on_drain_deadline,
            _END: self._on_end, _WALL: self._on_wall, _PILOT_WALL: self._on_pilot_wall,
            _IDLE: self._on_idle, _ARRIVAL: self._on_arrival,
            _PILOT_START: self._on_pilot_start, _NODE_BACK: self._on_node_back,
            _ANNOUNCE: self._on_announce, _DRAIN: self._on_drain, _SAMPLE: self._on_sample,
            _DIRECTOR: self._on_director}
        heap = self.heap
        while heap:
            time, kind, _, obj = heapq.heappop(heap)
            if time > self.end:
                break
            self._advance(time)
            self.events += 1
            handlers[kind](obj)
        self._advance(self.end)
        for record in self.drains:
            self.draining_waste += record.draining_waste
        return RunResult(
            policy=self.policy.name, seed=self.seed,
            occupancy=self.used_integral / self.service_integral if self.service_integral
            else 0.0,
            draining_waste=self.draining_waste, kill_waste=self.kill_waste,
            killed_at_wall_limit=self.killed_at_wall, rescheduled=self.rescheduled,
            jobs_done=self.done, jobs_started=self.started,
            pilots_started=self.pilots_started, started_by_vo=dict(self.started_by_vo),
            drains=self.drains,
            occupancy_series=self.series, events=self.events,
            memory_occupancy=None if s.memory_per_node_mb is None else (
                self.memory_used_integral / (self.service_integral * s.memory_per_node_mb
                                             / s.cores_per_node)
                if self.service_integral else 0.0),
            started_by_class=dict(self.started_by_class),
            wait_by_class=dict(self.wait_by_class),
            waiting_by_class={k: v for k, v in self.waiting_by_class.items() if v},
            gpu_occupancy=None if not self.s.gpu_nodes else (
                self.gpu_used_integral / self.gpu_service_integral
                if self.gpu_service_integral else 0.0),
            idle={reason: value / max(1, self.idle_sample_count)
                  for reason, value in self.idle_samples.items()})

    def _advance(self, time: float) -> None:
        """Count core-seconds used and in service up to ``time`` (in the measured period, while
        work waits)."""
        if time > self.last:
            lo = max(self.last, self.start)
            hi = min(time, self.end)
            if hi > lo and self.central.waiting > 0:
                self.used_integral += self.used * (hi - lo)
                self.service_integral += self.in_service * (hi - lo)
                self.gpu_used_integral += self.gpus_used * (hi - lo)
                self.gpu_service_integral += self.gpus_in_service * (hi - lo)
                self.memory_used_integral += self.memory_used * (hi - lo)
            self.last = time
        self.now = time

    def _measuring(self) -> bool:
        return self.start <= self.now <= self.end

    # -- the workload and the central queue --------------------------------------------------

    def _new_job(self) -> Job:
        s = self.s
        rng = self.rng_jobs
        u = rng.random() * self.class_total
        i = bisect.bisect_right(self.class_cumulative, u)
        c = self.s.job_classes[min(i, len(self.s.job_classes) - 1)]
        low, high = self.class_logs[min(i, len(self.s.job_classes) - 1)]
        hours = math.exp(low + (high - low) * rng.random())
        cpu_time = max(1, round(hours * HOUR * c.cores * s.cpu_factor))
        run = cpu_time / s.cpu_factor / c.cores * rng.uniform(s.error_min, s.error_max)
        self.job_count += 1
        return Job(self.job_count, c.cores, cpu_time, run, c.memory_mb, c.vo, c.gpus,
                   min(i, len(self.s.job_classes) - 1))

    def _arrivals(self, _time: float, hours: float) -> None:
        s = self.s
        # Core-hours of an average job (the mean of a log-uniform draw: (max - min) / ln(max
        # / min)).
        mean = sum(c.weight * c.cores * (
            (c.hours_max - c.hours_min) / math.log(c.hours_max / c.hours_min)
            if c.hours_max > c.hours_min else c.hours_min)
            for c in s.job_classes) / sum(c.weight for c in s.job_classes)
        target = s.load * s.nodes * s.cores_per_node * hours
        count = round(target / mean)
        for _ in range(count):
            self._enqueue(self._new_job(), front=False)

    def _enqueue(self, job: Job, *, front: bool) -> None:
        job.queued = self.now
        self.waiting_by_class[self._class_name(job)] += 1
        self.central.enqueue(job, front=front, now=self.now)

    def _class_name(self, job: Job) -> str:
        return self.s.job_classes[job.job_class].name if job.job_class >= 0 else "other"

    def _work_returned(self) -> None:
        """Jobs came back to the queue: hungry pilots ask again, idle nodes get pilots."""
        for node in sorted(self.idle_nodes, key=lambda n: n.id):  # a set: order by id
            self.idle_nodes.discard(node)
            self._start_pilots_later(node)
        hungry = list(self.hungry)
        self.hungry.clear()
        for p in sorted(hungry, key=lambda x: x.id):
            self._fill(p)

    def _on_arrival(self, obj: object) -> None:
        if isinstance(obj, Job):
            self._enqueue(obj, front=False)
        else:
            self._arrivals(self.now, self.s.arrival_seconds / HOUR)
        self._work_returned()

    # -- the batch system and the pilots -----------------------------------------------------

    def _start_pilots_later(self, node: Node) -> None:
        if not node.starting and node.unheld > 0 and node.state == UP:
            node.starting = True
            if self.paced:
                self.wanting[node.id % len(self.wanting)].append(node)
            else:
                self.push(self.now + self.s.pilot_start_delay, _PILOT_START, node)

    def _on_director(self, _obj: object) -> None:
        """A cycle of the site director: each site gets at most its cap of pilots, for the
        nodes that have waited longest."""
        s = self.s
        for wanting in self.wanting:
            for _ in range(min(s.director_pilots_per_cycle, len(wanting))):
                self.push(self.now + s.pilot_start_delay, _PILOT_START, wanting.popleft())
        self.push(self.now + s.director_cycle_seconds, _DIRECTOR, None)

    def _on_pilot_start(self, obj: object) -> None:
        """The batch system starts pilots in the node's free cores: one whole-node pilot
        (multi-payload), or one-payload pilots sized like the jobs of the mix (drawn by the
        mix's weights among the sizes that fit)."""
        node = obj
        assert isinstance(node, Node)
        node.starting = False
        if node.state != UP or node.unheld <= 0:
            return
        if self.central.waiting == 0:
            self.idle_nodes.add(node)
            return
        if self.policy.multi_payload:
            if node.unheld == node.cores:
                self._new_pilot(node, node.cores)
            return
        while node.unheld > 0:
            sizes, cumulative = self._pilot_sizes(node.unheld)
            if not sizes:
                return
            # random.choices(sizes, cum_weights=cumulative)[0], without its overhead.
            size = sizes[0] if len(sizes) == 1 else sizes[bisect.bisect(
                cumulative, self.rng_pilots.random() * (cumulative[-1] + 0.0), 0,
                len(sizes) - 1)]
            if not self._new_pilot(node, size).alive:
                return  # it exited at once (no time left before the shutdown)

    def _next_vo(self) -> str:
        """The VO the batch system gives freed cores to: among the VOs with waiting work,
        the one whose pilots hold the fewest cores for its share (the first listed on a
        tie)."""
        shares = self.s.vo_shares
        if not shares:
            return "vo"
        waiting = self.central.waiting_by_vo
        candidates = [(vo, share) for vo, share in shares if waiting[vo] > 0] or list(shares)
        return min(candidates, key=lambda c: self.vo_cores[c[0]] / c[1])[0]

    def _pilot_sizes(self, free: int) -> tuple[list[int], list[float]]:
        """The one-payload pilot sizes that fit ``free`` cores and their cumulative weights
        (the same draw as ``choices(sizes, weights)``, computed once per ``free``)."""
        known = self.sizes_by_free.get(free)
        if known is None:
            fitting = [c for c in self.s.job_classes if c.cores <= free]
            known = self.sizes_by_free[free] = (
                [c.cores for c in fitting],
                list(itertools.accumulate(c.weight for c in fitting)))
        return known

    def _new_pilot(self, node: Node, cores: int) -> Pilot:
        sites = self.s.site_wall_limits_hours
        wall = (sites[node.id % len(sites)] if sites else self.s.wall_limit_hours) * HOUR
        if not node.started_once and self.s.stagger_first_pilots:
            # The first pilots: as if they had started at random times before, so that the
            # wall limits of the whole site do not all fall at once.
            wall *= self.rng_pilots.uniform(0.1, 1.0)
        if self.policy.multi_payload or node.unheld == cores:
            node.started_once = True
        node.unheld -= cores
        self.pilot_count += 1
        if self._measuring():
            self.pilots_started += 1
        p = Pilot(self.pilot_count, node, cores, self.now, self.now + wall,
                  self.policy.multi_payload, vo=self._next_vo())
        self.vo_cores[p.vo] += cores
        p.reference = f"pilot-{p.id}"
        if self.s.memory_per_node_mb is not None:
            p.memory = self.s.memory_per_node_mb * cores // node.cores
        p.gpus = node.gpus * cores // node.cores
        node.pilots.append(p)
        self._fill(p)
        return p

    def _limits(self, p: Pilot) -> Limits:
        """The pilot's limits, as its machine and job features give them (kept until the
        node's shutdown time changes)."""
        limits = p.limits
        if limits is None or limits.shutdown != p.node.shutdown:
            limits = p.limits = Limits(
                cores=p.cores, cpu_factor=self.s.cpu_factor, wall_end=p.wall_end,
                wall_left=None, cpu_left=None, memory_mb=None, disk_gb=None,
                shutdown=p.node.shutdown)
        return limits

    def _fill(self, p: Pilot) -> None:
        """The pilot's match loop: ask while cores are free (pilot/loop.py's ``_fill``)."""
        if not p.alive or p.retiring or self.now >= p.wall_end:
            return  # at its wall limit the batch system ends the pilot: no new payload
        s = self.s
        while p.used < p.cores:
            if not p.multi and p.asked_once:
                return
            limits = self._limits(p)
            left = limits.seconds_left(self.now) if self.policy.time_aware else None
            ask = what_to_ask(
                free_cores=p.cores - p.used,
                seconds_left=None if left is None else left * (1 - s.margin_share),
                margin=s.margin, cpu_factor=limits.cpu_factor, cpu_left=limits.cpu_left,
                cores=p.cores,
                free_memory_mb=None if p.memory is None else p.memory - p.memory_used)
            if ask is None:
                if not p.payloads:
                    self._retire(p)
                return
            first = memory_first(ask, memory_mb=p.memory, cores=p.cores) \
                if s.memory_first else None
            per_core = None
            if s.memory_per_core_rule and ask.memory is not None and p.memory is not None:
                # The memory left per free core, and an eighth more: the task queues round
                # a job's memory up by as much (as memory_first offers).
                per_core = ask.memory // ask.processors
                per_core += per_core // MEMORY_BUCKET_SLACK
                if s.memory_per_core_rule == "binding" and \
                        ask.memory * p.cores >= p.memory * ask.processors:
                    per_core = None  # at least its cores' share left per free core
            job = None if first is None else self._match(p, first)
            if job is None and s.gpu_first and p.gpus > p.gpus_used:
                job = self._match(p, ask, gpu_jobs_only=True)
            if job is None:
                job = self._match(p, ask, memory_per_core=per_core)
            if job is None:
                self.hungry.add(p)
                if not p.payloads:
                    self._idle_until(p, self.now + s.idle_timeout)
                return
            self.hungry.discard(p)
            p.asked_once = True
            self._start_payload(p, job, limits)

    def _match(self, p: Pilot, ask: Ask, *, gpu_jobs_only: bool = False,
               memory_per_core: int | None = None) -> Job | None:
        return self.central.match(p.vo, p.reference, ask.processors, ask.cpu_time_left,
                                  ask.memory, self.now, gpus=p.gpus - p.gpus_used,
                                  gpu_jobs_only=gpu_jobs_only,
                                  memory_per_core=memory_per_core)

    def _start_payload(self, p: Pilot, job: Job, limits: Limits) -> None:
        now = self.now
        cores = payload_cores(job.cores, p.cores - p.used)
        max_end = payload_max_end(now, limits.wall_end, limits.shutdown)
        expected = expected_end(now, job.cpu_time, limits.cpu_factor, cores, max_end)
        r = Running(job, cores, now, expected, max_end)
        p.payloads[job.id] = r
        p.used += cores
        p.memory_used += job.memory
        self.memory_used += job.memory
        p.gpus_used += job.gpus
        self.gpus_used += job.gpus
        p.node.used += cores
        self.used += cores
        p.idle_end = None
        self._ensure_wall(p)
        name = self._class_name(job)
        self.waiting_by_class[name] -= 1
        if self._measuring():
            self.started += 1
            self.started_by_vo[job.vo] += 1
            self.started_by_class[name] += 1
            self.wait_by_class[name] = self.wait_by_class.get(name, 0.0) + now - job.queued
        actual = now + job.run_seconds
        if actual <= max_end:
            self.push(actual, _END, (p, job.id))
        else:
            self.push(max_end, _WALL, (p, job.id))

    def _remove_payload(self, p: Pilot, job_id: int) -> Running:
        r = p.payloads.pop(job_id)
        node = p.node
        if node.drain is not None:
            node.drain_idle += (node.cores - node.used) * (self.now - node.drain_since)
            node.drain_since = self.now
        p.used -= r.cores
        p.memory_used -= r.job.memory
        self.memory_used -= r.job.memory
        p.gpus_used -= r.job.gpus
        self.gpus_used -= r.job.gpus
        node.used -= r.cores
        self.used -= r.cores
        return r

    def _kill(self, p: Pilot, job_id: int) -> float:
        """Stop a payload now; the core-seconds of work lost."""
        r = self._remove_payload(p, job_id)
        lost = r.cores * (self.now - r.start)
        if self._measuring():
            self.kill_waste += lost
        return lost

    def _on_end(self, obj: object) -> None:
        p, job_id = _pilot_and(obj)
        if job_id not in p.payloads:
            return
        self._remove_payload(p, job_id)
        if self._measuring():
            self.done += 1
        self._after_payload(p)

    def _on_wall(self, obj: object) -> None:
        """A payload reached its enforced end (the wall limit, or the shutdown time known when
        it started) before it finished: the pilot stops it; the job fails."""
        p, job_id = _pilot_and(obj)
        if job_id not in p.payloads:
            return
        self._kill(p, job_id)
        if self._measuring():
            self.killed_at_wall += 1
        self._after_payload(p)

    def _after_payload(self, p: Pilot) -> None:
        if not p.multi or p.retiring:
            if not p.payloads:
                self._exit(p)
            return
        self._fill(p)

    def _on_pilot_wall(self, obj: object) -> None:
        """The batch system ends the pilot at its wall limit, with whatever still runs."""
        p = obj
        assert isinstance(p, Pilot)
        if not p.alive:
            return
        for job_id in sorted(p.payloads):
            self._kill(p, job_id)
            if self._measuring():
                self.killed_at_wall += 1
        self._exit(p)

    def _idle_until(self, p: Pilot, end: float) -> None:
        p.idle_end = end
        if end >= p.wall_end:
            self._ensure_wall(p)
        if not p.idle_pending:
            p.idle_pending = True
            self.push(end, _IDLE, p)

    def _ensure_wall(self, p: Pilot) -> None:
        if not p.wall_pending:
            p.wall_pending = True
            self.push(p.wall_end, _PILOT_WALL, p)

    def _on_idle(self, obj: object) -> None:
        p = obj
        assert isinstance(p, Pilot)
        p.idle_pending = False
        if not p.alive or p.payloads or p.idle_end is None:
            return
        if p.idle_end > self.now:
            p.idle_pending = True
            self.push(p.idle_end, _IDLE, p)
            return
        self._exit(p)

    def _retire(self, p: Pilot) -> None:
        p.retiring = True
        self.hungry.discard(p)
        if not p.payloads:
            self._exit(p)

    def _exit(self, p: Pilot) -> None:
        if not p.alive:
            return
        p.alive = False
        self.hungry.discard(p)
        node = p.node
        node.pilots.remove(p)
        node.unheld += p.cores
        self.vo_cores[p.vo] -= p.cores
        if node.state == DRAINING:
            if not node.pilots:
                self._node_freed(node)
            return
        if node.state == UP:
            self._start_pilots_later(node)

    # -- shutdowns ---------------------------------------------------------------------------

    def _schedule_drain_events(self) -> None:
        s = self.s
        rng = self.rng_events
        if s.shutdowns_per_day > 0:
            t = self.start
            while True:
                t += rng.expovariate(s.shutdowns_per_day / 86400.0)
                if t > self.end:
                    break
                self.push(t, _ANNOUNCE, rng.random())
        if self.drain_times is not None:
            for t in self.drain_times:
                self.push(t, _DRAIN, None)
            return
        for i in range(int(s.drain_events)):
            span = (self.end - self.start) / s.drain_events
            self.push(self.start + span * (i + rng.uniform(0.1, 0.9)), _DRAIN, None)

    def _on_announce(self, obj: object) -> None:
        """A node announces its shutdown time (``shutdowntime`` in $MACHINEFEATURES)."""
        assert isinstance(obj, float)
        candidates = [n for n in self.nodes if n.state == UP and n.shutdown is None]
        if not candidates:
            return
        node = candidates[int(obj * len(candidates))]
        node.shutdown = self.now + self.s.shutdown_notice_hours * HOUR
        record = DrainRecord(self.now, "shutdown", [node.id], node.shutdown, open_nodes=1)
        self.drains.append(record)
        self._begin_drain(node, record)
        self.push(node.shutdown, _SHUTDOWN, node)

    def _on_shutdown(self, obj: object) -> None:
        """The node's shutdown time has come: every payload is stopped and handed back."""
        node = obj
        assert isinstance(node, Node)
        record = node.drain
        self._end_drain(node, record)
        node.shutdown = None
        self._take_out(node, self.now + self.s.downtime_hours * HOUR)

    # -- the site frees nodes ----------------------------------------------------------------

    def node_costs(self) -> dict[int, PilotCost]:
        """Each node's drain and kill costs now, from its pilots' ``$JOBSTATUS`` values as the
        real pilot computes them and the real drain-cost tool assesses them (a node's pilots
        summed; a node with no pilot costs nothing and can postpone)."""
        costs = {}
        for node in self.nodes:
            if node.state != UP or node.shutdown is not None:
                continue
            pilot_costs = [self.pilot_cost(p) for p in node.pilots]
            costs[node.id] = _node_cost(node.id, pilot_costs)
        return costs

    def pilot_cost(self, p: Pilot) -> PilotCost:
        values = compute_status(
            p.cores, [RunningPayload(r.cores, r.start, r.expected_end, r.max_end)
                      for r in p.payloads.values()],
            now=self.now, can_postpone=p.retiring, priority_factor=1.0,
            pilot_reference=f"pilot-{p.id}")
        return assess(Path(f"node-{p.node.id}/pilot-{p.id}"), values, self.now)

    def choose_victims(self, costs: dict[int, PilotCost], k: int) -> list[int]:
        victim = self.policy.victim
        if victim == "drain":
            ranked = sorted(costs.values(), key=drain_order)
            return [int(c.pilot.split("-")[1]) for c in ranked[:k]]
        if victim == "kill":
            ranked = sorted(costs.values(), key=kill_order)
            return [int(c.pilot.split("-")[1]) for c in ranked[:k]]
        ids = sorted(costs)
        if victim == "random":
            return sorted(self.rng_victims.sample(ids, min(k, len(ids))))

        def age(node_id: int) -> float:
            pilots = self.nodes[node_id].pilots
            return min(p.start for p in pilots) if pilots else -math.inf

        return sorted(ids, key=lambda i: (age(i), i))[:k]

    def _on_drain(self, _obj: object) -> None:
        s = self.s
        costs = self.node_costs()
        victims = self.choose_victims(costs, int(s.drain_nodes))
        deadline = self.now + s.drain_deadline_hours * HOUR
        record = DrainRecord(self.now, "free", victims, deadline, open_nodes=len(victims))
        # The simulator always knows each pilot's allocated cores, so every draining waste is known.
        record.predicted_draining_waste = sum(costs[v].draining_waste or 0.0 for v in victims)
        record.predicted_kill_waste = sum(costs[v].kill_waste for v in victims)
        self.drains.append(record)
        for v in victims:
            node = self.nodes[v]
            node.state = DRAINING
            self._begin_drain(node, record)
            for p in list(node.pilots):
                self._retire(p)  # the drain file: no new payload
            if node.drain is not None and not node.pilots:
                self._node_freed(node)
        self.push(deadline, _DRAIN_DEADLINE, record)

    def _begin_drain(self, node: Node, record: DrainRecord) -> None:
        node.drain = record
        node.drain_idle = 0.0
        node.drain_since = self.now

    def _on_drain_deadline(self, obj: object) -> None:
        record = obj
        assert isinstance(record, DrainRecord)
        for v in record.nodes:
            node = self.nodes[v]
            if node.drain is record:
                self._end_drain(node, record)
                self._take_out(node, record.deadline + self.s.drain_out_hours * HOUR)

    def _node_freed(self, node: Node) -> None:
        """A draining node has no pilot left: it is free before the deadline."""
        record = node.drain
        assert record is not None
        self._end_drain(node, record)
        self._take_out(node, record.deadline + self.s.drain_out_hours * HOUR)

    def _end_drain(self, node: Node, record: DrainRecord | None) -> None:
        """Close the node's drain: count its idle cores, stop what still runs (handed back
        for rescheduling, its work lost)."""
        if record is not None and node.drain is record:
            node.drain_idle += (node.cores - node.used) * (self.now - node.drain_since)
            node.drain_since = self.now
        returned = False
        for p in list(node.pilots):
            for job_id in sorted(p.payloads):
                r = p.payloads[job_id]
                lost = self._kill(p, job_id)
                if record is not None:
                    record.kill_waste += lost
                self._enqueue(r.job, front=True)
                returned = True
                if self._measuring():
                    self.rescheduled += 1
            p.alive = False
            self.hungry.discard(p)
            node.unheld += p.cores
            self.vo_cores[p.vo] -= p.cores
        node.pilots.clear()
        if record is not None and node.drain is record:
            record.draining_waste += node.drain_idle
            record.open_nodes -= 1
            node.drain = None
        if returned:
            self._work_returned()

    def _take_out(self, node: Node, until: float) -> None:
        if node.state != OUT:
            self.in_service -= node.cores
            self.gpus_in_service -= node.gpus
        node.state = OUT
        self.idle_nodes.discard(node)
        self.push(until, _NODE_BACK, node)

    def _on_node_back(self, obj: object) -> None:
        node = obj
        assert isinstance(node, Node)
        if node.state != OUT:
            return
        node.state = UP
        self.in_service += node.cores
        self.gpus_in_service += node.gpus
        self._start_pilots_later(node)

    def _on_sample(self, _obj: object) -> None:
        hours = (self.now - self.start) / HOUR
        self.series.append((hours, self.used / self.in_service if self.in_service else 0.0))
        if self.central.waiting > 0 and self.in_service > 0:
            self._classify_idle()

    def _classify_idle(self) -> None:
        """Why the cores in service are idle right now (sampled while work waits)."""
        idle = self.idle_samples
        self.idle_sample_count += 1
        shares = dict.fromkeys(IDLE_REASONS, 0)
        for node in self.nodes:
            if node.state == OUT:
                continue
            draining = node.state == DRAINING or node.shutdown is not None
            shares["draining" if draining else "no pilot"] += node.unheld
            for p in node.pilots:
                free = p.cores - p.used
                if free <= 0:
                    continue
                if draining or p.retiring:
                    shares["draining"] += free
                elif p in self.hungry:
                    cores_fit, memory_fits, gpus_fit = self.central.fits(
                        p.vo, free, None if p.memory is None else p.memory - p.memory_used,
                        p.gpus - p.gpus_used)
                    shares["too few free cores" if not cores_fit else "too little free memory"
                           if not memory_fits else "too few free GPUs" if not gpus_fit
                           else "too little time left"] += free
                else:
                    shares["end of the pilot's life"] += free
        for reason, cores in shares.items():
            idle[reason] += cores / self.in_service


def _has_gpus(node: int, s: Scenario) -> bool:
    """Whether node ``node`` is one of the scenario's ``gpu_nodes`` (spread evenly)."""
    return (node * s.gpu_nodes) // s.nodes != ((node + 1) * s.gpu_nodes) // s.nodes


def _pilot_and(obj: object) -> tuple[Pilot, int]:
    """An event's (pilot, number) pair."""
    assert isinstance(obj, tuple)
    p, n = obj
    assert isinstance(p, Pilot) and isinstance(n, int)
    return p, n


def _node_cost(node_id: int, pilot_costs: list[PilotCost]) -> PilotCost:
    """A node's costs: its pilots' summed (cores, times, wastes); it can postpone when all its
    pilots can; its priority is its most critical pilot's."""
    name = f"node-{node_id}"
    if not pilot_costs:
        return PilotCost(pilot=name, directory=Path(name), used_CPU=0, allocated_CPU=0,
                         remaining_time=0.0, remaining_time_enforced=0.0, draining_waste=0.0,
                         kill_waste=0.0, can_postpone=True, priority_factor=0.0)
    if len(pilot_costs) == 1:
        c = pilot_costs[0]
        return PilotCost(pilot=name, directory=Path(name), used_CPU=c.used_CPU,
                         allocated_CPU=c.allocated_CPU, remaining_time=c.remaining_time,
                         remaining_time_enforced=c.remaining_time_enforced,
                         draining_waste=c.draining_waste, kill_waste=c.kill_waste,
                         can_postpone=c.can_postpone, priority_factor=c.priority_factor)
    return PilotCost(
        pilot=name, directory=Path(name), used_CPU=sum(c.used_CPU for c in pilot_costs),
        allocated_CPU=sum(c.allocated_CPU or 0 for c in pilot_costs),
        remaining_time=max(c.remaining_time for c in pilot_costs),
        remaining_time_enforced=max(c.remaining_time_enforced for c in pilot_costs),
        draining_waste=(None if any(c.draining_waste is None for c in pilot_costs)
                        else sum(c.draining_waste or 0.0 for c in pilot_costs)),
        kill_waste=sum(c.kill_waste for c in pilot_costs),
        can_postpone=all(c.can_postpone for c in pilot_costs),
        priority_factor=max(c.priority_factor for c in pilot_costs))


def simulate(scenario: Scenario, policy: Policy, seed: int, *,
             workload: Sequence[tuple[float, Job]] | None = None,
             drain_times: Sequence[float] | None = None,
             central: CentralQueue | None = None) -> RunResult:
    """Run one simulation (see :class:`Simulation` for the keyword arguments)."""
    return Simulation(scenario, policy, seed, workload=workload, drain_times=drain_times,
                      central=central).run()
