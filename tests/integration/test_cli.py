"""The real ``gridpilot`` command in a subprocess: schema commands, the demo, clear errors."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import jwt
import requests

from matcher.auth import principal_from_header
from tests.conftest import Database


def run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GRIDPILOT_")}
    full_env.update(env)
    return subprocess.run([sys.executable, "-m", "gridpilot", *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=300)


def test_db_upgrade_then_current(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'g.db'}"
    first = run(["db", "current"], tmp_path, GRIDPILOT_DATABASE_URL=url)
    assert first.returncode == 0, first.stderr
    assert "(empty database) - behind" in first.stdout
    up = run(["db", "upgrade"], tmp_path, GRIDPILOT_DATABASE_URL=url)
    assert up.returncode == 0, up.stderr
    assert "revision (empty) -> 0010" in up.stdout
    again = run(["db", "upgrade"], tmp_path, GRIDPILOT_DATABASE_URL=url)
    assert "revision 0010 -> 0010" in again.stdout
    current = run(["db", "current"], tmp_path, GRIDPILOT_DATABASE_URL=url)
    assert current.stdout.strip() == "0010 - up to date"


def test_db_current_on_each_backend(database: Database, tmp_path: Path) -> None:
    out = run(["db", "current"], tmp_path, GRIDPILOT_DATABASE_URL=database.url)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0010 - up to date"


def test_bad_settings_give_one_clear_line(tmp_path: Path) -> None:
    conf = tmp_path / "bad.toml"
    conf.write_text("[taskqueue]\ncpu_time_segments = 'long'\n")
    out = run(["--config", str(conf), "db", "current"], tmp_path)
    assert out.returncode == 1
    assert "taskqueue.cpu_time_segments must be a list, got 'long'" in out.stderr
    assert "Traceback" not in out.stderr


def test_unusable_database_url(tmp_path: Path) -> None:
    out = run(["db", "upgrade"], tmp_path, GRIDPILOT_DATABASE_URL="oracle://x@y/z")
    assert out.returncode == 1 and "backend 'oracle' is not supported" in out.stderr
    out = run(["db", "current"], tmp_path,
              GRIDPILOT_DATABASE_URL="postgresql+psycopg://nobody@127.0.0.1:1/none")
    assert out.returncode == 1 and "cannot use the database" in out.stderr
    assert "Traceback" not in out.stderr


def test_demo_matches_every_job(tmp_path: Path) -> None:
    """The demo runs every job, and its dashboard answers while the pilots work and after,
    until Ctrl-C stops the demo (``--linger``; without a terminal, as in CI, it ends by
    itself: the other runs of the demo in this file show that)."""
    resources = Path(__file__).resolve().parents[2] / "conf" / "resources.toml"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRIDPILOT_")}
    env["GRIDPILOT_RESOURCES_FILE"] = str(resources)
    lines: list[str] = []
    seen_while_working = seen_after = url = token = ""
    with subprocess.Popen([sys.executable, "-m", "gridpilot", "demo", "--work",
                           str(tmp_path / "work"), "--jobs", "200", "--linger", "120"],
                          cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        try:
            for line in proc.stdout:
                lines.append(line)
                if line.startswith("Dashboard: "):
                    url = line.split()[1]
                elif url and not token:
                    token = line.strip()
                    seen_while_working = _dashboard_overview(url, token)
                elif line.startswith("The dashboard stays at"):
                    seen_after = _dashboard_overview(url, token)
                    proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        out = subprocess.CompletedProcess(proc.args, proc.returncode, "".join(lines),
                                          proc.stderr.read())
    assert out.returncode == 0, out.stderr
    assert "lhcb" in seen_while_working and "Sign out" in seen_while_working
    assert 'data-status="Done"' in seen_after and "Stopping." in out.stdout
    submitted = re.search(r"Submitted 200 jobs .*: (\d+) waiting, (\d+) failed", out.stdout)
    assert submitted, out.stdout
    waiting, failed = int(submitted[1]), int(submitted[2])
    assert waiting + failed == 200 and failed > 0  # the demo shows a failure and its reason
    assert "failed: Requirements: no queue offers SoftwareTag 'VO-lhcb-gauss-v99'" in out.stdout
    assert f"Jobs by status: Done {waiting}, Failed {failed}; left waiting: 0." in out.stdout
    # Driven by the site director: real pilots per queue, and the site admin's view.
    ran = re.search(r"total\s+(\d+)\s+(\d+)\n", out.stdout)
    assert ran, out.stdout
    assert int(ran[1]) > 0 and int(ran[2]) == waiting
    assert "gridpilot-drain-cost: no pilot $JOBSTATUS directory" in out.stdout


SECRET = "cli-test-secret-0123456789abcdef"


def test_token_issue_makes_a_token_the_matcher_accepts(tmp_path: Path) -> None:
    out = run(["token", "issue", "--role", "pilot", "--subject", "factory", "--vo", "lhcb",
               "--group", "lhcb_pilot", "--site", "LCG.CERN.cern", "--lifetime", "600"],
              tmp_path, GRIDPILOT_AUTH_SECRET=SECRET)
    assert out.returncode == 0, out.stderr
    principal = principal_from_header(f"Bearer {out.stdout.strip()}", SECRET)
    assert (principal.role, principal.subject, principal.vo, principal.site) == (
        "pilot", "factory", "lhcb", "LCG.CERN.cern")
    claims = jwt.decode(out.stdout.strip(), SECRET, algorithms=["HS256"], issuer="gridpilot")
    assert claims["exp"] - claims["iat"] == 600


def test_token_issue_refuses_without_a_secret_or_with_bad_claims(tmp_path: Path) -> None:
    no_secret = run(["token", "issue", "--role", "user", "--subject", "alice"], tmp_path)
    assert no_secret.returncode == 1 and "GRIDPILOT_AUTH_SECRET" in no_secret.stderr
    site_for_user = run(["token", "issue", "--role", "user", "--subject", "alice",
                         "--site", "X"], tmp_path, GRIDPILOT_AUTH_SECRET=SECRET)
    assert site_for_user.returncode == 2
    assert "only a pilot token names a site" in site_for_user.stderr
    assert "Traceback" not in no_secret.stderr + site_for_user.stderr


def test_agents_once_runs_every_loop(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'g.db'}"
    resources = Path(__file__).resolve().parents[2] / "conf" / "resources.toml"
    env = {"GRIDPILOT_DATABASE_URL": url, "GRIDPILOT_AUTH_SECRET": SECRET,
           "GRIDPILOT_RESOURCES_FILE": str(resources),
           "GRIDPILOT_AGENTS_PILOT_WORKDIR": str(tmp_path / "pilots")}
    assert run(["db", "upgrade"], tmp_path, **env).returncode == 0
    out = run(["agents", "--once"], tmp_path, **env)
    assert out.returncode == 0, out.stderr
    names = [line.split(":", 1)[0] for line in out.stdout.splitlines()]
    assert names == ["optimizer", "director", "pilots", "submitpools", "watchdog",
                     "priorities", "cleanup", "activity"]
    assert "director: 0 pilot(s) submitted" in out.stdout  # no job waits: no pilot
    unknown = run(["agents", "nosuch", "--once"], tmp_path, **env)
    assert unknown.returncode == 2 and "no agent loop named nosuch" in unknown.stderr


def _dashboard_overview(url: str, token: str) -> str:
    """The overview page, signed in with ``token`` as a browser would."""
    with requests.Session() as http:
        form = http.get(f"{url}login", timeout=30)
        csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert csrf, form.text
        page = http.post(f"{url}login", data={"token": token, "csrf": csrf[1]}, timeout=30)
        assert page.status_code == 200 and page.url == url, page.text
        return page.text
