"""The pilot's $JOBSTATUS directory: values, file format, errors, and the locking protocol
checked with real processes (multiprocessing, spawn).

Blocking is proven without timing assertions: a process waiting for an flock shows up in
/proc/locks as a waiter ("->") with its pid and the inode it waits on, so each test waits until
it sees the waiter there (or sees the process finish, which fails the test), and only then lets
the lock holder go."""

from __future__ import annotations

import multiprocessing
import os
import re
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pilot.jobstatus import (
    EXTRA_KEYS,
    KEYS,
    TEMP_PREFIX,
    JobStatusError,
    JobStatusValues,
    RunningPayload,
    compute_status,
    locked,
    read_status,
    write_status,
)

CTX = multiprocessing.get_context("spawn")
#: Safeguard against a hung test only; no assertion depends on it.
PATIENCE = 60.0

# A 4-core pilot running a 1-core payload (started at 1000, expected to end at 5000, limit
# 9000) and a 2-core payload (started at 2000, expected end 4000, limit 8000), at now = 3000.
ONE = RunningPayload(cores=1, start=1000, expected_end=5000, max_end=9000)
TWO = RunningPayload(cores=2, start=2000, expected_end=4000, max_end=8000)


def example(**changes: Any) -> JobStatusValues:
    values = compute_status(4, [ONE, TWO], now=3000, can_postpone=False, priority_factor=1.5,
                            pilot_reference="pilot-42")
    return replace(values, **changes)


# -- compute_status ---------------------------------------------------------------------------


def test_the_nine_keys() -> None:
    assert KEYS == ("used_CPU", "last_job_start", "first_exp_job_end", "last_exp_job_end",
                    "last_max_job_end", "add_uncom_time", "add_final_exp_waste",
                    "can_postpone_last_job", "priority_factor")
    assert EXTRA_KEYS == ("allocated_CPU", "pilot_reference", "last_max_job_end_assumed")


def test_compute_status_by_hand() -> None:
    values = compute_status(4, [ONE, TWO], now=3000, can_postpone=True, priority_factor=1.5,
                            pilot_reference="pilot-42")
    assert values == JobStatusValues(
        used_CPU=3,                     # 1 + 2
        last_job_start=2000,            # the 2-core payload started last
        first_exp_job_end=4000,         # the 2-core payload is expected to end first
        last_exp_job_end=5000,          # the 1-core payload last
        last_max_job_end=9000,          # the 1-core payload's limit
        add_uncom_time=1000,            # 1 * (2000 - 1000) + 2 * (2000 - 2000)
        add_final_exp_waste=3000,       # (4 - 3) * (5000 - 4000) + 1 * 0 + 2 * (5000 - 4000)
        can_postpone_last_job=True, priority_factor=1.5, allocated_CPU=4,
        pilot_reference="pilot-42", limit_assumed=False)  # the 1-core payload's limit is known


def test_an_assumed_limit_is_said_when_the_last_enforced_end_is_assumed() -> None:
    assumed = RunningPayload(1, 1000, 5000, 9000, max_end_assumed=True)
    known = RunningPayload(2, 2000, 4000, 9000)
    assert compute_status(4, [assumed], now=3000, can_postpone=False,
                          priority_factor=1).limit_assumed is True
    # a known limit at the same time wins; no payload: not said
    assert compute_status(4, [assumed, known], now=3000, can_postpone=False,
                          priority_factor=1).limit_assumed is False
    assert compute_status(4, [], now=3000, can_postpone=False,
                          priority_factor=1).limit_assumed is None


def test_payload_order_does_not_matter() -> None:
    kw: dict[str, Any] = {"now": 3000, "can_postpone": False, "priority_factor": 1}
    assert compute_status(4, [ONE, TWO], **kw) == compute_status(4, [TWO, ONE], **kw)


def test_no_payload_writes_now_for_every_time() -> None:
    values = compute_status(8, [], now=1234.5, can_postpone=False, priority_factor=0)
    assert values == JobStatusValues(0, 1234.5, 1234.5, 1234.5, 1234.5, 0, 0, False, 0, 8, None)


