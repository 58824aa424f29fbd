"""Matcher benchmark: end-to-end HTTP matching, real gunicorn server, concurrent pilot clients.

A fresh database (``gp_bench_*`` on a server, dropped at the end unless ``--keep``) is loaded
with ``--jobs`` waiting jobs over ``--queues`` task queues by bench/queue_ops.py's own code: the
first ``--insert-jobs`` through the library's insert path (which creates the queues), the rest
by bulk load (COPY on PostgreSQL); the fair share is recomputed once and the planner statistics
refreshed. Then, for each gunicorn worker count (``--workers``), the matcher is started as a
real subprocess on loopback (``python -m gridpilot --config ... serve --bind 127.0.0.1:PORT
--workers W``), and for each jobs-per-request count (``--counts``) ``--clients`` pilot clients
POST /api/v1/pilots/match as fast as they are answered for ``--warmup`` seconds (not counted)
and then ``--duration`` seconds (measured). Before every measurement the jobs the previous one
took are put back by the same bulk load (task queues it emptied are reactivated as an insert
would), so that each one starts with ``--jobs`` waiting, and the tables are vacuumed and
analysed (autovacuum may be off on a test server; ``--no-vacuum`` skips this).

Clients are cheap: spawned processes (``--client-processes``, default one per client) that
import only the standard library, each client one ``http.client.HTTPConnection`` (kept alive
when the server allows it; gunicorn's sync workers close it after each answer, so every request
pays a loopback TCP connect, as a real pilot does), latency timed with ``time.perf_counter``
around request and answer. Every pilot client sends the same generic resource (VO lhcb, one
site, a CPU time above the jobs', owner group and tags ANY) with its own pilot reference.

In process. Before each HTTP measurement, the same work without HTTP (``--in-process``):
as many processes as gunicorn workers, each built as a worker is (gridpilot.server.worker_app)
with the worker's threads (matcher.threads), each thread doing back to back what the match
view does for the same pilot (``view``: read the resource, match_for_pilot, read the payloads,
encode the answer) or calling the Flask app as gunicorn would, with the token and body but no
socket (``wsgi``). Each HTTP line then carries ``http_share`` (its requests/s over the
``view`` rate just measured), ``http_cpu_share`` (the matcher's CPU per match in process over
its CPU per match over HTTP: the share where the matcher's CPU is the limit and the clients run
elsewhere) and ``http_machine_share`` (the same with the database's and the clients' CPU: the
share where all of them share this machine's cores); and every line its ratios to the
calibration of the same run (bench/calibration.py). ``--other-code DIR`` measures, in turn
with this tree's, a matcher run from the sources in DIR (an A/B of two versions).

Output. One JSON line per measurement on stdout (``"measure": "match_http"``): workers, clients,
count, requests and requests/s (answers 200 in the measured window, matched or not), matched
jobs and jobs/s, p50/p90/p99/max latency in ms (of the 200 answers), no-match answers by reason,
errors (non-200 answers and failed connections), the waiting jobs before and after, where the
CPU went (gunicorn processes, the PostgreSQL backends of the benchmark database, the clients,
and everything else on the machine, in cores and in ms per request), the server's own view
from GET /metrics (requests, mean handling time, share within 50 ms) and whether the target
(``--target-rps`` requests/s with p99 <= ``--target-p99-ms``) is met. Lines from
bench/queue_ops.py's functions (server description, insert, bulk_fill, recompute_priorities)
come first. Progress and a final human-readable table go to stderr. Run from the repository
root::

    .venv/bin/python bench/matcher_http.py --url postgresql+psycopg://postgres@127.0.0.1:5432/test

Small and quick (a development check)::

    .venv/bin/python bench/matcher_http.py --jobs 20000 --duration 5 --workers 1,2
"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import multiprocessing as mp
import os
import platform
import queue
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import calibration as cal
import queue_ops
from kit import (
    backend_of,
    children_of,
    emit,
    end_on_signals,
    fresh_database,
    int_list,
    log,
    machine_cpu_seconds,
    percentile_ms,
    postgres_default,
    proc_stat,
    process_comm,
    rate,
    store_missing_payloads,
    tree_cpu_seconds,
    url_option,
)

_HERE = Path(__file__).resolve().parent

if TYPE_CHECKING:
    from multiprocessing.synchronize import Barrier, Event

    from sqlalchemy import Engine

    from taskqueue.core.settings import Settings

# Only the standard library is imported at module level: spawned client processes import this
# module, and they must stay small. The database and server code is imported where it is used.

ROOT = _HERE.parent
MATCH_PATH = "/api/v1/pilots/match"
HOST = "127.0.0.1"
VO = "lhcb"
SITE = "LCG.CERN.cern"
CE = "ce1.cern.ch"
#: Above the bench jobs' CPU time (86,400 s), so that every queue matches.
CPU_TIME = 200_000
#: Tokens outlive any run.
TOKEN_LIFETIME = 7 * 86400
#: At most this many error texts are kept per client (the count is always exact).
ERROR_SAMPLES = 3


# --------------------------------------------------------------------------- clients


@dataclass(frozen=True)
class ClientSpec:
    """What one pilot client does."""

    index: int
    host: str
    port: int
    token: str
    count: int
    reference: str
    timeout: float


@dataclass
class ClientResult:
    """One client's measured window (requests started in it; warm-up requests apart)."""

    index: int
    latencies: list[float] = field(default_factory=list)
    matched: int = 0
    jobs: int = 0
    no_match: dict[str, int] = field(default_factory=dict)
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    warmup_requests: int = 0
    last_done: float = 0.0


def resource_body(reference: str, count: int) -> bytes:
    resource = {"vo": VO, "site": SITE, "ce": CE, "pilot_reference": reference,
                "cpu_time": CPU_TIME, "owner_group": "ANY", "tags": "ANY"}
    return json.dumps({"resource": resource, "count": count}).encode()


