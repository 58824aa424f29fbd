"""bench/ten_million.py at a tiny size on the test PostgreSQL: its JSON lines parse and are
sane (claims made with no miss, duplicate or violation; the bulk submission accepted; every
agent loop turned; every page answered 200; disk and memory read) and its database is dropped.
No timing is asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from agents.runner import LOOP_NAMES

ROOT = Path(__file__).resolve().parents[2]
URL = os.environ.get("GRIDPILOT_TEST_POSTGRES_URL")

pytestmark = pytest.mark.skipif(not URL, reason="GRIDPILOT_TEST_POSTGRES_URL is not set")


def _tenm_databases(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return set(conn.execute(text(
                "SELECT datname FROM pg_database WHERE datname LIKE 'gp_tenm_%'")).scalars())
    finally:
        engine.dispose()


def test_tiny_run_measures_everything_and_drops_its_database() -> None:
    assert URL is not None
    before = _tenm_databases(URL)
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "ten_million.py"), "--url", URL,
                           "--jobs", "3000", "--base", "1000", "--k", "20", "--queues", "150",
                           "--seconds", "10", "--repeat", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in done.stdout.splitlines()]
    by = {r["measure"]: r for r in records}
    assert {"server", "calibration", "claims_at_base", "load", "claims_at_full_size",
            "claim_rate_ratio", "bulk_submission", "agent_turn", "page", "disk",
            "server_memory"} <= set(by)
    assert by["calibration"]["update_commit"]["per_s"] > 0
    for name, waiting in (("claims_at_base", 1000), ("claims_at_full_size", 3000)):
        r = by[name]
        assert r["waiting_jobs_in_database"] == waiting, r
        assert r["claims"] > 0 and r["database_agrees"], r
        assert r["misses"] == r["duplicates"] == r["violations"] == r["errors"] == 0, r
        assert r["ratios"]["claims_per_s_x_floor"] > 0
    load = by["load"]
    assert load["jobs"] == 2000 and load["queues"] == 150 and load["method"] == "COPY"
    assert load["sites"] > 100 and load["tags"] > 100
    assert by["claim_rate_ratio"]["full_x_base"] > 0
    assert by["bulk_submission"]["status"] == 201 and by["bulk_submission"]["jobs"] == 1000
    turns = [r for r in records if r["measure"] == "agent_turn"]
    assert [t["loop"] for t in turns] == list(LOOP_NAMES)
    assert not any(t["summary"].startswith(("not run", "failed")) for t in turns), turns
    pages = [r for r in records if r["measure"] == "page"]
    assert len(pages) > 10 and all(p["all_200"] for p in pages), pages
    assert by["disk"]["database_mb"] > 0 and by["disk"]["jobs"] == 4001
    assert by["server_memory"]["postgres_processes"] > 0
    assert _tenm_databases(URL) == before
