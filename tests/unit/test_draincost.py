"""gridpilot-drain-cost on $JOBSTATUS directories written by write_status: table, JSON,
Prometheus, --pick, order, skipped garbage, exit codes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pilot.draincost import EXIT_NO_PILOT, EXIT_OK, EXIT_USAGE, ROOT_ENV, main
from pilot.jobstatus import RunningPayload, compute_status, locked, write_status

ROOT_DIR = Path(__file__).resolve().parents[2]
NOW = "3500"


def pilot(root: Path, name: str, allocated: int, payloads: list[RunningPayload], *,
          can_postpone: bool = False, priority: float = 1.0, reference: str | None = None,
          written_at: float = 3000) -> Path:
    directory = root / name
    write_status(directory, compute_status(allocated, payloads, now=written_at,
                                           can_postpone=can_postpone, priority_factor=priority,
                                           pilot_reference=reference))
    return directory


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """Four pilots, numbers at --now 3500:

    busy:     4 cores, payloads 1 core (1000..5000) and 2 cores (2000..4000), priority 1.5:
              draining 1 * 500 + 3000 = 3500, kill 1000 + 3 * 1500 = 5500
    retiring: 8 cores, one 8-core payload (0..10000), can postpone, priority 2:
              draining 0, kill 8 * 3500 = 28000
    idle:     2 cores, no payload, priority 0.5: draining 0, kill 0
    light:    4 cores, one 1-core payload (3000..3600, limit 4000), priority 1.5, no
              reference: draining 3 * 100 + 0 = 300, kill 1 * 500 = 500
    """
    r = tmp_path / "jobstatus"
    pilot(r, "p1", 4, [RunningPayload(1, 1000, 5000, 9000), RunningPayload(2, 2000, 4000, 8000)],
          priority=1.5, reference="busy")
    pilot(r, "p2", 8, [RunningPayload(8, 0, 10000, 20000)], can_postpone=True, priority=2,
          reference="retiring")
    pilot(r, "p3", 2, [], priority=0.5, reference="idle")
    pilot(r, "p4", 4, [RunningPayload(1, 3000, 3600, 4000)], priority=1.5)
    (r / "not-a-pilot").mkdir()  # no used_CPU: not reported at all
    (r / "stray-file").write_text("x")
    return r


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def test_json_numbers_and_drain_order(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--root", str(root), "--now", NOW, "--json")
    assert (code, err) == (EXIT_OK, "")
    rows = json.loads(out)
    # can postpone first; then lowest priority; then (equal priority 1.5) lowest draining waste.
    assert [r["pilot"] for r in rows] == ["retiring", "idle", "p4", "busy"]
    by_name = {r["pilot"]: r for r in rows}
    assert by_name["busy"] == {
        "pilot": "busy", "directory": str(root / "p1"), "used_CPU": 3, "allocated_CPU": 4,
        "remaining_time": 1500, "remaining_time_enforced": 5500, "draining_waste": 3500,
        "kill_waste": 5500, "can_postpone": False, "priority_factor": 1.5,
        "limit_assumed": False}
    assert (by_name["retiring"]["draining_waste"], by_name["retiring"]["kill_waste"]) == (0, 28000)
    assert (by_name["idle"]["draining_waste"], by_name["idle"]["kill_waste"]) == (0, 0)
    assert (by_name["p4"]["draining_waste"], by_name["p4"]["kill_waste"]) == (300, 500)
    assert by_name["p4"]["remaining_time"] == 100


def test_table(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--root", str(root), "--now", NOW)
    assert code == EXIT_OK
    lines = out.splitlines()
    assert lines[0].split() == ["PILOT", "CORES", "REMAINING", "LIMIT", "DRAIN(core-h)",
                                "KILL(core-h)", "POSTPONE", "PRIORITY"]
    assert [line.split() for line in lines[1:]] == [
        ["retiring", "8/8", "1:48:20", "4:35:00", "0.00", "7.78", "True", "2"],
        ["idle", "0/2", "idle", "idle", "0.00", "0.00", "False", "0.5"],
        ["p4", "1/4", "0:01:40", "0:08:20", "0.08", "0.14", "False", "1.5"],
        ["busy", "3/4", "0:25:00", "1:31:40", "0.97", "1.53", "False", "1.5"],
    ]


def test_prometheus(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--root", str(root), "--now", NOW, "--prometheus")
    assert code == EXIT_OK
    lines = out.splitlines()
    assert "gridpilot_drain_cost_pilots 4" in lines
    assert "gridpilot_drain_cost_unreadable 0" in lines
    busy = '{rank="4"}'  # the busy pilot is the last in the drain order
    assert f"gridpilot_pilot_draining_waste_core_seconds{busy} 3500" in lines
    assert f"gridpilot_pilot_kill_waste_core_seconds{busy} 5500" in lines
    assert f"gridpilot_pilot_used_cores{busy} 3" in lines
    assert f"gridpilot_pilot_allocated_cores{busy} 4" in lines
    assert f"gridpilot_pilot_remaining_seconds{busy} 1500" in lines
    assert f"gridpilot_pilot_can_postpone{busy} 0" in lines
    assert f"gridpilot_pilot_priority_factor{busy} 1.5" in lines
    # Every metric has HELP and TYPE gauge before its samples; every sample line is valid.
    sample = re.compile(r'^[a-z_]+(\{rank="[0-9]+"\})? -?[0-9.e+]+$')
    declared: set[str] = set()
    for line in lines:
        if line.startswith("# HELP "):
            declared.add(line.split()[2])
        elif line.startswith("# TYPE "):
            assert line.split()[2:] == [line.split()[2], "gauge"]
            assert line.split()[2] in declared
        else:
            assert sample.match(line), line
            assert line.split("{")[0].split()[0] in declared


def test_prometheus_series_stay_the_same_as_pilots_come_and_go(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The labels name the place in the drain order, never the pilot: a node that runs one
    pilot after another keeps one set of series, not one per pilot ever seen."""
    seen = []
    for n, reference in enumerate(['first', 'odd "name" \\ here', "third"]):
        node = tmp_path / str(n)
        pilot(node, "slot", 1, [], reference=reference)
        code, out, _ = run(capsys, "--root", str(node), "--now", NOW, "--prometheus")
        assert code == EXIT_OK
        assert reference not in out and str(node) not in out
        seen.append({line.rsplit(" ", 1)[0] for line in out.splitlines()})
    assert seen[0] == seen[1] == seen[2]
    assert 'gridpilot_pilot_used_cores{rank="1"}' in seen[0]


