"""psij-python's own executor tests against the ``gridpilot`` executor (tests/psij_suite.py):
every one passes but the multi-node one, which gridpilot refuses saying why. They are not in
psij-python's sdist, so they run only when GRIDPILOT_PSIJ_TESTS names the ``tests`` folder of
a psij-python checkout at the installed version's tag."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_psij_pythons_executor_tests_pass_but_multi_node(tmp_path: Path) -> None:
    source = os.environ.get("GRIDPILOT_PSIJ_TESTS")
    if not source:
        pytest.skip("GRIDPILOT_PSIJ_TESTS does not name psij-python's tests folder")
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "psij_suite.py"), source],
                         cwd=tmp_path, capture_output=True, text=True, timeout=1800)
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert out.returncode == 0, [r for r in lines if r.get("outcome") not in (
        "passed", "skipped")] or out.stderr[-2000:]
    outcomes = {r["test"].partition("[")[0]: r["outcome"] for r in lines if "test" in r}
    assert outcomes["test_executor::test_stdin_redirect"] == "passed"
    assert outcomes["test_executor::test_stderr_redirect"] == "passed"
    assert outcomes["user_guide.test_resourcespec::test_user_guide_resourcespec"] == (
        "refused as expected")
