"""Pilots that hang in a state of a REAL ARC-CE (tools/arc-localhost, A-REX 6.17): with the
CE's job manager stopped, A-REX takes a pilot and keeps it ACCEPTING for ever (its REST
interface still answers). Past ``[agents] pilot_stage_timeout`` the pilots loop kills it
through the CE, its record says where it hung and for how long, it is counted in the agents'
metric, and it never gets a job; once the job manager is back the CE ends it and its end is
followed as any other's.

Skipped locally when A-REX cannot start; failing where CI or GRIDPILOT_TEST_REQUIRE_SERVERS=1
is set (tests/integration/arc.py).
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest

from agents.ce.arcrest import FINAL_STATES, UNKNOWN, WAITING_KINDS
from taskqueue.pilots.monitoring import pilots_stuck_since
from tests.integration.arc import LocalCe, local_ce
from tests.integration.test_arc_director import CE, QUEUE, SITE, arc_grid


@pytest.fixture(scope="session")
def arc_ce() -> LocalCe:
    return local_ce()


@contextmanager
def job_manager_stopped(ce: LocalCe) -> Iterator[None]:
    """A-REX's job manager (not its REST interface) stopped, and started again after."""
    pid = int((ce.work_dir / "run" / "arex.pid").read_text().strip())
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def test_a_pilot_the_ce_keeps_accepting_is_killed_counted_and_never_gets_a_job(
        arc_ce: LocalCe, tmp_path: Path) -> None:
    with arc_grid(arc_ce, tmp_path, "token", pilot_stage_timeout=1) as grid:
        job_id = grid.submit("/bin/echo", "run by a pilot the CE kept")
        with job_manager_stopped(arc_ce):
            report = grid.director.cycle()
            assert report.submitted == {f"{SITE}/{CE}/{QUEUE}": 1}, report.line()
            first = grid.follower.turn()
            assert not first.failed, first.line()
            seen = grid.pilot()
            assert WAITING_KINDS.get(seen.ce_state) == "stage", (seen.status, seen.ce_state)
            assert seen.ce_state_since is not None

            turn = grid.follow_until("the pilot is killed for hanging",
                                     lambda: grid.pilot().hung_in is not None)
            pilot = grid.pilot()
            assert turn.stuck == 1 and turn.killed == 1, turn.line()
            assert (pilot.status, pilot.hung_in) == ("Aborted", seen.ce_state)
            assert re.fullmatch(rf"stuck in {seen.ce_state} for \d+ s: killed", pilot.reason)
            assert pilot.kill_requested_by == "the pilots loop"
            with grid.ctx.factory() as session:
                assert pilots_stuck_since(session, grid.ctx.now() - timedelta(hours=1)) == {
                    (SITE, CE, QUEUE, seen.ce_state): 1}
        # The job manager is back: the CE ends the pilot it was asked to kill, and its end is
        # followed (its log, or why there is none, kept) as any other's.
        grid.follow_until("the CE says the pilot ended",
                          lambda: grid.pilot().log_state is not None)
        pilot = grid.pilot()
        # A-REX ends a job killed before it reached the batch system as FAILED.
        assert (pilot.status, pilot.hung_in) == ("Aborted", seen.ce_state)
        assert pilot.ce_state in FINAL_STATES - {UNKNOWN}, pilot.ce_state
        assert pilot.reason.startswith(f"stuck in {seen.ce_state} for ")
        assert grid.job(job_id)["status"] == "Waiting"  # no pilot of it ever got the job
