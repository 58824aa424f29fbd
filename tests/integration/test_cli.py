"""The real ``gridpilot`` command in a subprocess: schema commands, the demo, clear errors."""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import jwt
import requests

from matcher.auth import principal_from_header
from taskqueue.core.settings import load_settings
from tests.conftest import Database
from tests.helpers import HEAD_REVISION

ROOT = Path(__file__).resolve().parents[2]


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
    assert f"revision (empty) -> {HEAD_REVISION}" in up.stdout
    again = run(["db", "upgrade"], tmp_path, GRIDPILOT_DATABASE_URL=url)
    assert f"revision {HEAD_REVISION} -> {HEAD_REVISION}" in again.stdout
    current = run(["db", "current"], tmp_path, GRIDPILOT_DATABASE_URL=url)
    assert current.stdout.strip() == f"{HEAD_REVISION} - up to date"


def test_db_current_on_each_backend(database: Database, tmp_path: Path) -> None:
    out = run(["db", "current"], tmp_path, GRIDPILOT_DATABASE_URL=database.url)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"{HEAD_REVISION} - up to date"


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
                          stderr=subprocess.PIPE, text=True,
                          # Ctrl-C as at a terminal, even where this test runs with SIGINT
                          # ignored (a shell's background job).
                          preexec_fn=_default_sigint) as proc:
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
    # A user's two jobs through gridpilot-client and one through the PSI/J executor run too.
    assert re.search(r"gridpilot-client submit hello.jdl \(as dave\): jobs \d+, \d+",
                     out.stdout)
    assert re.search(r"The PSI/J job \d+: QUEUED -> ACTIVE -> COMPLETED \(exit code 0\); "
                     r"its output: 'hello from PSI/J on ", out.stdout), out.stdout
    assert len(re.findall(r"\d+\s+Done\s+hello-\d", out.stdout)) == 2
    by_user = 4  # dave's two, the PSI/J job and alice's job with files (sandboxes)
    assert f"Jobs by status: Done {waiting + by_user}, Failed {failed}; left waiting: 0." \
        in out.stdout
    # Driven by the site director: real pilots per queue, and the site admin's view.
    ran = re.search(r"total\s+(\d+)\s+(\d+)\n", out.stdout)
    assert ran, out.stdout
    assert int(ran[1]) > 0 and int(ran[2]) == waiting + by_user
    assert "gridpilot-drain-cost: no pilot $JOBSTATUS directory" in out.stdout
    # Every queue that got pilots is labelled, and the ended pilots' folders are gone.
    table = out.stdout.split("per queue:\n", 1)[1].split("\n  total", 1)[0].splitlines()[1:]
    labels = [line[2:14].strip() for line in table]
    assert len(labels) == 6 and all(labels), table
    assert [p.name for p in (tmp_path / "work" / "pilots").iterdir()] in ([], ["psij"])


def test_demo_without_a_terminal_says_its_services_stopped(tmp_path: Path) -> None:
    """Without a terminal the demo does not linger; it says so, and how to keep the matcher
    and its dashboard up, rather than leaving a dead dashboard address as its last word."""
    resources = ROOT / "conf" / "resources.toml"
    out = run(["demo", "--work", str(tmp_path / "work"), "--jobs", "20"], tmp_path,
              GRIDPILOT_RESOURCES_FILE=str(resources))
    assert out.returncode == 0, out.stderr
    dashboard = next(line for line in out.stdout.splitlines() if line.startswith("Dashboard: "))
    assert "--linger" in dashboard, dashboard
    last = out.stdout.rstrip().splitlines()[-1]
    assert "the matcher and its dashboard have stopped" in last, last
    assert "gridpilot demo --linger 600" in last, last


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
                     "priorities", "cleanup", "activity", "sandboxes", "purge"]
    assert "purge: 0 ended job(s) purged" in out.stdout
    assert "director: 0 pilot(s) submitted" in out.stdout  # no job waits: no pilot
    unknown = run(["agents", "nosuch", "--once"], tmp_path, **env)
    assert unknown.returncode == 2 and "no agent loop named nosuch" in unknown.stderr


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _dashboard_overview(url: str, token: str) -> str:
    """The overview page, signed in with ``token`` as a browser would."""
    with requests.Session() as http:
        form = http.get(f"{url}login", timeout=30)
        csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert csrf, form.text
        page = http.post(f"{url}login", data={"token": token, "csrf": csrf[1]}, timeout=30)
        assert page.status_code == 200 and page.url == url, page.text
        return page.text


