"""The match rules measured with the site simulator, each on its own: the reference policy
(multi-payload pilots, time-aware asks, drain-cost victims) of a preset, with the rule before,
each rule changed alone, and all of them, on the same seeds.

    .venv/bin/python bench/match_rules.py [--preset drain-week] [--segments 3600,7200,...]

Prints one JSON line per variant: occupancy of multi-payload pilots while work waits (mean and
half-width of its 95% interval over the seeds, per seed), jobs killed at the wall limit, the
idle shares by reason, and the seconds the variant took.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from simulator.config import POLICIES, PRESETS, Scenario
from simulator.report import compare

_HERE = Path(__file__).resolve().parent

#: The segments before finer ones below a day (taskqueue's default until then).
OLD_SEGMENTS = (360, 1800, 3600, 21600, 43200, 86400, 172800, 259200, 345600, 518400, 691200,
                864000, 1080000)


def variants(base: Scenario, segments: tuple[int, ...] | None) -> dict[str, Scenario]:
    before = dataclasses.replace(base, cpu_time_segments=OLD_SEGMENTS, cpu_time_per_core=False)
    fine = segments or base.cpu_time_segments
    return {
        "before": before,
        "per-core CPU time": dataclasses.replace(before, cpu_time_per_core=True),
        "finer segments": dataclasses.replace(before, cpu_time_segments=fine),
        "both": dataclasses.replace(before, cpu_time_per_core=True, cpu_time_segments=fine),
        # What-ifs: the pilot also keeping a share of its time left free.
        "both, 3% of the time left kept": dataclasses.replace(
            before, cpu_time_per_core=True, cpu_time_segments=fine, margin_share=0.03),
        "both, 5% of the time left kept": dataclasses.replace(
            before, cpu_time_per_core=True, cpu_time_segments=fine, margin_share=0.05),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="drain-week", choices=sorted(PRESETS))
    parser.add_argument("--segments", default=None,
                        help="comma-separated CPU-time segments of the 'finer' variant "
                        "(default: taskqueue's default)")
    parser.add_argument("--only", action="append", default=None, help="variant name")
    args = parser.parse_args()
    preset = PRESETS[args.preset]
    segments = (tuple(int(x) for x in args.segments.split(",")) if args.segments else None)
    for name, scenario in variants(preset.scenario, segments).items():
        if args.only and name not in args.only:
            continue
        started = time.perf_counter()
        c = compare(scenario, POLICIES[:1], preset.seeds)
        policy = c.as_dict()["policies"][POLICIES[0].name]
        print(json.dumps({
            "variant": name, "preset": args.preset,
            "occupancy": {k: policy["occupancy"][k] for k in ("mean", "ci95", "per_seed")},
            "jobs_killed_at_wall_limit": policy["jobs_killed_at_wall_limit"]["mean"],
            "idle_percent": {k: round(100 * v["mean"], 2) for k, v in
                             policy["idle_share_while_work_waits"].items()},
            "seconds": round(time.perf_counter() - started, 1)}), flush=True)


if __name__ == "__main__":
    main()
