"""The site simulator: its bookkeeping against hand-computed cases, its wastes against the real
$JOBSTATUS code, reproducibility by seed, and the `gridpilot simulate` command."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import pytest
from click.testing import CliRunner

from gridpilot.cli import cli
from pilot.jobstatus import RunningPayload, compute_status
from pilot.waste import draining_waste, kill_waste
from simulator.config import HOUR, POLICIES, PRESETS, JobClass, Policy, Scenario
from simulator.engine import Job, simulate
from simulator.report import Estimate, compare, render_table

AWARE = Policy("aware")
BLIND = Policy("blind", time_aware=False)


def one_node(**changes: object) -> Scenario:
    """One 4-core node, 10 h pilots started at once, exact estimates, no random events."""
    base = Scenario(nodes=1, cores_per_node=4, wall_limit_hours=10.0, days=10 / 24,
                    warmup_hours=0.0, pilot_start_delay=0.0, stagger_first_pilots=False,
                    job_classes=(JobClass("one", 1.0, 1, 1.0, 1.0),), error_min=1.0,
                    error_max=1.0, shutdowns_per_day=0.0, drain_events=0, drain_nodes=1,
                    drain_deadline_hours=20.0)
    return replace(base, **changes)  # type: ignore[arg-type]


def job(job_id: int, cores: int, hours: float) -> Job:
    """A job asking for (and running exactly) ``hours`` of wall time on ``cores`` cores."""
    return Job(job_id, cores, round(hours * HOUR * cores), hours * HOUR)


# -- hand-computed cases: one node, two jobs --------------------------------------------------


def test_two_jobs_share_a_node_and_a_drain_costs_what_the_idle_cores_wait() -> None:
    # A: 1 core for 2 h; B: 2 cores for 3 h; both start at 0 on the 4-core pilot.
    # The site frees the node at 1 h: 1 core idles from 1 h to 2 h, 2 cores from 2 h to 3 h:
    # draining waste 1 + 2 = 3 core-hours. Killing it at 1 h would have lost 3 cores * 1 h.
    result = simulate(one_node(), AWARE, 1, workload=[(0.0, job(1, 1, 2)), (0.0, job(2, 2, 3))],
                      drain_times=[1 * HOUR])
    assert result.jobs_done == 2
    assert result.jobs_started == 2
    assert result.killed_at_wall_limit == 0
    assert result.rescheduled == 0
    [drain] = result.drains
    assert drain.kind == "free" and drain.nodes == [0]
    assert drain.draining_waste == pytest.approx(3 * HOUR)
    assert drain.predicted_draining_waste == pytest.approx(3 * HOUR)
    assert drain.predicted_kill_waste == pytest.approx(3 * HOUR)
    assert drain.kill_waste == 0
    assert result.draining_waste == pytest.approx(3 * HOUR)


def test_a_waiting_job_starts_when_cores_free_and_occupancy_counts_only_while_it_waits() -> None:
    # A: 4 cores for 2 h, B: 4 cores for 2.5 h (the same task queue: 8 and 10 CPU-hours, both
    # in the 12 h bucket). B waits 2 h with all 4 cores busy (occupancy 100% while work
    # waits), then runs from 2 h to 4.5 h.
    result = simulate(one_node(wall_limit_hours=24.0), AWARE, 1,
                      workload=[(0.0, job(1, 4, 2)), (0.0, job(2, 4, 2.5))])
    assert result.jobs_done == 2
    assert result.occupancy == pytest.approx(1.0)
    # One sample in each half hour: busy in the first nine (0 to 4.5 h), idle after.
    assert [f for _, f in result.occupancy_series] == [1.0] * 9 + [0.0] * 11


def test_time_aware_asks_leave_a_job_that_cannot_finish_and_blind_asks_get_it_killed() -> None:
    # One core, pilot wall limit 45 min. A (30 min) runs first; at 30 min, 15 min are left and
    # B asks for 30 min: the aware pilot does not take it, the blind one does and it is killed
    # at 45 min, losing 1 core * 15 min.
    scenario = one_node(cores_per_node=1, wall_limit_hours=0.75, days=1.0 / 24,
                        sample_seconds=60.0)
    work = [(0.0, job(1, 1, 0.5)), (0.0, job(2, 1, 0.5))]
    aware = simulate(scenario, AWARE, 1, workload=work)
    blind = simulate(scenario, BLIND, 1, workload=work)
    assert (aware.jobs_done, aware.killed_at_wall_limit, aware.kill_waste) == (1, 0, 0.0)
    assert (blind.jobs_done, blind.killed_at_wall_limit) == (1, 1)
    assert blind.kill_waste == pytest.approx(0.25 * HOUR)
    # At 30 min the aware pilot's free core is idle because too little time is left.
    assert aware.idle["too little time left"] > 0
    assert blind.idle["too little time left"] == 0


def test_a_job_running_longer_than_it_asked_is_killed_at_the_wall_limit() -> None:
    late = Job(1, 2, round(1 * HOUR * 2), 8 * HOUR)  # asks 1 h, needs 8 h; the wall is 7 h
    result = simulate(one_node(wall_limit_hours=7.0, days=9 / 24), AWARE, 1,
                      workload=[(0.0, late)])
    assert result.killed_at_wall_limit == 1
    assert result.jobs_done == 0
    assert result.kill_waste == pytest.approx(2 * 7 * HOUR)


def test_a_share_of_the_time_left_kept_free_leaves_a_job_that_may_run_late() -> None:
    # One core, 100 min pilots. A (1 h) runs first, B comes at 30 min; at 1 h, 40 min are
    # left and B asks for 20 min (the 30 min bucket) but runs 45 min. Keeping only the 60 s
    # margin the pilot takes B and it is killed at the wall limit; keeping 30% of the time
    # left too, the pilot offers 40 * 0.7 min - 60 s = 27 min, below B's bucket, and leaves
    # it to the next pilot, on which it ends.
    scenario = one_node(cores_per_node=1, wall_limit_hours=100 / 60, days=2.0 / 24,
                        sample_seconds=60.0)
    work = [(0.0, job(1, 1, 1.0)), (0.5 * HOUR, Job(2, 1, 20 * 60, 45 * 60))]
    plain = simulate(scenario, AWARE, 1, workload=work)
    kept = simulate(replace(scenario, margin_share=0.3), AWARE, 1, workload=work)
    assert (plain.jobs_done, plain.killed_at_wall_limit) == (1, 1)
    assert (kept.jobs_done, kept.killed_at_wall_limit) == (2, 0)
    assert kept.idle["too little time left"] > plain.idle["too little time left"]
    for share in (-0.1, 1.0):
        with pytest.raises(ValueError, match="margin_share"):
            one_node(margin_share=share)


def test_a_drain_past_its_deadline_kills_and_reschedules_what_still_runs() -> None:
    # Freed at 1 h with a deadline 1.5 h later: A (1 core, 2 h) ends at 2 h; B (2 cores, 3 h)
    # is killed at 2.5 h after 2.5 h of work on 2 cores. Idle: 1 core from 1 h to 2 h, 2 cores
    # from 2 h to 2.5 h.
    scenario = one_node(drain_deadline_hours=1.5, drain_out_hours=20.0)
    result = simulate(scenario, AWARE, 1, workload=[(0.0, job(1, 1, 2)), (0.0, job(2, 2, 3))],
                      drain_times=[1 * HOUR])
    [drain] = result.drains
    assert drain.kill_waste == pytest.approx(2 * 2.5 * HOUR)
    assert drain.draining_waste == pytest.approx(2 * HOUR)
    assert result.rescheduled == 1
    assert result.jobs_done == 1


def test_one_payload_pilots_each_run_a_single_job() -> None:
    scenario = one_node(job_classes=(JobClass("one", 1.0, 1, 1.0, 1.0),))
    single = Policy("single", multi_payload=False)
    work = [(0.0, job(i, 1, 1)) for i in range(1, 9)]
    result = simulate(scenario, single, 1, workload=work)
    assert result.jobs_done == 8
    assert result.jobs_started == 8


# -- the wastes are those of the real $JOBSTATUS code -----------------------------------------


#: When the site frees nodes: early enough that every payload ends before the run does.
DRAINS = [14 * HOUR, 18 * HOUR, 22 * HOUR, 26 * HOUR]


def exact_site(**changes: object) -> Scenario:
    base = replace(PRESETS["small"].scenario, nodes=12, days=3.0, error_min=1.0,
                   error_max=1.0, shutdowns_per_day=0.0, drain_nodes=3,
                   drain_deadline_hours=60.0)
    return replace(base, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize("victim", ["drain", "kill", "random", "oldest"])
def test_measured_draining_waste_equals_the_jobstatus_prediction(victim: str) -> None:
    result = simulate(exact_site(), Policy("p", victim=victim), 7, drain_times=DRAINS)
    free = [d for d in result.drains if d.kind == "free"]
    assert len(free) == 4
    assert any(d.draining_waste > 0 for d in free)
    for d in free:
        assert d.kill_waste == 0
        assert d.draining_waste == pytest.approx(d.predicted_draining_waste, rel=1e-9,
                                                 abs=1e-6)


def test_measured_kill_waste_equals_the_jobstatus_prediction() -> None:
    result = simulate(exact_site(drain_deadline_hours=0.0), Policy("p", victim="random"), 7,
                      drain_times=DRAINS)
    free = [d for d in result.drains if d.kind == "free"]
    assert any(d.kill_waste > 0 for d in free)
    for d in free:
        assert d.draining_waste == 0
        assert d.kill_waste == pytest.approx(d.predicted_kill_waste, rel=1e-9, abs=1e-6)


def test_hand_values_of_the_real_formulas_match_the_first_case() -> None:
    # The same events as the first hand-computed case, through pilot.jobstatus / pilot.waste.
    values = compute_status(4, [RunningPayload(1, 0, 2 * HOUR, 10 * HOUR),
                                RunningPayload(2, 0, 3 * HOUR, 10 * HOUR)],
                            now=1 * HOUR, can_postpone=False, priority_factor=1.0)
    assert draining_waste(values, 1 * HOUR) == pytest.approx(3 * HOUR)
    assert kill_waste(values, 1 * HOUR) == pytest.approx(3 * HOUR)


def test_drain_cost_choice_picks_nodes_the_formula_ranks_cheapest() -> None:
    by_cost = simulate(exact_site(), Policy("d", victim="drain"), 3, drain_times=DRAINS)
    at_random = simulate(exact_site(), Policy("r", victim="random"), 3, drain_times=DRAINS)
    cheap = sum(d.predicted_draining_waste for d in by_cost.drains)
    assert cheap <= sum(d.predicted_draining_waste for d in at_random.drains)


# -- reproducibility --------------------------------------------------------------------------


def test_the_same_seed_gives_the_same_figures_and_another_seed_others() -> None:
    scenario = PRESETS["small"].scenario
    policies = POLICIES[:2]
    first = compare(scenario, policies, [1, 2]).as_dict()
    again = compare(scenario, policies, [1, 2]).as_dict()
    other = compare(scenario, policies, [3, 4]).as_dict()
    for d in (first, again, other):
        d.pop("run_seconds")
    assert first == again
    assert first["policies"] != other["policies"]


def test_policies_see_the_same_jobs_on_the_same_seed() -> None:
    scenario = PRESETS["small"].scenario
    a = simulate(scenario, POLICIES[2], 5)
    b = simulate(scenario, POLICIES[3], 5)
    # Same drain times (the victim choice differs, the events do not).
    assert [d.time for d in a.drains] == [d.time for d in b.drains]


def test_confidence_interval_of_known_values() -> None:
    e = Estimate.of([1.0, 2.0, 3.0])
    assert e.mean == 2.0
    assert e.ci95 == pytest.approx(4.303 * 1.0 / 3 ** 0.5)
    assert Estimate.of([5.0]).ci95 == 0.0


@pytest.mark.parametrize("changes", [{"nodes": 0}, {"error_min": 2.0, "error_max": 1.0},
                                     {"days": 0}, {"drain_nodes": -1}])
def test_impossible_scenarios_are_refused(changes: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        replace(Scenario(), **changes)  # type: ignore[arg-type]


# -- the command ------------------------------------------------------------------------------


def test_simulate_prints_json_with_named_figures_and_writes_plots(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, [
        "simulate", "--preset", "small", "--seeds", "1,2", "--policy",
        "multi/aware/drain-cost", "--policy", "multi/aware/random", "--json", "--out",
        str(out)])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output)
    assert set(figures["policies"]) == {"multi/aware/drain-cost", "multi/aware/random"}
    one = figures["policies"]["multi/aware/drain-cost"]
    for key in ("occupancy", "draining_waste_core_hours", "kill_waste_core_hours",
                "jobs_killed_at_wall_limit", "jobs_rescheduled"):
        assert set(one[key]) == {"mean", "ci95", "per_seed"}
        assert len(one[key]["per_seed"]) == 2
    assert "drain_cost_vs_random_draining_waste_reduction" in figures["headline"]
    paired = figures["headline"]["drain_cost_vs_random_draining_waste_reduction_paired"]
    assert set(paired) == {"mean", "ci95", "per_seed"}  # random victims wasted some here
    assert all(r <= 1 for r in paired["per_seed"]) and len(paired["per_seed"]) == 2
    assert figures["preset"] == "small"
    for name in ("occupancy.png", "drain-waste.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((out / "figures.json").read_text())["seeds"] == [1, 2]


def test_simulate_prints_a_table() -> None:
    result = CliRunner().invoke(cli, ["simulate", "--preset", "small", "--seeds", "1",
                                      "--policy", "multi/aware/drain-cost", "--workers", "1"])
    assert result.exit_code == 0, result.output
    assert "occupancy %" in result.output
    assert "multi/aware/drain-cost" in result.output


@pytest.mark.parametrize(("args", "message"), [
    (["--preset", "nope"], "unknown preset 'nope'"),
    (["--seeds", "1,x"], "comma-separated list of integers"),
    (["--seeds", "1,1"], "different integers"),
    (["--policy", "sometimes"], "unknown policy 'sometimes'"),
    (["--nodes", "0"], "--nodes"),
    (["--workers", "0"], "--workers"),
])
def test_simulate_refuses_bad_options_clearly(args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["simulate", *args])
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_simulate_cannot_write_into_a_file(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = CliRunner().invoke(cli, ["simulate", "--preset", "small", "--seeds", "1",
                                      "--policy", "multi/aware/drain-cost", "--out",
                                      str(blocker / "sub")])
    assert result.exit_code == 1
    assert "cannot write into" in result.output


def test_two_processes_give_the_same_figures_for_one_seed() -> None:
    """Nothing depends on memory addresses or string hashing (sets walked in their order)."""
    import os
    import subprocess
    import sys

    code = ("import json; from simulator.config import PRESETS, POLICIES; "
            "from simulator.report import compare; "
            "d = compare(PRESETS['small'].scenario, POLICIES, [2]).as_dict(); "
            "d.pop('run_seconds'); print(json.dumps(d, sort_keys=True))")
    outputs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=True, timeout=300,
                              env={**os.environ, "PYTHONHASHSEED": seed}).stdout
               for seed in ("1", "2")]
    assert outputs[0] and outputs[0] == outputs[1]


def test_runs_spread_over_processes_give_the_figures_of_one_process() -> None:
    scenario = PRESETS["small"].scenario
    alone = compare(scenario, POLICIES[:2], [1, 2], workers=1).as_dict()
    spread = compare(scenario, POLICIES[:2], [1, 2], workers=2).as_dict()
    for d in (alone, spread):
        d.pop("run_seconds")
    assert alone == spread


@pytest.mark.parametrize(("per_core", "started"), [(True, 1), (False, 0)])
def test_a_multi_core_job_is_matched_by_its_cpu_time_per_core(per_core: bool,
                                                              started: int) -> None:
    # 8 cores for 1 h: 8 CPU-hours in all, 1 h per core. The 1.5 h pilot offers 1.5 h per core
    # (less its margin): per core the job fits; in total (the rule before) it does not.
    scenario = one_node(cores_per_node=8, wall_limit_hours=1.5, days=1.5 / 24,
                        cpu_time_per_core=per_core)
    result = simulate(scenario, AWARE, 1, workload=[(0.0, job(1, 8, 1.0))])
    assert result.jobs_started == started
    assert result.jobs_done == started


def test_memory_limits_how_many_jobs_share_a_pilot() -> None:
    # One 8-core node of 16,000 MB; four 1-core jobs of 6,000 MB each (bucket 6,144 MB): two
    # run at once (the third finds 4,000 MB free), the other two wait an hour with 6 cores
    # idle for want of memory: occupancy while work waits 2/8.
    scenario = one_node(cores_per_node=8, wall_limit_hours=24.0, memory_per_node_mb=16000,
                        job_classes=(JobClass("big", 1.0, 1, 1.0, 1.0, memory_mb=6000),),
                        sample_seconds=600.0)
    work = [(0.0, Job(i, 1, round(HOUR), HOUR, 6000)) for i in range(1, 5)]
    result = simulate(scenario, AWARE, 1, workload=work)
    assert result.jobs_done == 4
    assert result.occupancy == pytest.approx(0.25)
    assert result.idle["too little free memory"] == pytest.approx(0.75)


def test_a_job_class_needing_more_memory_than_a_node_has_is_refused() -> None:
    with pytest.raises(ValueError, match="memory_per_node_mb"):
        one_node(memory_per_node_mb=1000,
                 job_classes=(JobClass("big", 1.0, 1, 1.0, 1.0, memory_mb=6000),))


def test_gpu_jobs_run_only_where_gpus_are_free() -> None:
    # Two 4-core nodes, one with 2 GPUs; six 1-core 1-GPU jobs of an hour: two run at once
    # on the GPU node (its other 2 cores and the other node's 4 idle for want of GPUs), so
    # the six take three hours at 2 of 8 cores, with the GPUs always busy.
    scenario = one_node(nodes=2, gpu_nodes=1, gpus_per_node=2,
                        job_classes=(JobClass("gpu", 1.0, 1, 1.0, 1.0, gpus=1),),
                        days=3 / 24, sample_seconds=600.0)
    work = [(0.0, Job(i, 1, round(HOUR), HOUR, gpus=1)) for i in range(1, 7)]
    result = simulate(scenario, AWARE, 1, workload=work)
    assert result.jobs_done == 6
    assert result.occupancy == pytest.approx(0.25)
    assert result.gpu_occupancy == pytest.approx(1.0)
    assert result.idle["too few free GPUs"] == pytest.approx(0.75)


def test_a_gpu_pilot_takes_cpu_jobs_too_and_without_gpus_no_gpu_occupancy() -> None:
    # Six CPU jobs on a 4-core node with 2 GPUs: all run (four, then two), GPUs idle.
    scenario = one_node(gpu_nodes=1, gpus_per_node=2)
    result = simulate(scenario, AWARE, 1, workload=[(0.0, job(i, 1, 1)) for i in range(6)])
    assert result.jobs_done == 6
    assert result.gpu_occupancy == pytest.approx(0.0)
    assert simulate(one_node(), AWARE, 1, workload=[(0.0, job(1, 1, 1))]).gpu_occupancy is None


@pytest.mark.parametrize("gpu_first", [True, False])
def test_gpu_first_gives_a_free_gpu_its_job_before_older_cpu_jobs(gpu_first: bool) -> None:
    # A 1-core node with one GPU, for an hour; three CPU jobs and a GPU job waiting, an hour
    # each. Asking for GPU jobs first, the pilot starts the GPU job at once on every seed:
    # the GPU is busy the whole hour. Without, the draw among the two queues gives the CPU
    # jobs the core first on some seeds.
    scenario = one_node(cores_per_node=1, gpu_nodes=1, gpus_per_node=1, gpu_first=gpu_first,
                        days=1 / 24, job_classes=(JobClass("gpu", 1.0, 1, 1.0, 1.0, gpus=1),))
    work = [(0.0, job(1, 1, 1)), (0.0, job(2, 1, 1)), (0.0, job(3, 1, 1)),
            (0.0, Job(4, 1, round(HOUR), HOUR, gpus=1))]
    busy = [simulate(scenario, AWARE, seed, workload=work).gpu_occupancy
            for seed in range(1, 9)]
    if gpu_first:
        assert busy == [pytest.approx(1.0)] * 8
    else:
        assert sorted(set(busy)) == [0.0, pytest.approx(1.0)]


@pytest.mark.parametrize(("changes", "message"), [
    ({"gpu_nodes": 0, "gpus_per_node": 4}, "more GPUs than a node has"),
    ({"gpu_nodes": 1, "gpus_per_node": 0}, "more GPUs than a node has"),
    ({"gpu_nodes": 2, "gpus_per_node": 1}, "gpu_nodes must be between 0 and nodes"),
])
def test_a_gpu_job_class_without_gpu_nodes_is_refused(changes: dict[str, int],
                                                      message: str) -> None:
    with pytest.raises(ValueError, match=message):
        one_node(job_classes=(JobClass("gpu", 1.0, 1, 1.0, 1.0, gpus=1),), **changes)


def test_sites_with_different_wall_limits_share_the_queue() -> None:
    # Two one-core nodes: site 0 gives pilots 10 h, site 1 only 1 h. Two 2 h jobs: site 0
    # runs the first; site 1's pilots never have time for the second, which waits for site 0
    # (0 to 2 h: one core of two busy while work waits).
    scenario = one_node(nodes=2, cores_per_node=1, days=5 / 24,
                        site_wall_limits_hours=(10.0, 1.0))
    result = simulate(scenario, AWARE, 1, workload=[(0.0, job(1, 1, 2)), (0.0, job(2, 1, 2))])
    assert result.jobs_done == 2
    assert result.occupancy == pytest.approx(0.5)
    assert result.killed_at_wall_limit == 0


def test_a_director_paces_the_pilots() -> None:
    # Four one-core nodes, a director sending one pilot an hour: four 10 h jobs start at 0,
    # 1, 2 and 3 h. While work waits (0 to 3 h) 1, 2 then 3 of the 4 cores are busy: 6 of 12
    # core-hours.
    scenario = one_node(nodes=4, cores_per_node=1, wall_limit_hours=24.0, days=1.0,
                        director_cycle_seconds=HOUR, director_pilots_per_cycle=1)
    result = simulate(scenario, AWARE, 1, workload=[(0.0, job(i, 1, 10)) for i in range(1, 5)])
    assert result.jobs_started == 4
    assert result.occupancy == pytest.approx(0.5)


def test_director_pacing_needs_a_cycle_and_a_cap() -> None:
    with pytest.raises(ValueError, match="director_cycle_seconds"):
        one_node(director_cycle_seconds=60.0)


def test_vos_share_the_freed_cores_by_their_shares() -> None:
    # Four one-core nodes, VO a with share 3 and VO b with 1, both with 10 h jobs waiting:
    # the batch system gives 3 nodes to a's pilots and 1 to b's.
    scenario = one_node(nodes=4, cores_per_node=1, wall_limit_hours=24.0, days=5 / 24,
                        vo_shares=(("a", 3.0), ("b", 1.0)),
                        job_classes=(JobClass("a", 1.0, 1, 10.0, 10.0, vo="a"),
                                     JobClass("b", 1.0, 1, 10.0, 10.0, vo="b")))
    work = [(0.0, Job(i, 1, round(10 * HOUR), 10 * HOUR, vo=vo))
            for i, vo in enumerate("aaaabbbb", start=1)]
    result = simulate(scenario, AWARE, 1, workload=work)
    assert result.started_by_vo == {"a": 3, "b": 1}


def test_a_job_class_of_a_vo_without_a_share_is_refused() -> None:
    with pytest.raises(ValueError, match="vo_shares"):
        one_node(vo_shares=(("a", 1.0),))


def test_a_reduction_comes_with_its_interval_and_a_word_when_not_significant() -> None:
    from simulator.report import Estimate, reduction_text

    assert reduction_text(Estimate.of([0.5, 0.6, 0.55, 0.52, 0.58])).startswith(
        "55% less (95% interval ")
    assert "not significant" not in reduction_text(Estimate.of([0.5, 0.6, 0.55, 0.52, 0.58]))
    wide = reduction_text(Estimate.of([0.9, -0.6, 0.8, -0.5, 0.6]))
    assert wide.endswith("over 5 seeds); not significant: the interval includes no reduction")
    assert reduction_text(Estimate.of([0.4])) == "40% less (one seed: no interval)"


def test_one_day_is_one_day() -> None:
    from simulator.report import _days

    assert (_days(1), _days(7), _days(0.5)) == ("1 day", "7 days", "0.5 days")


def test_the_occupancy_plot_is_readable() -> None:
    """Smoothed lines, the reference policy drawn last and distinct, the legend beside the
    data (not over it) giving each policy's mean occupancy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from simulator.plots import SMOOTHING_HOURS, moving_average, occupancy_figure

    preset = PRESETS["small"]
    c = compare(preset.scenario, preset.policies[:3], (1,), workers=1)
    fig = occupancy_figure(c)
    try:
        ax = fig.axes[0]
        lines = ax.get_lines()
        reference = c.policies[0].name
        lines = [line for line in lines if not line.get_label().startswith("_")]
        assert len(lines) == 3 and lines[-1].get_label().startswith(f"{reference} (reference)")
        assert lines[-1].get_linewidth() > max(line.get_linewidth() for line in lines[:-1])
        for p, line in zip([*c.policies[1:], c.policies[0]], lines, strict=True):
            mean = c.estimate(p.name, "occupancy").mean
            assert 0 < mean <= 100  # a percentage, as the table gives it
            assert line.get_label().endswith(f": mean {mean:.1f}%"), line.get_label()
        raw = [100 * f for _, f in c.runs[reference][0].occupancy_series]
        drawn = list(lines[-1].get_ydata())
        assert len(drawn) == len(raw)
        assert sum(abs(b - a) for a, b in pairwise(drawn)) \
            < sum(abs(b - a) for a, b in pairwise(raw))  # smoothed: less jagged
        fig.canvas.draw()
        legend = ax.get_legend()
        assert legend is not None
        box, data = legend.get_window_extent(), ax.get_window_extent()
        assert box.x0 >= data.x1  # beside the data, not over it
        assert box.x1 <= fig.bbox.x1  # and inside the picture
        assert f"{SMOOTHING_HOURS:g} h moving average" in ax.get_title()
    finally:
        plt.close(fig)
    assert moving_average([(0.0, 1.0), (1.0, 0.0), (2.0, 1.0)], 2.0) == [
        (0.0, 0.5), (1.0, 2 / 3), (2.0, 0.5)]


