"""Sizing of the deployment: what one matcher instance, the database and the proxies each need
per 1,000 claims/s, measured on this machine, with a calibration taken in the same run.

tools/topology brings the deployment up in a folder of its own (one matcher instance of
``--workers`` gunicorn workers, 4 threads each; PgBouncer in transaction mode; HAProxy; nginx
with TLS) over a database of its own on ``--postgres``; its agents, Prometheus and
Alertmanager are stopped (their loops and scrapes would be counted). ``--jobs`` waiting jobs
are submitted (parametric JDLs, a few owners). Then the same stream of match requests (one
job each, ``--clients`` clients in spawned processes, each on one kept-alive connection) runs
three ways, ``--warmup`` seconds not counted and ``--duration`` seconds measured:

  direct     clients -> a matcher instance -> PostgreSQL (a `gridpilot serve` started here over
             the database itself: prepared statements, no pooler)
  pgbouncer  clients -> the topology's matcher instance -> PgBouncer -> PostgreSQL
  balanced   clients -> nginx (TLS) -> HAProxy -> that instance -> PgBouncer -> PostgreSQL

For each, one JSON line on stdout: claims/s and latency (p50, p99), and the CPU each part used
per claim, from /proc: the matcher (gunicorn and its workers), the PostgreSQL backends of the
database, PgBouncer, HAProxy, nginx, the clients, and the machine's busy cores. CPU ms per claim
is also the cores that part needs per 1,000 claims/s. Connections: the PostgreSQL backends of
the database, PgBouncer's client and server connections (at most, sampled each second).

Calibration, in the same run: the median wall time of one durable single-row commit on the same
PostgreSQL (INSERT and COMMIT in autocommit, 200 times), and the CPU time of a fixed piece of
Python (json round trips), so that runs on other machines or under other loads compare through
the ratios printed with them. The machine's load (1-minute average, busy cores) is printed
too: on a shared machine the claims/s are those of what was left of it, the CPU per claim much
less so. Run from the repository root, as root (the daemons run as nobody)::

    .venv/bin/python bench/topology.py --postgres postgresql://postgres@127.0.0.1:5432/postgres
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kit import log, machine_cpu_seconds, proc_stat, tree_cpu_seconds
from sqlalchemy import text

from matcher.auth import issue_token
from taskqueue.db.database import make_engine

_HERE = Path(__file__).resolve().parent

ROOT = _HERE.parent
TOOL = ROOT / "tools" / "topology"
SITE = "LCG.CERN.cern"
MATCH_PATH = "/api/v1/pilots/match"

# -- clients ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Target:
    name: str
    host: str
    port: int
    tls_ca: str | None = None


def _client(target: Target, token: str, reference: str, t_warm: float, t_end: float,
            out: list[float], errors: list[str]) -> None:
    body = json.dumps({"resource": {"vo": "lhcb", "site": SITE, "ce": "ce503.cern.ch",
                                    "pilot_reference": reference, "cpu_time": 10**6},
                       "count": 1}).encode()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    conn: http.client.HTTPConnection
    if target.tls_ca:
        context = ssl.create_default_context(cafile=target.tls_ca)
        conn = http.client.HTTPSConnection(target.host, target.port, timeout=60,
                                           context=context)
    else:
        conn = http.client.HTTPConnection(target.host, target.port, timeout=60)
    while (started := time.monotonic()) < t_end:
        t0 = time.perf_counter()
        try:
            conn.request("POST", MATCH_PATH, body, headers)
            answer = conn.getresponse()
            data = answer.read()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            errors.append(repr(exc))
            time.sleep(0.05)
            continue
        elapsed = time.perf_counter() - t0
        if answer.status != 200 or not json.loads(data).get("jobs"):
            if started >= t_warm:
                errors.append(f"{answer.status}: {data[:200]!r}")
            continue
        if started >= t_warm:
            out.append(elapsed)
    conn.close()


def client_process(target: Target, token: str, first: int, threads: int, t_warm: float,
                   t_end: float, results: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    latencies: list[float] = []
    errors: list[str] = []
    workers = [threading.Thread(target=_client, args=(target, token, f"sizing-{first + i}",
                                                      t_warm, t_end, latencies, errors))
               for i in range(threads)]
    for w in workers:
        w.start()
    while time.monotonic() < t_warm:
        time.sleep(0.05)
    cpu0 = time.process_time()
    for w in workers:
        w.join()
    results.put({"latencies": latencies, "errors": errors[:5], "error_count": len(errors),
                 "cpu": time.process_time() - cpu0})


# -- CPU of the parts ------------------------------------------------------------------------

def backends(engine: Any, database: str) -> dict[int, float]:
    """CPU seconds of the PostgreSQL backends connected to ``database`` (not this one)."""
    with engine.connect() as conn:
        pids = list(conn.execute(text(
            "SELECT pid FROM pg_stat_activity WHERE datname = :d AND pid <> pg_backend_pid()"),
            {"d": database}).scalars())
    out = {}
    for pid in pids:
        stat = proc_stat(pid)
        if stat is not None:
            out[pid] = stat[1]
    return out


@dataclass
class Sample:
    at: float
    parts: dict[str, float]
    backends: dict[int, float]
    busy: float


def sample(pids: dict[str, int], engine: Any, database: str) -> Sample:
    busy, _ = machine_cpu_seconds()
    return Sample(time.monotonic(), {name: tree_cpu_seconds(pid) for name, pid in pids.items()},
                  backends(engine, database), busy)


class ConnectionWatch:
    """The most connections seen, sampled each second: the database's backends, PgBouncer's
    clients and servers."""

    def __init__(self, state: dict[str, Any], engine: Any) -> None:
        self.state, self.engine = state, engine
        self.most = {"postgres_backends": 0, "pgbouncer_clients": 0, "pgbouncer_servers": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ConnectionWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            try:
                self._sample()
            except Exception as exc:  # a sample lost is no result lost
                log(f"connection sample failed: {exc}")

    def _sample(self) -> None:
        with self.engine.connect() as conn:
            n = conn.execute(text("SELECT count(*) FROM pg_stat_activity WHERE datname = :d "
                                  "AND pid <> pg_backend_pid()"),
                             {"d": self.state["database"]}).scalar_one()
        self.most["postgres_backends"] = max(self.most["postgres_backends"], int(n))
        done = subprocess.run(
            ["psql", "-X", "-A", "-t", "-F", "\t", "-h", "127.0.0.1", "-p",
             str(self.state["ports"]["pgbouncer"]), "-U", "gpadmin", "-d", "pgbouncer", "-c",
             "SHOW POOLS"], capture_output=True, text=True, timeout=30,
            env={**os.environ, "PGPASSWORD": self.state["passwords"]["gpadmin"]})
        for line in done.stdout.splitlines():
            cols = line.split("\t")
            if cols[0] == self.state["database"]:
                clients = int(cols[2]) + int(cols[3])
                servers = int(cols[6]) + int(cols[9]) + int(cols[10])
                self.most["pgbouncer_clients"] = max(self.most["pgbouncer_clients"], clients)
                self.most["pgbouncer_servers"] = max(self.most["pgbouncer_servers"], servers)


# -- calibration -----------------------------------------------------------------------------

def commit_calibration(url: str, n: int = 200) -> float:
    """Median ms of one durable single-row commit on the server."""
    engine = make_engine(url, pool_size=1, autocommit=True)
    try:
        with engine.connect() as conn:
            conn.execute(text("CREATE TABLE IF NOT EXISTS sizing_calibration "
                              "(id bigserial PRIMARY KEY, at timestamptz)"))
            times = []
            for _ in range(n):
                t0 = time.perf_counter()
                conn.execute(text("INSERT INTO sizing_calibration (at) VALUES (now())"))
                times.append(time.perf_counter() - t0)
    finally:
        engine.dispose()
    return statistics.median(times) * 1000


def python_calibration() -> float:
    """CPU ms of a fixed piece of Python: 2,000 JSON round trips of a small document."""
    document = {"resource": {"vo": "lhcb", "site": SITE, "tags": ["a", "b"], "cpu": 10**6},
                "count": 1, "jobs": [{"id": i, "name": f"job-{i}"} for i in range(20)]}
    best = float("inf")
    for _ in range(5):
        t0 = time.process_time()
        for _ in range(2000):
            json.loads(json.dumps(document))
        best = min(best, time.process_time() - t0)
    return best * 1000


# -- the run ---------------------------------------------------------------------------------

def tool(folder: Path, *args: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, str(TOOL), *args, "--dir", str(folder)],
                          capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"tools/topology {' '.join(args)} failed: {done.stderr}")
    state: dict[str, Any] = json.loads((folder / "state.json").read_text())
    return state


def submit_jobs(port: int, token: str, jobs: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    left = jobs
    while left > 0:
        n = min(left, 5000)
        jdl = (f'[Executable = "sizing.sh"; Site = "{SITE}"; CPUTime = 3600; '
               f'Parameters = {n}; JobName = "sizing-%n";]')
        conn.request("POST", "/api/v1/jobs", jdl.encode(),
                     {"Authorization": f"Bearer {token}", "Content-Type": "text/plain"})
        answer = conn.getresponse()
        body = answer.read()
        if answer.status != 201:
            raise SystemExit(f"submission refused: {answer.status} {body[:300]!r}")
        left -= n
    conn.close()


def direct_server(state: dict[str, Any], folder: Path, workers: int
                  ) -> tuple[subprocess.Popen[bytes], int]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    env = {**os.environ, "GRIDPILOT_DATABASE_URL": state["direct_url"],
           "GRIDPILOT_AUTH_SECRET": state["secret"],
           "GRIDPILOT_RESOURCES_FILE": str(ROOT / "conf" / "resources.toml"),
           "GRIDPILOT_MATCHER_METRICS_DIR": str(folder / "direct-metrics")}
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "gridpilot"), "--config",
         str(ROOT / "conf" / "gridpilot.toml"), "serve", "--bind", f"127.0.0.1:{port}",
         "--workers", str(workers)], env=env, cwd=folder, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return process, port
        except OSError:
            pass
        time.sleep(0.3)
    process.kill()
    raise SystemExit("the direct matcher did not start")


def measure(target: Target, token: str, args: argparse.Namespace, pids: dict[str, int],
            state: dict[str, Any], engine: Any) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    results: Any = ctx.Queue()
    per = max(1, args.clients // args.client_processes)
    start = time.monotonic() + 3.0  # the processes' start-up
    t_warm, t_end = start + args.warmup, start + args.warmup + args.duration
    processes = [ctx.Process(target=client_process, args=(target, token, i * per, per, t_warm,
                                                         t_end, results))
                 for i in range(args.client_processes)]
    for p in processes:
        p.start()
    with ConnectionWatch(state, engine) as watch:
        while time.monotonic() < t_warm:
            time.sleep(0.01)
        load = os.getloadavg()[0]
        before = sample(pids, engine, state["database"])
        while time.monotonic() < t_end:
            time.sleep(0.05)
        after = sample(pids, engine, state["database"])
        outs = [results.get(timeout=120) for _ in processes]
    for p in processes:
        p.join(timeout=60)
    latencies = sorted(x for out in outs for x in out["latencies"])
    claims = len(latencies)
    seconds = after.at - before.at

    def ms_per_claim(cpu: float) -> float | None:
        return round(cpu * 1000 / claims, 3) if claims else None

    backend_cpu = sum(cpu - before.backends.get(pid, 0.0) for pid, cpu in after.backends.items())
    parts = {name: ms_per_claim(after.parts[name] - before.parts[name]) for name in pids}
    return {
        "measure": "sizing", "path": target.name, "workers": args.workers,
        "clients": per * args.client_processes, "claims": claims,
        "claims_per_s": round(claims / seconds, 1),
        "p50_ms": round(latencies[len(latencies) // 2] * 1000, 2) if latencies else None,
        "p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 2) if latencies else None,
        "errors": sum(out["error_count"] for out in outs),
        "error_samples": [e for out in outs for e in out["errors"]][:3],
        "cpu_ms_per_claim": {**parts, "postgres_backends": ms_per_claim(backend_cpu),
                             "clients": ms_per_claim(sum(out["cpu"] for out in outs))},
        "machine": {"cores": os.cpu_count(), "busy_cores": round((after.busy - before.busy)
                                                                 / seconds, 2),
                    "load_1min": round(load, 2)},
        "connections_at_most": dict(watch.most),
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--jobs", type=int, default=40000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--client-processes", type=int, default=2)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--duration", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=1,
                        help="times each path is measured, the paths taken in turn")
    parser.add_argument("--paths", default="direct,pgbouncer,balanced")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    folder = Path(tempfile.mkdtemp(prefix="gridpilot-sizing-"))
    folder.chmod(0o755)
    direct: subprocess.Popen[bytes] | None = None
    try:
        log(f"tools/topology up in {folder}")
        state = tool(folder, "up", "--matchers", "1", "--workers", str(args.workers),
                     "--postgres", args.postgres)
        for name in ("prometheus", "alertmanager", "agents"):
            state = tool(folder, "stop", name)
        secret = state["secret"]
        user = issue_token(secret, subject="sizing", role="user", vo="lhcb",
                           group="lhcb_user", lifetime=7200)
        pilot = issue_token(secret, subject="sizing-pilots", role="pilot", vo="lhcb",
                            group="lhcb_pilot", lifetime=7200, site=SITE)
        log(f"submitting {args.jobs} jobs")
        submit_jobs(state["ports"]["matcher-1"], user, args.jobs)
        engine = make_engine(state["direct_url"], pool_size=2)
        direct, direct_port = direct_server(state, folder, args.workers)
        calibration = {"durable_commit_ms": round(commit_calibration(state["direct_url"]), 3),
                       "python_json_ms": round(python_calibration(), 1)}
        print(json.dumps({"measure": "calibration", **calibration}), flush=True)
        pids = state["pids"]
        targets = {
            "direct": (Target("direct", "127.0.0.1", direct_port), {"matcher": direct.pid}),
            "pgbouncer": (Target("pgbouncer", "127.0.0.1", state["ports"]["matcher-1"]),
                          {"matcher": pids["matcher-1"], "pgbouncer": pids["pgbouncer"]}),
            "balanced": (Target("balanced", "localhost", state["ports"]["nginx"],
                                tls_ca=state["ca"]),
                         {"matcher": pids["matcher-1"], "pgbouncer": pids["pgbouncer"],
                          "haproxy": pids["haproxy"], "nginx": pids["nginx"]}),
        }
        for _ in range(args.rounds):
            for path in args.paths.split(","):
                target, parts = targets[path]
                record = measure(target, pilot, args, parts, state, engine)
                cpu = record["cpu_ms_per_claim"]
                record["ratios"] = {
                    "matcher_cpu_per_claim_in_python_units": round(
                        cpu["matcher"] / calibration["python_json_ms"], 4)
                    if cpu["matcher"] else None,
                    "postgres_cpu_per_claim_in_commits": round(
                        cpu["postgres_backends"] / calibration["durable_commit_ms"], 3)
                    if cpu["postgres_backends"] else None,
                }
                print(json.dumps(record), flush=True)
                log(f"{path}: {record['claims_per_s']} claims/s, p99 {record['p99_ms']} ms, "
                    f"cpu ms/claim {cpu}, busy {record['machine']['busy_cores']} cores")
        engine.dispose()
    finally:
        if direct is not None:
            os.killpg(direct.pid, signal.SIGTERM)
            direct.wait(timeout=60)
        subprocess.run([sys.executable, str(TOOL), "down", "--dir", str(folder)],
                       capture_output=True, timeout=300)
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