def test_unknown_allocated_cores_leave_the_draining_waste_unknown(
        root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without allocated_CPU the idle cores are unknown: the draining waste is unknown too,
    not computed as if every allocated core were in use."""
    (root / "p1" / "allocated_CPU").unlink()
    code, out, _ = run(capsys, "--root", str(root), "--now", NOW, "--json")
    assert code == EXIT_OK
    busy = next(r for r in json.loads(out) if r["pilot"] == "busy")
    assert busy["allocated_CPU"] is None and busy["draining_waste"] is None
    assert busy["kill_waste"] == 5500  # the work done so far does not depend on it
    code, out, _ = run(capsys, "--root", str(root), "--now", NOW)
    row = next(line.split() for line in out.splitlines() if line.startswith("busy"))
    assert row[1] == "3/?" and row[4] == "?"
    code, out, _ = run(capsys, "--root", str(root), "--now", NOW, "--prometheus")
    assert code == EXIT_OK
    assert out.count("gridpilot_pilot_draining_waste_core_seconds{") == 3


def test_pick_drain(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--root", str(root), "--now", NOW, "--pick", "drain")
    assert code == EXIT_OK
    lines = out.splitlines()
    assert lines[0] == str(root / "p2")
    assert dict(line.split(" ", 1) for line in lines[1:]) == {
        "pilot": "retiring", "used_CPU": "8", "allocated_CPU": "8", "remaining_time": "6500",
        "remaining_time_enforced": "16500", "draining_waste": "0", "kill_waste": "28000",
        "can_postpone": "True", "priority_factor": "2", "limit_assumed": "False"}


def test_pick_kill_takes_the_least_critical_then_the_cheapest(
        root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--root", str(root), "--now", NOW, "--pick", "kill", "--json")
    assert code == EXIT_OK
    assert json.loads(out)["pilot"] == "idle"   # priority 0.5
    (root / "p3" / "used_CPU").unlink()          # without it: 1.5 p4 (kill 500) < busy (5500)
    code, out, _ = run(capsys, "--root", str(root), "--now", NOW, "--pick", "kill")
    assert (code, out.splitlines()[0]) == (EXIT_OK, str(root / "p4"))


def test_drain_order_prefers_postponable_over_low_priority(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pilot(tmp_path, "critical-but-retiring", 4, [RunningPayload(4, 0, 9000, 9000)],
          can_postpone=True, priority=100)
    pilot(tmp_path, "trivial", 4, [], priority=0)
    code, out, _ = run(capsys, "--root", str(tmp_path), "--now", NOW, "--pick", "drain")
    assert (code, out.splitlines()[0]) == (EXIT_OK, str(tmp_path / "critical-but-retiring"))


def test_garbage_directory_is_skipped_with_its_reason(root: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    pilot(root, "p5", 4, [], reference="broken")
    (root / "p5" / "add_uncom_time").write_text("lots\n")
    code, out, err = run(capsys, "--root", str(root), "--now", NOW, "--json")
    assert code == EXIT_OK
    assert [r["pilot"] for r in json.loads(out)] == ["retiring", "idle", "p4", "busy"]
    assert err.count("\n") == 1
    assert "skipped" in err and str(root / "p5") in err and "add_uncom_time" in err
    code, out, err = run(capsys, "--root", str(root), "--now", NOW, "--prometheus")
    assert "gridpilot_drain_cost_unreadable 1" in out.splitlines()


def test_explicit_directories(root: Path, tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--now", NOW, "--json", str(root / "p1"),
                         str(tmp_path / "missing"))
    assert code == EXIT_OK
    assert [r["pilot"] for r in json.loads(out)] == ["busy"]
    assert str(tmp_path / "missing") in err and "used_CPU" in err


def test_root_given_as_a_directory_gets_a_hint(root: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--now", NOW, str(root))
    assert (code, out) == (EXIT_NO_PILOT, "")
    assert "did you mean --root?" in err


def test_root_from_the_environment(root: Path, capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ROOT_ENV, str(root))
    code, out, _ = run(capsys, "--now", NOW, "--pick", "drain")
    assert (code, out.splitlines()[0]) == (EXIT_OK, str(root / "p2"))


def test_a_locked_pilot_is_skipped_after_the_lock_timeout(
        root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # This thread holds p1's lock (a second thread of the same process, as main() is, would be
    # a different locker, so main() runs in a subprocess here).
    with locked(root / "p1", exclusive=True):
        done = subprocess.run(
            [sys.executable, "-m", "pilot.draincost", "--root", str(root), "--now", NOW,
             "--json", "--lock-timeout", "0.05"],
            capture_output=True, text=True, cwd=ROOT_DIR, timeout=120, check=False)
    assert done.returncode == EXIT_OK
    assert [r["pilot"] for r in json.loads(done.stdout)] == ["retiring", "idle", "p4"]
    assert "stayed locked" in done.stderr and str(root / "p1") in done.stderr


@pytest.mark.parametrize("fmt", [[], ["--json"], ["--pick", "drain"]])
def test_no_pilot_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                          fmt: list[str]) -> None:
    code, out, err = run(capsys, "--root", str(tmp_path), *fmt)
    assert (code, out) == (EXIT_NO_PILOT, "")
    assert "no pilot" in err


def test_missing_root_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--root", str(tmp_path / "nowhere"))
    assert (code, out) == (EXIT_NO_PILOT, "")
    assert str(tmp_path / "nowhere") in err and ROOT_ENV in err


def test_no_readable_pilot_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "used_CPU").write_text("3\n")
    code, out, err = run(capsys, "--root", str(tmp_path))
    assert (code, out) == (EXIT_NO_PILOT, "")
    assert "bad" in err and "missing" in err


def test_prometheus_without_pilot_still_prints_the_summary(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A node with no pilot is a normal state for the textfile collector: exit 0, the summary
    gauges, no pilot series (also when the root does not exist yet)."""
    for root in (tmp_path, tmp_path / "not-yet"):
        code, out, _ = run(capsys, "--root", str(root), "--prometheus")
        assert code == EXIT_OK
        assert "gridpilot_drain_cost_pilots 0" in out.splitlines()
        assert "gridpilot_pilot_used_cores{" not in out


@pytest.mark.parametrize("argv", [
    ["--pick", "maybe"], ["--json", "--prometheus"], ["--now", "soon"], ["--now", "nan"],
    ["--pick", "drain", "--prometheus"], ["--lock-timeout", "-1"], ["--bogus"],
])
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, *argv)
    assert (code, out) == (EXIT_USAGE, "")
    assert "usage:" in err


