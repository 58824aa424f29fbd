"""HEPiX machine/job features read from directories: values, garbage, dynamic keys, limits,
and the writer. The HTTP side is in tests/integration/test_features_http.py."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests

from pilot.features import (
    JOB_KEYS,
    MACHINE_KEYS,
    RETRY_AFTER,
    Features,
    JobFeatures,
    Limits,
    MachineFeatures,
    write_features,
)

LOGGER = "pilot.features"

MACHINE = {"hs06": 160.0, "shutdowntime": 1_700_010_000, "jobslots": 8, "phys_cores": 8,
           "log_cores": 16, "shutdown_command": "/sbin/shutdown -h now"}
JOB = {"cpufactor_lrms": 10.0, "cpu_limit_secs_lrms": 36_000, "cpu_limit_secs": 360_000,
       "wall_limit_secs_lrms": 7_200, "wall_limit_secs": 72_000, "disk_limit_GB": 20.5,
       "jobstart_secs": 1_700_000_000, "mem_limit_MB": 16_000, "allocated_CPU": 4,
       "shutdowntime_job": 1_700_005_000}


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    machine, job = tmp_path / "machine", tmp_path / "job"
    write_features(machine, MACHINE)
    write_features(job, JOB)
    return machine, job


def records(caplog: pytest.LogCaptureFixture, text: str = "",
            level: int | None = None) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and text in r.getMessage()
            and (level is None or r.levelno == level)]


# --- all keys, derived limits -------------------------------------------------------------


def test_the_key_lists_are_mjf_v1() -> None:
    assert set(MACHINE_KEYS) == set(MACHINE)
    assert set(JOB_KEYS) == set(JOB)


def test_all_keys_from_directories(dirs: tuple[Path, Path],
                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    features = Features(str(dirs[0]), str(dirs[1]))
    assert features.machine() == MachineFeatures(**MACHINE)  # type: ignore[arg-type]
    assert features.job() == JobFeatures(**JOB)  # type: ignore[arg-type]
    assert isinstance(features.machine().hs06, float)
    assert isinstance(features.job().jobstart_secs, int)
    assert records(caplog) == []


def test_limits_from_directories(dirs: tuple[Path, Path]) -> None:
    now = 1_700_001_000.0
    limits = Features(str(dirs[0]), str(dirs[1])).limits(now, cpu_used=600.0)
    assert limits == Limits(
        cores=4,
        cpu_factor=10.0,                     # cpufactor_lrms
        wall_end=1_700_007_200.0,            # jobstart 1_700_000_000 + 7_200 real seconds
        wall_left=6_200.0,                   # 1_700_007_200 - 1_700_001_000
        cpu_left=354_000.0,                  # 360_000 - 600 * 10
        memory_mb=16_000,
        disk_gb=20.5,
        shutdown=1_700_005_000.0,            # the job's, earlier than the machine's
    )
    assert limits.seconds_left(now) == 4_000.0          # to the shutdown, before wall_end
    assert limits.seconds_left(1_700_006_000.0) == 0.0  # past it: not below 0


def test_limits_now_defaults_to_the_clock(dirs: tuple[Path, Path]) -> None:
    clock = Clock(1_700_007_000.0)
    limits = Features(str(dirs[0]), str(dirs[1]), clock=clock).limits()
    assert limits.wall_left == 200.0


def test_cpu_factor_from_the_cpu_limits() -> None:
    job = JobFeatures(cpu_limit_secs=30_000, cpu_limit_secs_lrms=12_000, jobstart_secs=1_000,
                      wall_limit_secs=25_000)
    limits = Limits.derive(MachineFeatures(hs06=100.0, log_cores=10), job, now=2_000.0,
                           cpu_used=1_000.0)
    assert limits.cpu_factor == 2.5                      # 30_000 / 12_000, not hs06 / cores
    assert limits.wall_end == 11_000.0                   # 1_000 + 25_000 / 2.5
    assert limits.wall_left == 9_000.0
    assert limits.cpu_left == 27_500.0                   # 30_000 - 1_000 * 2.5


def test_cpu_factor_from_hs06_per_core() -> None:
    job = JobFeatures(cpu_limit_secs_lrms=1_000)
    logical = Limits.derive(MachineFeatures(hs06=160.0, log_cores=16, phys_cores=8), job,
                            now=0.0, cpu_used=100.0)
    assert logical.cpu_factor == 10.0
    assert logical.cpu_left == 9_000.0                   # 1_000 * 10 - 100 * 10
    physical = Limits.derive(MachineFeatures(hs06=160.0, phys_cores=8), job, now=0.0)
    assert physical.cpu_factor == 20.0
    assert physical.cpu_left == 20_000.0
    assert Limits.derive(MachineFeatures(hs06=160.0), job, now=0.0).cpu_factor is None


def test_cpu_and_wall_left_never_go_below_zero() -> None:
    job = JobFeatures(cpufactor_lrms=2.0, cpu_limit_secs=100, jobstart_secs=0,
                      wall_limit_secs_lrms=50)
    limits = Limits.derive(MachineFeatures(), job, now=80.0, cpu_used=70.0)
    assert limits.cpu_left == 0.0
    assert limits.wall_left == 0.0


def test_used_cpu_without_a_factor_leaves_cpu_left_unknown() -> None:
    job = JobFeatures(cpu_limit_secs=100)
    assert Limits.derive(MachineFeatures(), job, now=0.0).cpu_left == 100.0
    assert Limits.derive(MachineFeatures(), job, now=0.0, cpu_used=1.0).cpu_left is None
    assert Limits.derive(MachineFeatures(), JobFeatures(cpu_limit_secs_lrms=100),
                         now=0.0).cpu_left is None


def test_nothing_known_means_no_limits() -> None:
    limits = Features(None, None).limits(123.0, cpu_used=5.0)
    assert limits == Limits(None, None, None, None, None, None, None, None)
    assert limits.seconds_left(123.0) is None


@pytest.mark.parametrize("cpu_used", [-1.0, float("nan"), float("inf")])
def test_impossible_cpu_used_is_refused(cpu_used: float) -> None:
    with pytest.raises(ValueError, match="cpu_used"):
        Features(None, None).limits(0.0, cpu_used=cpu_used)


@pytest.mark.parametrize(("machine_end", "job_end", "expected"), [
    (500, 900, 500.0), (900, 500, 500.0), (None, 700, 700.0), (700, None, 700.0),
    (None, None, None),
])
def test_shutdown_is_the_earliest_of_machine_and_job(tmp_path: Path, machine_end: int | None,
                                                    job_end: int | None,
                                                    expected: float | None) -> None:
    write_features(tmp_path / "m", {"shutdowntime": machine_end})
    write_features(tmp_path / "j", {"shutdowntime_job": job_end, "jobstart_secs": 100,
                                    "wall_limit_secs_lrms": 1_000})
    limits = Features(str(tmp_path / "m"), str(tmp_path / "j")).limits(now=200.0)
    assert limits.shutdown == expected
    assert limits.seconds_left(200.0) == (expected if expected is not None else 1_100.0) - 200


# --- values and garbage -------------------------------------------------------------------


@pytest.mark.parametrize("text", [b"12", b"12.0", b" 12\n", b"1.2e1", b"+12", b"12.9"])
def test_integer_keys_accept_plain_decimals(tmp_path: Path, text: bytes) -> None:
    write_features(tmp_path, {"mem_limit_MB": text, "wall_limit_secs": text})
    job = Features(None, str(tmp_path)).job()
    assert job.mem_limit_MB == 12 and type(job.mem_limit_MB) is int   # a fraction is dropped
    assert job.wall_limit_secs == 12


@pytest.mark.parametrize("text", [b"12", b"12.0", b" 12\n"])
def test_float_keys_are_floats(tmp_path: Path, text: bytes) -> None:
    write_features(tmp_path, {"hs06": text})
    hs06 = Features(str(tmp_path), None).machine().hs06
    assert hs06 == 12.0 and type(hs06) is float


def test_shutdown_command_is_stripped_text(tmp_path: Path) -> None:
    write_features(tmp_path, {"shutdown_command": b"  /usr/bin/drain --now\n\n"})
    assert Features(str(tmp_path), None).machine().shutdown_command == "/usr/bin/drain --now"


GARBAGE = [
    ("allocated_CPU", b"four", "not a number"),
    ("allocated_CPU", b"4.5", "not a whole number"),
    ("allocated_CPU", b"0", "zero"),
    ("allocated_CPU", b"1_000", "not a number"),
    ("wall_limit_secs", b"-3600", "negative"),
    ("wall_limit_secs", b"", "empty"),
    ("wall_limit_secs", b" \n\t", "empty"),
    ("cpufactor_lrms", b"NaN", "not finite"),
    ("cpufactor_lrms", b"-inf", "not finite"),
    ("cpufactor_lrms", b"1e999", "not finite"),
    ("jobstart_secs", b"\x00\x01\x02\x03", "binary content"),
    ("jobstart_secs", b"\xff\xfe\x80", "not UTF-8 text"),
    ("jobstart_secs", b"1" * 5000, "too large"),
    ("mem_limit_MB", b"16000 MB", "not a number"),
    ("mem_limit_MB", b"0x10", "not a number"),
    # Absurd values are unknown too: a shutdown after year 9999 once made every match refused.
    ("shutdowntime_job", b"99999999999999999999999999999", "absurdly large"),
    ("jobstart_secs", b"1e300", "absurdly large"),
    ("allocated_CPU", b"1000000000", "absurdly large"),
    ("wall_limit_secs", b"9" * 30, "absurdly large"),
    ("cpufactor_lrms", b"1e200", "absurdly large"),
    ("mem_limit_MB", b"9223372036854775807", "absurdly large"),
]


@pytest.mark.parametrize(("key", "data", "problem"), GARBAGE)
def test_garbage_is_unknown_and_logged_once(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                            key: str, data: bytes, problem: str) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    neighbour = "allocated_CPU" if key == "mem_limit_MB" else "mem_limit_MB"
    write_features(tmp_path, {key: data, neighbour: 2})
    features = Features(None, str(tmp_path))
    for _ in range(3):
        assert getattr(features.job(), key) is None
    warned = records(caplog, key, logging.WARNING)
    assert len(warned) == 1
    assert problem in warned[0].getMessage()
    assert getattr(features.job(), neighbour) == 2  # the good neighbour is unharmed


def test_garbage_dynamic_key_is_reread_but_logged_once(tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    write_features(tmp_path, {"shutdowntime": "soon"})
    features = Features(str(tmp_path), None)
    assert [features.machine().shutdowntime for _ in range(3)] == [None, None, None]
    assert len(records(caplog, "shutdowntime", logging.WARNING)) == 1
    write_features(tmp_path, {"shutdowntime": -5})
    assert features.machine().shutdowntime is None
    assert features.machine().shutdowntime is None
    negative = records(caplog, "shutdowntime", logging.WARNING)
    assert len(negative) == 2 and "negative" in negative[1].getMessage()
    write_features(tmp_path, {"shutdowntime": 0})  # the epoch: shut down now
    assert features.machine().shutdowntime == 0


def test_unreadable_entries_are_unknown(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    (tmp_path / "hs06").mkdir()
    os.mkfifo(tmp_path / "jobslots")  # must not block the reader
    write_features(tmp_path, {"log_cores": 8})
    features = Features(str(tmp_path), None)
    machine = features.machine()
    assert machine.hs06 is None and machine.jobslots is None and machine.log_cores == 8
    features.machine()
    assert len(records(caplog, "hs06", logging.WARNING)) == 1
    assert len(records(caplog, "jobslots", logging.WARNING)) == 1
    assert "not a regular file" in records(caplog, "jobslots")[0].getMessage()


def test_a_missing_key_is_logged_once_at_info(tmp_path: Path,
                                              caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    write_features(tmp_path, {"hs06": 10})
    features = Features(str(tmp_path), None)
    for _ in range(3):
        assert features.machine().shutdowntime is None
    absent = records(caplog, "shutdowntime")
    assert [r.levelno for r in absent] == [logging.INFO]
    assert records(caplog, level=logging.WARNING) == []


def test_a_missing_directory_means_all_unknown(tmp_path: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    features = Features(str(tmp_path / "nope"), str(tmp_path / "nope" / "job"))
    for _ in range(2):
        assert features.machine() == MachineFeatures()
        assert features.job() == JobFeatures()
        assert features.limits(0.0).seconds_left(0.0) is None
    # one warning per source, not one per key and check
    warned = records(caplog, level=logging.WARNING)
    assert len(warned) == 2
    assert all("directory missing" in r.getMessage() for r in warned)


def test_a_directory_that_appears_later_is_read(tmp_path: Path) -> None:
    features = Features(str(tmp_path / "m"), None)
    assert features.machine().hs06 is None
    write_features(tmp_path / "m", {"hs06": 42})
    assert features.machine().hs06 == 42.0  # the static key was not settled by the failure


@pytest.mark.parametrize("source", ["relative/dir", "ftp://host/mjf", "~/mjf"])
def test_a_source_that_is_neither_path_nor_url_is_ignored(
        source: str, caplog: pytest.LogCaptureFixture) -> None:
    features = Features(source, None)
    assert features.machine() == MachineFeatures()
    assert "neither an absolute directory nor an http(s) URL" in caplog.text


@pytest.mark.parametrize("source", [None, "", "  "])
def test_no_source_means_nothing_known_and_nothing_logged(
        source: str | None, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    features = Features(source, source)
    assert features.machine() == MachineFeatures()
    assert features.job() == JobFeatures()
    assert records(caplog) == []


def test_from_environ(dirs: tuple[Path, Path]) -> None:
    env = {"MACHINEFEATURES": str(dirs[0]), "JOBFEATURES": str(dirs[1])}
    features = Features.from_environ(env)
    assert features.machine().jobslots == 8
    assert features.job().allocated_CPU == 4


# --- when values are read -----------------------------------------------------------------


def test_shutdowntime_appearing_mid_run_is_picked_up(tmp_path: Path) -> None:
    machine, job = tmp_path / "m", tmp_path / "j"
    write_features(machine, {"hs06": 10})
    write_features(job, {"jobstart_secs": 1_000, "wall_limit_secs_lrms": 10_000})
    features = Features(str(machine), str(job))
    assert features.limits(2_000.0).shutdown is None
    assert features.limits(2_000.0).seconds_left(2_000.0) == 9_000.0
    write_features(machine, {"shutdowntime": 5_000})
    assert features.machine().shutdowntime == 5_000
    assert features.limits(2_000.0).seconds_left(2_000.0) == 3_000.0
    write_features(job, {"shutdowntime_job": 4_000})
    assert features.job().shutdowntime_job == 4_000
    assert features.limits(2_000.0).shutdown == 4_000.0
    write_features(job, {"shutdowntime_job": 4_500})   # moved
    assert features.limits(2_000.0).shutdown == 4_500.0
    write_features(machine, {"shutdowntime": None})     # withdrawn
    write_features(job, {"shutdowntime_job": None})
    assert features.limits(2_000.0).shutdown is None


def test_static_keys_are_read_once(tmp_path: Path) -> None:
    write_features(tmp_path, {"hs06": 10, "jobslots": 4})
    features = Features(str(tmp_path), None)
    assert features.machine().hs06 == 10.0
    write_features(tmp_path, {"hs06": 99, "jobslots": None})
    assert features.machine().hs06 == 10.0
    assert features.machine().jobslots == 4


# --- HTTP failures with an injected session (the real server is in the integration tests) ---


class FailingSession(requests.Session):
    def __init__(self, error: Callable[[], Exception]) -> None:
        super().__init__()
        self.error = error
        self.urls: list[str] = []

    def request(self, method: str | bytes, url: str | bytes,
                *args: Any, **kwargs: Any) -> requests.Response:
        self.urls.append(str(url))
        assert kwargs["timeout"] is not None and kwargs["timeout"] <= 10
        raise self.error()


@pytest.mark.parametrize(("error", "problem"), [
    (lambda: requests.ConnectTimeout("slow"), "timeout"),
    (lambda: requests.ConnectionError("refused"), "connection failed"),
])
def test_an_unreachable_server_is_unknown_and_not_hammered(
        caplog: pytest.LogCaptureFixture, error: Callable[[], Exception], problem: str) -> None:
    clock = Clock(1_000.0)
    with FailingSession(error) as session:
        features = Features("http://mjf.invalid/machine", None, session=session, clock=clock)
        assert features.machine() == MachineFeatures()
        assert len(session.urls) == 1                  # the first failure pauses the source
        clock.now += RETRY_AFTER / 2
        assert features.limits().shutdown is None
        assert len(session.urls) == 1
        clock.now += RETRY_AFTER
        assert features.machine() == MachineFeatures()
        assert len(session.urls) == 2                  # asked again after the pause
    warned = records(caplog, level=logging.WARNING)
    assert len(warned) == 1 and problem in warned[0].getMessage()


def test_close_leaves_an_injected_session_open() -> None:
    with FailingSession(lambda: requests.ConnectionError("x")) as session:
        features = Features("http://mjf.invalid/m", None, session=session)
        features.close()
        features.machine()
        assert session.urls == ["http://mjf.invalid/m/hs06"]


# --- write_features -----------------------------------------------------------------------


def test_write_features_round_trip(tmp_path: Path) -> None:
    write_features(tmp_path / "m", MACHINE)
    write_features(tmp_path / "j", JOB)
    features = Features(str(tmp_path / "m"), str(tmp_path / "j"))
    assert features.machine() == MachineFeatures(**MACHINE)  # type: ignore[arg-type]
    assert features.job() == JobFeatures(**JOB)  # type: ignore[arg-type]
    assert (tmp_path / "j" / "allocated_CPU").read_text() == "4\n"
    assert (tmp_path / "j" / "disk_limit_GB").read_text() == "20.5\n"
    assert sorted(p.name for p in (tmp_path / "j").iterdir()) == sorted(JOB)  # no temp files


def test_write_features_replaces_files_atomically(tmp_path: Path) -> None:
    write_features(tmp_path, {"shutdowntime": 100})
    before = (tmp_path / "shutdowntime").stat().st_ino
    write_features(tmp_path, {"shutdowntime": 200})
    assert (tmp_path / "shutdowntime").stat().st_ino != before  # a new file renamed in place
    assert (tmp_path / "shutdowntime").read_text() == "200\n"
    assert stat.S_IMODE((tmp_path / "shutdowntime").stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["shutdowntime"]


def test_write_features_bytes_none_and_floats(tmp_path: Path) -> None:
    write_features(tmp_path, {"hs06": 0.1 + 0.2, "shutdown_command": b"raw\x00", "jobslots": 3})
    assert (tmp_path / "shutdown_command").read_bytes() == b"raw\x00"
    assert Features(str(tmp_path), None).machine().hs06 == 0.1 + 0.2  # exact round trip
    write_features(tmp_path, {"jobslots": None, "phys_cores": None})  # absent stays absent
    assert not (tmp_path / "jobslots").exists()
    assert not (tmp_path / "phys_cores").exists()


@pytest.mark.parametrize("key", ["", ".", "..", "a/b", ".hidden", "x\x00y"])
def test_write_features_refuses_keys_that_are_not_file_names(tmp_path: Path, key: str) -> None:
    with pytest.raises(ValueError, match="not a features key"):
        write_features(tmp_path / "d", {key: 1})
    assert not (tmp_path / "d").exists()


def test_write_features_refuses_bools(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="bool"):
        write_features(tmp_path, {"jobslots": True})
    assert list(tmp_path.iterdir()) == []
