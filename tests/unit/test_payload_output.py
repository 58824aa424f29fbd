"""A payload's output files, with real payload subprocesses: named inside the job folder only,
never through a link planted there, and capped while the payload runs."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

from pilot.payload import Payload, fresh_job_folder, start_payload
from pilot.protocol import JobPayload


def _run(tmp_path: Path, script: str, **fields: str | None) -> Payload:
    job = JobPayload(job_id=7, vo="lhcb", owner="alice", owner_group="lhcb_user",
                     job_type="User", executable=sys.executable, arguments=["-c", script],
                     **fields)  # type: ignore[arg-type]
    return start_payload(job, cores=1, memory_mb=0, root=tmp_path / "work", now=time.time(),
                         max_end=time.time() + 600, cpu_factor=None, machine_features=None,
                         base_env={"PATH": "/usr/bin:/bin"})


SAY = "import sys; print('to stdout'); print('to stderr', file=sys.stderr)"


def test_output_names_that_leave_the_job_folder_stay_inside_it(tmp_path: Path) -> None:
    p = _run(tmp_path, SAY, stdout="../../escape.out", stderr=str(tmp_path / "abs.err"))
    assert p.wait() == 0
    folder = tmp_path / "work" / "job_7"
    assert not (tmp_path / "escape.out").exists() and not (tmp_path.parent / "escape.out").exists()
    assert not (tmp_path / "abs.err").exists()
    assert p.stdout_path == folder / "output.log" and p.stderr_path == folder / "error.log"
    assert "to stdout" in p.tail() and "to stderr" in p.tail()


def test_a_name_in_a_subfolder_is_kept(tmp_path: Path) -> None:
    p = _run(tmp_path, SAY, stdout="logs/std.out")
    assert p.wait() == 0
    assert (tmp_path / "work" / "job_7" / "logs" / "std.out").read_text().count("to ") == 2


def test_a_link_planted_in_the_job_folder_is_not_followed(tmp_path: Path) -> None:
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    folder = tmp_path / "work" / "job_7"
    folder.mkdir(parents=True)
    (folder / "output.log").symlink_to(precious)
    (folder / "std.out").symlink_to(precious)
    for name in (None, "std.out"):
        p = _run(tmp_path, SAY, stdout=name)
        assert p.wait() == 0
        assert precious.read_text() == "keep me"
        assert "to stdout" in p.tail()


def test_output_is_capped_to_its_end_while_the_payload_runs(tmp_path: Path) -> None:
    limit = 256 * 1024
    writer = ("import sys\n"
              "for i in range(60000): print(f'line {i:06d} ' + 'x' * 40)\n"
              "print('END')\n")
    p = _run(tmp_path, writer)
    while p.poll() is None:
        p.cap_output(limit)
        time.sleep(0.01)
    p.cap_output(limit)
    kept = p.stdout_path.read_bytes()
    assert len(kept) <= limit
    assert b"output cut here" in kept
    assert kept.rstrip().endswith(b"END")
    assert p.tail().rstrip().endswith("END")


def _run_in(tmp_path: Path, script: str, files: dict[str, bytes], **fields: str | None
            ) -> Payload:
    """Like _run, with ``files`` in the job folder first (as an input sandbox puts them)."""
    folder = fresh_job_folder(tmp_path / "work", 7)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    job = JobPayload(job_id=7, vo="lhcb", owner="alice", owner_group="lhcb_user",
                     job_type="User", executable=sys.executable, arguments=["-c", script],
                     **fields)  # type: ignore[arg-type]
    return start_payload(job, cores=1, memory_mb=0, root=tmp_path / "work", now=time.time(),
                         max_end=time.time() + 600, cpu_factor=None, machine_features=None,
                         base_env={"PATH": "/usr/bin:/bin"}, fresh=False)


ECHO_STDIN = "import sys; sys.stdout.write(sys.stdin.read().upper())"


def test_standard_input_comes_from_the_file_stdin_names(tmp_path: Path) -> None:
    p = _run_in(tmp_path, ECHO_STDIN, {"in.txt": b"from the sandbox"}, stdin="in.txt")
    assert p.wait() == 0
    assert p.stdout_path.read_text() == "FROM THE SANDBOX"


def test_without_stdin_the_payload_reads_nothing(tmp_path: Path) -> None:
    p = _run_in(tmp_path, ECHO_STDIN, {})
    assert p.wait() == 0
    assert p.stdout_path.read_text() == ""


@pytest.mark.parametrize(("name", "why"), [
    ("absent.txt", "No such file"), ("../../secret.txt", "leaves the job folder"),
    ("/etc/hostname", "leaves the job folder"), ("link.txt", "a link")])
def test_a_missing_outside_or_linked_stdin_is_an_error_naming_it(tmp_path: Path, name: str,
                                                                 why: str) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the payload")
    folder = fresh_job_folder(tmp_path / "work", 7)
    (folder / "link.txt").symlink_to(secret)
    job = JobPayload(job_id=7, vo="lhcb", owner="alice", owner_group="lhcb_user",
                     job_type="User", executable=sys.executable, arguments=["-c", ECHO_STDIN],
                     stdin=name)
    with pytest.raises(OSError, match=f"StdInput {re.escape(name)}.*{why}"):
        start_payload(job, cores=1, memory_mb=0, root=tmp_path / "work", now=time.time(),
                      max_end=time.time() + 600, cpu_factor=None, machine_features=None,
                      base_env={"PATH": "/usr/bin:/bin"}, fresh=False)


def test_stdout_and_stderr_stay_apart_when_both_are_named(tmp_path: Path) -> None:
    p = _run(tmp_path, SAY, stdout="psij.stdout", stderr="psij.stderr")
    assert p.wait() == 0
    assert p.stdout_path.read_text() == "to stdout\n"
    assert p.stderr_path is not None and p.stderr_path.read_text() == "to stderr\n"
