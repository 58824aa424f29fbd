"""bench/dirac_side_by_side.py without DIRAC: its gridpilot sides at a tiny size on the
configured servers (JSON lines, checks, summary), and its clear errors. DIRAC itself is never
imported here (its side runs in DIRAC's own Python). No timing is asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "dirac_side_by_side.py"
PG, MARIA = "GRIDPILOT_TEST_POSTGRES_URL", "GRIDPILOT_TEST_MARIADB_URL"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(BENCH), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.skipif(not (os.environ.get(PG) and os.environ.get(MARIA)),
                    reason="needs the PostgreSQL and MariaDB test servers")
def test_gridpilot_sides_run_and_are_checked() -> None:
    sides = "gp_claim_postgresql,gp_match_postgresql,gp_claim_mariadb,gp_match_mariadb"
    done = run("--postgres", os.environ[PG], "--mariadb", os.environ[MARIA], "--k", "10",
               "--jobs", "120", "--claims", "60", "--rounds", "2", "--sides", sides,
               "--calibration-seconds", "0.2")
    assert done.returncode == 0, done.stderr[-3000:]
    records: list[dict[str, Any]] = [json.loads(line) for line in done.stdout.splitlines()]
    measured = [r for r in records if r["measure"] == "side_by_side"]
    assert [r["side"] for r in measured] == [
        *sides.split(","), *sides.split(",")[1:], sides.split(",")[0]]  # turned in round 2
    for r in measured:
        assert (r["claims"], r["jobs"], r["misses"], r["duplicates"], r["violations"]) == (
            60, 60, 0, 0, 0), r
        assert r["database_agrees"] and r["x_floor"] > 0
    assert {r["backend"] for r in records if r["measure"] == "calibration"} == {
        "postgresql", "mariadb"}
    (summary,) = [r for r in records if r["measure"] == "side_by_side_summary"]
    assert summary["k"] == 10 and summary["rounds"] == 0  # no DIRAC side measured
    assert summary["full_match_vs_dirac_matcher"] == {"postgresql": None, "mariadb": None}
    assert summary["matches_per_s"]["gp_match_mariadb"] > 0


def test_clear_errors() -> None:
    done = run("--sides", "gp_claim_sqlite")
    assert done.returncode == 2 and "unknown ['gp_claim_sqlite']" in done.stderr
    done = run("--dirac-python", "/nonexistent/python", "--sides", "dirac_tqdb")
    assert done.returncode == 2 and "does not exist" in done.stderr
    done = run("--k", "ten")
    assert done.returncode == 2 and "comma list of integers" in done.stderr
    assert "Traceback" not in done.stderr