@pytest.mark.parametrize(("bits", "occupancy"), [(3, 0.75), (7, 1.0)])
def test_memory_buckets_rounded_up_leave_a_core_without_its_share(bits: int,
                                                                    occupancy: float) -> None:
    # One 4-core node of 8,000 MB and eight 1-core jobs of 2,000 MB: with 3 significant bits
    # their bucket is 2,048 MB and the fourth finds 2,000 MB free, so 3 run at once; with 7
    # bits the bucket is 2,000 MB and all 4 cores run.
    scenario = one_node(memory_per_node_mb=8000, significant_bits=bits, sample_seconds=600.0,
                        job_classes=(JobClass("two", 1.0, 1, 1.0, 1.0, memory_mb=2000),))
    work = [(0.0, Job(i, 1, round(HOUR), HOUR, 2000)) for i in range(1, 9)]
    result = simulate(scenario, AWARE, 1, workload=work)
    assert result.jobs_done == 8
    assert result.occupancy == pytest.approx(occupancy)


def test_memory_first_takes_the_jobs_within_the_memory_left_per_core_first() -> None:
    # One 4-core node of 8,000 MB (2,000 a core), a 6,000 MB job and three of 2,000 MB: the
    # memory-first what-if asks for one core and 2,000 MB (and an eighth) while memory binds,
    # so the three small jobs run first and the big one waits for them: 3 of 4 cores busy
    # while it waits, whatever the draw.
    scenario = one_node(memory_per_node_mb=8000, significant_bits=7, memory_first=True,
                        sample_seconds=600.0,
                        job_classes=(JobClass("two", 1.0, 1, 1.0, 1.0, memory_mb=2000),))
    for seed in range(1, 8):  # without it, seeds 3 and 5 draw the big job first: 2 of 4
        work = [(0.0, Job(1, 1, round(HOUR), HOUR, 6000))] + [
            (0.0, Job(i, 1, round(HOUR), HOUR, 2000)) for i in range(2, 5)]
        result = simulate(scenario, AWARE, seed, workload=work)
        assert result.jobs_done == 4
        assert result.occupancy == pytest.approx(0.75)