def test_payload_times_are_normalised_around_now() -> None:
    overdue = RunningPayload(cores=1, start=1000, expected_end=2000, max_end=9000)
    future_start = RunningPayload(cores=1, start=4000, expected_end=6000, max_end=7000)
    beyond_limit = RunningPayload(cores=2, start=1500, expected_end=8000, max_end=5000)
    values = compute_status(4, [overdue, future_start, beyond_limit], now=3000,
                            can_postpone=False, priority_factor=1)
    # starts: 1000, 3000 (not 4000), 1500; expected ends: 3000 (not 2000), 6000, 5000 (not
    # 8000); limits 9000, 7000, 5000.
    assert values.last_job_start == 3000
    assert values.first_exp_job_end == 3000
    assert values.last_exp_job_end == 6000
    assert values.last_max_job_end == 9000
    assert values.add_uncom_time == 1 * 2000 + 1 * 0 + 2 * 1500
    assert values.add_final_exp_waste == 0 * 3000 + 1 * 3000 + 1 * 0 + 2 * 1000


def test_an_enforced_end_already_passed_counts_as_now() -> None:
    late = RunningPayload(cores=1, start=0, expected_end=500, max_end=1000)
    values = compute_status(1, [late], now=3000, can_postpone=False, priority_factor=1)
    assert (values.first_exp_job_end, values.last_exp_job_end, values.last_max_job_end) == (
        3000, 3000, 3000)


def test_more_cores_used_than_allocated_counts_no_idle_core() -> None:
    values = compute_status(2, [ONE, TWO], now=3000, can_postpone=False, priority_factor=1)
    assert values.used_CPU == 3
    assert values.add_final_exp_waste == 0 * 1000 + 1 * 0 + 2 * 1000


@pytest.mark.parametrize(("allocated", "payloads", "kw", "message"), [
    (-1, [], {}, "allocated"),
    (4, [RunningPayload(0, 1, 2, 3)], {}, "cores"),
    (4, [RunningPayload(1, float("nan"), 2, 3)], {}, "start"),
    (4, [], {"priority_factor": -0.5}, "priority_factor"),
    (4, [], {"priority_factor": float("inf")}, "priority_factor"),
    (4, [], {"now": float("nan")}, "now"),
])
def test_compute_status_refuses_impossible_input(allocated: int, payloads: list[RunningPayload],
                                                 kw: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"now": 10, "can_postpone": False, "priority_factor": 1} | kw
    with pytest.raises(ValueError, match=message):
        compute_status(allocated, payloads, **args)


# -- files ------------------------------------------------------------------------------------


def test_round_trip_and_file_format(tmp_path: Path) -> None:
    directory = tmp_path / "deep" / "pilot"
    values = example(priority_factor=0.1, can_postpone_last_job=True, last_job_start=2000.25)
    write_status(directory, values)
    files = {p.name: p.read_text() for p in directory.iterdir()}
    assert files == {
        "used_CPU": "3\n", "last_job_start": "2000.25\n", "first_exp_job_end": "4000\n",
        "last_exp_job_end": "5000\n", "last_max_job_end": "9000\n", "add_uncom_time": "1000\n",
        "add_final_exp_waste": "3000\n", "can_postpone_last_job": "True\n",
        "priority_factor": "0.1\n", "allocated_CPU": "4\n", "pilot_reference": "pilot-42\n",
        "last_max_job_end_assumed": "False\n"}
    assert read_status(directory) == values


def test_files_are_readable_by_the_site(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        write_status(tmp_path / "p", example())
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "p").iterdir()}
    assert set(modes.values()) == {0o644}


def test_absent_extensions_remove_their_files(tmp_path: Path) -> None:
    write_status(tmp_path, example())
    write_status(tmp_path, example(allocated_CPU=None, pilot_reference=None))
    assert not (tmp_path / "allocated_CPU").exists()
    assert not (tmp_path / "pilot_reference").exists()
    assert read_status(tmp_path) == example(allocated_CPU=None, pilot_reference=None)


def test_a_rewrite_replaces_every_value(tmp_path: Path) -> None:
    write_status(tmp_path, example())
    empty = compute_status(4, [], now=7000, can_postpone=True, priority_factor=3,
                           pilot_reference="pilot-42")
    write_status(tmp_path, empty)
    assert read_status(tmp_path) == empty


def test_stale_temporary_files_are_removed_and_none_is_left(tmp_path: Path) -> None:
    write_status(tmp_path, example())
    stale = tmp_path / f"{TEMP_PREFIX}used_CPU.99999.deadbeef"
    stale.write_text("7")
    write_status(tmp_path, example(used_CPU=2))
    assert not stale.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(KEYS + EXTRA_KEYS)


