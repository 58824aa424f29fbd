"""The pilot's ``$JOBSTATUS`` directory (HEPiX machine/job features): one file per key, read and
written under a lock, so that the site can see what draining or killing the pilot would waste.

Keys (:data:`KEYS`), one value per file followed by a newline; times are Unix seconds, written as
integers when integral:

``used_CPU``
    cores in use by payloads (integer).
``last_job_start``
    when the most recently started payload started.
``first_exp_job_end`` / ``last_exp_job_end``
    expected end of the payload expected to end first / last.
``last_max_job_end``
    latest *enforced* end (from the payloads' hard limits).
``add_uncom_time``
    core-seconds of uncommitted work besides ``used_CPU * (now - last_job_start)``:
    ``Σ cores_i * (last_job_start - start_i)``.
``add_final_exp_waste``
    core-seconds such that ``draining_waste`` (see :mod:`pilot.waste`) is the idle core-seconds
    until the last expected end: ``(allocated - used) * (last_exp - first_exp)
    + Σ cores_i * (last_exp - exp_end_i)``.
``can_postpone_last_job``
    ``True`` once the pilot has decided to retire (it starts no new payload), so draining it costs
    nothing more than waiting for its payloads; ``False`` otherwise.
``priority_factor``
    a float ≥ 0: how critical the pilot's work is (higher: more critical).

gridpilot extensions (informational, optional for readers; absent when unknown):
``allocated_CPU`` (cores the pilot was given, integer), ``pilot_reference`` (the pilot's
reference, one line) and ``last_max_job_end_assumed`` (``True`` when the payload that ends
last has no known limit, no wall limit and no shutdown time, so that ``last_max_job_end`` is
the pilot's own assumption of a week), so that ``gridpilot-drain-cost`` can show
used/allocated cores, name the pilot and mark an assumed limit.

Conventions of :func:`compute_status`:

* **No payload**: ``used_CPU`` 0, ``add_*`` 0, and every time key is *now* (the time of writing).
  Every formula of :mod:`pilot.waste` then gives 0 from that moment on (remaining time, draining
  and kill waste), so readers need no special case and every key is always present.
* **Payload times are normalised** to ``start ≤ now ≤ expected_end ≤ max_end``: a start in the
  future counts as now; an enforced end already passed counts as now (the pilot is stopping it);
  an expected end already passed counts as now (overdue: expected to end any moment); an
  expected end beyond the enforced one counts as the enforced one. The formulas are then exact at
  the time of writing.
* **More cores used than allocated** (should not happen): ``used_CPU`` is the real sum, and the
  idle-core count ``allocated - used`` is taken as 0.

Locking protocol. ``used_CPU`` is the lock target: before ANY key is read or written it is
``flock``-ed (exclusive for writers, shared for readers). Every file is replaced atomically (a
temporary file in the same directory, written, ``fsync``-ed, then ``os.replace``-d), so a file is
never seen empty or half written. Because ``used_CPU`` itself is replaced by a rename, a locker
checks, once it holds the lock on its open file, that the file is still the one at the path
(``os.fstat`` versus ``os.stat``) and starts over if not. A writer replaces ``used_CPU`` LAST: it
locks the new file before renaming it into place and only then lets the old one go, so the lock
is held without a gap and whoever locks the new file sees every other key already written.
The first writer creates the directory and the lock target with ``O_CREAT`` (several writers
racing all open the same file and the lock orders them); a reader that gets the empty lock target
before that writer's first write gets a :class:`JobStatusError` saying so.

Locks are re-entrant within a thread: :func:`read_status` and :func:`write_status` called inside
``locked(directory, exclusive=True)`` use the lock already held (a read-modify-write needs no
second lock, which would deadlock). A :func:`write_status` inside such a block keeps the lock
(on the new ``used_CPU``) until the block ends. Do not fork while holding a lock.
"""

from __future__ import annotations

import errno
import fcntl
import math
import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