def test_significant_bits_out_of_range_are_refused() -> None:
    with pytest.raises(ValueError, match="significant_bits"):
        one_node(significant_bits=0)


# -- memory: the ceiling of the mix, memory occupancy, waits per class -----------------------


def test_memory_bound_core_occupancy_of_hand_computed_mixes() -> None:
    # 2,000 MB a core. Two classes of 1 core and 1 h, equally many: 6,000 and 2,000 MB need
    # 4,000 MB a core-hour, so at most half the cores can run; 3,000 and 1,000 MB need 2,000
    # MB: all of them.
    node = one_node(memory_per_node_mb=8000)
    heavy = replace(node, job_classes=(JobClass("a", 1.0, 1, 1.0, 1.0, memory_mb=6000),
                                       JobClass("b", 1.0, 1, 1.0, 1.0, memory_mb=2000)))
    assert heavy.memory_bound_core_occupancy() == pytest.approx(0.5)
    fitting = replace(node, job_classes=(JobClass("a", 1.0, 1, 1.0, 1.0, memory_mb=3000),
                                         JobClass("b", 1.0, 1, 1.0, 1.0, memory_mb=1000)))
    assert fitting.memory_bound_core_occupancy() == pytest.approx(1.0)
    # Weights count jobs: a 4-core job of 1 h is 4 core-hours against 1 of the other's.
    # 5 core-hours need 8,000 + 4,000 MB-hours: 2,400 MB a core-hour.
    cores = replace(node, job_classes=(JobClass("a", 1.0, 4, 1.0, 1.0, memory_mb=8000),
                                       JobClass("b", 1.0, 1, 1.0, 1.0, memory_mb=4000)))
    assert cores.memory_bound_core_occupancy() == pytest.approx(2000 / 2400)
    assert one_node().memory_bound_core_occupancy() is None


