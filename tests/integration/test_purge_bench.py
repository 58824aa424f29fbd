"""bench/purge.py at a tiny size: its JSON lines parse, the purge removes every ended job
while the claims run, and the claims meet no miss, duplicate or violation. No timing is
asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_tiny_run_purges_everything_while_claims_run(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "purge.py"), "--url",
                           f"sqlite:///{tmp_path / 'p.db'}", "--ended", "1200", "--jobs", "300",
                           "--k", "10", "--batch", "100", "--seconds", "30"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    records = {r["measure"]: r for r in map(json.loads, done.stdout.splitlines())}
    assert {"server", "calibration", "claims_without_purge", "claims_with_purge",
            "purge"} <= set(records)
    for name in ("claims_without_purge", "claims_with_purge"):
        r = records[name]
        assert r["claims"] > 0 and r["database_agrees"], r
        assert r["misses"] == r["duplicates"] == r["violations"] == r["errors"] == 0, r
    purge = records["purge"]
    assert purge["removed"] == 1200 and purge["left"] == 0
    assert purge["summary"].startswith("1200 ended job(s) purged (Done 1200)")
    assert purge["claim_p99_with_x_without"] > 0