USED_CPU = "used_CPU"
#: The nine keys of the HEPiX ``$JOBSTATUS`` proposal, in the order they are documented.
KEYS: tuple[str, ...] = (
    USED_CPU,
    "last_job_start",
    "first_exp_job_end",
    "last_exp_job_end",
    "last_max_job_end",
    "add_uncom_time",
    "add_final_exp_waste",
    "can_postpone_last_job",
    "priority_factor",
)
ALLOCATED_CPU = "allocated_CPU"
PILOT_REFERENCE = "pilot_reference"
LIMIT_ASSUMED = "last_max_job_end_assumed"
#: gridpilot's informational extensions (optional).
EXTRA_KEYS: tuple[str, ...] = (ALLOCATED_CPU, PILOT_REFERENCE, LIMIT_ASSUMED)

#: Temporary files are named ``<TEMP_PREFIX><key>.<pid>.<random>``; a writer holding the lock
#: removes any it finds (left by a writer that died mid-write).
TEMP_PREFIX = ".gridpilot-tmp."
#: Longest value file read; anything longer is garbage.
MAX_VALUE_BYTES = 4096

_FLOAT_KEYS = ("last_job_start", "first_exp_job_end", "last_exp_job_end", "last_max_job_end",
               "add_uncom_time", "add_final_exp_waste", "priority_factor")


class JobStatusError(Exception):
    """A ``$JOBSTATUS`` directory that cannot be read: missing, garbage, or locked too long.
    The message names the directory (and the key, when one is at fault)."""


@dataclass(frozen=True)
class RunningPayload:
    """One payload as the pilot sees it: cores given to it, start, expected and enforced end
    (Unix seconds)."""

    cores: int
    start: float
    expected_end: float
    max_end: float
    #: max_end is the pilot's assumption, not a known limit.
    max_end_assumed: bool = False


@dataclass(frozen=True)
class JobStatusValues:
    """The values of a ``$JOBSTATUS`` directory (see the module documentation for each key)."""

    used_CPU: int
    last_job_start: float
    first_exp_job_end: float
    last_exp_job_end: float
    last_max_job_end: float
    add_uncom_time: float
    add_final_exp_waste: float
    can_postpone_last_job: bool
    priority_factor: float
    allocated_CPU: int | None = None
    pilot_reference: str | None = None
    #: Whether last_max_job_end is assumed (None: not written, or no payload).
    limit_assumed: bool | None = None


# -- computing --------------------------------------------------------------------------------


