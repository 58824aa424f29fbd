"""bench/claim_variants.py at a tiny size on the test PostgreSQL, in a database of its own: in
rounds, the canonical text (``-``) and a copy of it hand out the same answers (equal digests);
side by side (``--interleave``), both variants claim, the first is the yardstick of the others,
and the schemas that held them are gone afterwards. Either way the installed function is its
canonical text again at the end. No timing is asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from taskqueue.matching.sql import canonical_text

ROOT = Path(__file__).resolve().parents[2]
URL = os.environ.get("GRIDPILOT_TEST_POSTGRES_URL")

pytestmark = pytest.mark.skipif(not URL, reason="GRIDPILOT_TEST_POSTGRES_URL is not set")


@pytest.fixture
def database() -> Iterator[str]:
    assert URL is not None
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from kit import fresh_database

        with fresh_database(URL, prefix="gp_test_claimvar") as db:
            yield db.url
    finally:
        sys.path.remove(str(ROOT / "bench"))


def _run(url: str, *args: str) -> list[dict[str, object]]:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "claim_variants.py"),
                           "--url", url, "--k", "20", "--claims", "80", "--rounds", "1", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


def _installed(url: str) -> tuple[str, list[str]]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            body = conn.execute(text(
                "SELECT p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                "WHERE p.proname = 'gridpilot_claim' AND n.nspname = 'public'")).scalar_one()
            schemas = list(conn.execute(text(
                "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'gp_claim_variant_%'"))
                .scalars())
    finally:
        engine.dispose()
    return " ".join(str(body).split()), schemas


def _canonical_body() -> str:
    sql = canonical_text("postgresql")
    return " ".join(sql[sql.index("$fn$") + 4:sql.rindex("$fn$")].split())


def test_rounds_and_side_by_side_runs(database: str, tmp_path: Path) -> None:
    # The same rules in another text: a variant whose answers must be the canonical's.
    copy = tmp_path / "copy.sql"
    copy.write_text(canonical_text("postgresql").replace(
        "v_claimed := v_claimed + 1;", "v_claimed := 1 + v_claimed;"))
    records = _run(database, "-", str(copy))
    assert [r["measure"] for r in records] == ["calibration", "claim_variant", "claim_variant"]
    a, b = records[1], records[2]
    assert a["variant"] == "-" and b["variant"] == str(copy)
    assert a["claims"] == b["claims"] == 30
    assert isinstance(a["jobs"], int) and a["jobs"] > 0
    assert a["answers_digest"] == b["answers_digest"]
    assert isinstance(a["server_cpu_x_calibration"], float)
    assert _installed(database) == (_canonical_body(), [])

    records = _run(database, "--interleave", "10", "-", str(copy))
    assert [r["measure"] for r in records] == ["calibration", "claim_variant", "claim_variant"]
    a, b = records[1], records[2]
    assert a["claims"] == b["claims"] == 30 and a["interleave"] == 10
    assert isinstance(a["jobs"], int) and isinstance(b["jobs"], int)
    assert a["jobs"] > 0 and b["jobs"] > 0
    assert a["server_cpu_x_first"] == 1.0
    assert _installed(database) == (_canonical_body(), [])
