"""Pilot payload isolation benchmark: what a sandbox (pilot.isolation) costs a payload.

Each payload is started as the pilot starts it (pilot.payload.start_payload: its folder, its
``$JOBFEATURES``, its output files), bare and in a bubblewrap sandbox, alternately, and waited
for. Printed, one JSON line each:

- ``pilot_isolation_start``: ``/bin/true``, ``--repeat`` times each way: the median and p90 ms
  from the start to its end, bare and isolated, the cost in ms (isolated - bare medians) and
  the ratio isolated / bare; the bare start is the yardstick of this machine, measured in the
  same run (absolute times differ from machine to machine, the ratio much less);
- ``pilot_isolation_job``: a one-second job (``/bin/sleep 1``), ``--jobs`` times each way: the
  median wall time bare and isolated and the difference in ms.

Run from the repository root (bubblewrap installed)::

    .venv/bin/python bench/pilot_isolation.py --repeat 200 --jobs 10
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from pilot.isolation import Isolation, Layout, choose
from pilot.payload import start_payload
from pilot.protocol import JobPayload


def _run(work: Path, job_id: int, argv: list[str], isolation: Isolation | None) -> float:
    """Seconds from the payload's start to its end, as the pilot starts it."""
    job = JobPayload(job_id=job_id, vo="bench", owner="bench", owner_group="bench",
                     job_type="User", executable=argv[0], arguments=argv[1:])
    t0 = time.perf_counter()
    payload = start_payload(job, cores=1, memory_mb=0, root=work, now=time.time(),
                            max_end=time.time() + 600, cpu_factor=None,
                            machine_features=None, base_env=os.environ, isolation=isolation)
    code = payload.wait()
    elapsed = time.perf_counter() - t0
    if code != 0:
        raise SystemExit(f"{argv} ended with exit code {code} "
                         f"({'isolated' if isolation else 'bare'})")
    shutil.rmtree(payload.directory)
    return elapsed


def _pair(work: Path, argv: list[str], repeat: int,
          isolation: Isolation) -> tuple[list[float], list[float]]:
    bare: list[float] = []
    isolated: list[float] = []
    for i in range(repeat):  # alternately: a load that comes and goes hits both alike
        bare.append(_run(work, 2 * i + 1, argv, None) * 1000)
        isolated.append(_run(work, 2 * i + 2, argv, isolation) * 1000)
    return bare, isolated


def _p90(values: list[float]) -> float:
    return sorted(values)[int(0.9 * (len(values) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200, help="starts of /bin/true each way")
    parser.add_argument("--jobs", type=int, default=10, help="one-second jobs each way")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gp-bench-isolation-") as folder:
        work = Path(folder) / "work"
        choice = choose("bwrap", Layout(work))
        if not choice.isolation.isolated:
            raise SystemExit(f"no sandbox: {'; '.join(choice.refused)}")
        tool = choice.isolation.describe()
        _pair(work, ["/bin/true"], 5, choice.isolation)  # warm the caches
        bare, isolated = _pair(work, ["/bin/true"], args.repeat, choice.isolation)
        b, s = statistics.median(bare), statistics.median(isolated)
        print(json.dumps({
            "bench": "pilot_isolation_start", "tool": tool, "runs": args.repeat,
            "bare_median_ms": round(b, 2), "bare_p90_ms": round(_p90(bare), 2),
            "isolated_median_ms": round(s, 2), "isolated_p90_ms": round(_p90(isolated), 2),
            "cost_ms": round(s - b, 2), "ratio": round(s / b, 2),
            "load": os.getloadavg()[0]}))
        bare, isolated = _pair(work, ["/bin/sleep", "1"], args.jobs, choice.isolation)
        b, s = statistics.median(bare), statistics.median(isolated)
        print(json.dumps({
            "bench": "pilot_isolation_job", "tool": tool, "runs": args.jobs,
            "bare_median_ms": round(b, 1), "isolated_median_ms": round(s, 1),
            "cost_ms": round(s - b, 1), "load": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