@pytest.mark.parametrize(("changes", "message"), [
    ({"used_CPU": -1}, "used_CPU"),
    ({"used_CPU": True}, "used_CPU"),
    ({"allocated_CPU": -4}, "allocated_CPU"),
    ({"last_job_start": float("nan")}, "last_job_start"),
    ({"add_uncom_time": -1.0}, "add_uncom_time"),
    ({"priority_factor": float("inf")}, "priority_factor"),
    ({"pilot_reference": "two\nlines"}, "pilot_reference"),
    ({"pilot_reference": "  "}, "pilot_reference"),
])
def test_write_refuses_values_readers_would_reject(tmp_path: Path, changes: dict[str, Any],
                                                   message: str) -> None:
    write_status(tmp_path, example())
    before = {p.name: p.read_text() for p in tmp_path.iterdir()}
    with pytest.raises(ValueError, match=message):
        write_status(tmp_path, example(**changes))
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == before


def test_reading_a_missing_directory(tmp_path: Path) -> None:
    where = re.escape(str(tmp_path / "nope"))
    with pytest.raises(JobStatusError, match=rf"{where}.*used_CPU.*missing"):
        read_status(tmp_path / "nope")
    assert not (tmp_path / "nope").exists()  # readers create nothing


@pytest.mark.parametrize("key", KEYS)
def test_a_missing_key_is_named(tmp_path: Path, key: str) -> None:
    write_status(tmp_path, example())
    (tmp_path / key).unlink()
    with pytest.raises(JobStatusError, match=rf"{re.escape(str(tmp_path))}.*key {key}.*missing"):
        read_status(tmp_path)


@pytest.mark.parametrize(("key", "text"), [
    ("used_CPU", "three\n"), ("used_CPU", "3.5\n"), ("used_CPU", "-1\n"),
    ("last_job_start", "yesterday\n"), ("first_exp_job_end", "nan\n"),
    ("last_exp_job_end", "inf\n"), ("last_max_job_end", "-5\n"), ("add_uncom_time", "\n"),
    ("add_final_exp_waste", "1e\n"), ("can_postpone_last_job", "maybe\n"),
    ("priority_factor", "high\n"), ("allocated_CPU", "four\n"),
])
def test_a_garbage_value_is_named(tmp_path: Path, key: str, text: str) -> None:
    write_status(tmp_path, example())
    (tmp_path / key).write_text(text)
    with pytest.raises(JobStatusError, match=rf"{re.escape(str(tmp_path))}.*key {key}"):
        read_status(tmp_path)


def test_binary_and_oversized_values_are_garbage(tmp_path: Path) -> None:
    write_status(tmp_path, example())
    (tmp_path / "priority_factor").write_bytes(b"\xff\xfe1")
    with pytest.raises(JobStatusError, match="key priority_factor: not UTF-8"):
        read_status(tmp_path)
    (tmp_path / "priority_factor").write_text("1" * 5000)
    with pytest.raises(JobStatusError, match="key priority_factor: longer than"):
        read_status(tmp_path)


def test_values_are_read_leniently_where_harmless(tmp_path: Path) -> None:
    write_status(tmp_path, example())
    (tmp_path / "can_postpone_last_job").write_text("true")      # no newline, lower case
    (tmp_path / "priority_factor").write_text("  2.5 \n")
    (tmp_path / "pilot_reference").write_text("\n")              # blank: unknown
    assert read_status(tmp_path) == example(can_postpone_last_job=True, priority_factor=2.5,
                                            pilot_reference=None)


def test_an_empty_lock_target_is_a_pilot_not_yet_written(tmp_path: Path) -> None:
    with locked(tmp_path / "new", exclusive=True):  # a writer creates the lock target...
        assert (tmp_path / "new" / "used_CPU").read_text() == ""
    # ...and dies before its first write: readers say so.
    with pytest.raises(JobStatusError, match=r"used_CPU: empty.*first write"):
        read_status(tmp_path / "new")


# -- locks within one process -----------------------------------------------------------------


def _locks() -> list[list[str]]:
    return [line.split() for line in Path("/proc/locks").read_text().splitlines()]