def test_help_documents_order_and_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--help")
    assert code == EXIT_OK
    assert "can postpone" in out and "lowest priority factor" in out
    assert "lowest draining waste" in out
    for status in ("0 ", "1 ", "2 "):
        assert re.search(rf"^\s+{status}\s*\S", out, re.MULTILINE), status
    assert ROOT_ENV in out


def test_runs_as_a_module(root: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "pilot.draincost", "--root", str(root),
                           "--now", NOW, "--pick", "drain"],
                          capture_output=True, text=True, cwd=ROOT_DIR, timeout=120, check=False)
    assert (done.returncode, done.stdout.splitlines()[0], done.stderr) == (
        EXIT_OK, str(root / "p2"), "")


def test_what_if_later(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--now moves the evaluation: at 4000 busy's first payload is due and p4 is past its
    expected end (draining 0), the retiring pilot has done more work."""
    code, out, _ = run(capsys, "--root", str(root), "--now", "4000", "--json")
    assert code == EXIT_OK
    rows: dict[str, Any] = {r["pilot"]: r for r in json.loads(out)}
    assert rows["busy"]["draining_waste"] == 3000       # 1 * 0 + 3000
    assert rows["p4"]["draining_waste"] == 0             # 3 * (3600 - 4000) + 0 < 0
    assert rows["retiring"]["kill_waste"] == 32000       # 8 * 4000


def test_an_assumed_limit_is_marked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r = tmp_path / "jobstatus"
    pilot(r, "p", 1, [RunningPayload(1, 3000, 3600, 3000 + 7 * 86400, max_end_assumed=True)],
          reference="no-features")
    code, out, _ = run(capsys, "--root", str(r), "--now", NOW)
    assert code == EXIT_OK
    assert out.splitlines()[1].split()[:5] == ["no-features", "1/1", "0:01:40", "167:51:40",
                                               "assumed"]