def test_memory_bound_core_occupancy_of_wide_week_weighs_the_log_uniform_mean_hours() -> None:
    # wide-week: 30% 1 core 1,000 MB 0.1-1 h; 35% 1 core 2,000 MB 1-20 h; 10% 1 core 6,000 MB
    # 1-10 h; 25% 8 cores 16,000 MB 0.5-2.9 h; the nodes have 2,000 MB a core.
    def mean(lo: float, hi: float) -> float:
        return (hi - lo) / math.log(hi / lo)

    mix = [(0.3, 1, 1000, mean(0.1, 1.0)), (0.35, 1, 2000, mean(1.0, 20.0)),
           (0.1, 1, 6000, mean(1.0, 10.0)), (0.25, 8, 16000, mean(0.5, 2.9))]
    need = sum(w * m * h for w, _, m, h in mix) / sum(w * c * h for w, c, _, h in mix)
    assert need == pytest.approx(2265, abs=1)
    bound = PRESETS["wide-week"].scenario.memory_bound_core_occupancy()
    assert bound == pytest.approx(2000 / need)
    assert bound == pytest.approx(0.883, abs=0.0005)


def test_a_mix_heavier_than_the_nodes_fills_their_memory_not_their_cores() -> None:
    # One 4-core node of 8,000 MB; 1-core jobs of 4,000 MB (exact buckets): two run at once,
    # half the cores and all the memory, the ceiling the scenario computes.
    scenario = one_node(memory_per_node_mb=8000, significant_bits=7, sample_seconds=600.0,
                        job_classes=(JobClass("four", 1.0, 1, 1.0, 1.0, memory_mb=4000),))
    work = [(0.0, Job(i, 1, round(HOUR), HOUR, 4000, job_class=0)) for i in range(1, 9)]
    result = simulate(scenario, AWARE, 1, workload=work)
    assert result.jobs_done == 8
    assert result.occupancy == pytest.approx(0.5)
    assert result.memory_occupancy == pytest.approx(1.0)
    assert scenario.memory_bound_core_occupancy() == pytest.approx(0.5)
    assert simulate(one_node(), AWARE, 1, workload=work).memory_occupancy is None