def _holds_flock(pid: int, inode: int) -> bool:
    return any(f[1] == "FLOCK" and f[3] == "WRITE" and int(f[4]) == pid
               and int(f[5].rsplit(":", 1)[1]) == inode for f in _locks() if len(f) > 5)


def _waits_on(pid: int, inode: int) -> bool:
    return any(f[1] == "->" and f[2] == "FLOCK" and int(f[5]) == pid
               and int(f[6].rsplit(":", 1)[1]) == inode for f in _locks() if len(f) > 6)


needs_proc_locks = pytest.mark.skipif(not Path("/proc/locks").exists(),
                                      reason="needs Linux /proc/locks")


def test_reads_and_writes_inside_a_held_lock_reuse_it(tmp_path: Path) -> None:
    with locked(tmp_path, exclusive=True):
        write_status(tmp_path, example())
        assert read_status(tmp_path) == example()
        write_status(tmp_path, example(used_CPU=1))
        assert read_status(tmp_path) == example(used_CPU=1)
    with locked(tmp_path, exclusive=False), locked(tmp_path, exclusive=False):
        assert read_status(tmp_path) == example(used_CPU=1)


def test_no_upgrade_from_shared_to_exclusive(tmp_path: Path) -> None:
    write_status(tmp_path, example())
    with locked(tmp_path, exclusive=False), pytest.raises(RuntimeError, match="shared"):
        write_status(tmp_path, example(used_CPU=1))
    assert read_status(tmp_path) == example()


@needs_proc_locks
def test_a_write_inside_a_lock_keeps_the_lock_on_the_new_used_cpu(tmp_path: Path) -> None:
    write_status(tmp_path, example())
    old = (tmp_path / "used_CPU").stat().st_ino
    with locked(tmp_path, exclusive=True):
        assert _holds_flock(os.getpid(), old)
        write_status(tmp_path, example(used_CPU=2))
        new = (tmp_path / "used_CPU").stat().st_ino
        assert new != old
        assert _holds_flock(os.getpid(), new)
        assert not _holds_flock(os.getpid(), old)
    assert not _holds_flock(os.getpid(), new)


# -- locks between processes ------------------------------------------------------------------


def _hold(directory: str, held: Any, release: Any, go: Any, replaced: Any,
          rewrite: JobStatusValues | None) -> None:
    """Hold the exclusive lock until ``release``; with ``rewrite``, write it (after ``go``)
    while still holding the lock, then set ``replaced``."""
    with locked(Path(directory), exclusive=True):
        held.set()
        if rewrite is not None:
            go.wait(PATIENCE)
            write_status(Path(directory), rewrite)
            replaced.set()
        release.wait(PATIENCE)


def _read(directory: str, out: Any, done: Any) -> None:
    try:
        out.put(("ok", read_status(Path(directory))))
    except Exception as exc:
        out.put(("error", repr(exc)))
    done.set()


def _write(directory: str, values: JobStatusValues, out: Any, done: Any) -> None:
    try:
        write_status(Path(directory), values)
        out.put(("ok", None))
    except Exception as exc:
        out.put(("error", repr(exc)))
    done.set()


class Holder:
    """Process A: holds locked(directory, exclusive=True) until released."""

    def __init__(self, directory: Path, rewrite: JobStatusValues | None = None) -> None:
        self.held, self.release, self.go, self.replaced = (CTX.Event() for _ in range(4))
        self.process = CTX.Process(target=_hold, args=(
            str(directory), self.held, self.release, self.go, self.replaced, rewrite))

    def __enter__(self) -> Holder:
        self.process.start()
        assert self.held.wait(PATIENCE), "process A never took the lock"
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.go.set()
        self.process.join(PATIENCE)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join()
        assert self.process.exitcode == 0


class Worker:
    """Process B: one read_status or write_status, its result on a queue."""

    def __init__(self, target: Callable[..., None], *args: Any) -> None:
        self.out = CTX.Queue()
        self.done = CTX.Event()
        self.process = CTX.Process(target=target, args=(*args, self.out, self.done))
        self.process.start()

    def wait_blocked_on(self, inode: int) -> None:
        """Return once the process waits for the lock on ``inode``; fail if it finishes
        first."""
        deadline = time.monotonic() + PATIENCE
        while not _waits_on(self.process.pid or 0, inode):
            assert not self.done.is_set(), (
                f"process B finished without waiting for the lock: {self.out.get(timeout=5)}")
            assert time.monotonic() < deadline, "process B never waited for the lock"
            time.sleep(0.002)

    def result(self) -> tuple[str, Any]:
        outcome: tuple[str, Any] = self.out.get(timeout=PATIENCE)
        self.process.join(PATIENCE)
        assert self.process.exitcode == 0
        return outcome

    def stop(self) -> None:
        if self.process.is_alive():
            self.process.terminate()
        self.process.join()


