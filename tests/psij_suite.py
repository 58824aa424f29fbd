"""Runs psij-python's own executor tests against the ``gridpilot`` executor.

    python tests/psij_suite.py PSIJ_TESTS_DIR [pytest arguments...]

PSIJ_TESTS_DIR is the ``tests`` folder of a psij-python checkout of the installed version (its
conftest.py, _test_tools.py, executor_test_params.py and ci_runner.py are needed, which the
sdist on PyPI does not hold; they need the ``filelock`` package). A matcher (``gridpilot
serve``, SQLite) starts on loopback with two pilots of two cores each that run every job; the
suite runs with ``--executors gridpilot::URL`` and a user token in GRIDPILOT_TOKEN. Prints one
JSON line per test (its outcome) and a summary line; exits 1 when a test failed that is not
among EXPECTED (what gridpilot refuses on purpose), or none passed. Not collected by pytest (it
needs the other project's tests): tests/integration/test_psij_suite.py runs it when
GRIDPILOT_PSIJ_TESTS names that folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gridpilot import schema  # noqa: E402
from gridpilot.devserver import matcher_server  # noqa: E402
from taskqueue.db.database import make_engine  # noqa: E402
from taskqueue.tokens import issue_token  # noqa: E402
from tests.helpers import write_token_file  # noqa: E402

SECRET = "psij-suite-signing-secret-0123456789"
#: The files whose tests take an executor (``execparams``) and apply to a remote service.
FILES = ("test_executor.py", "test_callbacks.py", "test_wait.py", "test_resources.py",
         "test_issue_435.py", "getting_started", "user_guide")
#: Tests that fail on purpose, by name (without parameters) → what their failure says.
EXPECTED = {"test_user_guide_resourcespec": "multi-node jobs are not supported"}


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    source = Path(argv[0]).resolve()
    if not (source / "conftest.py").is_file():
        print(f"{source} has no conftest.py: give psij-python's tests folder", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="gridpilot-psij-") as tmp:
        work = Path(tmp)
        tests = work / "tests"
        shutil.copytree(source, tests)
        url = f"sqlite:///{work / 'gridpilot.db'}"
        engine = make_engine(url)
        schema.upgrade(engine)
        engine.dispose()
        user = issue_token(SECRET, subject="psij", role="user", vo="lhcb", group="lhcb_user",
                           lifetime=7200)
        pilot_token = issue_token(SECRET, subject="factory", role="pilot", vo="lhcb",
                                  group="lhcb_pilot", lifetime=7200)
        with matcher_server(url, SECRET, ROOT / "conf" / "resources.toml", work,
                            workers=2) as base:
            pilots = [_pilot(base, pilot_token, work, n) for n in range(2)]
            try:
                report = work / "report.xml"
                targets = [str(tests / f) for f in FILES if (tests / f).exists()]
                env = {**os.environ, "GRIDPILOT_TOKEN": user, "PYTHONPATH": str(ROOT)}
                env.pop("GRIDPILOT_TOKEN_FILE", None)
                subprocess.run([sys.executable, "-m", "pytest", *targets, "-p",
                                "no:cacheprovider", "--executors", f"gridpilot::{base}",
                                f"--junitxml={report}", "-q", "-o", "filterwarnings=",
                                "--rootdir", str(tests), *argv[1:]],
                               cwd=work, env=env, check=False)
            finally:
                for p in pilots:
                    p.terminate()
                    p.wait(timeout=60)
            return _summary(report)


def _pilot(base: str, token: str, work: Path, n: int) -> subprocess.Popen[bytes]:
    # Each pilot reads its token from a private file and removes it (as the site director does).
    token_file = write_token_file(work / f"pilot-{n}.token", token)
    with (work / f"pilot-{n}.log").open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "pilot.cli", "--matcher", base, "--token-file",
             str(token_file), "--vo", "lhcb", "--site", "LCG.CERN.cern", "--ce",
             "ce503.cern.ch", "--queue",
             "condor", "--cores", "2", "--submit-pools", "", "--idle-timeout", "3600",
             "--backoff-cap", "1", "--heartbeat", "1", "--grace", "1",
             "--workdir", str(work / f"pilot-{n}")],
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)


def _summary(report: Path) -> int:
    if not report.is_file():
        print(json.dumps({"error": "pytest wrote no report"}))
        return 1
    counts: dict[str, int] = {}
    unexpected = 0
    for case in ET.parse(report).getroot().iter("testcase"):
        outcome = "passed"
        detail = ""
        for kind in ("failure", "error", "skipped"):
            found = case.find(kind)
            if found is not None:
                outcome = {"failure": "failed"}.get(kind, kind)
                detail = (found.get("message") or "").splitlines()[0][:200] if found.get(
                    "message") else ""
        name = str(case.get("name")).partition("[")[0]
        if outcome in ("failed", "error"):
            expected = EXPECTED.get(name)
            if expected is not None and expected in detail:
                outcome = "refused as expected"
            else:
                unexpected += 1
        counts[outcome] = counts.get(outcome, 0) + 1
        print(json.dumps({"test": f"{case.get('classname')}::{case.get('name')}",
                          "outcome": outcome, "detail": detail}))
    print(json.dumps({"summary": counts}))
    return 1 if unexpected or not counts.get("passed") else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