def test_waits_are_counted_per_job_class() -> None:
    # One 4-core node: six 1-core jobs of 1 h at 0 (class 0) and one more at 0 given apart
    # from the mix: four start at 0 and three at 1 h (which three: the draw's).
    scenario = one_node(job_classes=(JobClass("one", 1.0, 1, 1.0, 1.0),))
    work = [(0.0, Job(i, 1, round(HOUR), HOUR, job_class=0)) for i in range(1, 7)]
    work.append((0.0, Job(7, 1, round(HOUR), HOUR)))
    result = simulate(scenario, AWARE, 1, workload=work)
    assert sum(result.started_by_class.values()) == 7
    assert result.started_by_class["one"] == 6
    assert result.started_by_class["other"] == 1
    assert sum(result.wait_by_class.values()) == pytest.approx(3 * HOUR)
    assert result.waiting_by_class == {}
    one = result.mean_wait_hours("one")
    assert one is not None and one * 6 == pytest.approx(result.wait_by_class["one"] / HOUR)
    assert result.mean_wait_hours("none such") is None


@pytest.mark.parametrize("rule", ["", "always"])
def test_memory_per_core_rule_leaves_out_a_job_above_the_memory_left_per_core(rule: str
                                                                               ) -> None:
    # One 4-core node of 8,000 MB (2,000 a core), a 6,000 MB job and four of 2,000 MB, all
    # of 1 core and 1 h. With the rule "always" a pilot offers the memory left per free core
    # (and an eighth): 2,250 MB on a fresh pilot, so the four small jobs run at 0 on every
    # seed, and the big one never (no lighter job leaves it the room): what the rule costs
    # the jobs above the nodes' memory per core. Without it some seeds draw the big job
    # first and run 2 cores at a time.
    scenario = one_node(memory_per_node_mb=8000, significant_bits=7, sample_seconds=600.0,
                        memory_per_core_rule=rule, days=3.0 / 24,
                        job_classes=(JobClass("two", 1.0, 1, 1.0, 1.0, memory_mb=2000),))
    big_first = []
    for seed in range(1, 9):
        work = [(0.0, Job(1, 1, round(HOUR), HOUR, 6000))] + [
            (0.0, Job(i, 1, round(HOUR), HOUR, 2000, job_class=0)) for i in range(2, 6)]
        result = simulate(scenario, AWARE, seed, workload=work)
        if rule:
            assert result.started_by_class == {"two": 4}
            assert result.wait_by_class == {"two": 0.0}
            assert result.waiting_by_class == {"other": 1}
        else:
            assert result.jobs_done == 5
            big_first.append(result.wait_by_class["two"] > 0)
    assert any(big_first) or rule