@needs_proc_locks
def test_a_reader_waits_for_the_writer_lock(tmp_path: Path) -> None:
    write_status(tmp_path, example())
    inode = (tmp_path / "used_CPU").stat().st_ino
    with Holder(tmp_path) as a:
        b = Worker(_read, str(tmp_path))
        try:
            b.wait_blocked_on(inode)
            assert not b.done.is_set()
            a.release.set()
            assert b.result() == ("ok", example())
        finally:
            b.stop()


@needs_proc_locks
def test_a_writer_waits_for_the_writer_lock_and_changes_nothing_before(tmp_path: Path) -> None:
    write_status(tmp_path, example())
    before = {p.name: p.read_text() for p in tmp_path.iterdir()}
    inode = (tmp_path / "used_CPU").stat().st_ino
    with Holder(tmp_path) as a:
        b = Worker(_write, str(tmp_path), example(used_CPU=1, pilot_reference="B"))
        try:
            b.wait_blocked_on(inode)
            # B waits for the lock before touching any file, even a temporary one.
            assert {p.name: p.read_text() for p in tmp_path.iterdir()} == before
            a.release.set()
            assert b.result() == ("ok", None)
        finally:
            b.stop()
    assert read_status(tmp_path) == example(used_CPU=1, pilot_reference="B")


@needs_proc_locks
def test_a_reader_waiting_on_a_replaced_used_cpu_retries_on_the_new_one(tmp_path: Path) -> None:
    write_status(tmp_path, example())
    old = (tmp_path / "used_CPU").stat().st_ino
    rewritten = example(used_CPU=2, priority_factor=9)
    with Holder(tmp_path, rewrite=rewritten) as a:
        b = Worker(_read, str(tmp_path))
        try:
            b.wait_blocked_on(old)
            a.go.set()  # A writes: used_CPU is replaced, A now holds the lock on the new file
            assert a.replaced.wait(PATIENCE)
            new = (tmp_path / "used_CPU").stat().st_ino
            assert new != old
            # B woke up on the old file (A let it go) and must now wait on the new one.
            b.wait_blocked_on(new)
            a.release.set()
            assert b.result() == ("ok", rewritten)
        finally:
            b.stop()


def test_a_reader_gives_up_after_its_timeout(tmp_path: Path) -> None:
    write_status(tmp_path, example())
    where = re.escape(str(tmp_path))
    with Holder(tmp_path), pytest.raises(JobStatusError, match=rf"{where}.*stayed locked"):
        read_status(tmp_path, timeout=0.05)
    assert read_status(tmp_path, timeout=0.05) == example()


def _first_writer(directory: str, values: JobStatusValues, start: Any) -> None:
    start.wait(PATIENCE)
    write_status(Path(directory), values)


def test_writers_racing_to_create_the_directory(tmp_path: Path) -> None:
    directory = tmp_path / "a" / "b"
    start = CTX.Event()
    candidates = [example(used_CPU=n, pilot_reference=f"w{n}") for n in range(4)]
    writers = [CTX.Process(target=_first_writer, args=(str(directory), v, start))
               for v in candidates]
    for w in writers:
        w.start()
    start.set()
    for w in writers:
        w.join(PATIENCE)
    assert [w.exitcode for w in writers] == [0, 0, 0, 0]
    assert read_status(directory) in candidates
    assert sorted(p.name for p in directory.iterdir()) == sorted(KEYS + EXTRA_KEYS)


# -- atomic replacement: readers only ever see whole snapshots --------------------------------

SNAPSHOTS = 200
CHECKPOINT = 10


def snapshot(k: int) -> JobStatusValues:
    """Snapshot k: every value derived from k, most of them long decimals, so that a mix of
    two snapshots or a truncated number cannot go unnoticed."""
    return JobStatusValues(
        used_CPU=k, last_job_start=1_700_000_000 + k / 3, first_exp_job_end=1_700_100_000 + k,
        last_exp_job_end=1_700_200_000 + k / 7, last_max_job_end=1_700_300_000 + k,
        add_uncom_time=k * 11.1, add_final_exp_waste=k / 13, can_postpone_last_job=k % 2 == 0,
        priority_factor=k / 17, allocated_CPU=k + 1000, pilot_reference=f"snapshot-{k}-" + "x" * k,
        limit_assumed=k % 3 == 0)


