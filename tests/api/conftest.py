"""The matcher app on each backend's database, its test client, and tokens for each role."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from flask import Flask

from matcher.app import create_app
from matcher.auth import issue_token
from matcher.runtime import runtime_of
from taskqueue.core.settings import Settings
from tests.api.helpers import GROUP, OTHER_VO, PILOT_REF, SITE, VO, Api
from tests.conftest import Database

SECRET = "api-tests-signing-secret-0123456789"
RESOURCES = Path(__file__).resolve().parents[2] / "conf" / "resources.toml"

TokenMaker = Callable[..., str]


@pytest.fixture()
def api_settings(settings: Settings, tmp_path: Path) -> Settings:
    """The backend's settings with a signing secret, the repository's resources file and a
    metrics folder of the test's own."""
    assert RESOURCES.is_file(), RESOURCES
    return replace(settings,
                   auth=replace(settings.auth, secret=SECRET),
                   resources=replace(settings.resources, file=str(RESOURCES)),
                   matcher=replace(settings.matcher, metrics_dir=str(tmp_path / "metrics")),
                   sandboxes=replace(settings.sandboxes, directory=str(tmp_path / "sandboxes")))


@pytest.fixture()
def make_app(db: Database) -> Iterator[Callable[[Settings], Flask]]:
    """Builds apps on the test's database; their engines are disposed of afterwards."""
    apps: list[Flask] = []

    def build(settings: Settings) -> Flask:
        app = create_app(settings)
        apps.append(app)
        return app

    yield build
    for app in apps:
        runtime_of(app).dispose()


@pytest.fixture()
def app(make_app: Callable[[Settings], Flask], api_settings: Settings) -> Flask:
    return make_app(api_settings)


@pytest.fixture()
def client(app: Flask, api_settings: Settings) -> Api:
    return Api(app.test_client(), api_settings, SECRET)


@pytest.fixture()
def token() -> TokenMaker:
    """A token with the claims given (VO lhcb, group lhcb_user, one hour, unless told)."""

    def make(subject: str, role: str, *, vo: str = VO, group: str = GROUP,
             lifetime: int = 3600, secret: str = SECRET, site: str | None = None,
             pilot: str | None = None) -> str:
        return issue_token(secret, subject=subject, role=role, vo=vo, group=group,
                           lifetime=lifetime, site=site, pilot=pilot)

    return make


@pytest.fixture()
def user_token(token: TokenMaker) -> str:
    return token("alice", "user")


@pytest.fixture()
def other_user_token(token: TokenMaker) -> str:
    """A second user of the same VO and group."""
    return token("bob", "user")


@pytest.fixture()
def pilot_token(token: TokenMaker) -> str:
    """A pilot of the VO that names neither a site nor a pilot reference."""
    return token("pilot-factory", "pilot", group="lhcb_pilot")


@pytest.fixture()
def site_pilot_token(token: TokenMaker) -> str:
    """A pilot token for one site (LCG.CERN.cern), any pilot reference."""
    return token("cern-factory", "pilot", group="lhcb_pilot", site=SITE)


@pytest.fixture()
def own_pilot_token(token: TokenMaker) -> str:
    """A pilot token that speaks for one pilot reference only (pilot-1) at LCG.CERN.cern."""
    return token("pilot-1-owner", "pilot", group="lhcb_pilot", site=SITE, pilot=PILOT_REF)


@pytest.fixture()
def operator_token(token: TokenMaker) -> str:
    return token("olga", "operator", group="lhcb_admin")


@pytest.fixture()
def other_vo_operator_token(token: TokenMaker) -> str:
    """An operator of another VO (belle)."""
    return token("boris", "operator", vo=OTHER_VO, group="belle_admin")


@pytest.fixture()
def expired_token() -> str:
    return issue_token(SECRET, subject="alice", role="user", vo=VO, group=GROUP, lifetime=60,
                       now=time.time() - 7200)


@pytest.fixture()
def forged_token() -> str:
    """Right claims, signed with another secret."""
    return issue_token("not-the-service-secret-0123456789", subject="alice", role="operator",
                       vo=VO, group=GROUP, lifetime=3600)