@pytest.mark.parametrize("rule", ["", "binding"])
def test_memory_per_core_rule_binding_limits_only_below_the_pilots_share(rule: str) -> None:
    # The same node: a 3,000 MB job runs first (alone at 0); at 0.5 h a 2,500 MB job and
    # three of 1,500 MB come. Left: 5,000 MB for 3 cores (1,666 a core, below the share of
    # 2,000): "binding" offers 1,875 a core, so the 2,500 MB job waits; after a 1,500 MB job,
    # 3,500 MB for 2 cores (1,750 a core): it waits again; then 2,000 MB for 1 core is the
    # share, no limit, but too little memory. It starts when the 3,000 MB job ends, at 1 h.
    # Without the rule some seeds draw it at 0.5 h.
    scenario = one_node(memory_per_node_mb=8000, significant_bits=7, sample_seconds=600.0,
                        memory_per_core_rule=rule,
                        job_classes=(JobClass("two", 1.0, 1, 1.0, 1.0, memory_mb=2000),))
    waits = []
    for seed in range(1, 9):
        work = [(0.0, Job(1, 1, round(HOUR), HOUR, 3000, job_class=0)),
                (0.5 * HOUR, Job(2, 1, round(HOUR), HOUR, 2500))] + [
            (0.5 * HOUR, Job(i, 1, round(HOUR), HOUR, 1500, job_class=0)) for i in range(3, 6)]
        result = simulate(scenario, AWARE, seed, workload=work)
        assert result.jobs_done == 5
        waits.append(result.wait_by_class["other"])
    if rule:
        assert waits == pytest.approx([0.5 * HOUR] * 8)
    else:
        assert 0.0 in waits