def _write_snapshots(directory: str, seen: Any, writer_done: Any) -> None:
    """Write snapshots 1..SNAPSHOTS; every CHECKPOINT-th, wait until the reader has seen it
    (so reads and writes interleave, deterministically)."""
    try:
        for k in range(1, SNAPSHOTS + 1):
            write_status(Path(directory), snapshot(k))
            if k % CHECKPOINT == 0:
                deadline = time.monotonic() + PATIENCE
                while seen.value < k and time.monotonic() < deadline:
                    time.sleep(0.0005)
    finally:
        writer_done.set()


def _whole(key: str, text: str) -> bool:
    """Whether ``text`` is a complete value as some snapshot wrote it."""
    if not text.endswith("\n"):
        return False
    if key == "pilot_reference":
        return re.fullmatch(r"snapshot-(\d+)-x*\n", text) is not None and len(text) == len(
            snapshot(int(text.split("-")[1])).pilot_reference or "") + 1
    if key in ("can_postpone_last_job", "last_max_job_end_assumed"):
        return text in ("True\n", "False\n")
    try:
        k = float(text)
    except ValueError:
        return False
    return key not in ("used_CPU", "allocated_CPU") or k.is_integer()


def _read_snapshots(directory: str, seen: Any, writer_done: Any, out: Any) -> None:
    """Read under the lock until the writer is done: each read must be one snapshot."""
    mixed: list[str] = []
    ks: list[int] = []
    try:
        while True:
            last = writer_done.is_set()
            values = read_status(Path(directory))
            k = values.used_CPU
            ks.append(k)
            if values != snapshot(k):
                mixed.append(repr(values))
            seen.value = k
            if last:
                break
        out.put(("ok", ks, mixed[:5]))
    except Exception as exc:
        out.put(("error", repr(exc), []))


def _read_files_unlocked(directory: str, writer_done: Any, out: Any) -> None:
    """Read the files as fast as possible WITHOUT the lock: keys may then come from different
    snapshots, but each file, being replaced by a rename, is always whole."""
    broken: list[str] = []
    reads = 0
    try:
        while not writer_done.is_set():
            for key in KEYS + EXTRA_KEYS:
                text = (Path(directory) / key).read_text()
                reads += 1
                if not _whole(key, text):
                    broken.append(f"{key}={text!r}")
        out.put(("ok", reads, broken[:5]))
    except Exception as exc:
        out.put(("error", repr(exc), []))


def test_readers_only_ever_see_whole_snapshots(tmp_path: Path) -> None:
    write_status(tmp_path, snapshot(0))
    seen = CTX.Value("q", 0)
    writer_done = CTX.Event()
    locked_out, raw_out = CTX.Queue(), CTX.Queue()
    processes = [
        CTX.Process(target=_read_snapshots, args=(str(tmp_path), seen, writer_done, locked_out)),
        CTX.Process(target=_read_files_unlocked, args=(str(tmp_path), writer_done, raw_out)),
        CTX.Process(target=_write_snapshots, args=(str(tmp_path), seen, writer_done)),
    ]
    for p in processes:
        p.start()
    try:
        status, ks, mixed = locked_out.get(timeout=5 * PATIENCE)
        raw_status, raw_reads, broken = raw_out.get(timeout=PATIENCE)
        for p in processes:
            p.join(PATIENCE)
    finally:
        for p in processes:
            if p.is_alive():
                p.terminate()
            p.join()
    assert (status, raw_status) == ("ok", "ok"), (ks, raw_reads)
    assert mixed == []
    assert broken == []
    assert raw_reads > 0
    # The checkpoints force the reader to see at least every CHECKPOINT-th snapshot...
    assert set(range(CHECKPOINT, SNAPSHOTS + 1, CHECKPOINT)) <= set(ks)
    # ...in the order they were written, ending with the last one.
    assert ks == sorted(ks)
    assert ks[-1] == SNAPSHOTS
    assert [p.exitcode for p in processes] == [0, 0, 0]
