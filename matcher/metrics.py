"""Prometheus metrics that add up over every worker process of one host.

Each process counts in memory and, at most once a second, writes its totals to its own file in
a shared folder; ``/metrics`` adds up the files. A process that has exited leaves its file, so
counters never go backwards; the scrape folds such files into one archive file (under a file
lock) so that recycled workers do not pile up files.
"""

from __future__ import annotations

import bisect
import fcntl
import json
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

#: Upper bounds of the latency histogram, in seconds.
LATENCY_BUCKETS: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                      1.0, 2.5, 5.0)
FLUSH_INTERVAL = 1.0

HELP: dict[str, tuple[str, str]] = {
    "gridpilot_http_requests_total": ("counter", "HTTP requests handled, by endpoint and status"),
    "gridpilot_http_request_duration_seconds": ("histogram",
                                                "Time to handle a request, by endpoint"),
    "gridpilot_match_requests_total": ("counter", "Match requests, by outcome"),
    "gridpilot_jobs_matched_total": ("counter", "Jobs handed to pilots"),
    "gridpilot_no_matches_total": ("counter", "Match requests that found no job, by reason"),
    "gridpilot_waiting_jobs": ("gauge", "Jobs waiting in each task queue"),
    "gridpilot_sandboxes": ("gauge", "Sandboxes stored, per VO"),
    "gridpilot_sandbox_bytes": ("gauge", "Bytes of sandboxes stored, per VO"),
}

def _key(name: str, labels: Mapping[str, str]) -> str:
    return json.dumps([name, sorted(labels.items())])


class Metrics:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._counters: dict[str, float] = {}
        self._histograms: dict[str, list[float]] = {}  # bucket counts..., sum, count
        self._file = directory / f"worker-{os.getpid()}-{time.time_ns()}.json"
        self._pid = os.getpid()
        self._flushed = 0.0

    def inc(self, name: str, labels: Mapping[str, str], amount: float = 1.0) -> None:
        key = _key(name, labels)
        self._counters[key] = self._counters.get(key, 0.0) + amount

    def observe(self, name: str, labels: Mapping[str, str], value: float) -> None:
        key = _key(name, labels)
        row = self._histograms.get(key)
        if row is None:
            row = self._histograms[key] = [0.0] * (len(LATENCY_BUCKETS) + 2)
        bucket = bisect.bisect_left(LATENCY_BUCKETS, value)  # first bound >= value
        if bucket < len(LATENCY_BUCKETS):  # beyond the last bound: only in +Inf (the count)
            row[bucket] += 1
        row[-2] += value
        row[-1] += 1

    def flush(self, *, force: bool = False) -> None:
        """Write this process's totals to its file (at most once a second unless forced)."""
        now = time.monotonic()
        if not force and now - self._flushed < FLUSH_INTERVAL:
            return
        if self._pid != os.getpid():  # forked: start a file of our own
            self._file = self.directory / f"worker-{os.getpid()}-{time.time_ns()}.json"
            self._pid = os.getpid()
            self._counters.clear()
            self._histograms.clear()
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self._file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"pid": os.getpid(), "counters": self._counters,
                                   "histograms": self._histograms}), encoding="utf-8")
        os.replace(tmp, self._file)
        self._flushed = now

    def render(self, gauges: Iterable[tuple[str, Mapping[str, str], float]] = ()) -> str:
        """The Prometheus text exposition of every process's totals plus ``gauges``."""
        self.flush(force=True)
        counters, histograms = self._collect()
        by_name: dict[str, list[str]] = {}
        for key, value in sorted(counters.items()):
            name, labels = json.loads(key)
            by_name.setdefault(name, []).append(f"{name}{_labels(labels)} {_num(value)}")
        for key, row in sorted(histograms.items()):
            name, labels = json.loads(key)
            lines = by_name.setdefault(name, [])
            cumulative = 0.0
            for bound, count in zip(LATENCY_BUCKETS, row[:len(LATENCY_BUCKETS)], strict=True):
                cumulative += count
                lines.append(f"{name}_bucket{_labels([*labels, ['le', _num(bound)]])} "
                             f"{_num(cumulative)}")
            lines.append(f"{name}_bucket{_labels([*labels, ['le', '+Inf']])} {_num(row[-1])}")
            lines.append(f"{name}_sum{_labels(labels)} {row[-2]!r}")
            lines.append(f"{name}_count{_labels(labels)} {_num(row[-1])}")
        for name, labels_map, value in gauges:
            by_name.setdefault(name, []).append(
                f"{name}{_labels(sorted(labels_map.items()))} {_num(value)}")
        out: list[str] = []
        for name in sorted(by_name):
            kind, text = HELP.get(name, ("untyped", name))
            out += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", *by_name[name]]
        return "\n".join(out) + "\n"

    def _collect(self) -> tuple[dict[str, float], dict[str, list[float]]]:
        counters: dict[str, float] = {}
        histograms: dict[str, list[float]] = {}
        with _locked(self.directory / "metrics.lock"):
            self._archive_dead()
            for path in sorted(self.directory.glob("*.json")):
                data = _read(path)
                for key, value in data.get("counters", {}).items():
                    counters[key] = counters.get(key, 0.0) + value
                for key, row in data.get("histograms", {}).items():
                    total = histograms.setdefault(key, [0.0] * len(row))
                    for i, v in enumerate(row):
                        total[i] += v
        return counters, histograms

    def _archive_dead(self) -> None:
        archive = self.directory / "archive.json"
        merged = _read(archive)
        for path in self.directory.glob("worker-*.json"):
            data = _read(path)
            pid = data.get("pid")
            if not isinstance(pid, int) or _alive(pid):
                continue
            for key, value in data.get("counters", {}).items():
                merged.setdefault("counters", {})[key] = (
                    merged.get("counters", {}).get(key, 0.0) + value)
            for key, row in data.get("histograms", {}).items():
                total = merged.setdefault("histograms", {}).setdefault(key, [0.0] * len(row))
                for i, v in enumerate(row):
                    total[i] += v
            tmp = archive.with_suffix(".tmp")
            tmp.write_text(json.dumps(merged), encoding="utf-8")
            os.replace(tmp, archive)  # archived before the worker's file goes
            path.unlink(missing_ok=True)


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


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
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)


def _labels(labels: list[list[str]] | list[tuple[str, str]]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels)
    return "{" + inner + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