def test_an_unknown_memory_per_core_rule_is_refused() -> None:
    with pytest.raises(ValueError, match="memory_per_core_rule"):
        one_node(memory_per_core_rule="sometimes")


def test_the_report_gives_the_memory_bound_the_memory_occupancy_and_waits_per_class() -> None:
    # Two 4-core nodes of 8,000 MB, half the jobs of 6,000 MB: at most half the cores.
    scenario = replace(PRESETS["small"].scenario, nodes=2, cores_per_node=4, days=0.5,
                       warmup_hours=2.0, shutdowns_per_day=0.0, drain_events=0,
                       memory_per_node_mb=8000,
                       job_classes=(JobClass("heavy", 1.0, 1, 1.0, 2.0, memory_mb=6000),
                                    JobClass("light", 1.0, 1, 1.0, 2.0, memory_mb=2000)))
    c = compare(scenario, [AWARE], [1, 2], workers=1)
    figures = c.as_dict()
    assert figures["memory_bound_core_occupancy"] == pytest.approx(50.0)
    policy = figures["policies"]["aware"]
    assert 0 < policy["memory_occupancy"]["mean"] <= 100
    assert set(policy["job_classes"]) == {"heavy", "light"}
    for name in ("heavy", "light"):
        started = policy["job_classes"][name]["started"]["per_seed"]
        assert started == [float(r.started_by_class[name]) for r in c.runs["aware"]]
    table = render_table(c)
    assert "memory-bound core occupancy of the job mix: 50.00%" in table
    assert "  heavy: " in table and "  light: " in table
    no_memory = compare(replace(scenario, memory_per_node_mb=None), [AWARE], [1], workers=1)
    assert no_memory.as_dict()["memory_bound_core_occupancy"] is None
    assert "memory_occupancy" not in no_memory.as_dict()["policies"]["aware"]
    assert "memory-bound" not in render_table(no_memory)
