"""Pilot submissions through the local ARC-CE (tools/arc-localhost) and the cost of one bulk
status poll, with agents.ce.arcrest over REST and a token.

The jobs submitted declare an input file that is never uploaded, so A-REX holds them (ACCEPTED)
instead of running them: what is measured is the CE taking them, not the fork back end running
a thousand processes. They are killed and cleaned at the end.

    .venv/bin/python bench/arc_ce.py [--jobs 1000] [--bulk 100] [--single 50] [--rounds 5]

Prints one JSON line per measurement, each with the same run's calibration (a GET of the CE's
REST version list, the cheapest authenticated request): milliseconds per request, the client's
CPU, A-REX's CPU (its two daemons and their children, the information provider included) and
the bytes sent and received; the machine's busy cores and load average say how loaded it was.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
from kit import machine_cpu_seconds, tree_cpu_seconds

from agents.ce.adl import job_description
from agents.ce.arcrest import ArcRestClient

_HERE = Path(__file__).resolve().parent

ROOT = _HERE.parent
ARC_LOCALHOST = ROOT / "tools" / "arc-localhost"


@dataclass
class Traffic:
    """Requests and bytes a client exchanged (a response hook on its session)."""

    requests: int = 0
    sent: int = 0
    received: int = 0

    def hook(self, response: requests.Response, *args: Any, **kwargs: Any) -> None:
        self.requests += 1
        body = response.request.body
        self.sent += len(body) if isinstance(body, bytes | str) else 0
        self.received += len(response.content)


def local_ce() -> dict[str, str]:
    subprocess.run([str(ARC_LOCALHOST), "up"], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    out = subprocess.run([str(ARC_LOCALHOST), "env"], check=True, cwd=ROOT, text=True,
                         capture_output=True).stdout
    return dict(line.removeprefix("export ").split("=", 1) for line in out.splitlines())


def arex_pids(work: Path) -> list[int]:
    return [int((work / "run" / name).read_text()) for name in ("arex-ws.pid", "arex.pid")]


def measure(label: str, client: ArcRestClient, traffic: Traffic, pids: list[int],
            action: Callable[[], int], rounds: int) -> dict[str, Any]:
    """Run ``action`` ``rounds`` times (it returns how many units it did); medians per round."""
    walls, cpus, arex, sent, received, reqs, units = [], [], [], [], [], [], 0
    busy0, total0 = machine_cpu_seconds()
    for _ in range(rounds):
        traffic.requests = traffic.sent = traffic.received = 0
        a0 = sum(tree_cpu_seconds(p) for p in pids)
        c0, t0 = time.process_time(), time.perf_counter()
        units = action()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        arex.append(sum(tree_cpu_seconds(p) for p in pids) - a0)
        sent.append(traffic.sent)
        received.append(traffic.received)
        reqs.append(traffic.requests)
    busy1, total1 = machine_cpu_seconds()
    wall = statistics.median(walls)
    return {"bench": "arc_ce", "what": label, "units": units, "rounds": rounds,
            "requests": statistics.median(reqs), "wall_ms": round(wall * 1000, 2),
            "per_second": round(units / wall, 1) if wall else None,
            "client_cpu_ms": round(statistics.median(cpus) * 1000, 2),
            "arex_cpu_ms": round(statistics.median(arex) * 1000, 2),
            "bytes_sent": statistics.median(sent), "bytes_received": statistics.median(received),
            "machine_busy_cores": round((busy1 - busy0) / max(total1 - total0, 1e-9)
                                        * (os.cpu_count() or 1), 2),
            "loadavg_1m": round(os.getloadavg()[0], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000, help="jobs held for the status poll")
    parser.add_argument("--bulk", type=int, default=100, help="jobs per bulk submission")
    parser.add_argument("--single", type=int, default=50, help="jobs submitted one by one")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    env = local_ce()
    work = Path(env["GRIDPILOT_ARC_DIR"])
    client = ArcRestClient(env["GRIDPILOT_ARC_ENDPOINT"],
                           token_file=Path(env["GRIDPILOT_ARC_TOKEN_FILE"]),
                           ca_bundle=Path(env["GRIDPILOT_ARC_CA_BUNDLE"]), timeout=600)
    proxied = ArcRestClient(env["GRIDPILOT_ARC_ENDPOINT"],
                            proxy_file=Path(env["GRIDPILOT_ARC_PROXY"]),
                            ca_bundle=Path(env["GRIDPILOT_ARC_CA_BUNDLE"]), timeout=600)
    traffic, proxy_traffic = Traffic(), Traffic()
    for c, t in ((client, traffic), (proxied, proxy_traffic)):
        c.statuses([])  # the session made, the REST version asked once
        c._session.hooks["response"].append(t.hook)
    proxied.delegation()
    pids = arex_pids(work)
    held = job_description("/bin/true", queue="fork", wall_minutes=10,
                           input_files=["never-uploaded"])
    submitted: list[str] = []
    proxy_jobs: list[str] = []

    def calibration(c: ArcRestClient) -> Callable[[], int]:
        def run() -> int:
            for _ in range(20):
                c._request("GET", "", versioned=False)
            return 20
        return run

    def submit(count: int, per_request: int, c: ArcRestClient = client) -> Callable[[], int]:
        def run() -> int:
            done = 0
            while done < count:
                n = min(per_request, count - done)
                results = c.submit([held] * n)
                bad = [r for r in results if not isinstance(r, str)]
                if bad:
                    raise SystemExit(f"the CE refused jobs: {bad[0]}")
                submitted.extend(str(r) for r in results)
                done += n
            return count
        return run

    try:
        print(json.dumps(measure("calibration: GET /rest (20 requests), token", client,
                                 traffic, pids, calibration(client), args.rounds)), flush=True)
        print(json.dumps(measure("calibration: GET /rest (20 requests), proxy", proxied,
                                 proxy_traffic, pids, calibration(proxied), args.rounds)),
              flush=True)
        print(json.dumps(measure(f"submit one by one ({args.single} jobs)", client, traffic,
                                 pids, submit(args.single, 1), args.rounds)), flush=True)
        print(json.dumps(measure(f"submit in bulks of {args.bulk} ({args.bulk} jobs)", client,
                                 traffic, pids, submit(args.bulk, args.bulk), args.rounds)),
              flush=True)
        print(json.dumps(measure(f"submit in bulks of {args.bulk} ({args.bulk} jobs), proxy "
                                 f"and its delegation", proxied, proxy_traffic, pids,
                                 submit(args.bulk, args.bulk, proxied), args.rounds)), flush=True)
        proxy_jobs = submitted[-args.bulk * args.rounds:]
        del submitted[-args.bulk * args.rounds:]
        missing = args.jobs - len(submitted)
        if missing > 0:
            submit(missing, args.bulk)()
        ids = submitted[:args.jobs]

        def poll_ids() -> int:
            states = client.statuses(ids)
            assert len(states) == len(ids)
            return len(ids)

        def poll_all() -> int:
            return len(client.statuses(None))

        print(json.dumps(measure(f"status of {len(ids)} jobs by id (one request)", client,
                                 traffic, pids, poll_ids, args.rounds)), flush=True)
        print(json.dumps(measure("status of every job of the identity (one request)", client,
                                 traffic, pids, poll_all, args.rounds)), flush=True)
    finally:
        for c, jobs in ((client, submitted), (proxied, proxy_jobs)):
            for start in range(0, len(jobs), 500):
                chunk = jobs[start:start + 500]
                c.kill(chunk)
                c.clean(chunk)


if __name__ == "__main__":
    main()
