"""The site simulator's speed: a week (after a day of warm-up) of a 1,000-node site with 32-core
nodes and 48 h multi-payload pilots, one policy and one seed, the scale ``gridpilot simulate``
is meant to handle in under a minute.

    .venv/bin/python bench/simulate.py [--nodes 1000] [--policy multi/aware/drain-cost]

Prints one JSON line per run: wall-clock seconds, CPU seconds of this process (the machine may
be shared), events handled, jobs started, and events per CPU second.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from simulator.config import POLICIES, PRESETS
from simulator.engine import simulate

_HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--policy", action="append", default=None,
                        help="policy name (repeatable; default: the reference policy)")
    args = parser.parse_args()
    scenario = dataclasses.replace(PRESETS["big-week"].scenario, nodes=args.nodes,
                                   days=args.days)
    known = {p.name: p for p in POLICIES}
    for name in args.policy or [POLICIES[0].name]:
        wall, cpu = time.perf_counter(), time.process_time()
        result = simulate(scenario, known[name], args.seed)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        print(json.dumps({
            "bench": "simulate", "nodes": scenario.nodes, "cores_per_node":
            scenario.cores_per_node, "days": scenario.days, "policy": name,
            "seed": args.seed, "seconds": round(wall, 2), "cpu_seconds": round(cpu, 2),
            "events": result.events, "jobs_started": result.jobs_started,
            "events_per_cpu_second": round(result.events / cpu) if cpu else None,
            "occupancy": round(result.occupancy, 4)}), flush=True)


if __name__ == "__main__":
    main()