def _finite(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, not {value!r}")
    return float(value)


def compute_status(allocated: int, payloads: Sequence[RunningPayload], *, now: float,
                   can_postpone: bool, priority_factor: float,
                   pilot_reference: str | None = None) -> JobStatusValues:
    """The ``$JOBSTATUS`` values of a pilot given ``allocated`` cores and running ``payloads``
    at ``now`` (Unix seconds). Raises ValueError on impossible input (negative cores, a payload
    with fewer than 1 core, non-finite times, a negative or non-finite priority factor)."""
    if isinstance(allocated, bool) or not isinstance(allocated, int) or allocated < 0:
        raise ValueError(f"allocated cores must be an integer >= 0, not {allocated!r}")
    now = _finite("now", now)
    priority = _finite("priority_factor", priority_factor)
    if priority < 0:
        raise ValueError(f"priority_factor must be >= 0, not {priority_factor!r}")
    cores: list[int] = []
    starts: list[float] = []
    expected: list[float] = []
    enforced: list[float] = []
    for p in payloads:
        if isinstance(p.cores, bool) or not isinstance(p.cores, int) or p.cores < 1:
            raise ValueError(f"a payload must have an integer number of cores >= 1: {p!r}")
        max_end = max(_finite("max_end", p.max_end), now)
        cores.append(p.cores)
        starts.append(min(_finite("start", p.start), now))
        expected.append(min(max(_finite("expected_end", p.expected_end), now), max_end))
        enforced.append(max_end)
    if not cores:
        return JobStatusValues(
            used_CPU=0, last_job_start=now, first_exp_job_end=now, last_exp_job_end=now,
            last_max_job_end=now, add_uncom_time=0.0, add_final_exp_waste=0.0,
            can_postpone_last_job=bool(can_postpone), priority_factor=priority,
            allocated_CPU=allocated, pilot_reference=pilot_reference)
    used = sum(cores)
    last_start = max(starts)
    first_exp, last_exp = min(expected), max(expected)
    uncommitted = sum(c * (last_start - s) for c, s in zip(cores, starts, strict=True))
    final = max(0, allocated - used) * (last_exp - first_exp) + sum(
        c * (last_exp - e) for c, e in zip(cores, expected, strict=True))
    last = max(range(len(enforced)), key=lambda i: (enforced[i], not payloads[i].max_end_assumed))
    return JobStatusValues(
        used_CPU=used, last_job_start=last_start, first_exp_job_end=first_exp,
        last_exp_job_end=last_exp, last_max_job_end=enforced[last],
        add_uncom_time=float(uncommitted), add_final_exp_waste=float(final),
        can_postpone_last_job=bool(can_postpone), priority_factor=priority,
        allocated_CPU=allocated, pilot_reference=pilot_reference,
        limit_assumed=bool(payloads[last].max_end_assumed))


# -- text form --------------------------------------------------------------------------------


def _format_number(value: float) -> str:
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


def _problems(values: JobStatusValues) -> list[str]:
    """What makes ``values`` unfit to be written (empty when fine)."""
    found = []
    for key in (USED_CPU, ALLOCATED_CPU):
        v = getattr(values, key)
        if v is None and key == ALLOCATED_CPU:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            found.append(f"{key} must be an integer >= 0, not {v!r}")
    for key in _FLOAT_KEYS:
        v = getattr(values, key)
        if (isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)
                or v < 0):
            found.append(f"{key} must be a finite number >= 0, not {v!r}")
    if not isinstance(values.can_postpone_last_job, bool):
        found.append(f"can_postpone_last_job must be a bool, not {values.can_postpone_last_job!r}")
    ref = values.pilot_reference
    if ref is not None and (not isinstance(ref, str) or not ref.strip()
                            or any(ch in ref for ch in "\n\r\0")):
        found.append(f"pilot_reference must be one non-blank line, not {ref!r}")
    return found


def _texts(values: JobStatusValues) -> dict[str, str | None]:
    """File contents per key (None: the optional file must be absent)."""
    texts: dict[str, str | None] = {USED_CPU: str(values.used_CPU)}
    for key in _FLOAT_KEYS:
        texts[key] = _format_number(getattr(values, key))
    texts["can_postpone_last_job"] = "True" if values.can_postpone_last_job else "False"
    texts[ALLOCATED_CPU] = None if values.allocated_CPU is None else str(values.allocated_CPU)
    texts[PILOT_REFERENCE] = values.pilot_reference
    texts[LIMIT_ASSUMED] = None if values.limit_assumed is None else str(values.limit_assumed)
    return {k: None if t is None else t + "\n" for k, t in texts.items()}


