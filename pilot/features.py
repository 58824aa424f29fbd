"""HEPiX Machine/Job Features (MJF v1): what the site tells a job about its machine and limits.

Sources
    ``$MACHINEFEATURES`` and ``$JOBFEATURES`` each name either a local directory (a path that
    starts with ``/``), holding one file per key whose content, stripped of surrounding white
    space, is the value; or an ``http://``/``https://`` URL, where the value of key ``K`` is the
    body of ``GET <url>/K``. ``None`` or an empty string means "nothing known"; anything else
    (a relative path, another scheme) is refused with a warning and also means nothing known.

Keys (MJF v1 names)
    machine: ``hs06``, ``shutdowntime``, ``jobslots``, ``phys_cores``, ``log_cores``,
    ``shutdown_command``; job: ``cpufactor_lrms``, ``cpu_limit_secs_lrms``, ``cpu_limit_secs``,
    ``wall_limit_secs_lrms``, ``wall_limit_secs``, ``disk_limit_GB``, ``jobstart_secs``,
    ``mem_limit_MB``, ``allocated_CPU``, ``shutdowntime_job``.

Values
    ``hs06``, ``cpufactor_lrms`` and ``disk_limit_GB`` are floats; every other key except
    ``shutdown_command`` (free text) is an integer. Numbers are plain decimals (``12``,
    ``12.0``, `` 12\\n``, ``1.2e3``). Core and slot counts (``jobslots``, ``phys_cores``,
    ``log_cores``, ``allocated_CPU``) must be whole numbers; seconds and MB may carry a fraction,
    which is dropped (rounding down is the cautious side for times and limits). Every number must
    be positive: a zero limit, factor or count is read as "not set", not as "nothing allowed".
    Only the time stamps ``shutdowntime`` and ``shutdowntime_job`` may be 0 (the epoch: shut down
    now). A value that is missing, empty, not a number, negative, NaN or infinite, absurdly
    large (a time stamp after year 9999, more than 2^20 cores, a limit of more than 10^11
    seconds or 2^31-1 MB, a CPU factor above 10^4), not UTF-8 text, larger than 4 KiB,
    unreadable, or answered with an HTTP error or not at all is *unknown* (``None``). Nothing
    here ever raises to the caller because of what a source holds.

Logging (logger ``pilot.features``)
    Each problem is logged once per source, key and kind of problem for the life of a
    :class:`Features` object: a key that is simply not provided at INFO (every MJF key is
    optional), anything malformed or failing at WARNING. A source-wide problem (the directory
    does not exist, the server cannot be reached) is logged once for the source, not per key.

When values are read
    ``shutdowntime`` and ``shutdowntime_job`` may change while the job runs: they are read again
    on every :meth:`Features.machine`, :meth:`Features.job` and :meth:`Features.limits` call, so
    a shutdown announced mid-run is seen at the next check, and a withdrawn one (file removed,
    HTTP 404) is forgotten. Every other key is read once, at the first check, and kept; only a
    passing failure (missing directory, unreachable server, HTTP 5xx/408/429) makes the next
    check try it again. When such a passing failure hits a dynamic key, the last value read is
    kept rather than forgotten: an unreachable server does not cancel an announced shutdown.

HTTP
    Requests go through one ``requests.Session`` (injectable); each fetch has a total deadline
    of :data:`HTTP_TIMEOUT` seconds, however slowly the server trickles its answer (the fetch
    runs in a thread that is given up at the deadline). 404 and 410 mean the key is absent. A
    response is reused while it is fresh for a private cache: ``Cache-Control: no-store`` or
    ``no-cache`` means never reuse it; ``max-age=N`` means for N seconds after it arrived (less
    any ``Age``); otherwise ``Expires`` (measured against the response's ``Date``) decides; with
    none of these it is not reused, so dynamic keys are fetched at every check. Only definite
    answers (a value, absent, malformed) are cached. After a timeout or a connection failure the
    source is not asked again for :data:`RETRY_AFTER` seconds, so a dead server costs one
    timeout per pause rather than one per key and check.

Derived limits (:class:`Limits`, all times Unix seconds)
    - ``cores`` = ``allocated_CPU``; ``memory_mb`` = ``mem_limit_MB``;
      ``disk_gb`` = ``disk_limit_GB``.
    - ``cpu_factor`` = ``cpufactor_lrms``, else ``cpu_limit_secs / cpu_limit_secs_lrms``, else
      ``hs06 / log_cores`` (or ``hs06 / phys_cores``).
    - ``wall_end`` = ``jobstart_secs + wall_limit_secs_lrms`` (real seconds), else
      ``jobstart_secs + wall_limit_secs / cpu_factor``; ``wall_left`` = ``wall_end - now`` >= 0.
    - ``cpu_left`` (normalised CPU seconds) = ``cpu_limit_secs`` (else
      ``cpu_limit_secs_lrms * cpu_factor``) ``- cpu_used * cpu_factor``, not below 0; unknown
      when CPU has been used but no factor is known to normalise it.
    - ``shutdown`` = the earlier of ``shutdowntime`` and ``shutdowntime_job``.
    - ``seconds_left(now)`` = real seconds to the earlier of ``wall_end`` and ``shutdown``.

Writing
    :func:`write_features` writes a features directory, one file per key, each replaced
    atomically (a temporary file in the same directory, then ``os.replace``), so a reader sees
    the old value or the new one, never half of one. The pilot uses it to give each payload its
    own ``$JOBFEATURES``.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import math
import os
import re
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, Literal

import requests

__all__ = [
    "HTTP_TIMEOUT",
    "JOB_KEYS",
    "MACHINE_KEYS",
    "RETRY_AFTER",
    "Features",
    "JobFeatures",
    "Limits",
    "MachineFeatures",
    "write_features",
]

log = logging.getLogger("pilot.features")

#: Seconds to wait for a features server (connect and read).
HTTP_TIMEOUT = 5.0
#: Seconds during which a server that timed out or refused the connection is not asked again.
RETRY_AFTER = 60.0
#: A value file larger than this is not a feature value.
MAX_VALUE_BYTES = 4096

_Kind = Literal["float", "count", "int", "time", "text"]


#: Largest plausible values: beyond them a value is absurd, and unknown like garbage.
#: Time stamps: the last second of year 9999 (the last a datetime holds).
MAX_TIME = 253402300799
#: Cores and slots of one machine.
MAX_COUNT = 1 << 20
#: Seconds of a limit (about 3,000 years).
MAX_SECONDS = 10**11
#: Memory of one job, MB (what the matcher takes as a memory figure).
MAX_MEMORY_MB = 2**31 - 1


@dataclass(frozen=True)
class _Spec:
    #: float: positive float; count: positive whole number; int: positive, fraction dropped;
    #: time: time stamp >= 0, fraction dropped; text: any non-empty text.
    kind: _Kind
    #: The largest plausible value (numbers only).
    maximum: float = math.inf


MACHINE_KEYS: Mapping[str, _Spec] = {
    "hs06": _Spec("float", 1e7),
    "shutdowntime": _Spec("time", MAX_TIME),
    "jobslots": _Spec("count", MAX_COUNT),
    "phys_cores": _Spec("count", MAX_COUNT),
    "log_cores": _Spec("count", MAX_COUNT),
    "shutdown_command": _Spec("text"),
}
JOB_KEYS: Mapping[str, _Spec] = {
    "cpufactor_lrms": _Spec("float", 1e4),
    "cpu_limit_secs_lrms": _Spec("int", MAX_SECONDS),
    "cpu_limit_secs": _Spec("int", MAX_SECONDS),
    "wall_limit_secs_lrms": _Spec("int", MAX_SECONDS),
    "wall_limit_secs": _Spec("int", MAX_SECONDS),
    "disk_limit_GB": _Spec("float", 1e9),
    "jobstart_secs": _Spec("int", MAX_TIME),
    "mem_limit_MB": _Spec("int", MAX_MEMORY_MB),
    "allocated_CPU": _Spec("count", MAX_COUNT),
    "shutdowntime_job": _Spec("time", MAX_TIME),
}
#: Keys read again at every check; the others are read once.
DYNAMIC_KEYS = frozenset({"shutdowntime", "shutdowntime_job"})

_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_NOT_FINITE = re.compile(r"[+-]?(?:nan|inf|infinity)", re.IGNORECASE)


@dataclass(frozen=True)
class MachineFeatures:
    """``$MACHINEFEATURES``; ``None`` = unknown."""

    hs06: float | None = None
    shutdowntime: int | None = None
    jobslots: int | None = None
    phys_cores: int | None = None
    log_cores: int | None = None
    shutdown_command: str | None = None


@dataclass(frozen=True)
class JobFeatures:
    """``$JOBFEATURES``; ``None`` = unknown."""

    cpufactor_lrms: float | None = None
    cpu_limit_secs_lrms: int | None = None
    cpu_limit_secs: int | None = None
    wall_limit_secs_lrms: int | None = None
    wall_limit_secs: int | None = None
    disk_limit_GB: float | None = None
    jobstart_secs: int | None = None
    mem_limit_MB: int | None = None
    allocated_CPU: int | None = None
    shutdowntime_job: int | None = None


@dataclass(frozen=True)
class Limits:
    """What the features allow this job, derived as the module docstring says."""

    cores: int | None
    cpu_factor: float | None
    wall_end: float | None
    wall_left: float | None
    cpu_left: float | None
    memory_mb: int | None
    disk_gb: float | None
    shutdown: float | None

    def seconds_left(self, now: float) -> float | None:
        """Real seconds from ``now`` to the earlier of ``wall_end`` and ``shutdown`` (not below
        0), or ``None`` when neither is known."""
        wall_end, shutdown = self.wall_end, self.shutdown
        end = shutdown if wall_end is None else (
            wall_end if shutdown is None else min(wall_end, shutdown))
        return None if end is None else max(0.0, end - now)

    @classmethod
    def derive(cls, machine: MachineFeatures, job: JobFeatures, *, now: float,
               cpu_used: float = 0.0) -> Limits:
        """The limits for features already read; ``cpu_used`` is real CPU seconds used so far
        (all cores together). Raises ValueError for a negative or non-finite ``cpu_used``."""
        if not math.isfinite(cpu_used) or cpu_used < 0:
            raise ValueError(f"cpu_used must be a finite number >= 0, not {cpu_used!r}")
        factor: float | None
        if job.cpufactor_lrms is not None:
            factor = job.cpufactor_lrms
        elif job.cpu_limit_secs is not None and job.cpu_limit_secs_lrms is not None:
            factor = job.cpu_limit_secs / job.cpu_limit_secs_lrms
        elif machine.hs06 is not None and (machine.log_cores or machine.phys_cores):
            factor = machine.hs06 / (machine.log_cores or machine.phys_cores or 1)
        else:
            factor = None

        wall_end: float | None = None
        if job.jobstart_secs is not None:
            if job.wall_limit_secs_lrms is not None:
                wall_end = float(job.jobstart_secs + job.wall_limit_secs_lrms)
            elif job.wall_limit_secs is not None and factor is not None:
                wall_end = job.jobstart_secs + job.wall_limit_secs / factor
        wall_left = None if wall_end is None else max(0.0, wall_end - now)

        cpu_limit: float | None = None
        if job.cpu_limit_secs is not None:
            cpu_limit = float(job.cpu_limit_secs)
        elif job.cpu_limit_secs_lrms is not None and factor is not None:
            cpu_limit = job.cpu_limit_secs_lrms * factor
        cpu_left: float | None = None
        if cpu_limit is not None:
            if cpu_used == 0:
                cpu_left = cpu_limit
            elif factor is not None:
                cpu_left = max(0.0, cpu_limit - cpu_used * factor)

        shutdowns = [t for t in (machine.shutdowntime, job.shutdowntime_job) if t is not None]
        return cls(cores=job.allocated_CPU, cpu_factor=factor, wall_end=wall_end,
                   wall_left=wall_left, cpu_left=cpu_left, memory_mb=job.mem_limit_MB,
                   disk_gb=job.disk_limit_GB,
                   shutdown=float(min(shutdowns)) if shutdowns else None)


# --- reading one value --------------------------------------------------------------------


@dataclass(frozen=True)
class _Problem:
    kind: str  # what is wrong, the unit of "logged once"
    detail: str = ""
    whole_source: bool = False  # about the source, not this key: logged once per source


@dataclass(frozen=True)
class _Raw:
    """What a source answered for one key: bytes, absent (data and problem None), or a
    problem; ``passing`` problems are worth asking again at the next check."""

    data: bytes | None = None
    problem: _Problem | None = None
    passing: bool = False


class _Source:
    where: str

    def read(self, key: str) -> _Raw:
        raise NotImplementedError

    def close(self) -> None:
        pass


class _DirectorySource(_Source):
    def __init__(self, path: str) -> None:
        self.where = path

    def read(self, key: str) -> _Raw:
        path = os.path.join(self.where, key)
        try:
            # O_NONBLOCK: a FIFO under a key's name must not hang the pilot.
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        except (FileNotFoundError, NotADirectoryError):
            if not os.path.isdir(self.where):
                return _Raw(problem=_Problem("directory missing", "no such directory",
                                             whole_source=True), passing=True)
            return _Raw()
        except OSError as exc:
            return _Raw(problem=_Problem("unreadable", exc.strerror or str(exc)))
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return _Raw(problem=_Problem("not a regular file"))
            with os.fdopen(fd, "rb", closefd=False) as handle:
                return _Raw(data=handle.read(MAX_VALUE_BYTES + 1))
        except OSError as exc:
            return _Raw(problem=_Problem("unreadable", exc.strerror or str(exc)))
        finally:
            os.close(fd)


class _HttpSource(_Source):
    def __init__(self, url: str, session: requests.Session | None,
                 clock: Callable[[], float]) -> None:
        self.where = url
        self._base = url.rstrip("/")
        self._session = session
        self._own_session = session is None
        self._clock = clock
        self._cache: dict[str, tuple[_Raw, float]] = {}
        self._quiet_until = -math.inf
        self._failure = _Problem("unreachable", whole_source=True)

    def close(self) -> None:
        if self._own_session and self._session is not None:
            self._session.close()
            self._session = None

    def read(self, key: str) -> _Raw:
        now = self._clock()
        cached = self._cache.get(key)
        if cached is not None and now < cached[1]:
            return cached[0]
        if now < self._quiet_until:  # the last failure stands until the pause is over
            return _Raw(problem=self._failure, passing=True)
        if self._session is None:
            self._session = requests.Session()
        # The socket timeout bounds each wait for a byte, not the whole answer: a server that
        # trickles its answer a byte at a time would hold the pilot for ever. So the fetch runs
        # in a thread of its own and is given up after HTTP_TIMEOUT seconds in all.
        timeout = HTTP_TIMEOUT
        fetch = _Fetch(self._session, f"{self._base}/{key}", timeout)
        worker = threading.Thread(target=fetch.run, name=f"features {key}", daemon=True)
        worker.start()
        worker.join(timeout)
        if worker.is_alive():
            fetch.abandoned = True
            kind = "timeout"
            detail = f"no complete answer within {timeout:g} s"
        elif isinstance(fetch.outcome, requests.Timeout):
            kind = "timeout"
            detail = f"no answer within {timeout:g} s"
        elif isinstance(fetch.outcome, BaseException):
            kind = "connection failed"
            detail = f"{type(fetch.outcome).__name__}: {fetch.outcome}"
        else:
            assert fetch.outcome is not None
            raw, headers = fetch.outcome
            received = self._clock()
            if raw.passing:
                self._cache.pop(key, None)
            else:
                self._cache[key] = (raw, _fresh_until(headers, received))
            return raw
        self._quiet_until = self._clock() + RETRY_AFTER
        self._failure = _Problem(kind, detail, whole_source=True)
        return _Raw(problem=self._failure, passing=True)



class _Fetch:
    """One GET of one key, run in a thread that may be given up (``abandoned``): it then
    stops reading the body at the next chunk."""

    def __init__(self, session: requests.Session, url: str, timeout: float) -> None:
        self.session, self.url, self.timeout = session, url, timeout
        self.abandoned = False
        self.outcome: tuple[_Raw, Mapping[str, str]] | BaseException | None = None

    def run(self) -> None:
        try:
            with self.session.get(self.url, timeout=self.timeout, stream=True) as response:
                self.outcome = (self._answer(response), dict(response.headers))
        except (requests.RequestException, http.client.HTTPException, OSError,
                ValueError) as exc:
            self.outcome = exc

    def _answer(self, response: requests.Response) -> _Raw:
        code = response.status_code
        if code in (404, 410):
            return _Raw()
        if code != 200:
            reason = f"HTTP {code} {response.reason or ''}".strip()
            return _Raw(problem=_Problem(f"HTTP {code}", reason),
                        passing=code >= 500 or code in (408, 429))
        body = bytearray()
        for chunk in response.iter_content(chunk_size=1024):
            if self.abandoned:
                break
            body += chunk
            if len(body) > MAX_VALUE_BYTES:
                break
        return _Raw(data=bytes(body))


def _fresh_until(headers: Mapping[str, str], received: float) -> float:
    """Until when a private cache may reuse a response that arrived at ``received``."""
    directives: dict[str, str] = {}
    for part in headers.get("Cache-Control", "").split(","):
        name, _, value = part.partition("=")
        if name.strip():
            directives[name.strip().lower()] = value.strip().strip('"')
    if "no-store" in directives or "no-cache" in directives:
        return -math.inf
    try:
        age = max(0, int(headers.get("Age", "0")))
    except ValueError:
        age = 0
    if "max-age" in directives:
        try:
            return received + int(directives["max-age"]) - age
        except ValueError:
            return -math.inf
    if "Expires" in headers:
        expires = _http_date(headers["Expires"])
        if expires is None:
            return -math.inf  # an invalid Expires ("0") means already expired
        date = _http_date(headers.get("Date", ""))
        return received + expires - (received if date is None else date) - age
    return -math.inf


def _http_date(text: str) -> float | None:
    try:
        return parsedate_to_datetime(text).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def _parse(data: bytes, spec: _Spec) -> tuple[object, _Problem | None]:
    """The value of ``data`` for ``spec``, or the problem that makes it unknown."""
    if len(data) > MAX_VALUE_BYTES:
        return None, _Problem("too large", f"more than {MAX_VALUE_BYTES} bytes")
    try:
        text = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        return None, _Problem("not UTF-8 text")
    if "\x00" in text:
        return None, _Problem("binary content")
    if not text:
        return None, _Problem("empty")
    if spec.kind == "text":
        return text, None
    if _NOT_FINITE.fullmatch(text):
        return None, _Problem("not finite")
    if not _NUMBER.fullmatch(text):
        return None, _Problem("not a number")
    number = float(text)
    if not math.isfinite(number):
        return None, _Problem("not finite")
    if number < 0:
        return None, _Problem("negative")
    if number == 0 and spec.kind != "time":
        return None, _Problem("zero")
    if number > spec.maximum:
        return None, _Problem("absurdly large", f"more than {spec.maximum:g}")
    if spec.kind == "float":
        return number, None
    if spec.kind == "count" and not number.is_integer():
        return None, _Problem("not a whole number")
    return int(number), None


def _snippet(data: bytes | None) -> str:
    if data is None:
        return ""
    shown = data[:40].decode("utf-8", errors="backslashreplace").strip()
    return f" (value {shown!r}{'...' if len(data) > 40 else ''})"


# --- the public reader --------------------------------------------------------------------


class _FeatureSet:
    """The keys of one source, with what has been read and logged so far."""

    def __init__(self, name: str, source: _Source | None, specs: Mapping[str, _Spec],
                 logged: set[tuple[str, str, str]]) -> None:
        self.name = name
        self.source = source
        self.specs = specs
        self._logged = logged
        self._kept: dict[str, object] = {}  # static keys read for good
        self._last: dict[str, object] = {}  # last definite value of each dynamic key

    def values(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, spec in self.specs.items():
            if self.source is None:
                out[key] = None
            elif key in DYNAMIC_KEYS:
                value, definite = self._read(self.source, key, spec)
                if definite:
                    self._last[key] = value
                out[key] = self._last.get(key)
            elif key in self._kept:
                out[key] = self._kept[key]
            else:
                value, definite = self._read(self.source, key, spec)
                if definite:
                    self._kept[key] = value
                out[key] = value
        return out

    def _read(self, source: _Source, key: str, spec: _Spec) -> tuple[object, bool]:
        raw = source.read(key)
        if raw.problem is not None:
            self._warn(source, key, raw.problem, raw.data)
            return None, not raw.passing
        if raw.data is None:
            if self._once(key, "absent"):
                log.info("%s key %s is not provided by %s; unknown", self.name, key,
                         source.where)
            return None, True
        value, problem = _parse(raw.data, spec)
        if problem is not None:
            self._warn(source, key, problem, raw.data)
            return None, True
        return value, True

    def _warn(self, source: _Source, key: str, problem: _Problem, data: bytes | None) -> None:
        if problem.whole_source:
            if self._once("*", problem.kind):
                log.warning("%s source %s: %s (%s); its keys are unknown", self.name,
                            source.where, problem.kind, problem.detail)
        elif self._once(key, problem.kind):
            detail = f": {problem.detail}" if problem.detail else ""
            log.warning("%s key %s from %s: %s%s%s; treated as unknown", self.name, key,
                        source.where, problem.kind, detail, _snippet(data))

    def _once(self, key: str, kind: str) -> bool:
        mark = (self.name, key, kind)
        if mark in self._logged:
            return False
        self._logged.add(mark)
        return True


class Features:
    """Machine and job features from ``$MACHINEFEATURES``/``$JOBFEATURES`` (see the module
    docstring for the rules). Thread-safe; never raises because of what a source holds."""

    def __init__(self, machine: str | None, job: str | None, *,
                 session: requests.Session | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        logged: set[tuple[str, str, str]] = set()
        self._machine = _FeatureSet(
            "$MACHINEFEATURES", self._source("$MACHINEFEATURES", machine, session),
            MACHINE_KEYS, logged)
        self._job = _FeatureSet("$JOBFEATURES", self._source("$JOBFEATURES", job, session),
                                JOB_KEYS, logged)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None, *,
                     session: requests.Session | None = None,
                     clock: Callable[[], float] = time.time) -> Features:
        """Features named by ``$MACHINEFEATURES`` and ``$JOBFEATURES`` (default: os.environ)."""
        env = os.environ if environ is None else environ
        return cls(env.get("MACHINEFEATURES"), env.get("JOBFEATURES"), session=session,
                   clock=clock)

    def _source(self, name: str, value: str | None,
                session: requests.Session | None) -> _Source | None:
        where = (value or "").strip()
        if not where:
            return None
        if where.startswith("/"):
            return _DirectorySource(where)
        if where.lower().startswith(("http://", "https://")):
            return _HttpSource(where, session, self._clock)
        log.warning("%s is %r: neither an absolute directory nor an http(s) URL; ignored",
                    name, where)
        return None

    def machine(self) -> MachineFeatures:
        """The machine features; ``shutdowntime`` is read again at each call."""
        with self._lock:
            return MachineFeatures(**self._machine.values())

    def job(self) -> JobFeatures:
        """The job features; ``shutdowntime_job`` is read again at each call."""
        with self._lock:
            return JobFeatures(**self._job.values())

    def limits(self, now: float | None = None, cpu_used: float = 0.0) -> Limits:
        """The derived limits at ``now`` (default: the clock) after ``cpu_used`` real CPU
        seconds; re-reads the shutdown times. Raises ValueError only for a negative or
        non-finite ``cpu_used``."""
        machine, job = self.machine(), self.job()
        return Limits.derive(machine, job, now=self._clock() if now is None else now,
                             cpu_used=cpu_used)

    def close(self) -> None:
        """Close the HTTP session if this object created it (an injected one is left open)."""
        with self._lock:
            for features in (self._machine, self._job):
                if features.source is not None:
                    features.source.close()


# --- writing ------------------------------------------------------------------------------


def write_features(directory: Path, values: Mapping[str, object]) -> None:
    """Write ``values`` into ``directory`` (created if needed), one file per key, each replaced
    atomically. ``bytes`` are written as they are, ``None`` removes the key's file, anything
    else is written as text (floats so that they read back exactly) with a final newline.
    Raises ValueError for a key that is not a plain file name, TypeError for a bool."""
    directory = Path(directory)
    for key in values:
        if (not key or key in (".", "..") or key.startswith(".")
                or any(c in key for c in "/\\\x00")):
            raise ValueError(f"not a features key: {key!r}")
        if isinstance(values[key], bool):
            raise TypeError(f"{key}: a bool is not a feature value")
    directory.mkdir(parents=True, exist_ok=True)
    for key, value in values.items():
        target = directory / key
        if value is None:
            target.unlink(missing_ok=True)
            continue
        if isinstance(value, bytes):
            data = value
        elif isinstance(value, float):
            data = f"{value!r}\n".encode()
        else:
            data = f"{value}\n".encode()
        fd, temp = tempfile.mkstemp(prefix=f".{key}.", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                os.fchmod(handle.fileno(), 0o644)  # the payload may read it as another user
            os.replace(temp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
