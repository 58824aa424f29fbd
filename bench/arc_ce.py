"""Pilot submissions through the local ARC-CE (tools/arc-localhost), the cost of one bulk
status poll, and what ended pilots cost, with agents.ce.arcrest over REST and a token.

The jobs submitted declare an input file that is never uploaded, so A-REX holds them (ACCEPTED)
instead of running them: what is measured is the CE taking them, not the fork back end running
a thousand processes. They are killed and cleaned at the end.

    .venv/bin/python bench/arc_ce.py [--jobs 1000] [--bulk 100] [--single 50] [--rounds 5]
                                     [--ended 100] [--ended-only]

Ended pilots (``--ended``) are followed as the pilots loop (agents/pilotstatus.py) follows
them, through agents.ce.arc.ArcCE: pilots that run a few seconds (every fourth one exits 3,
which the CE calls FAILED) and write some 9 KB of standard output; once the CE says all of
them ended, the status poll and the fetch of their outputs are measured (``--rounds`` times:
neither changes anything), then the CE's cleaning of them (once). Each of these lines has
``requests_per_pilot`` and ``ms_per_pilot``; the last one adds them up for the whole end of a
pilot, and divides its milliseconds by the calibration's per request.

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
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from kit import machine_cpu_seconds, tree_cpu_seconds

from agents.ce.adl import job_description
from agents.ce.arc import ArcCE
from agents.ce.arcrest import FINAL_STATES, ArcRestClient
from agents.ce.base import CEPilot, PilotSpec
from agents.ce.config import CEConfig

_HERE = Path(__file__).resolve().parent

ROOT = _HERE.parent
ARC_LOCALHOST = ROOT / "tools" / "arc-localhost"
#: How much of each stream of an ended pilot is kept ([agents] pilot_log_bytes' default).
LOG_BYTES = 1024 * 1024


@dataclass
class Traffic:
    """Requests and bytes a client exchanged (a response hook on its session, which threads
    fetching outputs together call at once)."""

    requests: int = 0
    sent: int = 0
    received: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def hook(self, response: requests.Response, *args: Any, **kwargs: Any) -> None:
        body = response.request.body
        sent = len(body) if isinstance(body, bytes | str) else 0
        received = len(response.content)  # reads the answer: other threads run meanwhile
        with self.lock:
            self.requests += 1
            self.sent += sent
            self.received += received


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


def per_pilot(line: dict[str, Any]) -> dict[str, Any]:
    """``line`` with its requests and milliseconds per unit (an ended pilot)."""
    units = max(line["units"], 1)
    return {**line, "requests_per_pilot": round(line["requests"] / units, 3),
            "ms_per_pilot": round(line["wall_ms"] / units, 3)}


def ended_pilots(env: dict[str, str], count: int, rounds: int, pids: list[int],
                 request_ms: float) -> None:
    """Print what ``count`` ended pilots cost: the poll, their outputs, their cleaning."""
    ce = ArcCE(CEConfig("arc", "arc", endpoint=env["GRIDPILOT_ARC_ENDPOINT"],
                        token_file=env["GRIDPILOT_ARC_TOKEN_FILE"],
                        ca_bundle=env["GRIDPILOT_ARC_CA_BUNDLE"]), timeout=600)
    traffic = Traffic()
    ce.client.statuses([])
    ce.client._session.hooks["response"].append(traffic.hook)
    specs = [PilotSpec(f"bench-{i}", "/bin/sh", ["-c", (
        f"seq 1 2000; echo 'pilot {i} ends'; echo 'gridpilot-pilot: its last words' >&2; "
        f"exit {3 if i % 4 == 3 else 0}")], {}, token=f"token-{i}", queue_name="fork",
        wall_minutes=10) for i in range(count)]
    ids: list[str] = []
    try:
        for start in range(0, count, 100):
            for result in ce.submit(specs[start:start + 100]):
                if not isinstance(result, str):
                    raise SystemExit(f"the CE refused a pilot: {result}")
                ids.append(result)
        pilots = [CEPilot(s.reference, i) for s, i in zip(specs, ids, strict=True)]
        deadline = time.monotonic() + 600
        while not all(s in FINAL_STATES for s in ce.client.statuses(ids).values()):
            if time.monotonic() > deadline:
                raise SystemExit("the pilots did not end within 600 s")
            time.sleep(2)

        def poll() -> int:
            states = ce.states(pilots)
            assert len(states) == count and all(s.exit_code is not None
                                                for s in states.values()), states
            return count

        def outputs() -> int:
            got = ce.outputs(pilots, LOG_BYTES)
            assert all(not isinstance(o, Exception) for o in got.values()), got
            return count

        def clean() -> int:
            ce.clean(pilots)
            return count

        lines = [per_pilot(measure(f"status poll of {count} ended pilots", ce.client, traffic,
                                   pids, poll, rounds)),
                 per_pilot(measure(f"outputs of {count} ended pilots", ce.client, traffic,
                                   pids, outputs, rounds)),
                 per_pilot(measure(f"clean of {count} ended pilots", ce.client, traffic, pids,
                                   clean, 1))]
        for line in lines:
            print(json.dumps(line), flush=True)
        ms = sum(line["ms_per_pilot"] for line in lines)
        print(json.dumps({"bench": "arc_ce", "what": f"end of {count} ended pilots (poll, "
                          "outputs, clean), per pilot", "units": count,
                          "requests_per_pilot": round(sum(line["requests_per_pilot"]
                                                          for line in lines), 3),
                          "ms_per_pilot": round(ms, 3),
                          "calibration_ms_per_request": round(request_ms, 3),
                          "ms_per_pilot_in_requests": round(ms / request_ms, 2)}), flush=True)
        ids.clear()
    finally:
        if ids:
            ce.client.kill(ids)
            ce.client.clean(ids)
        ce.client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000, help="jobs held for the status poll")
    parser.add_argument("--bulk", type=int, default=100, help="jobs per bulk submission")
    parser.add_argument("--single", type=int, default=50, help="jobs submitted one by one")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ended", type=int, default=100, help="ended pilots (0: none)")
    parser.add_argument("--ended-only", action="store_true",
                        help="measure the calibration and the ended pilots only")
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
        calibrated = measure("calibration: GET /rest (20 requests), token", client, traffic,
                             pids, calibration(client), args.rounds)
        print(json.dumps(calibrated), flush=True)
        if args.ended:
            ended_pilots(env, args.ended, args.rounds, pids, calibrated["wall_ms"] / 20)
        if args.ended_only:
            return
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
