"""The simulator's model of the matcher against the real claim code: a small scenario (4
nodes of 8 cores, 12 h pilots, about 400 jobs in a simulated day) run twice on each seed, once
with :class:`simulator.central.ModelQueue` and once with the real task queues on an SQLite file
(:mod:`simulator.realqueue`), both driven by the same simulated pilots.

The tolerance: the two runs share the jobs, their arrival times and the pilots' life, but not
the draws (each side draws with its own random stream), so their figures differ as two seeds
of one side do: occupancy of multi-payload pilots while work waits within 2.5 points, the jobs
started and the jobs per pilot within 5%, the work lost at the wall limit within 5
core-hours."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from gridpilot import schema
from simulator.config import HOUR, JobClass, Policy, Scenario
from simulator.engine import RunResult, simulate
from simulator.realqueue import TaskQueueCentral
from taskqueue.database import make_engine

SCENARIO = Scenario(
    nodes=4, cores_per_node=8, wall_limit_hours=12.0, days=1.0, warmup_hours=0.0,
    job_classes=(JobClass("short single-core", 0.3, 1, 0.1, 1.0),
                 JobClass("single-core", 0.45, 1, 1.0, 6.0),
                 JobClass("4-core", 0.25, 4, 0.5, 2.0)),
    error_max=1.3, shutdowns_per_day=0.0, drain_events=0, drain_nodes=0, backlog_hours=2.0,
    sample_seconds=600.0)
POLICY = Policy("multi/aware/drain-cost")


@pytest.mark.parametrize("seed", [1, 2])
def test_the_model_of_the_matcher_agrees_with_the_real_claim(tmp_path: Path,
                                                              seed: int) -> None:
    model = simulate(SCENARIO, POLICY, seed)
    engine = make_engine(f"sqlite:///{tmp_path / 'tq.db'}", pooled=False)
    try:
        schema.upgrade(engine)
        central = TaskQueueCentral(SCENARIO, engine, random.Random(seed))
        real = simulate(SCENARIO, POLICY, seed, central=central)
    finally:
        engine.dispose()
    assert 300 <= model.jobs_started <= 600  # the scenario is what its docstring says
    assert real.pilots_started == model.pilots_started > 0
    assert abs(real.occupancy - model.occupancy) <= 0.025, (real.occupancy, model.occupancy)
    assert real.jobs_started == pytest.approx(model.jobs_started, rel=0.05)
    assert per_pilot(real) == pytest.approx(per_pilot(model), rel=0.05)
    assert abs(real.kill_waste - model.kill_waste) <= 5 * HOUR, (real.kill_waste / HOUR,
                                                                 model.kill_waste / HOUR)


def per_pilot(r: RunResult) -> float:
    return r.jobs_started / r.pilots_started
