"""Prometheus metrics that add up over every worker process of one host, kept by
``prometheus_client`` in its multiprocess mode: each process writes its counters and histograms
to memory-mapped files of its own in one folder, and ``/metrics`` adds the files up.

The folder is private to the service: it is created with mode 0700, and one that is a
symbolic link, not a folder, or owned by another user is refused (anyone who can write there
can add series to ``/metrics`` or make the service write through a link). A scrape folds the
files of processes that have exited (workers recycled by gunicorn) into one archive file per
kind, so they do not pile up and counters never go backwards.
"""

from __future__ import annotations

import fcntl
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, values
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.multiprocess import MultiProcessCollector

from taskqueue.core.errors import ConfigurationError

#: Upper bounds of the latency histogram, in seconds.
LATENCY_BUCKETS: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                      1.0, 2.5, 5.0)

HELP: dict[str, tuple[str, str]] = {
    "gridpilot_http_requests_total": ("counter", "HTTP requests handled, by endpoint and status"),
    "gridpilot_http_request_duration_seconds": ("histogram",
                                                "Time to handle a request, by endpoint"),
    "gridpilot_match_requests_total": ("counter", "Match requests, by outcome"),
    "gridpilot_jobs_matched_total": ("counter", "Jobs handed to pilots"),
    "gridpilot_jobs_failed_unreadable_total": (
        "counter", "Jobs failed at their match: their stored description could not be read"),
    "gridpilot_answer_tokens_failed_total": (
        "counter", "Payloads handed out without their first token: it could not be issued "
                   "with the match answer (their pilots ask the token endpoint)"),
    "gridpilot_no_matches_total": ("counter", "Match requests that found no job, by reason"),
    "gridpilot_waiting_jobs": ("gauge", "Jobs waiting in each task queue"),
    "gridpilot_database_up": ("gauge", "Whether the database answered the scrape's check "
                                       "within a second (1) or not (0)"),
    "gridpilot_sandboxes": ("gauge", "Sandboxes stored, per VO"),
    "gridpilot_sandbox_bytes": ("gauge", "Bytes of sandboxes stored, per VO"),
}
#: Kinds of files a process writes, and so of archives.
_KINDS = ("counter", "histogram")

_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: Most series a process keeps at hand (more are still counted, each looked up again).
_SERIES_MAX = 4096
#: The folder this process's metric values are written to now (prometheus_client keeps one).
_current_dir: str | None = None


def private_directory(path: Path | None) -> Path:
    """``path`` made ready for the metrics files (created 0700), or a new private temporary
    folder when ``path`` is None; refuses a folder others could write to or plant."""
    if path is None:
        return Path(tempfile.mkdtemp(prefix="gridpilot-metrics-"))
    try:
        path.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        pass
    except OSError as exc:
        raise ConfigurationError(f"matcher.metrics_dir {path} cannot be created: {exc}") from exc
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode):
        raise ConfigurationError(f"matcher.metrics_dir {path} is a symbolic link; give the "
                                 "folder itself (one only the service can write to)")
    if not stat.S_ISDIR(info.st_mode):
        raise ConfigurationError(f"matcher.metrics_dir {path} is not a folder")
    if info.st_uid != os.geteuid():
        raise ConfigurationError(
            f"matcher.metrics_dir {path} belongs to user id {info.st_uid}, not to the service's "
            f"({os.geteuid()}); remove it or choose another folder")
    if stat.S_IMODE(info.st_mode) & 0o077:
        path.chmod(0o700)  # ours: close it to others before anything is written there
    return path


