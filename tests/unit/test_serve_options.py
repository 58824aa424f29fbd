"""``gridpilot serve``'s gunicorn options follow the [matcher] settings: one thread per
worker keeps the sync workers, more (the default) choose the threaded workers (gunicorn's
gthread with a thread kept for /healthz, gridpilot.worker)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from gridpilot.server import gunicorn_options
from taskqueue.core.errors import ConfigurationError
from taskqueue.core.settings import MatcherSettings, Settings


def test_one_thread_per_worker_runs_sync_workers() -> None:
    settings = Settings()
    settings = replace(settings, matcher=replace(settings.matcher, threads=1))
    options = gunicorn_options(settings)
    assert options["worker_class"] == "sync"
    assert options["threads"] == 1


def test_the_default_is_four_threads_per_worker() -> None:
    options = gunicorn_options(Settings())
    assert (options["worker_class"], options["threads"]) == ("gridpilot.worker.MatcherWorker", 4)


def test_more_threads_run_threaded_workers() -> None:
    settings = Settings()
    settings = replace(settings, matcher=replace(settings.matcher, threads=4))
    options = gunicorn_options(settings, workers=3)
    assert (options["worker_class"], options["threads"], options["workers"]) == (
        "gridpilot.worker.MatcherWorker", 4, 3)


def test_gunicorn_believes_no_proxy_header_itself() -> None:
    """gunicorn would take X-Forwarded-Proto from loopback peers by default: the service
    reads forwarded headers from [matcher] trusted_proxies only (matcher.proxies)."""
    options = gunicorn_options(Settings())
    assert (options["forwarded_allow_ips"], options["secure_scheme_headers"]) == ("", {})


def test_no_threads_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"matcher\.threads"):
        MatcherSettings(threads=0)


#: Builds a worker's app as gunicorn's worker does, in a process of its own (freezing the
#: collector's view of this test process would hide its garbage from it), and reports.
_WORKER = """
import gc, json, sys
from gridpilot import schema
from gridpilot.server import worker_app
from taskqueue.db.database import make_engine
from taskqueue.core.settings import load_settings
url, work = sys.argv[1], sys.argv[2]
engine = make_engine(url)
schema.upgrade(engine)
engine.dispose()
before = gc.get_freeze_count()
app = worker_app(load_settings(None, {
    "GRIDPILOT_DATABASE_URL": url,
    "GRIDPILOT_AUTH_SECRET": "S3kvJq0-Yd1bN7xLwR2aHc9pTfUe5mZoGi4VtKy6sQ8",
    "GRIDPILOT_MATCHER_METRICS_DIR": work}))
answer = app.test_client().get("/healthz")
print(json.dumps({"before": before, "frozen": gc.get_freeze_count(),
                  "status": answer.status_code}))
"""


def test_a_worker_freezes_what_it_built_before_serving(tmp_path: Path) -> None:
    """The objects a worker builds before its first request (modules, app, tables) are out
    of the collector's sight, and the app still serves."""
    done = subprocess.run([sys.executable, "-c", _WORKER, f"sqlite:///{tmp_path / 'w.db'}",
                           str(tmp_path / "metrics")], capture_output=True, text=True,
                          timeout=120, check=False, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["before"] == 0
    assert report["frozen"] > 50_000
    assert report["status"] == 200
