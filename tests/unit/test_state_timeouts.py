"""Which CE states a pilot may hang in, and the timeout each gets: every state before an
ARC-CE's batch system has the pilot takes ``[agents] pilot_stage_timeout``, held and queued
ones their own; no state in which a pilot runs or ended is ever timed out."""

from __future__ import annotations

from dataclasses import replace

from agents.ce.arcrest import PILOT_STATUS
from agents.ce.config import CEConfig
from agents.ce.psij import STATES
from agents.ce.registry import state_timeouts
from taskqueue.core.settings import AgentSettings

AGENTS = replace(AgentSettings(), pilot_stage_timeout=11, pilot_held_timeout=22,
                 pilot_queued_timeout=33)


def test_an_arc_ce_times_its_own_steps_held_and_queued_pilots_apart() -> None:
    timeouts = state_timeouts(CEConfig("arc", "arc", endpoint="https://ce.example.org/arex"),
                              AGENTS)
    assert {s for s, status in PILOT_STATUS.items() if status == "Submitted"} == {
        s for s, seconds in timeouts.items() if seconds == 11}
    assert (timeouts["HELD"], timeouts["QUEUING"]) == (22, 33)
    assert all(PILOT_STATUS[s] in ("Submitted", "Waiting") for s in timeouts)


def test_a_psij_executor_times_new_and_queued_pilots() -> None:
    timeouts = state_timeouts(CEConfig("psij", "slurm"), AGENTS)
    assert timeouts == {"NEW": 11, "QUEUED": 33}
    assert all(STATES[s] in ("Submitted", "Waiting") for s in timeouts)
