"""A payload's output files, with real payload subprocesses: named inside the job folder only,
never through a link planted there, and capped while the payload runs."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from pilot.payload import Payload, start_payload
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
