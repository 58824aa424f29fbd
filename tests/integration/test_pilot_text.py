"""A payload whose output is not valid text (NUL bytes, invalid UTF-8, the encoding of a
surrogate): a real pilot against a real matcher still beats with its tail and ends the job
with its exit code; and a final report the matcher refuses is sent plainer, never dropped."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator

import pytest

from gridpilot import schema
from gridpilot.devserver import matcher_server
from pilot.cli import parser, pilot_options
from pilot.loop import Pilot, _Report
from pilot.replay import load_reports, replay
from taskqueue.db.database import make_engine
from tests.integration.test_pilot import CE, QUEUE, ROOT, SECRET, SITE, Grid
from tests.integration.test_pilot_hardening import finish, submit

#: Prints bytes that are not text, then waits for the file named by its argument.
NOT_TEXT = '''\
import os, sys, time
sys.stdout.buffer.write(b"before\\x00after \\xff\\xfe|\\xed\\xa0\\x80| end\\n")
sys.stdout.flush()
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
sys.exit(int(sys.argv[2]))
'''


@pytest.fixture(scope="module")
def grid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Grid]:
    """One matcher for the module (each test ends the jobs it submits)."""
    tmp_path = tmp_path_factory.mktemp("text-matcher")
    url = f"sqlite:///{tmp_path / 'gridpilot.db'}"
    engine = make_engine(url)
    schema.upgrade(engine)
    engine.dispose()
    with matcher_server(url, SECRET, ROOT / "conf" / "resources.toml", tmp_path) as base:
        yield Grid(base, tmp_path)


def _output(grid: Grid, job_id: int) -> dict[str, object]:
    response = grid.user.get(f"{grid.base}/api/v1/jobs/{job_id}/output", timeout=30)
    assert response.status_code == 200, response.text
    answer: dict[str, object] = response.json()
    return answer


def test_a_payload_printing_nul_and_invalid_utf8_ends_with_its_exit_code(grid: Grid) -> None:
    script = grid.tmp / "not_text.py"
    script.write_text(NOT_TEXT, encoding="utf-8")
    release = grid.tmp / "release"
    job_id = submit(grid, sys.executable, f"{script} {release} 0")
    proc = grid.pilot("--cores", "1", "--idle-timeout", "2")
    # While it runs, its heartbeats are taken: the tail they carry can be peeked at.
    deadline = time.monotonic() + 15
    tail = ""
    while "end" not in tail:
        assert proc.poll() is None, finish(proc)[1]
        assert time.monotonic() < deadline, (
            f"no heartbeat of job {job_id} was accepted with its output tail "
            f"(status {grid.job(job_id)['status']})")
        time.sleep(0.2)
        tail = str(_output(grid, job_id).get("output_tail") or "")
    assert tail.startswith("before\ufffdafter \ufffd\ufffd|"), repr(tail)
    release.touch()
    code, out = finish(proc)
    assert code == 0, out
    job = grid.job(job_id)
    assert (job["status"], job["exit_code"]) == ("Done", 0), out
    final = str(_output(grid, job_id)["output_tail"])
    assert "\x00" not in final and final.startswith("before\ufffdafter"), repr(final)
    assert final.rstrip("\n").endswith("| end"), repr(final)


def _pilot_holding_a_job(grid: Grid, reference: str) -> tuple[Pilot, int]:
    """A pilot (its loop's own code, against the real matcher) that was given a job and
    runs it."""
    args = parser().parse_args([
        "--matcher", grid.base, "--vo", "lhcb", "--site", SITE, "--ce", CE, "--queue", QUEUE,
        "--reference", reference, "--cores", "1", "--workdir", str(grid.tmp / "work"),
        "--backoff-cap", "1"])
    problems: list[str] = []
    options = pilot_options(args, grid.pilot_token, problems)
    assert options is not None, problems
    pilot = Pilot(options)
    pilot.prepare(time.time())
    job_id = submit(grid, "/bin/true", "")
    assert pilot.client is not None
    answer = pilot.client.match({"vo": "lhcb", "pilot_reference": reference, "site": SITE,
                                 "ce": CE, "queue": QUEUE})
    assert [j.job_id for j in answer.jobs] == [job_id]
    pilot.client.report(job_id, {"pilot_reference": reference, "status": "Running"})
    return pilot, job_id


@pytest.mark.parametrize(("body", "tail", "minor"), [
    # Refused for its NUL (a tail built by other means than Payload.tail): sent cleaned.
    ({"output_tail": "a\x00b\ud800c"}, "a\ufffdb\ufffdc", None),
    # Refused even cleaned (a field this matcher does not know): the exit code alone.
    ({"output_tail": "fine", "progress_note": "x"}, None, "Full report refused by the matcher"),
])
def test_a_refused_final_report_is_sent_plainer_and_the_job_ends(
        grid: Grid, body: dict[str, str], tail: str | None, minor: str | None) -> None:
    pilot, job_id = _pilot_holding_a_job(grid, f"pilot-plain-{len(body)}")
    pilot.outbox.append(_Report(job_id, {"status": "Failed", "exit_code": 7, "cpu_used": 1.5,
                                         **body}))
    assert pilot._flush_reports() == 0.0
    assert pilot.outbox == []
    job = grid.job(job_id)
    assert (job["status"], job["exit_code"]) == ("Failed", 7), job
    if minor is not None:
        assert minor in job["minor_status"], job
    if tail is not None:
        assert _output(grid, job_id)["output_tail"] == tail


def test_replay_sends_a_refused_report_plainer(grid: Grid) -> None:
    pilot, job_id = _pilot_holding_a_job(grid, "pilot-replay")
    kept = grid.tmp / "undelivered-reports.json"
    reports = [{"job_id": job_id, "pilot_reference": "pilot-replay", "status": "Done",
                "exit_code": 0, "output_tail": "kept\x00tail"}]
    kept.write_text(json.dumps(reports), encoding="utf-8")
    assert pilot.client is not None
    code, line = replay(pilot.client, kept, load_reports(kept, None), timeout=10)
    assert (code, line) == (0, "1 reports delivered, 0 refused by the matcher, 0 undelivered")
    job = grid.job(job_id)
    assert (job["status"], job["exit_code"]) == ("Done", 0), job
    assert _output(grid, job_id)["output_tail"] == "kept\ufffdtail"