def run_client(spec: ClientSpec, t_warm: float, t_end: float) -> ClientResult:
    """Send match requests back to back until ``t_end`` (``time.monotonic``)."""
    body = resource_body(spec.reference, spec.count)
    headers = {"Authorization": f"Bearer {spec.token}", "Content-Type": "application/json",
               "Accept": "application/json"}
    result = ClientResult(spec.index)
    conn = http.client.HTTPConnection(spec.host, spec.port, timeout=spec.timeout)
    clock = time.monotonic
    perf = time.perf_counter
    try:
        while True:
            started = clock()
            if started >= t_end:
                break
            counted = started >= t_warm
            t0 = perf()
            try:
                conn.request("POST", MATCH_PATH, body, headers)
                response = conn.getresponse()
                data = response.read()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                if counted:
                    result.errors += 1
                    _sample(result, f"{type(exc).__name__}: {exc}")
                time.sleep(0.01)  # a server that is down must not make the client spin
                continue
            elapsed = perf() - t0
            if not counted:
                result.warmup_requests += 1
                continue
            result.last_done = clock()
            if response.status != 200:
                result.errors += 1
                _sample(result, f"HTTP {response.status}: {data[:300].decode(errors='replace')}")
                continue
            result.latencies.append(elapsed)
            answer = json.loads(data)
            jobs = answer.get("jobs") or []
            if jobs:
                result.matched += 1
                result.jobs += len(jobs)
            else:
                reason = str((answer.get("no_match") or {}).get("reason"))
                result.no_match[reason] = result.no_match.get(reason, 0) + 1
    finally:
        conn.close()
    return result


def _sample(result: ClientResult, text: str) -> None:
    if len(result.error_samples) < ERROR_SAMPLES:
        result.error_samples.append(text)


def client_process(specs: list[ClientSpec], warmup: float, duration: float, barrier: Barrier,
                   go: Event, clock: Any, results: Any) -> None:
    """One client process: its clients in threads (one each), its CPU time in the window."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent ends the run and this process
    out: dict[str, Any] = {"pid": os.getpid(), "clients": [], "cpu_seconds": 0.0, "error": None}
    try:
        barrier.wait()
        go.wait()
        t_warm = clock.value + warmup
        t_end = t_warm + duration
        _run_threads([partial(run_client, s, t_warm, t_end) for s in specs], t_warm, out,
                     "client")
    except BaseException:  # report, so that the parent does not wait for ever
        out["error"] = traceback.format_exc()
    results.put(out)


def _sleep_until(deadline: float) -> None:
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.5))


# --------------------------------------------------------------------------- in process

@dataclass(frozen=True)
class InProcessSpec:
    """One in-process matcher: the work of one gunicorn worker, without HTTP or Flask."""

    index: int
    env: dict[str, str]
    config: str
    threads: int
    count: int
    warmup: float
    duration: float
    #: "view": what the match view does; "wsgi": the whole Flask app called as gunicorn
    #: would call it (routing, token, body checks, metrics), without HTTP.
    mode: str = "view"
    token: str = ""


def server_env(db_url: str, secret: str, metrics_dir: Path, max_requests: int,
               threads: int) -> dict[str, str]:
    """The environment the matcher runs with (the in-process matchers' too)."""
    return {**os.environ,
            "GRIDPILOT_DATABASE_URL": db_url,
            "GRIDPILOT_AUTH_SECRET": secret,
            "GRIDPILOT_RESOURCES_FILE": str(ROOT / "conf" / "resources.toml"),
            "GRIDPILOT_MATCHER_METRICS_DIR": str(metrics_dir),
            "GRIDPILOT_MATCHER_MAX_REQUESTS": str(max_requests),
            "GRIDPILOT_MATCHER_THREADS": str(threads)}


def in_process_matcher(spec: InProcessSpec, barrier: Barrier, go: Event, clock: Any,
                       results: Any) -> None:
    """One process as a gunicorn worker is (the app built by gridpilot.server.worker_app,
    its runtime, ``threads`` threads) whose threads do what the match view does for the
    benchmark's pilot, back to back: read the resource, match_for_pilot, read each job's
    payload and encode the answer with the matcher's encoder. No HTTP, no Flask request,
    no token."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    out: dict[str, Any] = {"pid": os.getpid(), "clients": [], "cpu_seconds": 0.0,
                           "error": None}
    try:
        from datetime import UTC, datetime

        import orjson

        from gridpilot.server import worker_app
        from matcher.pilots import payload
        from matcher.runtime import runtime_of
        from optimizers.classads import expression_check
        from taskqueue.core.resources import parse_resource
        from taskqueue.core.settings import load_settings
        from taskqueue.pilots.pilotmatch import match_for_pilot

        app = worker_app(load_settings(Path(spec.config), spec.env))
        runtime = runtime_of(app)
        runtime.match_database()

        def view(data: dict[str, Any], _body: bytes) -> tuple[list[Any], str | None]:
            resource = parse_resource(data["resource"])
            answer = match_for_pilot(runtime.match_database(), resource,
                                     now=datetime.now(UTC), count=data["count"],
                                     rng=runtime.random(),
                                     expression_check=expression_check(resource))
            jobs = [payload(job).to_dict() for job in answer.jobs]
            orjson.dumps({"jobs": jobs, "no_match": None if jobs else {
                "reason": answer.reason, "detail": answer.detail}})
            return jobs, answer.reason

        def wsgi(_data: dict[str, Any], body: bytes) -> tuple[list[Any], str | None]:
            environ = {"REQUEST_METHOD": "POST", "SCRIPT_NAME": "", "PATH_INFO": MATCH_PATH,
                       "QUERY_STRING": "", "SERVER_NAME": HOST, "SERVER_PORT": "80",
                       "SERVER_PROTOCOL": "HTTP/1.1", "REMOTE_ADDR": HOST,
                       "CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(body)),
                       "HTTP_AUTHORIZATION": f"Bearer {spec.token}",
                       "HTTP_ACCEPT": "application/json", "wsgi.version": (1, 0),
                       "wsgi.url_scheme": "http", "wsgi.input": io.BytesIO(body),
                       "wsgi.errors": sys.stderr, "wsgi.multithread": True,
                       "wsgi.multiprocess": False, "wsgi.run_once": False}
            status: list[str] = []

            def start_response(line: str, _headers: Any, _exc: Any = None) -> Any:
                status.append(line)
                return lambda _data: None

            chunks = app(environ, start_response)
            try:
                text = b"".join(chunks)
            finally:
                getattr(chunks, "close", lambda: None)()
            if not status or not status[0].startswith("200"):
                raise RuntimeError(f"the app answered {status}: {text[:300]!r}")
            answer = json.loads(text)
            return answer["jobs"] or [], (answer.get("no_match") or {}).get("reason")

        work = wsgi if spec.mode == "wsgi" else view

        def run(thread: int, t_warm: float, t_end: float) -> ClientResult:
            reference = f"bench-inproc-p{spec.index}-t{thread}"
            body = resource_body(reference, spec.count)
            data = json.loads(body)
            result = ClientResult(spec.index * 1000 + thread)
            perf, clock_ = time.perf_counter, time.monotonic
            while (started := clock_()) < t_end:
                t0 = perf()
                jobs, reason = work(data, body)
                elapsed = perf() - t0
                if started < t_warm:
                    result.warmup_requests += 1
                    continue
                result.last_done = clock_()
                result.latencies.append(elapsed)
                if jobs:
                    result.matched += 1
                    result.jobs += len(jobs)
                else:
                    result.no_match[str(reason)] = result.no_match.get(str(reason), 0) + 1
            return result

        barrier.wait()
        go.wait()
        t_warm = clock.value + spec.warmup
        t_end = t_warm + spec.duration
        _run_threads([partial(run, i, t_warm, t_end) for i in range(spec.threads)], t_warm,
                     out, "matcher")
        runtime.dispose()
    except BaseException:
        out["error"] = traceback.format_exc()
    results.put(out)


def _run_threads(work: list[Callable[[], ClientResult]], t_warm: float,
                 out: dict[str, Any], what: str) -> None:
    """Run each of ``work`` in a thread of this process; put in ``out`` this process's CPU
    seconds from ``t_warm`` to the last thread's end, the threads' results, and an error when
    some ``what`` thread died."""
    done: list[ClientResult] = []
    threads = [threading.Thread(target=lambda w=w: done.append(w()), daemon=True)
               for w in work]
    for t in threads:
        t.start()
    _sleep_until(t_warm)
    cpu0 = time.process_time()
    for t in threads:
        t.join()
    out["cpu_seconds"] = time.process_time() - cpu0
    out["clients"] = [asdict(r) for r in done]
    if len(done) < len(work):
        out["error"] = f"{len(work) - len(done)} {what} thread(s) died"


@dataclass
class Window:
    """One measured window: the CPU samples at its start and end, its bounds on the shared
    monotonic clock, and what each process reported."""

    cpu_a: CpuSample
    cpu_b: CpuSample
    t_warm: float
    t_end: float
    outcomes: list[dict[str, Any]]


def _run_window(procs: list[Any], barrier: Any, go: Any, clock: Any, results: Any,
                cfg: RunConfig, pid: int, engine: Engine | None, what: str, *,
                start_wait: float) -> Window:
    """Start ``procs`` (``what`` they are, for the messages), let them go together, sample the
    CPU of ``pid`` (and of the database, through ``engine``) at the start and the end of the
    measured window, and collect each process's outcome; stop any that is left."""
    outcomes: list[dict[str, Any]] = []
    try:
        for p in procs:
            p.start()
        try:
            barrier.wait(timeout=start_wait)
        except Exception as exc:
            raise SystemExit(f"{what} did not start: {exc!r}") from exc
        clock.value = time.monotonic()
        go.set()
        t_warm = clock.value + cfg.warmup
        t_end = t_warm + cfg.duration
        _sleep_until(t_warm)
        cpu_a = sample_cpu(pid, engine)
        _sleep_until(t_end)
        cpu_b = sample_cpu(pid, engine)
        deadline = time.monotonic() + cfg.timeout + 60
        while len(outcomes) < len(procs):
            try:
                outcomes.append(results.get(timeout=max(deadline - time.monotonic(), 0.1)))
            except queue.Empty as exc:
                raise SystemExit(f"{what} did not report in time") from exc
        for p in procs:
            p.join(timeout=30)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=10)
    return Window(cpu_a, cpu_b, t_warm, t_end, outcomes)


