"""What a simulation runs: the site and its workload (:class:`Scenario`), the choices compared
(:class:`Policy`), and the named presets."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from taskqueue.core.settings import DEFAULT_CPU_SEGMENTS

HOUR = 3600.0
DAY = 86400.0

VICTIM_CHOICES = ("drain", "kill", "random", "oldest")
MEMORY_PER_CORE_RULES = ("", "binding", "always")


@dataclass(frozen=True)
class JobClass:
    """One kind of job in the mix: its share of the jobs (by count), its cores, and the wall
    time it asks for (hours, drawn log-uniformly between the bounds). The CPU time in its
    description is that wall time times its cores (normalised by the node's CPU factor); its
    memory (MaxRAM, MB, for the whole job; 0: none asked) counts only on a scenario with
    ``memory_per_node_mb``; its GPUs (NumberOfGPUs) run it only on the nodes that have them
    (``gpu_nodes``); its VO shares the site with the others by ``vo_shares``."""

    name: str
    weight: float
    cores: int
    hours_min: float
    hours_max: float
    memory_mb: int = 0
    #: The VO whose jobs these are (one of the scenario's ``vo_shares``).
    vo: str = "vo"
    gpus: int = 0


@dataclass(frozen=True)
class Scenario:
    """A site, its batch system, its workload and its drain events."""

    nodes: int = 1000
    cores_per_node: int = 32
    #: Wall limit of one pilot (one batch job), hours.
    wall_limit_hours: float = 48.0
    #: VOs sharing the site and their fair shares: the batch system gives freed cores to the
    #: pilots of the VO with waiting work whose pilots hold the fewest cores for its share
    #: (empty: one VO, "vo", for every job class).
    vo_shares: tuple[tuple[str, float], ...] = ()
    #: Several sites sharing the central queue, by their wall limits (hours): node i belongs
    #: to site i modulo their number (empty: one site, of ``wall_limit_hours``).
    site_wall_limits_hours: tuple[float, ...] = ()
    cpu_factor: float = 1.0
    #: Memory of a node, MB (None: memory is not simulated). A pilot holds its cores' share
    #: of it and offers what its running payloads leave free; a job needs its class's memory
    #: (so a one-payload pilot only gets the jobs its cores' share of memory holds).
    memory_per_node_mb: int | None = None
    #: A what-if, not what the pilot does: a pilot whose payloads hold more than their cores'
    #: share of its memory first asks for one core and the memory left per free core
    #: (``pilot.planning.memory_first``), then for any job fitting what is left. It costs a
    #: second match request whenever memory binds and gained 0.3 point in ``wide-week``
    #: (within the seeds' spread), so the pilot does not do it.
    memory_first: bool = False
    #: A what-if, not a rule the matcher has: a pilot also offers a memory per core, and a
    #: job matches only if its memory bucket over its cores is at most that. ``"binding"``:
    #: the pilot offers the memory left per free core while that is below its cores' share
    #: (no limit otherwise); ``"always"``: it always offers the memory left per free core, so
    #: that what it leaves free never holds less memory per core than it had; ``""``: no
    #: such offer (what the pilot and the matcher do). Offered memory per core counts an
    #: eighth more, as the task queues round a job's memory up by as much. In ``wide-week``
    #: (5 seeds) "always" gives 84.0% against 82.9% only by leaving the 6,000 MB jobs
    #: waiting (96 h against 2 h), "binding" 41.5% (a pilot running a few 6,000 MB jobs
    #: takes only the 1,000 MB ones), so the matcher has no such rule.
    memory_per_core_rule: str = ""
    #: Nodes with GPUs, spread evenly over the site(s), and the GPUs each has. A pilot holds
    #: its cores' share of its node's GPUs (a whole-node pilot: all of them) and offers
    #: those its payloads leave free; a job asking for GPUs runs only where they are free.
    gpu_nodes: int = 0
    gpus_per_node: int = 0
    #: A what-if, not what the pilot does: a pilot with a free GPU first asks for a job that
    #: needs one, then for any job (the matcher has no rule for the first ask).
    gpu_first: bool = False
    #: Measured period after the warm-up, days.
    days: float = 7.0
    warmup_hours: float = 24.0
    #: The first pilot of each node gets a random part of the wall limit (as if it had
    #: started earlier), so that the site's wall limits do not all fall at once.
    stagger_first_pilots: bool = True
    #: Seconds between a pilot's end and the next pilot's start in the freed cores.
    pilot_start_delay: float = 120.0
    #: The site director's pace: every ``director_cycle_seconds`` it sends each site at most
    #: ``director_pilots_per_cycle`` pilots (its per-queue cap), each to the node that has
    #: waited longest for one (0: no director pacing, a pilot is always waiting in the batch
    #: system).
    director_cycle_seconds: float = 0.0
    director_pilots_per_cycle: int = 0
    #: The pilot's defaults (``PilotOptions.margin`` and ``idle_timeout``).
    margin: float = 60.0
    #: A what-if, not a pilot option: the share of its seconds left that a pilot also keeps
    #: free, for jobs that run longer than they asked (bench/match_rules.py measures it).
    margin_share: float = 0.0
    idle_timeout: float = 600.0
    job_classes: tuple[JobClass, ...] = (
        JobClass("short single-core", 0.3, 1, 0.1, 1.0),
        JobClass("single-core", 0.45, 1, 1.0, 20.0),
        JobClass("8-core", 0.25, 8, 0.5, 2.9),
    )
    #: A job runs for its requested wall time times a factor drawn uniformly in this range
    #: (below 1: it ends earlier than it asked; above 1: later, and may hit the wall limit).
    error_min: float = 0.3
    error_max: float = 1.1
    #: Work submitted per hour, as a multiple of the site's capacity (above 1: work waits).
    load: float = 1.1
    #: Seconds between two submissions of new work (each brings that interval's share).
    arrival_seconds: float = 900.0
    #: Work waiting at the start, in hours of the whole site's capacity.
    backlog_hours: float = 6.0
    #: Nodes announcing a shutdown time, per day, and the notice they give (hours); a node
    #: shut down comes back after downtime_hours.
    shutdowns_per_day: float = 10.0
    shutdown_notice_hours: float = 24.0
    downtime_hours: float = 8.0
    #: "Free K nodes" events during the measured period: K nodes chosen by the victim policy
    #: are drained; what still runs at the deadline is killed; they come back out_hours after
    #: the deadline.
    drain_events: int = 7
    drain_nodes: int = 20
    drain_deadline_hours: float = 12.0
    drain_out_hours: float = 24.0
    #: Seconds between two samples of the occupancy over time.
    sample_seconds: float = 1800.0
    #: The matcher's rules, as the task-queue settings set them: the CPU-time segments (a
    #: task queue matches a pilot when its bucket is at most the CPU time per core the pilot
    #: offers); and whether a job's CPU time is bucketed per core (its CPU time / its cores,
    #: the matcher's rule) or in total (the rule before, kept to measure the change).
    cpu_time_segments: tuple[int, ...] = DEFAULT_CPU_SEGMENTS
    cpu_time_per_core: bool = True
    #: The significant bits a job's memory keeps in its task queue's bucket
    #: (``taskqueue.significant_bits``): 3 rounds 2,000 MB up to 2,048, 7 keeps it.
    significant_bits: int = 3

    def __post_init__(self) -> None:
        problems = []
        for name in ("nodes", "cores_per_node"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be at least 1")
        for name in ("wall_limit_hours", "cpu_factor", "days", "sample_seconds",
                     "arrival_seconds"):
            if not getattr(self, name) > 0:
                problems.append(f"{name} must be above 0")
        for name in ("warmup_hours", "pilot_start_delay", "margin", "idle_timeout", "load",
                     "backlog_hours", "shutdowns_per_day", "shutdown_notice_hours",
                     "downtime_hours", "drain_events", "drain_nodes", "drain_deadline_hours",
                     "drain_out_hours"):
            if not getattr(self, name) >= 0:
                problems.append(f"{name} must not be negative")
        if not 0 <= self.margin_share < 1:
            problems.append("margin_share must be at least 0 and below 1")
        if (self.director_cycle_seconds > 0) != (self.director_pilots_per_cycle > 0):
            problems.append("director_cycle_seconds and director_pilots_per_cycle must be "
                            "both above 0 (director pacing) or both 0")
        vos = {vo for vo, _ in self.vo_shares} or {"vo"}
        if any(not share > 0 for _, share in self.vo_shares) or any(
                c.vo not in vos for c in self.job_classes):
            problems.append("vo_shares must be above 0 and name the VO of every job class")
        if any(not h > 0 for h in self.site_wall_limits_hours):
            problems.append("site_wall_limits_hours must all be above 0")
        if self.memory_per_core_rule not in MEMORY_PER_CORE_RULES:
            problems.append(f"memory_per_core_rule must be one of "
                            f"{', '.join(map(repr, MEMORY_PER_CORE_RULES))}")
        if not 1 <= self.significant_bits <= 16:
            problems.append("significant_bits must be between 1 and 16")
        segs = self.cpu_time_segments
        if not segs or segs[0] <= 0 or list(segs) != sorted(set(segs)):
            problems.append("cpu_time_segments must be positive, strictly ascending seconds")
        if not 0 < self.error_min <= self.error_max:
            problems.append("error_min must be above 0 and at most error_max")
        if not self.job_classes:
            problems.append("job_classes must name at least one class")
        for c in self.job_classes:
            if c.cores < 1 or not c.weight > 0 or not 0 < c.hours_min <= c.hours_max:
                problems.append(f"job class {c.name!r}: cores >= 1, weight > 0 and "
                                f"0 < hours_min <= hours_max are needed")
        if self.memory_per_node_mb is not None and (self.memory_per_node_mb < 1 or any(
                c.memory_mb > self.memory_per_node_mb for c in self.job_classes)):
            problems.append("memory_per_node_mb must be at least 1 and at least each job "
                            "class's memory_mb")
        if not 0 <= self.gpu_nodes <= self.nodes or self.gpus_per_node < 0:
            problems.append("gpu_nodes must be between 0 and nodes, gpus_per_node at least 0")
        if any(c.gpus < 0 for c in self.job_classes):
            problems.append("a job class has a negative gpus")
        elif any(c.gpus > (self.gpus_per_node if self.gpu_nodes else 0)
                 for c in self.job_classes):
            problems.append("a job class asks for more GPUs than a node has (gpu_nodes, "
                            "gpus_per_node)")
        if any(c.memory_mb < 0 for c in self.job_classes):
            problems.append("a job class has a negative memory_mb")
        if any(c.cores > self.cores_per_node for c in self.job_classes):
            problems.append("a job class has more cores than a node")
        if problems:
            raise ValueError("; ".join(problems))

    def memory_bound_core_occupancy(self) -> float | None:
        """The most of the cores the job mix can keep busy when its classes run in the shares
        they are submitted in (a class-blind draw): the nodes' memory per core over the memory
        the mix needs per core-hour, at most 1 (None: memory not simulated or asked).

        A class's core-hours are its share times its cores times the mean of its log-uniform
        wall time, ``(max - min) / ln(max / min)``; its memory-hours the same with its memory
        for its cores. The run-time factor (``error_min`` to ``error_max``) is the same for
        every class and cancels out; jobs cut at the wall limit are not counted apart."""
        if self.memory_per_node_mb is None:
            return None
        core_hours = memory_hours = 0.0
        for c in self.job_classes:
            hours = ((c.hours_max - c.hours_min) / math.log(c.hours_max / c.hours_min)
                     if c.hours_max > c.hours_min else c.hours_min)
            core_hours += c.weight * c.cores * hours
            memory_hours += c.weight * c.memory_mb * hours
        if memory_hours <= 0:
            return None
        per_core = self.memory_per_node_mb / self.cores_per_node
        return min(1.0, per_core * core_hours / memory_hours)


@dataclass(frozen=True)
class Policy:
    """The choices compared: asks aware of the time left (or blind to it), how drain victims
    are chosen, and pilots running many payloads (or one each)."""

    name: str
    time_aware: bool = True
    victim: str = "drain"
    multi_payload: bool = True

    def __post_init__(self) -> None:
        if self.victim not in VICTIM_CHOICES:
            raise ValueError(f"victim must be one of {', '.join(VICTIM_CHOICES)}, "
                             f"not {self.victim!r}")


#: The policies of the comparison: the first is the reference; each other one changes one
#: choice.
POLICIES: tuple[Policy, ...] = (
    Policy("multi/aware/drain-cost"),
    Policy("multi/blind/drain-cost", time_aware=False),
    Policy("multi/aware/kill-cost", victim="kill"),
    Policy("multi/aware/random", victim="random"),
    Policy("multi/aware/oldest", victim="oldest"),
    Policy("single/aware/drain-cost", multi_payload=False),
)


@dataclass(frozen=True)
class Preset:
    description: str
    scenario: Scenario
    seeds: tuple[int, ...]
    policies: tuple[Policy, ...] = field(default=POLICIES)


PRESETS: dict[str, Preset] = {
    "drain-week": Preset(
        "a week of a 100-node site with 32-core nodes and 48 h pilots: 5 shutdowns a day "
        "with a day's notice, and a daily 'free 10 nodes within 12 h'",
        replace(Scenario(), nodes=100, drain_nodes=10, shutdowns_per_day=5.0),
        seeds=(1, 2, 3, 4, 5)),
    "big-week": Preset(
        "a week of a 1,000-node site with 32-core nodes (the scale benchmark)",
        replace(Scenario(), nodes=1000, drain_nodes=50, shutdowns_per_day=50.0),
        seeds=(1, 2, 3)),
    "wide-week": Preset(
        "drain-week with memory (64 GB per 32-core node; jobs of 1 to 16 GB), two sites "
        "(48 h and 24 h pilots) and a director sending each site at most 10 pilots every "
        "5 min",
        replace(Scenario(), nodes=100, drain_nodes=10, shutdowns_per_day=5.0,
                memory_per_node_mb=64000, site_wall_limits_hours=(48.0, 24.0),
                director_cycle_seconds=300.0, director_pilots_per_cycle=10,
                job_classes=(JobClass("short single-core", 0.3, 1, 0.1, 1.0, memory_mb=1000),
                             JobClass("single-core", 0.35, 1, 1.0, 20.0, memory_mb=2000),
                             JobClass("big-memory single-core", 0.1, 1, 1.0, 10.0,
                                      memory_mb=6000),
                             JobClass("8-core", 0.25, 8, 0.5, 2.9, memory_mb=16000))),
        seeds=(1, 2, 3, 4, 5)),
    "gpu-week": Preset(
        "drain-week with GPUs: a quarter of the nodes have 4 GPUs each, and one job in 25 "
        "asks for one (1 core, 1 to 10 h): about as many GPU-hours as the site has",
        replace(Scenario(), nodes=100, drain_nodes=10, shutdowns_per_day=5.0, gpu_nodes=25,
                gpus_per_node=4,
                job_classes=(JobClass("short single-core", 0.3, 1, 0.1, 1.0),
                             JobClass("single-core", 0.41, 1, 1.0, 20.0),
                             JobClass("8-core", 0.25, 8, 0.5, 2.9),
                             JobClass("GPU single-core", 0.04, 1, 1.0, 10.0, gpus=1))),
        seeds=(1, 2, 3)),
    "small": Preset(
        "a day of a 10-node site (a quick look)",
        replace(Scenario(), nodes=10, days=1.0, warmup_hours=12.0, shutdowns_per_day=2.0,
                drain_events=2, drain_nodes=2),
        seeds=(1, 2, 3)),
}
