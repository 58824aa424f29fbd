"""Run a comparison (every policy on the same seeds) and summarise it: means with 95%
confidence intervals over the seeds, as a table or as JSON."""

from __future__ import annotations

import math
import multiprocessing
import os
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from simulator.config import HOUR, Policy, Scenario
from simulator.engine import IDLE_REASONS, RunResult, simulate

#: Two-sided 95% quantiles of Student's t distribution, by degrees of freedom (1..30).
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
        2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
        2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


@dataclass(frozen=True)
class Estimate:
    """A mean over seeds, the half-width of its 95% confidence interval (0 with one seed),
    and the value of each seed."""

    mean: float
    ci95: float
    per_seed: tuple[float, ...]

    @classmethod
    def of(cls, values: Sequence[float]) -> Estimate:
        mean = statistics.fmean(values)
        n = len(values)
        if n < 2:
            return cls(mean, 0.0, tuple(values))
        t = _T95[min(n - 1, len(_T95)) - 1] if n - 1 <= len(_T95) else 1.960
        return cls(mean, t * statistics.stdev(values) / math.sqrt(n), tuple(values))

    def as_dict(self) -> dict[str, Any]:
        return {"mean": self.mean, "ci95": self.ci95, "per_seed": list(self.per_seed)}


#: The figures of the comparison: JSON key, table heading, how to get it from one run.
FIGURES: tuple[tuple[str, str, Callable[[RunResult], float]], ...] = (
    ("occupancy", "occupancy %", lambda r: 100.0 * r.occupancy),
    ("draining_waste_core_hours", "draining waste core-h", lambda r: r.draining_waste / HOUR),
    ("free_nodes_draining_waste_core_hours", "of it freeing nodes",
     lambda r: sum(d.draining_waste for d in r.drains if d.kind == "free") / HOUR),
    ("kill_waste_core_hours", "kill waste core-h", lambda r: r.kill_waste / HOUR),
    ("jobs_killed_at_wall_limit", "killed at wall limit",
     lambda r: float(r.killed_at_wall_limit)),
    ("jobs_rescheduled", "rescheduled", lambda r: float(r.rescheduled)),
    ("jobs_done", "jobs done", lambda r: float(r.jobs_done)),
)