def _parse(directory: Path, texts: dict[str, str | None]) -> JobStatusValues:
    def where(key: str) -> str:
        return f"$JOBSTATUS {directory}: key {key}"

    def integer(key: str, text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise JobStatusError(f"{where(key)}: {text!r} is not an integer") from None
        if value < 0:
            raise JobStatusError(f"{where(key)}: {value} is negative")
        return value

    def number(key: str, text: str) -> float:
        try:
            value = float(text.strip())
        except ValueError:
            raise JobStatusError(f"{where(key)}: {text!r} is not a number") from None
        if not math.isfinite(value) or value < 0:
            raise JobStatusError(f"{where(key)}: {text.strip()!r} is not a finite number >= 0")
        return value

    required: dict[str, str] = {}
    for key in KEYS:
        text = texts.get(key)
        if text is None:
            raise JobStatusError(f"{where(key)}: missing")
        if not text.strip():
            hint = " (the pilot has not completed its first write)" if key == USED_CPU else ""
            raise JobStatusError(f"{where(key)}: empty{hint}")
        required[key] = text
    flag = required["can_postpone_last_job"].strip().lower()
    if flag not in ("true", "false"):
        raise JobStatusError(f"{where('can_postpone_last_job')}: "
                             f"{required['can_postpone_last_job']!r} is neither True nor False")
    allocated_text = texts.get(ALLOCATED_CPU)
    allocated = (None if allocated_text is None or not allocated_text.strip()
                 else integer(ALLOCATED_CPU, allocated_text))
    reference = (texts.get(PILOT_REFERENCE) or "").strip() or None
    # Informational: anything but True or False counts as not written.
    assumed = {"true": True, "false": False}.get((texts.get(LIMIT_ASSUMED) or "").strip().lower())
    return JobStatusValues(
        used_CPU=integer(USED_CPU, required[USED_CPU]),
        last_job_start=number("last_job_start", required["last_job_start"]),
        first_exp_job_end=number("first_exp_job_end", required["first_exp_job_end"]),
        last_exp_job_end=number("last_exp_job_end", required["last_exp_job_end"]),
        last_max_job_end=number("last_max_job_end", required["last_max_job_end"]),
        add_uncom_time=number("add_uncom_time", required["add_uncom_time"]),
        add_final_exp_waste=number("add_final_exp_waste", required["add_final_exp_waste"]),
        can_postpone_last_job=flag == "true",
        priority_factor=number("priority_factor", required["priority_factor"]),
        allocated_CPU=allocated, pilot_reference=reference, limit_assumed=assumed)


# -- locking ----------------------------------------------------------------------------------


class _Held:
    """A lock this thread holds on one directory: the open lock target and its mode."""

    def __init__(self, fd: int, exclusive: bool) -> None:
        self.fd = fd
        self.exclusive = exclusive


_local = threading.local()


def _held_locks() -> dict[str, _Held]:
    held: dict[str, _Held] | None = getattr(_local, "held", None)
    if held is None:
        held = {}
        _local.held = held
    return held


def _flock(fd: int, exclusive: bool, deadline: float | None, directory: Path,
           timeout: float | None) -> None:
    operation = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
    if deadline is None:
        fcntl.flock(fd, operation)
        return
    while True:
        try:
            fcntl.flock(fd, operation | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0:
                raise JobStatusError(f"$JOBSTATUS {directory}: {USED_CPU} stayed locked by "
                                     f"another process for more than {timeout:g} s") from None
            time.sleep(min(0.02, left))


def _same_file(fd: int, path: Path) -> bool:
    try:
        at_path = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (mine.st_dev, mine.st_ino) == (at_path.st_dev, at_path.st_ino)


def _acquire(directory: Path, exclusive: bool, timeout: float | None) -> int:
    """Open and lock the lock target, starting over until the locked file is the one at the
    path. Writers (exclusive) create the directory and the lock target; readers do not."""
    path = directory / USED_CPU
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        if exclusive:
            directory.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except FileNotFoundError:  # the directory vanished between mkdir and open
                continue
        else:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                raise JobStatusError(f"$JOBSTATUS {directory}: key {USED_CPU}: missing "
                                     "(not a pilot's $JOBSTATUS directory)") from None
            except OSError as exc:
                raise JobStatusError(f"$JOBSTATUS {directory}: key {USED_CPU}: cannot be "
                                     f"opened: {exc.strerror or exc}") from None
        try:
            _flock(fd, exclusive, deadline, directory, timeout)
            if _same_file(fd, path):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # replaced (or removed) while we waited: lock the file now at the path


@contextmanager
def _holding(directory: Path, *, exclusive: bool, timeout: float | None) -> Iterator[_Held]:
    directory = Path(directory)
    key = os.path.realpath(directory)
    held = _held_locks()
    mine = held.get(key)
    if mine is not None:  # re-entrant use within this thread
        if exclusive and not mine.exclusive:
            raise RuntimeError(f"$JOBSTATUS {directory}: cannot take an exclusive lock while "
                               "holding a shared one (release it first)")
        yield mine
        return
    mine = _Held(_acquire(directory, exclusive, timeout), exclusive)
    held[key] = mine
    try:
        yield mine
    finally:
        del held[key]
        os.close(mine.fd)


@contextmanager
def locked(directory: Path, *, exclusive: bool, timeout: float | None = None) -> Iterator[None]:
    """Hold the ``$JOBSTATUS`` lock of ``directory``: exclusive for a writer (creating the
    directory and the lock target when missing), shared for a reader (JobStatusError when the
    directory holds no ``used_CPU``). ``timeout`` (seconds; None waits for ever): give up with
    JobStatusError when another process keeps the lock longer. Re-entrant within a thread."""
    with _holding(directory, exclusive=exclusive, timeout=timeout):
        yield


# -- reading and writing ----------------------------------------------------------------------


def _create_temp(directory: Path, key: str) -> tuple[int, Path]:
    while True:
        path = directory / f"{TEMP_PREFIX}{key}.{os.getpid()}.{os.urandom(4).hex()}"
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                           0o644), path
        except FileExistsError:
            continue


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.fsync(fd)


def _write_temp(directory: Path, key: str, text: str) -> tuple[int, Path]:
    """A temporary file holding ``text``, written and fsync-ed; its fd is still open."""
    fd, temp = _create_temp(directory, key)
    try:
        _write_all(fd, text.encode("utf-8"))
    except BaseException:
        os.close(fd)
        temp.unlink(missing_ok=True)
        raise
    return fd, temp


def _remove_stale_temps(directory: Path) -> None:
    """Temporary files left by a writer that died (we hold the exclusive lock, so no live
    writer has any)."""
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.name.startswith(TEMP_PREFIX):
                Path(entry.path).unlink(missing_ok=True)


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:  # some file systems cannot sync a directory
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def write_status(directory: Path, values: JobStatusValues) -> None:
    """Write ``values`` to ``directory`` (created when missing) under the exclusive lock.

    Every value is first written to its temporary file and fsync-ed (a full disk fails here,
    before anything visible changed); then the other keys are renamed into place, the optional
    files removed when their value is None, and ``used_CPU``, locked beforehand, renamed last.
    Raises ValueError for values that readers would reject and OSError when the files cannot be
    written."""
    problems = _problems(values)
    if problems:
        raise ValueError(f"$JOBSTATUS {directory}: " + "; ".join(problems))
    directory = Path(directory)
    texts = _texts(values)
    with _holding(directory, exclusive=True, timeout=None) as mine:
        _remove_stale_temps(directory)
        temps: dict[str, Path] = {}
        new_fd: int | None = None
        try:
            for key, text in texts.items():
                if text is None:
                    continue
                fd, temps[key] = _write_temp(directory, key, text)
                if key == USED_CPU:
                    new_fd = fd
                else:
                    os.close(fd)
            assert new_fd is not None
            for key, text in texts.items():
                if key == USED_CPU:
                    continue
                if text is None:
                    (directory / key).unlink(missing_ok=True)
                else:
                    os.replace(temps[key], directory / key)
                    del temps[key]
            fcntl.flock(new_fd, fcntl.LOCK_EX)  # nobody else knows this file yet: no wait
            os.replace(temps[USED_CPU], directory / USED_CPU)
        except BaseException:
            if new_fd is not None:
                os.close(new_fd)
            for temp in temps.values():
                temp.unlink(missing_ok=True)
            raise
        old_fd, mine.fd = mine.fd, new_fd
        os.close(old_fd)  # waiters on the old file wake, see it replaced, and lock the new one
        _fsync_directory(directory)


def _read_value(directory: Path, key: str) -> str | None:
    try:
        with open(directory / key, "rb") as f:
            data = f.read(MAX_VALUE_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise JobStatusError(f"$JOBSTATUS {directory}: key {key}: cannot be read: "
                             f"{exc.strerror or exc}") from None
    if len(data) > MAX_VALUE_BYTES:
        raise JobStatusError(f"$JOBSTATUS {directory}: key {key}: longer than "
                             f"{MAX_VALUE_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise JobStatusError(f"$JOBSTATUS {directory}: key {key}: not UTF-8 text") from None


def read_status(directory: Path, *, timeout: float | None = None) -> JobStatusValues:
    """Read ``directory`` under the shared lock. Raises JobStatusError, naming the directory
    and the key, when it is missing, unreadable or garbage, or (with ``timeout`` seconds) when
    another process keeps the lock longer than that."""
    directory = Path(directory)
    with _holding(directory, exclusive=False, timeout=timeout):
        texts = {key: _read_value(directory, key) for key in KEYS + EXTRA_KEYS}
    return _parse(directory, texts)
