"""The simulator's model of the matcher against the real claim code: a small scenario (4
nodes of 8 cores, 12 h pilots, about 400 jobs in a simulated day) run twice on each seed, once
with :class:`simulator.central.ModelQueue` and once with the real task queues on an SQLite file
(:mod:`simulator.realqueue`), both driven by the same simulated pilots; and the same site
shared by two VOs with memory per job and per node, and two sites of different wall limits;
and the site with GPUs on half its nodes.

The tolerance: the two runs share the jobs, their arrival times and the pilots' life, but not
the draws (each side draws with its own random stream), so their figures differ as two seeds
of one side do: occupancy of multi-payload pilots while work waits within 2.5 points, the jobs
started and the jobs per pilot within 5%, the work lost at the wall limit within 5
core-hours. With two VOs the pilots' counts differ too (the batch system's fair share gives
freed cores by what each VO's pilots hold), so the counts need only differ by chance (three
Poisson standard deviations, the jobs killed at the wall limit as well) and the jobs per pilot
within 10%."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from pathlib import Path

import pytest

from gridpilot import schema
from simulator.config import HOUR, JobClass, Policy, Scenario
from simulator.engine import RunResult, simulate
from simulator.realqueue import TaskQueueCentral
from taskqueue.db.database import make_engine

SCENARIO = Scenario(
    nodes=4, cores_per_node=8, wall_limit_hours=12.0, days=1.0, warmup_hours=0.0,
    job_classes=(JobClass("short single-core", 0.3, 1, 0.1, 1.0),
                 JobClass("single-core", 0.45, 1, 1.0, 6.0),
                 JobClass("4-core", 0.25, 4, 0.5, 2.0)),
    error_max=1.3, shutdowns_per_day=0.0, drain_events=0, drain_nodes=0, backlog_hours=2.0,
    sample_seconds=600.0)
#: The same site shared by two VOs (fair shares 2:1), with memory (32 GB per node; jobs of
#: 1 to 6 GB, so memory, not cores, bounds some pilots) and two sites of 12 h and 8 h pilots:
#: the matcher's VO, memory and CPU-time rules all decide what a pilot gets.
WIDE = replace(
    SCENARIO, vo_shares=(("lhcb", 2.0), ("belle", 1.0)), memory_per_node_mb=32000,
    site_wall_limits_hours=(12.0, 8.0),
    job_classes=(JobClass("short single-core", 0.3, 1, 0.1, 1.0, memory_mb=1000, vo="lhcb"),
                 JobClass("big-memory single-core", 0.2, 1, 1.0, 6.0, memory_mb=6000,
                          vo="lhcb"),
                 JobClass("single-core", 0.3, 1, 1.0, 6.0, memory_mb=2000, vo="belle"),
                 JobClass("4-core", 0.2, 4, 0.5, 2.0, memory_mb=8000, vo="belle")))
#: The one-VO site with GPUs on two of its nodes (2 each) and one job in ten asking for one:
#: the GPU rule decides too, and GPU jobs wait for the GPU nodes.
GPUS = replace(
    SCENARIO, gpu_nodes=2, gpus_per_node=2,
    job_classes=(*SCENARIO.job_classes, JobClass("GPU single-core", 0.1, 1, 0.5, 3.0, gpus=1)))
POLICY = Policy("multi/aware/drain-cost")


@pytest.mark.parametrize(("scenario", "seed"), [(SCENARIO, 1), (SCENARIO, 2), (WIDE, 1),
                                                (WIDE, 2), (GPUS, 1), (GPUS, 2)],
                         ids=["one-vo-1", "one-vo-2", "two-vos-memory-1", "two-vos-memory-2",
                              "gpus-1", "gpus-2"])
def test_the_model_of_the_matcher_agrees_with_the_real_claim(tmp_path: Path, scenario: Scenario,
                                                              seed: int) -> None:
    model = simulate(scenario, POLICY, seed)
    engine = make_engine(f"sqlite:///{tmp_path / 'tq.db'}", pooled=False)
    try:
        schema.upgrade(engine)
        central = TaskQueueCentral(scenario, engine, random.Random(seed))
        real = simulate(scenario, POLICY, seed, central=central)
    finally:
        engine.dispose()
    assert 300 <= model.jobs_started <= 600  # the scenario is what its docstring says
    assert set(real.started_by_vo) == set(model.started_by_vo)
    for vo in model.started_by_vo:  # each VO got its jobs on both sides
        assert within_chance(real.started_by_vo[vo], model.started_by_vo[vo]), vo
    assert model.pilots_started > 0
    if len(scenario.vo_shares) < 2:
        assert real.pilots_started == model.pilots_started
    else:  # which VO's pilot takes freed cores follows what each VO's pilots got
        assert within_chance(real.pilots_started, model.pilots_started)
    assert abs(real.occupancy - model.occupancy) <= 0.025, (real.occupancy, model.occupancy)
    if len(scenario.vo_shares) < 2:
        assert real.jobs_started == pytest.approx(model.jobs_started, rel=0.05)
        assert per_pilot(real) == pytest.approx(per_pilot(model), rel=0.05)
    else:  # fewer jobs per VO, and pilot counts that differ too: the counts' own chance
        assert within_chance(real.jobs_started, model.jobs_started)
        assert per_pilot(real) == pytest.approx(per_pilot(model), rel=0.1)
    if scenario.gpu_nodes:
        assert model.gpu_occupancy is not None and real.gpu_occupancy is not None
        assert model.gpu_occupancy > 0.1  # GPU jobs ran, on the GPU nodes only
        assert abs(real.gpu_occupancy - model.gpu_occupancy) <= 0.05, (
            real.gpu_occupancy, model.gpu_occupancy)
    if len(scenario.vo_shares) < 2 and not scenario.gpu_nodes:
        assert abs(real.kill_waste - model.kill_waste) <= 5 * HOUR, (real.kill_waste / HOUR,
                                                                     model.kill_waste / HOUR)
    else:  # a few kills of hours each (GPU jobs wait, then run late): their number
        assert within_chance(real.killed_at_wall_limit, model.killed_at_wall_limit)


def within_chance(a: int, b: int) -> bool:
    """Two counts that differ as two seeds do: by at most three standard deviations of a
    Poisson count of their size."""
    return abs(a - b) <= 3 * math.sqrt(max(a, b, 1))


def per_pilot(r: RunResult) -> float:
    return r.jobs_started / r.pilots_started
