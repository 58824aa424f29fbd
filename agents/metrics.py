"""What ``gridpilot agents`` tells Prometheus, at ``[agents] metrics_bind``: the scrapers the
matcher admits to its /metrics are admitted here too (the metrics token, an operator's token,
judged by the matcher's rules that ``gridpilot agents`` passes in, or an allowed address), and
everyone else gets 401 (403 for a token of another role).

Two kinds of series. This process's own: its loops' runs by outcome, and how long each last
took. And what the database says, whichever agent process did the work (several may run,
each loop in one of them at a time): each loop's last start and last sign of life and whether
its last run failed, the pilots that ended in the last hour per site and status, the site
director's failures in a row per queue (submissions, polls, failed starts), its pilots
that never reached their CE, the pilots killed in the last hour for hanging in a CE state per
queue and state, and whether the database answered at all
(``gridpilot_database_up``; when it does not, only this process's series are given). Every
agent process reports the database's series alike, so take their ``max`` across instances.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from agents.context import AgentContext
from taskqueue.core.errors import ConfigurationError
from taskqueue.core.settings import host_and_port
from taskqueue.db.health import HealthProbe
from taskqueue.pilots.monitoring import (
    director_failures,
    loop_runs,
    pilots_ended_since,
    pilots_stuck_since,
)
from taskqueue.scrapes import scraper_admitted

#: The pilots counted as ended lately: those that ended within this window.
ENDED_WINDOW = timedelta(hours=1)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class AgentMetrics:
    """The series of one agent process (a prometheus_client collector)."""

    def __init__(self, ctx: AgentContext, intervals: Mapping[str, int]) -> None:
        self.ctx = ctx
        #: The loops this process runs, and their intervals in seconds.
        self.intervals = dict(intervals)
        self._lock = threading.Lock()
        self._runs: dict[tuple[str, str], int] = {}
        self._durations: dict[str, float] = {}
        self._probe: HealthProbe | None = None

    def record(self, loop: str, *, failed: bool, seconds: float) -> None:
        """Count one run of ``loop`` by this process."""
        with self._lock:
            key = (loop, "failed" if failed else "ok")
            self._runs[key] = self._runs.get(key, 0) + 1
            self._durations[loop] = seconds

    def render(self) -> bytes:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        return generate_latest(registry)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            runs, durations = dict(self._runs), dict(self._durations)
        counter = CounterMetricFamily("gridpilot_agent_loop_runs",
                                      "Turns of each loop this agent process ran, by outcome",
                                      labels=["loop", "outcome"])
        for (loop, outcome), n in sorted(runs.items()):
            counter.add_metric([loop, outcome], n)
        yield counter
        yield _gauge("gridpilot_agent_loop_last_duration_seconds",
                     "How long this process's last turn of each loop took", ["loop"],
                     {(loop,): seconds for loop, seconds in durations.items()})
        yield _gauge("gridpilot_agent_loop_interval_seconds",
                     "The interval of each loop this process runs", ["loop"],
                     {(loop,): float(s) for loop, s in self.intervals.items()})
        yield from self._from_database()

    def _from_database(self) -> Iterator[Metric]:
        with self._lock:  # scrapes may come at once, each in its thread
            if self._probe is None:
                self._probe = HealthProbe(self.ctx.settings.database)
            probe = self._probe
        up = probe.check() is None
        if up:
            try:
                now = self.ctx.now()
                runs, ended, failures, stuck = self.ctx.transaction(lambda s: (
                    loop_runs(s), pilots_ended_since(s, now - ENDED_WINDOW),
                    director_failures(s), pilots_stuck_since(s, now - ENDED_WINDOW)))
            except Exception:  # the scrape says so; the log says why
                self.ctx.log.exception("metrics: the database could not be read")
                up = False
        yield _gauge("gridpilot_database_up",
                     "Whether the database answered this scrape (1) or not (0)", [],
                     {(): 1.0 if up else 0.0})
        if not up:
            return
        yield _gauge("gridpilot_agent_loop_last_start_timestamp_seconds",
                     "When each loop's last turn started, in any agent process", ["loop"],
                     {(r.name,): r.started_at.timestamp() for r in runs})
        yield _gauge("gridpilot_agent_loop_last_seen_timestamp_seconds",
                     "The last sign of life of each loop (its start, a renewal of its turn "
                     "while it runs, or its end), in any agent process", ["loop"],
                     {(r.name,): r.seen_at.timestamp() for r in runs})
        yield _gauge("gridpilot_agent_loop_last_run_failed",
                     "Whether each loop's last finished turn failed (1) or not (0)", ["loop"],
                     {(r.name,): float(r.failed) for r in runs})
        yield _gauge("gridpilot_pilots_ended",
                     "Pilots that ended in the last hour, per VO, site and final status",
                     ["vo", "site", "status"], {k: float(n) for k, n in ended.items()})
        yield _gauge("gridpilot_director_queue_failures",
                     "The site director's submission failures in a row, per queue",
                     ["site", "ce", "queue"],
                     {k: float(f[0]) for k, f in failures.items()})
        yield _gauge("gridpilot_director_queue_poll_failures",
                     "Failed polls in a row of each queue's CE (the pilots loop)",
                     ["site", "ce", "queue"],
                     {k: float(f[1]) for k, f in failures.items()})
        yield _gauge("gridpilot_director_queue_failed_starts",
                     "Pilots in a row that ended before they reached the matcher and stopped "
                     "the queue's submissions (0: not stopped), per queue",
                     ["site", "ce", "queue"],
                     {k: float(f[2]) for k, f in failures.items()})
        unsent = CounterMetricFamily(
            "gridpilot_director_unsent_pilots",
            "Pilots the site director decided whose submission never reached the queue's CE "
            "(down, refused the credentials, its turn was over), per queue",
            labels=["site", "ce", "queue"])
        for key, f in sorted(failures.items()):
            unsent.add_metric(list(key), float(f[3]))
        yield unsent
        yield _gauge("gridpilot_director_pilots_stuck",
                     "Pilots killed in the last hour for staying in one state of their CE "
                     "past its timeout, per queue and CE state (Submitting: never submitted)",
                     ["site", "ce", "queue", "state"], {k: float(n) for k, n in stuck.items()})

    def dispose(self) -> None:
        if self._probe is not None:
            self._probe.dispose()


def _gauge(name: str, text: str, labels: list[str],
           values: Mapping[tuple[str, ...], float]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, text, labels=labels)
    for key, value in sorted(values.items()):
        family.add_metric(list(key), value)
    return family


NEEDED = ("the metrics token ([matcher] metrics_token), an operator's token or an address of "
          "[matcher] metrics_allow is needed")


def _refusal(header: str, judge: Callable[[str], tuple[int, str] | None] | None
             ) -> tuple[int, str] | None:
    """None for a scrape whose bearer token the matcher's /metrics admits, else the HTTP
    status and why not (the scraper's own checks, token and address, come first)."""
    if not header or judge is None:
        return 401, NEEDED
    verdict = judge(header)
    return None if verdict is None else (verdict[0], f"{verdict[1]} ({NEEDED})")


class MetricsServer:
    """The agents' /metrics over HTTP, in a thread of its own (one more per scrape)."""

    def __init__(self, metrics: AgentMetrics, bind: str) -> None:
        host, port = host_and_port(bind, "agents.metrics_bind")
        settings = metrics.ctx.settings.matcher
        judge = metrics.ctx.metrics_judge
        log = metrics.ctx.log

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server names it
                header = self.headers.get("Authorization", "")
                refused = None if scraper_admitted(settings, header, self.client_address[0]) \
                    else _refusal(header, judge)
                if self.path.split("?", 1)[0] != "/metrics":
                    self._answer(404, b"not found: the agents answer /metrics only\n")
                elif refused is not None:
                    self._answer(refused[0], refused[1].encode() + b"\n",
                                 {"WWW-Authenticate": 'Bearer realm="gridpilot"'})
                else:
                    started = time.monotonic()
                    body = metrics.render()
                    log.debug("metrics scraped in %.3f s", time.monotonic() - started)
                    self._answer(200, body, content_type=CONTENT_TYPE)

            def _answer(self, status: int, body: bytes,
                        headers: Mapping[str, str] | None = None,
                        content_type: str = "text/plain; charset=utf-8") -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # a scrape every few seconds is not news

        try:
            self.server = ThreadingHTTPServer((host, port), Handler)
        except OSError as exc:
            raise ConfigurationError(f"agents.metrics_bind {bind}: cannot listen there: "
                                     f"{exc.strerror or exc}") from exc
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, name="metrics",
                                        daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join()

