"""Property-based tests of the matcher's HTTP API against its own OpenAPI document.

Schemathesis reads the document the service serves (/api/v1/openapi.json), generates requests
for every operation (the document's examples, its coverage cases at the edges of each schema,
valid and invalid, and random fuzzing) and sends them to the WSGI app in-process. Every answer
must be a non-5xx response whose body matches the schema documented for its status.

Each role runs the operations its token may call (and the ones that need no token): an
operator, a pilot and a user, against a database holding a few submitted jobs of that user,
so that id-taking endpoints sometimes reach a real job. The run is seeded, so CI sees the same
requests every time.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import schemathesis
from flask import Flask
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from matcher import create_app
from matcher.api import OPERATIONS
from matcher.auth import issue_token
from taskqueue.settings import Settings
from tests.conftest import Database

ROOT = Path(__file__).resolve().parents[2]
SECRET = "schemathesis-test-secret-0123456789"
VO = "lhcb"
#: Who each role's token names.
CLAIMS: dict[str, dict[str, str]] = {
    "operator": {"subject": "olivia", "group": "lhcb_admin"},
    "pilot": {"subject": "pilot-agent", "group": "lhcb_pilot"},
    "user": {"subject": "alice", "group": "lhcb_user"},
}
JDL = '[ Executable = "/bin/echo"; Arguments = "hello"; CPUTime = 100; ]'
SEEDED_JOBS = 3
#: Random requests per operation, on top of the explicit (example and coverage) ones.
MAX_EXAMPLES = 25
SEED = 20261122
CHECKS = [not_a_server_error, response_schema_conformance]


def token(role: str) -> str:
    return issue_token(SECRET, role=role, vo=VO, lifetime=3600, **CLAIMS[role])


def settings_for_api(settings: Settings, metrics_dir: Path) -> Settings:
    return replace(settings,
                   auth=replace(settings.auth, secret=SECRET),
                   resources=replace(settings.resources,
                                     file=str(ROOT / "conf" / "resources.toml")),
                   matcher=replace(settings.matcher, metrics_dir=str(metrics_dir)))


def load_schema() -> Any:
    """The OpenAPI document as the service serves it.

    Loaded once, at collection, from a matcher that never opens its database (the document
    does not depend on one); each test sends its requests to its own app and database."""
    config = schemathesis.Config.from_dict({
        "seed": SEED,
        "generation": {
            "max-examples": MAX_EXAMPLES,
            # Each test sends its role's token; generated Authorization headers would only
            # ever get a 401.
            "with-security-parameters": False,
            # No example database: the same requests every run, and no .hypothesis folder.
            "database": "none",
        },
    })
    with tempfile.TemporaryDirectory() as tmp:
        base = Settings()
        served = create_app(settings_for_api(
            replace(base, database=replace(base.database, url=f"sqlite:///{tmp}/unused.db")),
            Path(tmp)))
        return schemathesis.openapi.from_wsgi("/api/v1/openapi.json", served, config=config)


SCHEMA = load_schema()


def for_role(role: str) -> Any:
    """The operations a ``role`` token may call, and those that need no token (the others
    would only ever answer 403)."""
    forbidden = [op.operation_id for op in OPERATIONS
                 if op.roles is not None and role not in op.roles]
    return SCHEMA.exclude(operation_id=forbidden)


@pytest.fixture()
def app(settings: Settings, db: Database, tmp_path: Path) -> Flask:
    """The matcher, its database holding a few jobs the user token's owner submitted."""
    flask_app = create_app(settings_for_api(settings, tmp_path / "metrics"))
    client = flask_app.test_client()
    for _ in range(SEEDED_JOBS):
        response = client.post("/api/v1/jobs", data=JDL, content_type="text/plain",
                               headers={"Authorization": f"Bearer {token('user')}"})
        assert response.status_code == 201, response.get_data(as_text=True)
    return flask_app


#: One app and database serve every request generated for an operation, on purpose: the
#: requests' effects (killed jobs, bans, limits) pile up as they would on a live service.
SHARED_APP = hypothesis.settings(
    suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture])


def check(case: schemathesis.Case, app: Flask, role: str) -> None:
    case.call_and_validate(app=app, headers={"Authorization": f"Bearer {token(role)}"},
                           checks=CHECKS)


@for_role("operator").parametrize()
@SHARED_APP
def test_as_operator(case: schemathesis.Case, app: Flask) -> None:
    check(case, app, "operator")


@for_role("pilot").parametrize()
@SHARED_APP
def test_as_pilot(case: schemathesis.Case, app: Flask) -> None:
    check(case, app, "pilot")


@for_role("user").parametrize()
@SHARED_APP
def test_as_user(case: schemathesis.Case, app: Flask) -> None:
    check(case, app, "user")
