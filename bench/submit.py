"""Submission benchmark: jobs stored per second over HTTP, on a real matcher (gunicorn).

For each backend (``--backends``; PostgreSQL and MariaDB from ``--postgres-url`` and
``--mariadb-url``, by default $GRIDPILOT_TEST_POSTGRES_URL and $GRIDPILOT_TEST_MARIADB_URL) a
fresh database is made (``gp_bench_submit_*``, or ``--database-prefix``; dropped at the end;
SQLite: a file in a temporary folder) and migrated, and ``gridpilot serve`` is started on
loopback with ``--workers`` of ``--threads`` each. Then:

- ``bulk_json``: one POST /api/v1/jobs of a JSON list of ``--bulk`` small jobs, ``--repeat``
  times;
- ``parametric``: one POST of a JDL with ``Parameters = --parametric``, ``--repeat`` times;
- ``single``: ``--clients`` processes POST one small JDL each, as fast as they are answered,
  for ``--duration`` seconds, over kept-alive connections (the standard library's
  http.client, which costs a tenth of the CPU requests does, so that the clients do not
  take the server's cores).

One JSON line per measurement on stdout: backend, measure, jobs per request, requests, seconds
and jobs/s (bulk: the median request; single: submissions/s over the run, the clients' CPU
per submission and the machine's busy cores), errors. Run from the
repository root::

    .venv/bin/python bench/submit.py --backends sqlite,postgresql,mariadb
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests
from kit import fresh_database, machine_cpu_seconds

from gridpilot.devserver import matcher_server
from matcher.auth import issue_token

_HERE = Path(__file__).resolve().parent

ROOT = _HERE.parent
SECRET = "bench-submit-secret-0123456789abcdef"
SINGLE_JDL = 'Executable = "/bin/true"; Arguments = "single";'

def base_url_for(backend: str, urls: dict[str, str | None]) -> str:
    """The URL a fresh database of ``backend`` is made from (SQLite needs none)."""
    if backend == "sqlite":
        return "sqlite://"
    base = urls.get(backend)
    if not base:
        raise SystemExit(f"no server URL for {backend}")
    return base


def post(base: str, token: str, body: str, content_type: str) -> tuple[int, float, int]:
    """(status, seconds, jobs stored) of one submission."""
    started = time.perf_counter()
    answer = requests.post(f"{base}/api/v1/jobs", data=body.encode(), timeout=120,
                           headers={"Authorization": f"Bearer {token}",
                                    "Content-Type": content_type})
    seconds = time.perf_counter() - started
    jobs = len(answer.json().get("job_ids", [])) if answer.status_code == 201 else 0
    return answer.status_code, seconds, jobs


def bulk(base: str, token: str, backend: str, measure: str, body: str, content_type: str,
         expected: int, repeat: int, workers: int) -> dict[str, Any]:
    times, errors = [], 0
    for _ in range(repeat):
        status, seconds, jobs = post(base, token, body, content_type)
        if status != 201 or jobs != expected:
            errors += 1
        times.append(seconds)
    median = statistics.median(times)
    return {"bench": "submit", "backend": backend, "measure": measure, "workers": workers,
            "jobs_per_request": expected, "requests": repeat, "seconds_median": round(median, 3),
            "seconds_max": round(max(times), 3), "jobs_per_s": round(expected / median, 1),
            "bytes": len(body.encode()), "errors": errors}


def _single_client(base: str, token: str, end: float, out: Any) -> None:
    """One client process: POST the small JDL over one kept-alive connection until ``end``
    (``time.monotonic``); put (accepted, refused or failed, CPU seconds of this process)."""
    url = urlsplit(base)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=30)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "text/plain"}
    body = SINGLE_JDL.encode()
    ok = bad = 0
    started = time.process_time()
    while time.monotonic() < end:
        try:
            conn.request("POST", "/api/v1/jobs", body=body, headers=headers)
            answer = conn.getresponse()
            answer.read()
            ok, bad = (ok + 1, bad) if answer.status == 201 else (ok, bad + 1)
        except (OSError, http.client.HTTPException):
            bad += 1
            conn.close()
    out.put((ok, bad, time.process_time() - started))


def single(base: str, token: str, backend: str, clients: int, duration: float,
           workers: int) -> dict[str, Any]:
    """``clients`` processes submit one small JDL each at a time, over kept-alive connections
    with the standard library's http.client (as the pilot stream's clients do): a client
    that costs less than the server leaves the machine's cores to the server, whose speed
    is measured. Reports the clients' own CPU per submission and the machine's busy cores."""
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    end = time.monotonic() + duration
    machine = machine_cpu_seconds()
    started = time.perf_counter()
    procs = [context.Process(target=_single_client, args=(base, token, end, out))
             for _ in range(clients)]
    for proc in procs:
        proc.start()
    results = [out.get(timeout=duration + 120) for _ in procs]
    for proc in procs:
        proc.join()
    seconds = time.perf_counter() - started
    now = machine_cpu_seconds()
    busy, total = now[0] - machine[0], now[1] - machine[1]
    done = sum(ok for ok, _, _ in results)
    return {"bench": "submit", "backend": backend, "measure": "single", "workers": workers,
            "threads": int(os.environ.get("GRIDPILOT_MATCHER_THREADS", "1")),
            "clients": clients, "requests": done, "seconds": round(seconds, 2),
            "submissions_per_s": round(done / seconds, 1),
            "errors": sum(bad for _, bad, _ in results),
            "client_cpu_ms_per_request": round(
                sum(cpu for _, _, cpu in results) / max(done, 1) * 1000, 3),
            "busy_cores": round(busy / total * (os.cpu_count() or 1), 2) if total else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", default="sqlite,postgresql,mariadb")
    parser.add_argument("--postgres-url", default=os.environ.get("GRIDPILOT_TEST_POSTGRES_URL"))
    parser.add_argument("--mariadb-url", default=os.environ.get("GRIDPILOT_TEST_MARIADB_URL"))
    parser.add_argument("--database-prefix", default="gp_bench_submit",
                        help="name of the fresh databases, before a random suffix")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4,
                        help="requests each worker serves at once (matcher.threads; its "
                             "default, 4)")
    parser.add_argument("--bulk", type=int, default=1000)
    parser.add_argument("--parametric", type=int, default=10000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--duration", type=float, default=10.0)
    args = parser.parse_args()
    os.environ["GRIDPILOT_MATCHER_THREADS"] = str(args.threads)  # the server's environment
    token = issue_token(SECRET, subject="bench", role="user", vo="lhcb", group="lhcb_user",
                        lifetime=3600)
    bulk_json = json.dumps([{"executable": "/bin/true", "arguments": [str(i)]}
                            for i in range(args.bulk)], separators=(",", ":"))
    parametric = (f'Executable = "/bin/echo"; Arguments = "%n"; '
                  f"Parameters = {args.parametric};")
    urls = {"postgresql": args.postgres_url, "mariadb": args.mariadb_url}
    for backend in args.backends.split(","):
        with tempfile.TemporaryDirectory(prefix="gp-bench-submit-") as tmp, \
                fresh_database(base_url_for(backend, urls), prefix=args.database_prefix,
                               tmpdir=Path(tmp)) as db, \
                matcher_server(db.url, SECRET, ROOT / "conf" / "resources.toml", Path(tmp),
                               workers=args.workers) as base:
            post(base, token, SINGLE_JDL, "text/plain")  # warm up
            for record in (
                bulk(base, token, backend, "bulk_json", bulk_json, "application/json",
                     args.bulk, args.repeat, args.workers),
                bulk(base, token, backend, "parametric", parametric, "text/plain",
                     args.parametric, args.repeat, args.workers),
                single(base, token, backend, args.clients, args.duration, args.workers),
            ):
                print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
