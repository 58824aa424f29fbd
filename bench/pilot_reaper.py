"""Pilot process tracking benchmark: what one look at the payloads' processes costs.

While payloads run, the pilot scans ``/proc`` about once a second (pilot.reaper) to follow the
processes each payload starts. This starts ``--payloads`` payload-like process trees (a shell
with ``--children`` sleeping children, half of them in sessions of their own), then times
``--repeat`` scans and prints one JSON line: the number of processes on the machine, the
median and worst scan time in ms, and how many processes the families hold. Run from the
repository root::

    .venv/bin/python bench/pilot_reaper.py --payloads 8 --children 10
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time

from pilot.reaper import Reaper, become_subreaper, process_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--payloads", type=int, default=8)
    parser.add_argument("--children", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    become_subreaper()
    reaper = Reaper()
    script = "\n".join(
        [f"{'setsid ' if i % 2 else ''}sleep 600 &" for i in range(args.children)] + ["wait"])
    roots = []
    for job_id in range(1, args.payloads + 1):
        proc = subprocess.Popen(["/bin/sh", "-c", script], start_new_session=True,
                                env={**os.environ, "GRIDPILOT_JOB_ID": str(job_id)})
        roots.append(proc)
        reaper.adopt(job_id, proc.pid)
    time.sleep(1.0)
    times = []
    try:
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            reaper.scan()
            times.append((time.perf_counter() - t0) * 1000)
        members = sum(len(f.members) for f in reaper.families.values())
        print(json.dumps({
            "bench": "pilot_reaper_scan", "processes": len(process_table()),
            "payloads": args.payloads, "tracked": members,
            "median_ms": round(statistics.median(times), 2), "worst_ms": round(max(times), 2)}))
    finally:
        for proc in roots:
            proc.terminate()
            proc.wait()
        reaper.end_all(grace=1.0)


if __name__ == "__main__":
    main()