def measure_in_process(workers: int, threads: int, count: int, cfg: RunConfig, *,
                       env: dict[str, str], config: Path, url: str, backend: str,
                       queues: int, mode: str = "view", token: str = "") -> dict[str, Any]:
    """``workers`` in-process matchers of ``threads`` threads (the processes and threads the
    server runs with), for the warm-up and the measured window."""
    from taskqueue.db.database import make_engine

    waiting_before = waiting_jobs(url)
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(workers + 1)
    go = ctx.Event()
    clock = ctx.Value("d", 0.0)
    results = ctx.Queue()
    specs = [InProcessSpec(i, env, str(config), threads, count, cfg.warmup, cfg.duration,
                           mode, token)
             for i in range(workers)]
    procs = [ctx.Process(target=in_process_matcher, args=(s, barrier, go, clock, results),
                         daemon=True) for s in specs]
    engine = make_engine(url, pool_size=1) if backend == "postgresql" else None
    try:
        window = _run_window(procs, barrier, go, clock, results, cfg, os.getpid(), engine,
                             "the in-process matchers", start_wait=180)
    finally:
        if engine is not None:
            engine.dispose()
    cpu_a, cpu_b, outcomes = window.cpu_a, window.cpu_b, window.outcomes
    t_warm, t_end = window.t_warm, window.t_end
    errors = [o["error"] for o in outcomes if o["error"]]
    for err in errors:
        log(f"in-process matcher error:\n{err}")
    clients = [ClientResult(**c) for o in outcomes for c in o["clients"]]
    latencies = sorted(x for c in clients for x in c.latencies)
    requests = len(latencies)
    last = max((c.last_done for c in clients), default=0.0)
    seconds = max(last, t_end) - t_warm if requests else cfg.duration
    jobs = sum(c.jobs for c in clients)
    no_match = sum(sum(c.no_match.values()) for c in clients)
    matcher_cpu = sum(float(o["cpu_seconds"]) for o in outcomes)
    cpu = cpu_record(cpu_a, cpu_b, 0.0, requests)
    # The matchers are this process's children: their CPU is theirs, not the clients'.
    cpu["server_ms_per_request"] = round(matcher_cpu * 1000 / requests, 3) if requests else None
    cpu["server_cores"] = round(matcher_cpu / cfg.duration, 2)
    return {"measure": "match_in_process", "mode": mode, "backend": backend, "queues": queues,
            "workers": workers, "threads": threads, "count": count,
            "seconds": round(seconds, 3), "requests": requests,
            "requests_per_s": rate(requests, seconds), "jobs": jobs,
            "jobs_per_s": rate(jobs, seconds),
            "p50_ms": percentile_ms(latencies, 0.50), "p90_ms": percentile_ms(latencies, 0.90),
            "p99_ms": percentile_ms(latencies, 0.99), "no_match": no_match,
            "errors": len(errors), "waiting_before": waiting_before,
            "waiting_after": waiting_jobs(url), "cpu": cpu}


# --------------------------------------------------------------------------- CPU accounting

