"""Memory in ``wide-week``: the reference policy (multi-payload, time-aware asks, drain-cost
victims) with the memory what-ifs of the scenario, over the preset's seeds.

    .venv/bin/python bench/memory_rules.py [--seeds 1,2,3,4,5] [--variant NAME ...]

Prints one JSON line per variant: the memory-bound core occupancy of the mix (the ceiling of
a class-blind draw), core and memory occupancy while work waits, idle cores for want of
memory, jobs killed at the wall limit (mean, 95% interval and per seed), and per job class
the jobs started, their mean wait (hours) and the jobs still waiting at the end (means over
the seeds).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from typing import Any

from simulator.config import POLICIES, PRESETS, Scenario
from simulator.report import Estimate, compare

BASE = PRESETS["wide-week"].scenario

VARIANTS: dict[str, Scenario] = {
    "as-is": BASE,
    "memory-first": dataclasses.replace(BASE, memory_first=True),
    "per-core-binding": dataclasses.replace(BASE, memory_per_core_rule="binding"),
    "per-core-always": dataclasses.replace(BASE, memory_per_core_rule="always"),
    "exact-buckets": dataclasses.replace(BASE, significant_bits=7),
    "exact-buckets-per-core-binding": dataclasses.replace(
        BASE, significant_bits=7, memory_per_core_rule="binding"),
    "exact-buckets-per-core-always": dataclasses.replace(
        BASE, significant_bits=7, memory_per_core_rule="always"),
}


def _figure(values: list[float], digits: int = 2) -> dict[str, Any]:
    e = Estimate.of(values)
    return {"mean": round(e.mean, digits), "ci95": round(e.ci95, digits),
            "per_seed": [round(v, digits) for v in values]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default=",".join(map(str, PRESETS["wide-week"].seeds)))
    parser.add_argument("--variant", action="append", choices=sorted(VARIANTS), default=None)
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    reference = POLICIES[0]
    for name in args.variant or list(VARIANTS):
        scenario = VARIANTS[name]
        runs = compare(scenario, [reference], seeds, workers=args.workers).runs[reference.name]
        classes: dict[str, Any] = {}
        for c in scenario.job_classes:
            waits = [r.mean_wait_hours(c.name) for r in runs]
            classes[c.name] = {
                "started": statistics.fmean(r.started_by_class.get(c.name, 0) for r in runs),
                "mean_wait_hours": _figure([w or 0.0 for w in waits]),
                "waiting_at_end": statistics.fmean(
                    r.waiting_by_class.get(c.name, 0) for r in runs)}
        print(json.dumps({
            "bench": "memory_rules", "variant": name, "seeds": seeds,
            "memory_bound_core_occupancy": round(
                100 * (scenario.memory_bound_core_occupancy() or 1.0), 2),
            "occupancy": _figure([100 * r.occupancy for r in runs]),
            "memory_occupancy": _figure([100 * (r.memory_occupancy or 0.0) for r in runs]),
            "idle_for_memory": _figure(
                [100 * r.idle.get("too little free memory", 0.0) for r in runs]),
            "idle_too_few_cores": _figure(
                [100 * r.idle.get("too few free cores", 0.0) for r in runs]),
            "killed_at_wall_limit": _figure([float(r.killed_at_wall_limit) for r in runs], 1),
            "classes": classes}), flush=True)


if __name__ == "__main__":
    main()
