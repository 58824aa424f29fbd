"""The metrics folder is the service's own (created 0700; a symbolic link, or a folder of
another user, is refused), counts of exited worker processes are kept, and a scrape may use a
long-lived metrics token or an allowed address instead of an operator's token."""

from __future__ import annotations

import os
import secrets
import stat
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from flask import Flask

from matcher.metrics import Metrics
from taskqueue.core.errors import ConfigurationError
from taskqueue.core.settings import MatcherSettings, Settings
from tests.api.helpers import Api, assert_problem

ROOT = Path(__file__).resolve().parents[2]
METRICS_TOKEN = secrets.token_urlsafe(32)


def _with_dir(settings: Settings, path: Path) -> Settings:
    return replace(settings, matcher=replace(settings.matcher, metrics_dir=str(path)))


def test_the_folder_is_created_private(make_app: Callable[[Settings], Flask],
                                       api_settings: Settings, tmp_path: Path) -> None:
    folder = tmp_path / "new" / "metrics"
    make_app(_with_dir(api_settings, folder))
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    opened = tmp_path / "opened"
    opened.mkdir(mode=0o777)
    opened.chmod(0o777)
    make_app(_with_dir(api_settings, opened))
    assert stat.S_IMODE(opened.stat().st_mode) == 0o700


def test_a_planted_symbolic_link_is_refused(make_app: Callable[[Settings], Flask],
                                            api_settings: Settings, tmp_path: Path) -> None:
    target = tmp_path / "root-owned-file"
    target.write_text("precious")
    link = tmp_path / "metrics"
    link.symlink_to(target)
    with pytest.raises(ConfigurationError, match="symbolic link"):
        make_app(_with_dir(api_settings, link))
    assert target.read_text() == "precious"
    (tmp_path / "dirlink").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(ConfigurationError, match="symbolic link"):
        make_app(_with_dir(api_settings, tmp_path / "dirlink"))


def test_another_users_folder_is_refused(make_app: Callable[[Settings], Flask],
                                         api_settings: Settings, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root can give a folder to another user")
    planted = tmp_path / "planted"
    planted.mkdir()
    os.chown(planted, 65534, 65534)
    with pytest.raises(ConfigurationError, match="belongs to user id 65534"):
        make_app(_with_dir(api_settings, planted))


def test_counts_of_an_exited_process_are_kept(tmp_path: Path) -> None:
    folder = tmp_path / "metrics"
    folder.mkdir(mode=0o700)
    script = ("import sys; from pathlib import Path; from matcher.metrics import Metrics; "
              "m = Metrics(Path(sys.argv[1])); "
              "m.inc('gridpilot_jobs_matched_total', {}, 5); "
              "m.observe('gridpilot_http_request_duration_seconds', {'endpoint': '/x'}, 0.2)")
    for _ in range(2):
        subprocess.run([sys.executable, "-c", script, str(folder)], check=True, cwd=ROOT)
    metrics = Metrics(folder)
    metrics.inc("gridpilot_jobs_matched_total", {}, 1)
    for _ in range(2):  # the first scrape folds the exited processes' files, the second reads
        text = metrics.render()
        assert "gridpilot_jobs_matched_total 11.0" in text
        assert ('gridpilot_http_request_duration_seconds_count{endpoint="/x"} 2.0' in text)
    names = sorted(p.name for p in folder.glob("*.db"))
    assert names == sorted(["counter_archive.db", "histogram_archive.db",
                            f"counter_{os.getpid()}.db"])


def _scrape_settings(api_settings: Settings, **matcher: object) -> Settings:
    return replace(api_settings, matcher=replace(api_settings.matcher, **matcher))


def test_a_scraper_with_the_metrics_token(make_app: Callable[[Settings], Flask],
                                          api_settings: Settings, user_token: str) -> None:
    settings = _scrape_settings(api_settings, metrics_token=METRICS_TOKEN)
    client = Api(make_app(settings).test_client(), settings, api_settings.auth.secret)
    assert client.call("GET", "/metrics", METRICS_TOKEN).status_code == 200
    assert_problem(client.call("GET", "/metrics", METRICS_TOKEN[:-1] + "x"), 401)
    assert_problem(client.call("GET", "/metrics"), 401)
    assert_problem(client.call("GET", "/metrics", user_token), 403, "operator")


def test_a_scraper_from_an_allowed_address(make_app: Callable[[Settings], Flask],
                                           api_settings: Settings) -> None:
    # The test client's requests come from 127.0.0.1.
    allowed = _scrape_settings(api_settings, metrics_allow=("127.0.0.0/8",))
    client = Api(make_app(allowed).test_client(), allowed, api_settings.auth.secret)
    assert client.call("GET", "/metrics").status_code == 200
    elsewhere = _scrape_settings(api_settings, metrics_allow=("10.0.0.0/8", "::1"))
    client = Api(make_app(elsewhere).test_client(), elsewhere, api_settings.auth.secret)
    assert_problem(client.call("GET", "/metrics"), 401)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("metrics_token", "short", "at least 32 characters"),
    ("metrics_allow", ("10.0.0.0/33",), "not an address or network"),
])
def test_bad_scrape_settings_are_refused(key: str, value: object, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        MatcherSettings(**{key: value})  # type: ignore[arg-type]