@dataclass
class CpuSample:
    at: float
    server: float
    #: PostgreSQL backend pid -> CPU seconds (None: the database server is not on this host).
    backends: dict[int, float] | None
    machine_busy: float
    machine_total: float


def backend_pids(engine: Engine | None) -> list[int] | None:
    """The PostgreSQL backends connected to the benchmark database (the matcher's), when the
    server runs on this machine; None otherwise."""
    if engine is None:
        return None
    from sqlalchemy import text

    with engine.connect() as conn:
        pids = list(conn.execute(text(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()")).scalars())
    local = [p for p in pids if process_comm(p) == "postgres"]
    return local if local or not pids else None


def sample_cpu(server_pid: int, engine: Engine | None) -> CpuSample:
    pids = backend_pids(engine)
    backends = None
    if pids is not None:
        backends = {}
        for pid in pids:
            stat = proc_stat(pid)
            if stat is not None:
                backends[pid] = stat[1]
    busy, total = machine_cpu_seconds()
    return CpuSample(time.monotonic(), tree_cpu_seconds(server_pid), backends, busy, total)


def cpu_record(a: CpuSample, b: CpuSample, clients_cpu: float, requests: int
               ) -> dict[str, Any]:
    """Where the CPU went between two samples: cores used (cpu-seconds per second) and ms per
    request, for the matcher, the database backends, the clients and everything else."""
    seconds = b.at - a.at
    if seconds <= 0:
        return {}
    server = b.server - a.server
    postgres: float | None = None
    if a.backends is not None and b.backends is not None:
        # A backend that appeared in the window is counted from its start.
        postgres = sum(cpu - a.backends.get(pid, 0.0) for pid, cpu in b.backends.items())
    busy = b.machine_busy - a.machine_busy
    other = busy - server - (postgres or 0.0) - clients_cpu

    def cores(x: float | None) -> float | None:
        return None if x is None else round(x / seconds, 2)

    def per_request(x: float | None) -> float | None:
        return None if x is None or requests == 0 else round(x * 1000 / requests, 3)

    return {
        "window_s": round(seconds, 2),
        "machine_cores": os.cpu_count(),
        "machine_busy_cores": cores(busy),
        "server_cores": cores(server), "postgres_cores": cores(postgres),
        "clients_cores": cores(clients_cpu), "other_cores": cores(other),
        "server_ms_per_request": per_request(server),
        "postgres_ms_per_request": per_request(postgres),
        "clients_ms_per_request": per_request(clients_cpu),
    }


# --------------------------------------------------------------------------- the server


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Server:
    """A running ``gridpilot serve`` (gunicorn arbiter in a session of its own)."""

    proc: subprocess.Popen[bytes]
    port: int
    workers: int
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def _get(port: int, path: str, token: str | None = None, timeout: float = 10.0
         ) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def server_command(config: Path, port: int, workers: int) -> list[str]:
    """How the matcher is started: as an operator would (an experiment may replace this)."""
    return [sys.executable, "-m", "gridpilot", "--config", str(config), "serve",
            "--bind", f"{HOST}:{port}", "--workers", str(workers)]


@contextmanager
def running_server(db_url: str, workers: int, *, config: Path, secret: str, tmpdir: Path,
                   max_requests: int, threads: int = 4, code: Path | None = None
                   ) -> Iterator[Server]:
    """Start the matcher under gunicorn on a free loopback port, wait until every worker is
    up and it answers /healthz, and stop it (and anything left of its session) afterwards."""
    port = free_port()
    run_dir = tmpdir / f"server-w{workers}-{port}"
    run_dir.mkdir(parents=True)
    env = server_env(db_url, secret, run_dir / "metrics", max_requests, threads)
    if code is not None:  # the matcher's code from another tree, measured against this one
        env["PYTHONPATH"] = os.pathsep.join([str(code), env.get("PYTHONPATH", "")])
    log_path = run_dir / "server.log"
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            server_command(config, port, workers), env=env, cwd=run_dir,
            stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file, start_new_session=True)
    server = Server(proc, port, workers, log_path)
    try:
        _wait_ready(server)
        log(f"matcher up: pid {server.pid}, {workers} worker(s) {children_of(server.pid)}, "
            f"port {port}")
        yield server
    finally:
        stop_server(server)


def _wait_ready(server: Server, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    healthy = False
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise SystemExit(f"the matcher exited with code {server.proc.returncode}:\n"
                             f"{server.log_tail()}")
        if not healthy:
            with suppress(OSError):
                healthy = _get(server.port, "/healthz", timeout=5)[0] == 200
        if healthy and len(children_of(server.pid)) >= server.workers:
            return
        time.sleep(0.2)
    raise SystemExit(f"the matcher did not become ready in {timeout:.0f} s:\n"
                     f"{server.log_tail()}")


def stop_server(server: Server) -> None:
    """SIGTERM to the arbiter (graceful stop), then SIGKILL to its session if it lingers."""
    proc = server.proc
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            log(f"matcher pid {proc.pid} did not stop in 40 s: killing its process group")
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # workers left behind, if any (our session)
    if proc.poll() is None:
        proc.wait(timeout=10)
    log(f"matcher pid {proc.pid} stopped (exit code {proc.returncode})")


# --------------------------------------------------------------------------- server metrics

_METRIC_LINE = re.compile(r"^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
Metrics = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape_metrics(port: int, token: str) -> Metrics | None:
    """GET /metrics (operator token), parsed; None when it fails (it is optional)."""
    try:
        status, body = _get(port, "/metrics", token, timeout=30)
    except OSError as exc:
        log(f"GET /metrics failed: {exc}")
        return None
    if status != 200:
        log(f"GET /metrics answered {status}: {body[:200]!r}")
        return None
    out: Metrics = {}
    for line in body.decode().splitlines():
        m = _METRIC_LINE.match(line)
        if m is None or line.startswith("#"):
            continue
        labels = frozenset(_LABEL.findall(m.group(2) or ""))
        try:
            out[(m.group(1), labels)] = float(m.group(3))
        except ValueError:
            continue
    return out


def _metric(metrics: Metrics, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in metrics.items() if n == name and wanted <= ls)


def flush_workers(server: Server) -> None:
    """Each worker writes its metrics at most once a second, on a request: after a pause, a
    few concurrent /healthz requests make every worker handle one and write its file."""
    time.sleep(1.1)

    def ping() -> None:
        with suppress(OSError):
            _get(server.port, "/healthz", timeout=10)

    threads = [threading.Thread(target=ping) for _ in range(server.workers * 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def server_view(before: Metrics | None, after: Metrics | None) -> dict[str, Any] | None:
    """The matcher's own count and handling time of the match requests between two scrapes
    (warm-up included; the time from the request's routing to its response, without the
    queueing in the listen backlog and the HTTP parsing)."""
    if before is None or after is None:
        return None

    def delta(name: str, **labels: str) -> float:
        return _metric(after, name, **labels) - _metric(before, name, **labels)

    hist = "gridpilot_http_request_duration_seconds"
    n = delta(f"{hist}_count", endpoint=MATCH_PATH)
    total = delta(f"{hist}_sum", endpoint=MATCH_PATH)
    within = delta(f"{hist}_bucket", endpoint=MATCH_PATH, le="0.05")
    return {
        "requests": int(n),
        "mean_ms": round(total / n * 1000, 3) if n else None,
        "within_50ms": round(within / n, 4) if n else None,
        "matched": int(delta("gridpilot_match_requests_total", outcome="matched")),
        "no_match": int(delta("gridpilot_match_requests_total", outcome="no_match")),
        "jobs_matched": int(delta("gridpilot_jobs_matched_total")),
        "non_200": int(delta("gridpilot_http_requests_total", endpoint=MATCH_PATH)
                       - delta("gridpilot_http_requests_total", endpoint=MATCH_PATH,
                               status="200")),
    }


# --------------------------------------------------------------------------- the jobs


@dataclass
class Fill:
    """The bulk load's numbering: the next job number (its queue is number % queues)."""

    url: str
    backend: str
    queues: int
    target: int
    next_number: int


def waiting_jobs(url: str) -> int:
    from sqlalchemy import func, select

    from taskqueue.db.database import make_engine
    from taskqueue.db.models import tq_jobs_table

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(tq_jobs_table))
                       .scalar_one())
    finally:
        engine.dispose()


#: Whether the bulk-loaded jobs get their stored payloads (job_payloads), as a submission
#: stores them (--stored-payloads no: as jobs stored before migration 0042, answered by
#: reading their description).
STORED_PAYLOADS = True


def initial_load(tq: ModuleType, fill: Fill, settings: Settings, insert_jobs: int) -> None:
    """``fill.target`` waiting jobs: the first ``insert_jobs`` through the library (they create
    the queues), the rest by bench/queue_ops.py's bulk load."""
    library = min(insert_jobs, fill.target)
    done = 0
    if library > 0:
        log(f"inserting {library:,} jobs through the library")
        done = tq.insert_jobs(fill.url, fill.backend, fill.queues, library, min(library, 1000),
                              settings, max_seconds=float("inf"), total_jobs=fill.target)
    if done < fill.target:
        log(f"bulk-filling jobs {done:,}..{fill.target - 1:,}")
        tq.bulk_fill(fill.url, fill.backend, fill.queues, done, fill.target, settings)
    fill.next_number = fill.target
    if STORED_PAYLOADS:
        log(f"stored the payloads of {store_missing_payloads(fill.url):,} jobs")
    tq.recompute(fill.url, fill.backend, fill.queues, settings)


def top_up(tq: ModuleType, fill: Fill, settings: Settings) -> int:
    """Put back the jobs the last measurement took (bulk load, queues it emptied reactivated);
    return how many were added."""
    missing = fill.target - waiting_jobs(fill.url)
    if missing <= 0:
        return 0
    log(f"refilling {missing:,} jobs")
    first = fill.next_number
    tq.bulk_fill(fill.url, fill.backend, fill.queues, first, first + missing, settings)
    fill.next_number += missing
    if STORED_PAYLOADS:
        store_missing_payloads(fill.url)
    revived = reactivate_queues(fill.url)
    if revived:
        log(f"reactivated {revived:,} task queue(s) that the last measurement emptied")
    tq.recompute(fill.url, fill.backend, fill.queues, settings)
    return missing


def reactivate_queues(url: str) -> int:
    """Mark active the inactive queues that hold jobs again, as the library's insert does for
    a queue coming back: its clock restarts from the VO's current virtual time."""
    from sqlalchemy import bindparam, exists, select, update

    from taskqueue.db.database import make_engine, make_session_factory
    from taskqueue.db.models import task_queues_table, tq_jobs_table
    from taskqueue.queues.shares import virtual_time

    tq = task_queues_table.c
    engine = make_engine(url)
    rng = random.Random()
    try:
        with make_session_factory(engine).begin() as session:
            conn = session.connection()
            rows = conn.execute(
                select(tq.id, tq.vo, tq.draw_key, tq.priority)
                .where(tq.active == 0, exists().where(tq_jobs_table.c.tq_id == tq.id))
                .order_by(tq.id).with_for_update()).all()
            clocks: dict[str, float] = {}
            changes = []
            for row in rows:
                if row.vo not in clocks:
                    clocks[row.vo] = virtual_time(session, row.vo)
                key = max(row.draw_key, clocks[row.vo]) + rng.expovariate(
                    max(row.priority, 1e-12))
                changes.append({"b_id": row.id, "b_key": key})
            if changes:
                conn.execute(update(task_queues_table).where(tq.id == bindparam("b_id"))
                             .values(draw_key=bindparam("b_key"), active=1, emptied_at=None),
                             changes)
            return len(changes)
    finally:
        engine.dispose()


def prepare_tables(tq: ModuleType, fill: Fill, *, vacuum: bool, full: bool) -> None:
    """Planner statistics and dead rows: VACUUM ANALYZE the database after a load, only the
    claim tables otherwise (PostgreSQL); ANALYZE elsewhere."""
    if full or fill.backend != "postgresql" or not vacuum:
        tq.analyze(fill.url, fill.backend, vacuum=vacuum)
    else:
        tq.vacuum_hot_tables(fill.url)


# --------------------------------------------------------------------------- a measurement


@dataclass(frozen=True)
class RunConfig:
    clients: int
    client_processes: int
    duration: float
    warmup: float
    timeout: float
    target_rps: float
    target_p99_ms: float


def measure(tq: ModuleType, server: Server, count: int, cfg: RunConfig, *, pilot_token: str,
            operator_token: str, url: str, backend: str, queues: int,
            metrics_before: Metrics | None) -> tuple[dict[str, Any], Metrics | None]:
    """Run the clients against ``server`` for the warm-up and the measured window; return the
    record and the metrics scraped after it."""
    from taskqueue.db.database import make_engine

    waiting_before = waiting_jobs(url)
    specs = [ClientSpec(i, HOST, server.port, pilot_token, count,
                        f"bench-w{server.workers}-n{count}-c{i}", cfg.timeout)
             for i in range(cfg.clients)]
    n_procs = min(cfg.client_processes, cfg.clients)
    groups = [specs[p::n_procs] for p in range(n_procs)]
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(n_procs + 1)
    go = ctx.Event()
    clock = ctx.Value("d", 0.0)
    results = ctx.Queue()
    procs = [ctx.Process(target=client_process,
                         args=(g, cfg.warmup, cfg.duration, barrier, go, clock, results),
                         daemon=True)
             for g in groups]
    engine = make_engine(url, pool_size=1) if backend == "postgresql" else None
    try:
        window = _run_window(procs, barrier, go, clock, results, cfg, server.pid, engine,
                             "the client processes", start_wait=120)
    finally:
        if engine is not None:
            engine.dispose()
    cpu_a, cpu_b, outcomes = window.cpu_a, window.cpu_b, window.outcomes
    t_warm, t_end = window.t_warm, window.t_end
    alive = server.proc.poll() is None
    flush_workers(server)
    metrics_after = scrape_metrics(server.port, operator_token) if alive else None

    clients = [ClientResult(**c) for o in outcomes for c in o["clients"]]
    proc_errors = [o["error"] for o in outcomes if o["error"]]
    for err in proc_errors:
        log(f"client process error:\n{err}")
    latencies = sorted(x for c in clients for x in c.latencies)
    requests = len(latencies)
    last = max((c.last_done for c in clients), default=0.0)
    seconds = max(last, t_end) - t_warm if requests else cfg.duration
    jobs = sum(c.jobs for c in clients)
    matched = sum(c.matched for c in clients)
    no_match: dict[str, int] = {}
    for c in clients:
        for reason, n in c.no_match.items():
            no_match[reason] = no_match.get(reason, 0) + n
    errors = sum(c.errors for c in clients)
    samples = [s for c in clients for s in c.error_samples][:ERROR_SAMPLES]
    rps = requests / seconds if seconds > 0 else 0.0
    p99 = percentile_ms(latencies, 0.99)
    waiting_after = waiting_jobs(url)
    record: dict[str, Any] = {
        "measure": "match_http", "backend": backend, "queues": queues,
        "workers": server.workers, "clients": cfg.clients, "client_processes": n_procs,
        "count": count, "seconds": round(seconds, 3), "warmup_s": cfg.warmup,
        "requests": requests, "requests_per_s": round(rps, 1),
        "matched_requests": matched, "jobs": jobs, "jobs_per_s": rate(jobs, seconds),
        "p50_ms": percentile_ms(latencies, 0.50),
        "p90_ms": percentile_ms(latencies, 0.90), "p99_ms": p99,
        "max_ms": round(latencies[-1] * 1000, 2) if latencies else None,
        "mean_ms": round(sum(latencies) / requests * 1000, 3) if requests else None,
        "no_match": sum(no_match.values()), "no_match_reasons": no_match,
        "errors": errors, "error_samples": samples,
        "warmup_requests": sum(c.warmup_requests for c in clients),
        "waiting_before": waiting_before, "waiting_after": waiting_after,
        "cpu": cpu_record(cpu_a, cpu_b, sum(float(o["cpu_seconds"]) for o in outcomes),
                          requests),
        "server": server_view(metrics_before, metrics_after),
        "target": {"requests_per_s": cfg.target_rps, "p99_ms": cfg.target_p99_ms,
                   "met": bool(requests and rps >= cfg.target_rps and p99 is not None
                               and p99 <= cfg.target_p99_ms and errors == 0)},
    }
    if proc_errors:
        record["client_process_errors"] = len(proc_errors)
    if not alive:
        record["server_exited"] = server.proc.returncode
        log(f"the matcher exited during the measurement:\n{server.log_tail()}")
    if waiting_after == 0 or (no_match and waiting_after < 0.05 * waiting_before):
        record["ran_out_of_jobs"] = True
        log("the measurement ran (nearly) out of jobs: raise --jobs or lower --duration")
    return record, metrics_after


# --------------------------------------------------------------------------- the table


def cpu_shares(inproc: dict[str, Any], http: dict[str, Any]) -> dict[str, float | None]:
    """The HTTP share by CPU time, steadier than the rates on a machine others load:
    ``http_cpu_share``, the matcher's CPU per match in process over its CPU per match over
    HTTP (the share of the in-process rate a matcher whose CPU is the limit keeps, clients
    elsewhere); ``http_machine_share``, the same with the database's and the clients' CPU
    added (the share when all of them share this machine's cores)."""
    a, b = inproc.get("cpu") or {}, http.get("cpu") or {}

    def total(cpu: dict[str, Any], keys: tuple[str, ...]) -> float | None:
        out = 0.0
        for key in keys:
            value = cpu.get(key)
            if value is None:
                return None
            out += float(value)
        return out

    def div(x: float | None, y: float | None) -> float | None:
        return round(x / y, 3) if x is not None and y else None

    own = ("server_ms_per_request",)
    machine = ("server_ms_per_request", "postgres_ms_per_request", "clients_ms_per_request")
    return {"http_cpu_share": div(total(a, own), total(b, own)),
            "http_machine_share": div(total(a, machine), total(b, machine))}


def _ratios(record: dict[str, Any], calibration: dict[str, Any]) -> dict[str, Any]:
    """The measurement as multiples of the calibration's floor (bench/calibration.py)."""
    floor = calibration["update_commit"]

    def div(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a is not None and b else None

    return {"requests_per_s_x_floor": div(record.get("requests_per_s"), floor["per_s"]),
            "p99_x_floor_p99": div(record.get("p99_ms"), floor["p99_ms"]),
            "matcher_cpu_ms_per_request": (record.get("cpu") or {}).get(
                "server_ms_per_request"),
            "matcher_cpu_x_floor_client_cpu": div(
                (record.get("cpu") or {}).get("server_ms_per_request"),
                floor["client_cpu_ms"])}


def table(records: Sequence[dict[str, Any]]) -> str:
    head = (f"{'workers':>7} {'clients':>7} {'count':>5} {'req/s':>8} {'jobs/s':>8} "
            f"{'p50 ms':>7} {'p90 ms':>7} {'p99 ms':>7} {'max ms':>7} {'no-match':>8} "
            f"{'errors':>6} {'srv ms':>6} {'cores srv/pg/cli/other':>23} {'target':>6} "
            f"{'share':>5}")
    lines = [head, "-" * len(head)]

    def num(value: Any, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    for r in records:
        cpu = r.get("cpu") or {}
        cores = "/".join(num(cpu.get(k), ".2f") for k in
                         ("server_cores", "postgres_cores", "clients_cores", "other_cores"))
        srv = (r.get("server") or {}).get("mean_ms")
        lines.append(
            f"{r['workers']:>7} {r['clients']:>7} {r['count']:>5} "
            f"{num(r['requests_per_s'], ',.1f'):>8} {num(r['jobs_per_s'], ',.1f'):>8} "
            f"{num(r['p50_ms'], '.1f'):>7} {num(r['p90_ms'], '.1f'):>7} "
            f"{num(r['p99_ms'], '.1f'):>7} {num(r['max_ms'], '.1f'):>7} {r['no_match']:>8} "
            f"{r['errors']:>6} {num(srv, '.2f'):>6} {cores:>23} "
            f"{'yes' if r['target']['met'] else 'no':>6} {num(r.get('http_share'), '.2f'):>5}")
    if records:
        t = records[0]["target"]
        lines.append(f"target: >= {t['requests_per_s']:g} match requests/s with p99 <= "
                     f"{t['p99_ms']:g} ms and no error; srv ms = the matcher's own mean "
                     "handling time (GET /metrics); cores = CPU used by the matcher, the "
                     "database backends, the clients and everything else; share = requests/s "
                     "as a share of the in-process rate with the same processes and threads")
    return "\n".join(lines)


# --------------------------------------------------------------------------- main

def _modes(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    unknown = set(modes) - {"view", "wsgi", "none"}
    if unknown or not modes:
        raise argparse.ArgumentTypeError(f"give view, wsgi or none, not {text!r}")
    return [m for m in modes if m != "none"]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    url_option(parser, postgres_default())
    parser.add_argument("--jobs", type=int, default=100_000,
                        help="waiting jobs at the start of every measurement (default 100000)")
    parser.add_argument("--queues", type=int, default=1000,
                        help="task queues the jobs are spread over (default 1000)")
    parser.add_argument("--workers", type=int_list, default=[1, 2, 4],
                        help="comma list of gunicorn worker counts (default 1,2,4)")
    parser.add_argument("--counts", type=int_list, default=[1, 4],
                        help="comma list of jobs asked for per match request (default 1,4)")
    parser.add_argument("--clients", type=int, default=8,
                        help="concurrent pilot clients (default 8)")
    parser.add_argument("--client-processes", type=int, default=None,
                        help="processes the clients run in, one thread per client (default: "
                             "one process per client)")
    parser.add_argument("--duration", type=float, default=20.0,
                        help="measured seconds per measurement (default 20)")
    parser.add_argument("--warmup", type=float, default=2.0,
                        help="seconds of requests before each measurement, not counted "
                             "(default 2)")
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="client socket timeout in seconds (default 30)")
    parser.add_argument("--max-requests", type=int, default=0,
                        help="gunicorn max_requests: a worker is replaced after this many "
                             "requests (default 0 = never, so that no restart falls in a "
                             "measurement; conf/gridpilot.toml says 20000)")
    parser.add_argument("--insert-jobs", type=int, default=None,
                        help="jobs inserted through the library's path before the bulk load "
                             "(default: one per queue, which creates the queues; 0 = none)")
    parser.add_argument("--config", type=Path, default=ROOT / "conf" / "gridpilot.toml",
                        help="the matcher's settings file (default conf/gridpilot.toml); the "
                             "database, secret, resources file and metrics folder are set "
                             "through the environment")
    parser.add_argument("--target-rps", type=float, default=500.0,
                        help="target match requests/s (default 500)")
    parser.add_argument("--target-p99-ms", type=float, default=50.0,
                        help="target p99 latency in ms (default 50)")
    parser.add_argument("--stored-payloads", choices=("yes", "no"), default="yes",
                        help="whether the bulk-loaded jobs get their stored payloads, as a "
                             "submission stores them (default yes; no: as jobs stored before "
                             "migration 0042, each answer reads its job's description)")
    parser.add_argument("--no-vacuum", action="store_true",
                        help="PostgreSQL: only ANALYZE, never VACUUM, between measurements")
    parser.add_argument("--in-process", type=_modes, default=["view"],
                        help="in-process measurements before each HTTP one, with the server's "
                             "processes and threads, comma-separated: view (what the match "
                             "view does, without HTTP or Flask: each HTTP line's http_share "
                             "is its share of this rate), wsgi (the Flask app called directly, "
                             "without HTTP), none (default view)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="measurements of each setting, in turn (default 1)")
    parser.add_argument("--other-code", type=Path, default=None,
                        help="also measure, in turn with this tree's, a matcher run from the "
                             "sources in this folder (put first on PYTHONPATH; e.g. "
                             "git archive of another commit): an A/B of two versions")
    parser.add_argument("--calibration-seconds", type=float, default=3.0,
                        help="seconds of each calibration loop (bench/calibration.py; "
                             "default 3)")
    parser.add_argument("--keep", action="store_true",
                        help="do not drop the database (nor remove the temporary folder with "
                             "the server logs)")
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.queues < 1 or args.clients < 1:
        parser.error("--jobs, --queues and --clients must be positive")
    if args.queues > args.jobs:
        parser.error("--queues must not exceed --jobs")
    if args.duration <= 0 or args.warmup < 0 or args.timeout <= 0:
        parser.error("--duration and --timeout must be positive, --warmup not negative")
    if args.client_processes is not None and args.client_processes < 1:
        parser.error("--client-processes must be positive")
    if args.rounds < 1 or args.calibration_seconds <= 0:
        parser.error("--rounds and --calibration-seconds must be positive")
    if args.other_code is not None and not (args.other_code / "matcher").is_dir():
        parser.error(f"--other-code {args.other_code} holds no matcher package")
    if args.max_requests < 0:
        parser.error("--max-requests must not be negative")
    if args.insert_jobs is not None and args.insert_jobs < 0:
        parser.error("--insert-jobs must not be negative")
    if not args.config.is_file():
        parser.error(f"--config {args.config} does not exist")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    end_on_signals(signal.SIGTERM, signal.SIGHUP)
    global STORED_PAYLOADS
    STORED_PAYLOADS = args.stored_payloads == "yes"
    tq = queue_ops
    import gunicorn

    from matcher.auth import issue_token
    from taskqueue.core.settings import load_settings

    settings = load_settings(args.config, {})
    most = settings.matcher.max_jobs_per_match
    if max(args.counts) > most:
        raise SystemExit(f"--counts: the matcher hands out at most {most} jobs per request "
                         f"(matcher.max_jobs_per_match)")
    secret = secrets.token_urlsafe(32)
    pilot_token = issue_token(secret, subject="bench-pilots", role="pilot", vo=VO,
                              group="lhcb_pilot", lifetime=TOKEN_LIFETIME)
    operator_token = issue_token(secret, subject="bench-operator", role="operator", vo=VO,
                                 group="lhcb_admin", lifetime=TOKEN_LIFETIME)
    cfg = RunConfig(args.clients, args.client_processes or args.clients, args.duration,
                    args.warmup, args.timeout, args.target_rps, args.target_p99_ms)
    backend = backend_of(args.url)
    tmpdir = Path(tempfile.mkdtemp(prefix="gp_bench_matcher_"))
    started = time.perf_counter()
    records: list[dict[str, Any]] = []
    log(f"backend {backend}, {args.jobs:,} jobs over {args.queues:,} queues, workers "
        f"{args.workers}, counts {args.counts}, {args.clients} clients in {cfg.client_processes} "
        f"process(es), {args.warmup:g} s warm-up + {args.duration:g} s per measurement")
    try:
        with fresh_database(args.url, prefix=f"gp_bench_m{args.queues}", keep=args.keep,
                            tmpdir=tmpdir) as db:
            emit(tq.server_info(db.url, backend))
            emit({"measure": "setup", "python": platform.python_version(),
                     "stored_payloads": STORED_PAYLOADS,
                     "gunicorn": gunicorn.__version__, "worker_class": "sync",
                     "max_requests": args.max_requests, "clients": args.clients,
                     "client_processes": cfg.client_processes, "jobs": args.jobs,
                     "queues": args.queues, "duration_s": args.duration,
                     "warmup_s": args.warmup, "resource": json.loads(
                         resource_body("bench-pilot", 1))["resource"]})
            fill = Fill(db.url, backend, args.queues, args.jobs, 0)
            initial_load(tq, fill, settings,
                         args.queues if args.insert_jobs is None else args.insert_jobs)
            calibration = cal.calibrate(db.url, backend, seconds=args.calibration_seconds)
            emit(calibration)
            log(f"calibration: SELECT 1 {calibration['select_1']['per_s']}/s, UPDATE+COMMIT "
                f"{calibration['update_commit']['per_s']}/s")
            fresh = True
            threads = settings.matcher.threads
            for workers in args.workers:
                log(f"starting the matcher with {workers} worker(s)")
                with ExitStack() as stack:
                    servers = {"own": stack.enter_context(running_server(
                        db.url, workers, config=args.config, secret=secret, tmpdir=tmpdir,
                        max_requests=args.max_requests, threads=threads))}
                    if args.other_code is not None:
                        servers["other"] = stack.enter_context(running_server(
                            db.url, workers, config=args.config, secret=secret, tmpdir=tmpdir,
                            max_requests=args.max_requests, threads=threads,
                            code=args.other_code))
                    metrics = {name: scrape_metrics(server.port, operator_token)
                               for name, server in servers.items()}
                    for count in args.counts:
                        for _round in range(args.rounds):
                            inproc: dict[str, Any] | None = None
                            for mode in args.in_process:
                                fresh = top_up(tq, fill, settings) > 0 or fresh
                                prepare_tables(tq, fill, vacuum=not args.no_vacuum, full=fresh)
                                fresh = False
                                log(f"measuring in process ({mode}): {workers} process(es) "
                                    f"of {threads} threads, count={count}")
                                measured = measure_in_process(
                                    workers, threads, count, cfg,
                                    env=server_env(db.url, secret, tmpdir / "inproc-metrics",
                                                   args.max_requests, threads),
                                    config=args.config, url=db.url, backend=backend,
                                    queues=args.queues, mode=mode, token=pilot_token)
                                measured["ratios"] = _ratios(measured, calibration)
                                emit(measured)
                                log(f"  {measured['requests_per_s']} requests/s in process "
                                    f"({mode}), p50 {measured['p50_ms']} ms, p99 "
                                    f"{measured['p99_ms']} ms, matcher CPU "
                                    f"{measured['cpu']['server_ms_per_request']} ms/request")
                                if mode == "view":
                                    inproc = measured
                            for name, server in servers.items():
                                fresh = top_up(tq, fill, settings) > 0 or fresh
                                prepare_tables(tq, fill, vacuum=not args.no_vacuum, full=fresh)
                                fresh = False
                                log(f"measuring over HTTP ({name} code): {workers} worker(s), "
                                    f"{args.clients} clients, count={count}")
                                record, metrics[name] = measure(
                                    tq, server, count, cfg, pilot_token=pilot_token,
                                    operator_token=operator_token, url=db.url,
                                    backend=backend, queues=args.queues,
                                    metrics_before=metrics[name])
                                record["code"] = name if args.other_code is not None else None
                                record["threads"] = threads
                                record["ratios"] = _ratios(record, calibration)
                                if inproc is not None and inproc["requests_per_s"]:
                                    record["in_process_requests_per_s"] = \
                                        inproc["requests_per_s"]
                                    record["http_share"] = round(
                                        record["requests_per_s"] / inproc["requests_per_s"], 3)
                                    record.update(cpu_shares(inproc, record))
                                emit(record)
                                records.append(record)
                                log(f"  {record['requests_per_s']:,.1f} requests/s, "
                                    f"{record['jobs_per_s'] or 0:,.1f} jobs/s, p50 "
                                    f"{record['p50_ms']} ms, p99 {record['p99_ms']} ms, "
                                    f"{record['no_match']} no-match, {record['errors']} "
                                    f"errors, share of in process {record.get('http_share')}"
                                    f" (by the matcher's CPU {record.get('http_cpu_share')}, "
                                    f"by the machine's {record.get('http_machine_share')})")
                log(f"elapsed so far {time.perf_counter() - started:.0f} s")
    finally:
        if args.keep:
            log(f"--keep: server logs left in {tmpdir}")
        else:
            shutil.rmtree(tmpdir, ignore_errors=True)
        if records:
            print("\n" + table(records), file=sys.stderr, flush=True)
    log(f"done in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt as interrupt:  # the finally blocks have cleaned up by now
        log(f"interrupted ({interrupt or 'Ctrl-C'})")
        raise SystemExit(130) from None