@dataclass
class Comparison:
    scenario: Scenario
    policies: tuple[Policy, ...]
    seeds: tuple[int, ...]
    runs: dict[str, list[RunResult]]
    seconds: float

    def estimate(self, policy: str, key: str) -> Estimate:
        get = next(f for k, _, f in FIGURES if k == key)
        return Estimate.of([get(r) for r in self.runs[policy]])

    def gpu_occupancy(self, policy: str) -> Estimate | None:
        """GPU-hours used per GPU-hour in service while work waits, % (None: no GPUs)."""
        values = [r.gpu_occupancy for r in self.runs[policy]]
        if any(v is None for v in values):
            return None
        return Estimate.of([100.0 * v for v in values if v is not None])

    def memory_occupancy(self, policy: str) -> Estimate | None:
        """Memory used per memory in service while work waits, % (None: no memory)."""
        values = [r.memory_occupancy for r in self.runs[policy]]
        if any(v is None for v in values):
            return None
        return Estimate.of([100.0 * v for v in values if v is not None])

    def classes(self, policy: str) -> dict[str, dict[str, Any]]:
        """Per job class of the scenario: jobs started in the measured period, the mean
        hours they waited (a run with none started counts 0) and the jobs still waiting at
        the end, over the seeds."""
        runs = self.runs[policy]
        return {c.name: {
            "started": Estimate.of([float(r.started_by_class.get(c.name, 0))
                                    for r in runs]).as_dict(),
            "mean_wait_hours": Estimate.of([r.mean_wait_hours(c.name) or 0.0
                                            for r in runs]).as_dict(),
            "waiting_at_end": Estimate.of([float(r.waiting_by_class.get(c.name, 0))
                                           for r in runs]).as_dict(),
        } for c in self.scenario.job_classes}

    def reduction(self, better: str, worse: str, key: str) -> float | None:
        """1 - mean(better) / mean(worse), over the same seeds (None: a policy is missing or
        the worse one wasted nothing)."""
        if better not in self.runs or worse not in self.runs:
            return None
        worse_mean = self.estimate(worse, key).mean
        if worse_mean <= 0:
            return None
        return 1.0 - self.estimate(better, key).mean / worse_mean

    def paired_reduction(self, better: str, worse: str, key: str) -> Estimate | None:
        """1 - better / worse seed by seed (the policies run on the same random streams), as
        a mean with its 95% interval; None when a policy is missing or no seed of the worse
        one wasted anything."""
        if better not in self.runs or worse not in self.runs:
            return None
        get = next(f for k, _, f in FIGURES if k == key)
        pairs = [(get(b), get(w)) for b, w in zip(self.runs[better], self.runs[worse],
                                                   strict=True) if get(w) > 0]
        return Estimate.of([1.0 - b / w for b, w in pairs]) if pairs else None

    def headline(self) -> dict[str, Any]:
        ref = self.policies[0].name
        paired = self.paired_reduction("multi/aware/drain-cost", "multi/aware/random",
                                       "free_nodes_draining_waste_core_hours")
        return {
            "reference_policy_occupancy": self.estimate(ref, "occupancy").mean
            if ref in self.runs else None,
            "drain_cost_vs_random_draining_waste_reduction": self.reduction(
                "multi/aware/drain-cost", "multi/aware/random",
                "free_nodes_draining_waste_core_hours"),
            "drain_cost_vs_random_total_waste_reduction": _total_reduction(self),
            # Seed by seed (the policies share their random streams), with its interval.
            "drain_cost_vs_random_draining_waste_reduction_paired":
                None if paired is None else paired.as_dict(),
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "scenario": asdict(self.scenario),
            "seeds": list(self.seeds),
            "run_seconds": self.seconds,
            "headline": self.headline(),
            # The most of the cores the mix can keep busy with the memory the nodes have
            # (a class-blind draw; None: memory not simulated), %.
            "memory_bound_core_occupancy": None if (
                bound := self.scenario.memory_bound_core_occupancy()) is None
            else 100.0 * bound,
            "policies": {
                p.name: {
                    "time_aware": p.time_aware, "victim": p.victim,
                    "multi_payload": p.multi_payload,
                    **{key: self.estimate(p.name, key).as_dict() for key, _, _ in FIGURES},
                    **({"gpu_occupancy": gpu.as_dict()}
                       if (gpu := self.gpu_occupancy(p.name)) is not None else {}),
                    **({"memory_occupancy": mem.as_dict()}
                       if (mem := self.memory_occupancy(p.name)) is not None else {}),
                    "job_classes": self.classes(p.name),
                    "idle_share_while_work_waits": {
                        reason: Estimate.of([r.idle.get(reason, 0.0) for r in
                                             self.runs[p.name]]).as_dict()
                        for reason in IDLE_REASONS},
                    "drain_events": [
                        {"time_hours": d.time / HOUR, "kind": d.kind, "nodes": len(d.nodes),
                         "draining_waste_core_hours": d.draining_waste / HOUR,
                         "kill_waste_core_hours": d.kill_waste / HOUR,
                         "predicted_draining_waste_core_hours":
                             d.predicted_draining_waste / HOUR,
                         "predicted_kill_waste_core_hours": d.predicted_kill_waste / HOUR}
                        for d in self.runs[p.name][0].drains if d.kind == "free"],
                } for p in self.policies},
        }


def _total_reduction(c: Comparison) -> float | None:
    if "multi/aware/drain-cost" not in c.runs or "multi/aware/random" not in c.runs:
        return None

    def total(name: str) -> float:
        return (c.estimate(name, "free_nodes_draining_waste_core_hours").mean
                + sum(d.kill_waste for r in c.runs[name] for d in r.drains
                      if d.kind == "free") / HOUR / len(c.runs[name]))

    worse = total("multi/aware/random")
    return None if worse <= 0 else 1.0 - total("multi/aware/drain-cost") / worse