class Metrics:
    """The metrics of the matcher processes sharing ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._metrics: dict[str, Counter | Histogram] = {}
        #: The series already used, by name and label values: prometheus_client's labels()
        #: costs more than the increment itself, and every request counts a few series.
        self._series: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
        _write_to(directory)

    def _child(self, name: str, labels: Mapping[str, str], kind: str) -> Any:
        key = (name, tuple(labels.items()))
        child = self._series.get(key)
        if child is None:
            child = self._metric(name, labels, kind)
            if len(self._series) < _SERIES_MAX:  # labels come from a small, fixed set
                self._series[key] = child
        return child

    def _metric(self, name: str, labels: Mapping[str, str], kind: str) -> Any:
        metric = self._metrics.get(name)
        if metric is None:
            text = HELP.get(name, (kind, name))[1]
            names = sorted(labels)
            if kind == "histogram":
                metric = Histogram(name, text, names, registry=None, buckets=LATENCY_BUCKETS)
            else:
                metric = Counter(name, text, names, registry=None)
            self._metrics[name] = metric
        return metric.labels(**labels) if labels else metric

    def inc(self, name: str, labels: Mapping[str, str], amount: float = 1.0) -> None:
        _write_to(self.directory)
        self._child(name, labels, "counter").inc(amount)

    def observe(self, name: str, labels: Mapping[str, str], value: float) -> None:
        _write_to(self.directory)
        self._child(name, labels, "histogram").observe(value)

    def flush(self, *, force: bool = False) -> None:
        """Values are in the shared files as soon as they change: nothing to do."""

    def render(self, gauges: Iterable[tuple[str, Mapping[str, str], float]] = ()) -> str:
        """The Prometheus text exposition of every process's totals plus ``gauges``."""
        with _locked(self.directory / "metrics.lock"):
            _archive_dead(self.directory)
            registry = CollectorRegistry()
            MultiProcessCollector(registry, path=str(self.directory))  # type: ignore[no-untyped-call]
            registry.register(_Gauges(list(gauges)))
            return generate_latest(registry).decode("utf-8")


def _write_to(directory: Path) -> None:
    """Make this process's metric values go to ``directory`` (prometheus_client chooses the
    folder when a value is made, from its environment variable)."""
    global _current_dir
    if _current_dir != str(directory):
        os.environ[_ENV] = str(directory)
        values.ValueClass = values.MultiProcessValue()  # type: ignore[no-untyped-call]
        _current_dir = str(directory)


class _Gauges:
    """The gauges computed at scrape time (waiting jobs per task queue)."""

    def __init__(self, gauges: list[tuple[str, Mapping[str, str], float]]) -> None:
        self.gauges = gauges

    def collect(self) -> Iterator[Metric]:
        by_name: dict[str, list[tuple[Mapping[str, str], float]]] = {}
        for name, labels, value in self.gauges:
            by_name.setdefault(name, []).append((labels, value))
        for name, rows in sorted(by_name.items()):
            names = sorted({k for labels, _ in rows for k in labels})
            family = GaugeMetricFamily(name, HELP.get(name, ("gauge", name))[1], labels=names)
            for labels, value in rows:
                family.add_metric([labels.get(k, "") for k in names], value)
            yield family


def _archive_dead(directory: Path) -> None:
    """Fold the files of processes that have exited into ``<kind>_archive.db``."""
    for kind in _KINDS:
        dead = [p for p in directory.glob(f"{kind}_*.db")
                if p.stem.split("_", 1)[1].isdigit() and not _alive(int(p.stem.split("_")[1]))]
        if not dead:
            continue
        archive = MmapedDict(str(directory / f"{kind}_archive.db"))  # type: ignore[no-untyped-call]
        try:
            for path in dead:
                source = MmapedDict(str(path), read_mode=True)  # type: ignore[no-untyped-call]
                try:
                    for key, value, timestamp in source.read_all_values():  # type: ignore[no-untyped-call]
                        total, _ = archive.read_value(key)  # type: ignore[no-untyped-call]
                        archive.write_value(key, total + value, timestamp)  # type: ignore[no-untyped-call]
                finally:
                    source.close()  # type: ignore[no-untyped-call]
                path.unlink()
        finally:
            archive.close()  # type: ignore[no-untyped-call]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _locked:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> None:
        self._fd = os.open(self.path, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