def test_config_example_prints_the_shipped_settings(tmp_path: Path) -> None:
    # No settings are read for it: a missing settings file does not matter.
    out = run(["config", "example"], tmp_path, GRIDPILOT_CONFIG=str(tmp_path / "missing.toml"))
    assert out.returncode == 0, out.stderr
    assert out.stdout == (ROOT / "conf" / "gridpilot.toml").read_text(encoding="utf-8")
    # Written beside a resources file, it loads, and its paths count from its folder.
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "gridpilot.toml").write_text(out.stdout, encoding="utf-8")
    resources = run(["config", "example", "resources"], tmp_path)
    assert "[" in resources.stdout
    (tmp_path / "etc" / "resources.toml").write_text(resources.stdout, encoding="utf-8")
    settings = load_settings(tmp_path / "etc" / "gridpilot.toml", {})
    assert settings.resources.file == str(tmp_path / "etc" / "resources.toml")


def _empty_server_databases() -> list[str]:
    import uuid

    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from tests.conftest import SERVER_ENV

    urls = []
    for env in SERVER_ENV.values():
        if os.environ.get(env):
            base = make_url(os.environ[env])
            name = f"gp_empty_{uuid.uuid4().hex[:8]}"
            admin = create_engine(base, isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:
                conn.execute(text(f"CREATE DATABASE {name}"))
            admin.dispose()
            urls.append(base.set(database=name).render_as_string(hide_password=False))
    return urls


def _drop(url: str) -> None:
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from tests.conftest import SERVER_ENV

    parsed = make_url(url)
    backend = "postgresql" if parsed.get_backend_name() == "postgresql" else "mariadb"
    admin = create_engine(os.environ[SERVER_ENV[backend]], isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        force = " WITH (FORCE)" if backend == "postgresql" else ""
        conn.execute(text(f"DROP DATABASE IF EXISTS {parsed.database}{force}"))
    admin.dispose()


def test_a_database_without_the_schema_says_to_upgrade(tmp_path: Path) -> None:
    secret = secrets.token_urlsafe(32)
    # A missing SQLite file is not created empty by a command that reads it.
    missing = f"sqlite:///{tmp_path / 'missing.db'}"
    for args in (["jobs"], ["serve"], ["agents", "--once"], ["queues", "list"]):
        out = run(args, tmp_path, GRIDPILOT_DATABASE_URL=missing, GRIDPILOT_AUTH_SECRET=secret)
        assert out.returncode == 1, (args, out.stdout, out.stderr)
        assert "missing.db does not exist: run `gridpilot db upgrade` first" in out.stderr
        assert not (tmp_path / "missing.db").exists()
    # An empty database (an SQLite file, or a server's) names the command that builds it.
    (tmp_path / "empty.db").touch()
    empties = [f"sqlite:///{tmp_path / 'empty.db'}", *_empty_server_databases()]
    try:
        for url in empties:
            for args in (["jobs"], ["job", "1"], ["serve"], ["agents", "--once"]):
                out = run(args, tmp_path, GRIDPILOT_DATABASE_URL=url,
                          GRIDPILOT_AUTH_SECRET=secret)
                assert out.returncode == 1, (url, args, out.stderr)
                assert "no gridpilot schema" in out.stderr, (url, args, out.stderr)
                assert "run `gridpilot db upgrade` first" in out.stderr
                assert "Traceback" not in out.stderr
    finally:
        for url in empties[1:]:
            _drop(url)