def default_workers() -> int:
    """Processes for a comparison: the cores this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)


def compare(scenario: Scenario, policies: Sequence[Policy], seeds: Sequence[int], *,
            workers: int | None = None) -> Comparison:
    """Every policy on every seed, the runs spread over ``workers`` processes (default: one
    per core; 1: all in this process). Each run depends only on its policy and seed, so the
    figures do not depend on the number of processes."""
    started = time.perf_counter()
    tasks = [(p, seed) for p in policies for seed in seeds]
    workers = min(workers or default_workers(), len(tasks))
    if workers <= 1:
        results = [simulate(scenario, p, seed) for p, seed in tasks]
    else:
        # "spawn": a clean interpreter per worker (no forked locks or threads of the caller).
        # One-payload pilots are the slow runs (a pilot per job, and idle ones coming and
        # going): started first, they do not hold up the end.
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")
                                 ) as pool:
            futures = {i: pool.submit(simulate, scenario, tasks[i][0], tasks[i][1])
                       for i in sorted(range(len(tasks)),
                                       key=lambda i: tasks[i][0].multi_payload)}
            results = [futures[i].result() for i in range(len(tasks))]
    runs: dict[str, list[RunResult]] = {p.name: [] for p in policies}
    for (p, _), result in zip(tasks, results, strict=True):
        runs[p.name].append(result)
    return Comparison(scenario, tuple(policies), tuple(seeds), runs,
                      time.perf_counter() - started)


def _cell(e: Estimate, digits: int) -> str:
    return f"{e.mean:.{digits}f} ± {e.ci95:.{digits}f}"


def _days(days: float) -> str:
    return f"{days:g} day" + ("" if days == 1 else "s")


def reduction_text(red: Estimate) -> str:
    """A reduction with its interval, and a word when the interval does not exclude none."""
    if len(red.per_seed) < 2:
        return f"{100 * red.mean:.0f}% less (one seed: no interval)"
    low, high = red.mean - red.ci95, red.mean + red.ci95
    text = (f"{100 * red.mean:.0f}% less (95% interval {100 * low:.0f}% to {100 * high:.0f}% "
            f"over {len(red.per_seed)} seeds)")
    return text + ("; not significant: the interval includes no reduction" if low <= 0 <= high
                   else "")


def render_table(c: Comparison) -> str:
    """The comparison as a text table (mean ± half-width of the 95% interval over seeds)."""
    shown = [f for f in FIGURES if f[0] != "jobs_done"]
    header = ["policy", *[title for _, title, _ in shown]]
    rows = [header]
    for p in c.policies:
        rows.append([p.name, *[_cell(c.estimate(p.name, key), 2 if key == "occupancy" else 0)
                               for key, _, _ in shown]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                       for i, (cell, w) in enumerate(zip(r, widths, strict=True))).rstrip()
             for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    lines += ["", "idle cores while work waits, % of the cores in service, by reason:"]
    idle_rows = [["policy", *IDLE_REASONS]]
    for p in c.policies:
        idle_rows.append([p.name, *[
            f"{100 * Estimate.of([r.idle.get(k, 0.0) for r in c.runs[p.name]]).mean:.2f}"
            for k in IDLE_REASONS]])
    iw = [max(len(r[i]) for r in idle_rows) for i in range(len(idle_rows[0]))]
    lines += ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                        for i, (cell, w) in enumerate(zip(r, iw, strict=True))).rstrip()
              for r in idle_rows]
    s = c.scenario
    head = c.headline()
    notes = [
        f"{s.nodes} nodes x {s.cores_per_node} cores, {_days(s.days)} after {s.warmup_hours:g} h "
        f"of warm-up, pilots of {s.wall_limit_hours:g} h; seeds {', '.join(map(str, c.seeds))}; "
        f"mean ± 95% interval over seeds; {c.seconds:.1f} s",
    ]
    occ = head["reference_policy_occupancy"]
    if occ is not None:
        notes.append(f"occupancy of multi-payload pilots while work waits: {occ:.2f}%")
    gpu = c.gpu_occupancy(c.policies[0].name) if c.policies[0].name in c.runs else None
    if gpu is not None:
        notes.append(f"GPU occupancy of {c.policies[0].name} while work waits "
                     f"({s.gpu_nodes} nodes x {s.gpus_per_node} GPUs): {_cell(gpu, 2)}%")
    bound = s.memory_bound_core_occupancy()
    ref = c.policies[0].name
    if bound is not None and ref in c.runs:
        mem = c.memory_occupancy(ref)
        occ_ref = c.estimate(ref, "occupancy")
        notes.append(
            f"memory-bound core occupancy of the job mix: {100 * bound:.2f}% (the nodes' "
            f"memory per core over what the mix needs per core-hour); {ref} reaches "
            f"{100 * occ_ref.mean / (100 * bound):.1f}% of it, with "
            + ("" if mem is None else f"{_cell(mem, 2)}% of the memory busy") + " while work "
            "waits")
    if ref in c.runs:
        notes.append(f"per job class, {ref}: jobs started, mean wait (h), waiting at the end")
        for name, figures in c.classes(ref).items():
            notes.append(f"  {name}: {figures['started']['mean']:.0f}, "
                         f"{figures['mean_wait_hours']['mean']:.2f} ± "
                         f"{figures['mean_wait_hours']['ci95']:.2f}, "
                         f"{figures['waiting_at_end']['mean']:.0f}")
    red = c.paired_reduction("multi/aware/drain-cost", "multi/aware/random",
                             "free_nodes_draining_waste_core_hours")
    if red is not None:
        notes.append("draining waste when freeing nodes, drain-cost choice vs random: "
                     + reduction_text(red))
    return "\n".join([*lines, "", *notes]) + "\n"
