"""A pilot outlives its token: a real pilot against a real matcher renews its token before it
expires, for as long as it works, and a pilot that slept through its token's end says so and
exits EXIT_TOKEN_EXPIRED, its payload's report kept for --replay.

Scaled from the issue's 45 s token, 70 s job and a job submitted 55 s in: a token of 8 s, a
job of 13 s, the second job submitted 10 s in (the proportions are the same)."""

from __future__ import annotations

import json
import signal
import time

import requests

from matcher.auth import issue_token
from pilot.loop import EXIT_TOKEN_EXPIRED
from tests.integration.test_pilot import SECRET, SITE, Grid, _finish, grid

__all__ = ["grid"]


def _operator() -> dict[str, str]:
    return {"Authorization": "Bearer " + issue_token(
        SECRET, subject="olga", role="operator", vo="lhcb", group="lhcb_admin",
        lifetime=3600)}


def test_a_pilot_renews_its_token_across_several_lifetimes(grid: Grid) -> None:
    grid.pilot_token = issue_token(SECRET, subject="pilots", role="pilot", vo="lhcb",
                                   group="lhcb_pilot", lifetime=8, site=SITE)
    started = time.monotonic()
    [first] = grid.submit(13.0)
    proc = grid.pilot("--cores", "1", "--idle-timeout", "4")
    try:
        grid.wait_status(first, {"Running"})
        time.sleep(max(0.0, 10.0 - (time.monotonic() - started)))
        [second] = grid.submit(1.0)
        code, out = _finish(proc, timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 0, out
    assert [grid.job(j)["status"] for j in (first, second)] == ["Done", "Done"], out
    # The pilot worked past its first token's end: the second job ended after it.
    assert time.monotonic() - started > 8
    reference = grid.job(first)["pilot_reference"]
    record = requests.get(f"{grid.base}/api/v1/pilots/{reference}", headers=_operator(),
                          timeout=30).json()
    assert record["token_renewals"] >= 2, record
    assert out.count("token renewed") == record["token_renewals"], out


def test_a_pilot_that_slept_through_its_tokens_end_exits_token_expired(grid: Grid) -> None:
    grid.pilot_token = issue_token(SECRET, subject="pilots", role="pilot", vo="lhcb",
                                   group="lhcb_pilot", lifetime=6, site=SITE)
    [job] = grid.submit(60.0)
    proc = grid.pilot("--cores", "1", "--idle-timeout", "30")
    try:
        grid.wait_status(job, {"Running"})
        proc.send_signal(signal.SIGSTOP)  # a suspended machine
        time.sleep(8)
        proc.send_signal(signal.SIGCONT)
        code, out = _finish(proc, timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == EXIT_TOKEN_EXPIRED, out
    assert "token expired" in out.splitlines()[-1], out
    # Its payload was stopped and its report kept for --replay, not lost.
    kept = json.loads((grid.tmp / "work" / "undelivered-reports.json").read_text())
    assert [(r["job_id"], r["status"]) for r in kept] == [(job, "Rescheduled")], kept
