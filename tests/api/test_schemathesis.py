"""Property-based tests of the matcher's HTTP API against its own OpenAPI document.

Schemathesis reads the document the service serves (/api/v1/openapi.json) and, for every
operation, sends the WSGI app in-process the document's examples, its coverage cases (the edges
of each schema, valid and invalid) and random requests. No answer may be a 5xx, and every
answer's body must match the schema the document gives for its status.

Each token runs the operations its role may call (and those that need no token): an operator,
a pilot, a pilot bound to one site and pilot reference, and a user. Their database holds a few
jobs the user submitted, so that id-taking endpoints sometimes reach a real job. The run is
seeded: CI sends the same requests every time.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
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
from matcher.runtime import runtime_of
from taskqueue.core.settings import Settings
from tests.conftest import Database

ROOT = Path(__file__).resolve().parents[2]
SECRET = "schemathesis-test-secret-0123456789"
VO = "lhcb"
#: The claims of each token the operations are run with.
TOKENS: dict[str, dict[str, str]] = {
    "operator": {"role": "operator", "subject": "olivia", "group": "lhcb_admin"},
    "pilot": {"role": "pilot", "subject": "pilot-factory", "group": "lhcb_pilot"},
    "site_pilot": {"role": "pilot", "subject": "cern-factory", "group": "lhcb_pilot",
                   "site": "LCG.CERN.cern", "pilot": "pilot-cern-1"},
    "user": {"role": "user", "subject": "alice", "group": "lhcb_user"},
}
JDL = '[ Executable = "/bin/echo"; Arguments = "hello"; CPUTime = 100; ]'
SEEDED_JOBS = 3
#: Random requests per operation, on top of the explicit (example and coverage) ones.
MAX_EXAMPLES = 25
SEED = 20261122
CHECKS = [not_a_server_error, response_schema_conformance]


def token(who: str) -> str:
    return issue_token(SECRET, vo=VO, lifetime=3600, **TOKENS[who])


def bearer(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token(who)}"}


def settings_for_api(settings: Settings, metrics_dir: Path) -> Settings:
    return replace(settings,
                   auth=replace(settings.auth, secret=SECRET),
                   resources=replace(settings.resources,
                                     file=str(ROOT / "conf" / "resources.toml")),
                   matcher=replace(settings.matcher, metrics_dir=str(metrics_dir)))


def load_schema() -> Any:
    """The OpenAPI document as the service serves it.

    Loaded once, at collection, from a matcher that never opens its database (the document
    does not depend on one); each test sends its requests to an app on its own database."""
    config = schemathesis.Config.from_dict({
        "seed": SEED,
        "generation": {
            "max-examples": MAX_EXAMPLES,
            # Each test sends its own token; generated Authorization headers would only ever
            # be answered 401.
            "with-security-parameters": False,
            # No example database: the same requests on every run.
            "database": "none",
        },
    })
    with tempfile.TemporaryDirectory() as tmp:
        base = Settings()
        served = create_app(settings_for_api(
            replace(base, database=replace(base.database, url=f"sqlite:///{tmp}/unused.db")),
            Path(tmp)))
        return schemathesis.openapi.from_wsgi("/api/v1/openapi.json", served, config=config)


@schemathesis.serializer("application/gzip")
def _archive(ctx: Any, value: Any) -> bytes:
    """Sandbox uploads: whatever was generated, as bytes (a real archive is rarely among
    them; the service must refuse the rest cleanly)."""
    if isinstance(value, bytes):
        return value
    return str(value).encode("utf-8")


SCHEMA = load_schema()


def operations_of(who: str) -> Any:
    """The operations ``who``'s token may call, and those that need no token (the others
    would only ever answer 403)."""
    role = TOKENS[who]["role"]
    forbidden = [op.operation_id for op in OPERATIONS
                 if op.roles is not None and role not in op.roles]
    return SCHEMA.exclude(operation_id=forbidden)


@pytest.fixture()
def seeded_app(settings: Settings, db: Database, tmp_path: Path) -> Iterator[Flask]:
    """The matcher, its database holding a few jobs the user token's owner submitted."""
    app = create_app(settings_for_api(settings, tmp_path / "metrics"))
    client = app.test_client()
    for _ in range(SEEDED_JOBS):
        response = client.post("/api/v1/jobs", data=JDL, content_type="text/plain",
                               headers=bearer("user"))
        assert response.status_code == 201, response.get_data(as_text=True)
    yield app
    # The app's own engine: closed here, or its pooled connections are left to the garbage
    # collector (a ResourceWarning from the servers' drivers).
    runtime_of(app).dispose()


#: All the requests generated for one operation go to one app and database, on purpose: their
#: effects (killed jobs, bans, limits) pile up as they would on a live service. Nor is data
#: generation held to Hypothesis' time limit: a busy CI machine is slow.
ONE_APP_PER_OPERATION = hypothesis.settings(suppress_health_check=[
    hypothesis.HealthCheck.function_scoped_fixture, hypothesis.HealthCheck.too_slow])


def call_and_check(case: schemathesis.Case, app: Flask, who: str) -> None:
    case.call_and_validate(app=app, headers=bearer(who), checks=CHECKS)


@operations_of("operator").parametrize()
@ONE_APP_PER_OPERATION
def test_as_operator(case: schemathesis.Case, seeded_app: Flask) -> None:
    call_and_check(case, seeded_app, "operator")


@operations_of("pilot").parametrize()
@ONE_APP_PER_OPERATION
def test_as_pilot(case: schemathesis.Case, seeded_app: Flask) -> None:
    call_and_check(case, seeded_app, "pilot")


@operations_of("site_pilot").parametrize()
@ONE_APP_PER_OPERATION
def test_as_site_pilot(case: schemathesis.Case, seeded_app: Flask) -> None:
    call_and_check(case, seeded_app, "site_pilot")


@operations_of("user").parametrize()
@ONE_APP_PER_OPERATION
def test_as_user(case: schemathesis.Case, seeded_app: Flask) -> None:
    call_and_check(case, seeded_app, "user")


BEYOND_BIGINT = 2**63
BEYOND_INT = 2**31
TOO_LONG = "x" * 300
NUL = "a\u0000b"
#: Stands for the id of a seeded job that the pilot reference PILOT_REF was given.
HELD = -424242
PILOT_REF = "pilot-edge"
CERN = {"site": "LCG.CERN.cern", "ce": "ce503.cern.ch", "queue": "condor"}
REGISTRATION = {**CERN, "status": "Running"}

#: Requests at the limits the document leaves open, or that its schemas cannot express
#: (integers beyond the columns' range, strings longer than the columns, NUL characters, which
#: PostgreSQL cannot store), and that the generated requests meet only by chance or not at all
#: (on a job a pilot holds): each may be refused or done, never fail with a 5xx.
EDGES = [pytest.param(who, method, path, body, id=name) for name, who, method, path, body in [
    ("job id beyond bigint", "operator", "GET", f"/api/v1/jobs/{BEYOND_BIGINT}", None),
    ("kill beyond bigint", "operator", "POST", f"/api/v1/jobs/{BEYOND_BIGINT}/kill", {}),
    ("limit id beyond bigint", "operator", "DELETE", f"/api/v1/limits/{BEYOND_BIGINT}", None),
    ("explain job beyond bigint", "operator", "POST", "/api/v1/taskqueues/explain",
     {"job_id": BEYOND_BIGINT, "queue": "a/b/c"}),
    ("max_running beyond int", "operator", "POST", "/api/v1/limits",
     {"site": "S", "attribute": "job_type", "value": "v", "max_running": BEYOND_INT}),
    ("limit value of 255", "operator", "POST", "/api/v1/limits",
     {"site": "S", "attribute": "job_type", "value": TOO_LONG[:255], "max_running": 1}),
    ("limit value with NUL", "operator", "POST", "/api/v1/limits",
     {"site": "S", "attribute": "job_type", "value": NUL, "max_running": 1}),
    ("ban a long site", "operator", "PUT", f"/api/v1/sitemask/{TOO_LONG}", {}),
    ("ban a site with NUL", "operator", "PUT", "/api/v1/sitemask/a%00b", {}),
    ("ban reason with NUL", "operator", "PUT", "/api/v1/sitemask/S", {"reason": NUL}),
    ("share of a long group", "operator", "PUT", f"/api/v1/shares/{TOO_LONG}", {"share": 2}),
    ("share of a group with NUL", "operator", "PUT", "/api/v1/shares/a%00b", {"share": 2}),
    ("long pilot reference", "operator", "PUT", f"/api/v1/pilots/{TOO_LONG}", REGISTRATION),
    ("pilot queue of 255", "operator", "PUT", "/api/v1/pilots/p1",
     {**REGISTRATION, "queue": TOO_LONG[:255]}),
    ("pilot CE with NUL", "operator", "PUT", "/api/v1/pilots/p2", {**REGISTRATION, "ce": NUL}),
    ("job list site with NUL", "operator", "GET", "/api/v1/jobs?site=a%00b", None),
    ("submit pools site with NUL", "operator", "GET",
     "/api/v1/pilots/submitpools?site=a%00b&ce=c&queue=q", None),
    ("matching processors beyond int", "operator", "POST", "/api/v1/taskqueues/matching",
     {"resource": {"vo": VO, "processors": BEYOND_INT}}),
    ("matching memory beyond bigint", "operator", "POST", "/api/v1/taskqueues/matching",
     {"resource": {"vo": VO, "memory": BEYOND_BIGINT}}),
    ("matching site with NUL", "operator", "POST", "/api/v1/taskqueues/matching",
     {"resource": {"vo": VO, "site": NUL}}),
    ("explain queue with NUL", "operator", "POST", "/api/v1/taskqueues/explain",
     {"job_id": HELD, "queue": f"{NUL}/ce/q"}),
    ("kill reason with NUL", "user", "POST", f"/api/v1/jobs/{HELD}/kill", {"reason": NUL}),
    ("reschedule reason with NUL", "operator", "POST", f"/api/v1/jobs/{HELD}/reschedule",
     {"reason": NUL}),
    ("match memory beyond int", "pilot", "POST", "/api/v1/pilots/match",
     {"resource": {"vo": VO, "pilot_reference": "p", "memory": BEYOND_INT}}),
    ("match a long site", "pilot", "POST", "/api/v1/pilots/match",
     {"resource": {"vo": VO, "pilot_reference": "p", "site": TOO_LONG}}),
    ("match reference with NUL", "pilot", "POST", "/api/v1/pilots/match",
     {"resource": {"vo": VO, "pilot_reference": NUL}}),
    ("heartbeat job beyond bigint", "pilot", "POST", "/api/v1/pilots/heartbeat",
     {"pilot_reference": PILOT_REF, "jobs": [{"job_id": BEYOND_BIGINT}]}),
    ("heartbeat reference with NUL", "pilot", "POST", "/api/v1/pilots/heartbeat",
     {"pilot_reference": NUL, "jobs": []}),
    ("heartbeat progress with NUL", "pilot", "POST", "/api/v1/pilots/heartbeat",
     {"pilot_reference": PILOT_REF, "jobs": [{"job_id": HELD, "progress": NUL}]}),
    ("status of job beyond bigint", "pilot", "POST",
     f"/api/v1/pilots/jobs/{BEYOND_BIGINT}/status",
     {"pilot_reference": PILOT_REF, "status": "Running"}),
    ("minor status with NUL", "pilot", "POST", f"/api/v1/pilots/jobs/{HELD}/status",
     {"pilot_reference": PILOT_REF, "status": "Running", "minor_status": NUL}),
    ("output tail with NUL", "pilot", "POST", f"/api/v1/pilots/jobs/{HELD}/status",
     {"pilot_reference": PILOT_REF, "status": "Done", "exit_code": 0, "output_tail": NUL}),
    ("duration of 1e19", "user", "POST", "/api/v1/jobs",
     {"executable": "x", "attributes": {"duration": 1e19}}),
    ("CPUTime of 2^63-1", "user", "POST", "/api/v1/jobs",
     {"executable": "x", "attributes": {"custom_attributes": {"CPUTime": BEYOND_BIGINT - 1}}}),
    ("MaxRAM of 2^31-1", "user", "POST", "/api/v1/jobs",
     {"executable": "x", "attributes": {"custom_attributes": {"MaxRAM": BEYOND_INT - 1}}}),
    ("MaxRAM of 2^31", "user", "POST", "/api/v1/jobs",
     {"executable": "x", "attributes": {"custom_attributes": {"MaxRAM": BEYOND_INT}}}),
    ("MaxRAM of 2^63-1", "user", "POST", "/api/v1/jobs",
     {"executable": "x", "attributes": {"custom_attributes": {"MaxRAM": BEYOND_BIGINT - 1}}}),
    ("memory of 2^51 bytes", "user", "POST", "/api/v1/jobs",
     {"executable": "x", "resources": {"memory": 2**51}}),
    ("memory of 2^63 bytes", "user", "POST", "/api/v1/jobs",
     {"executable": "x", "resources": {"memory": BEYOND_BIGINT}}),
    ("kill reason of 240", "user", "POST", f"/api/v1/jobs/{HELD}/kill", {"reason": "r" * 240}),
    ("match attribute of 10^30", "pilot", "POST", "/api/v1/pilots/match",
     {"resource": {"vo": VO, "pilot_reference": "p", "Disk": 10**30}}),
    ("match blank reference", "pilot", "POST", "/api/v1/pilots/match",
     {"resource": {"vo": VO, "pilot_reference": "  "}}),
]]


def held_job(app: Flask) -> int:
    """A seeded job, matched to the pilot reference PILOT_REF."""
    response = app.test_client().post(
        "/api/v1/pilots/match", headers=bearer("pilot"),
        json={"resource": {"vo": VO, "pilot_reference": PILOT_REF, **CERN}})
    assert response.status_code == 200, response.get_data(as_text=True)
    jobs = response.get_json()["jobs"]
    assert jobs, response.get_json()
    return int(jobs[0]["job_id"])


@pytest.mark.parametrize(("who", "method", "path", "body"), EDGES)
def test_edges_are_not_server_errors(seeded_app: Flask, who: str, method: str, path: str,
                                     body: Any) -> None:
    text = json.dumps(body)
    if str(HELD) in path or str(HELD) in text:
        job = str(held_job(seeded_app))
        path, text = path.replace(str(HELD), job), text.replace(str(HELD), job)
    response = seeded_app.test_client().open(
        path, method=method, headers=bearer(who),
        **({} if body is None else {"data": text, "content_type": "application/json"}))
    assert response.status_code < 500, (
        f"{method} {path} {text[:200]} -> {response.status_code} "
        f"{response.get_data(as_text=True)[:300]}")


#: JDL texts with values beyond what the columns hold: each is refused with a 4xx.
JDL_EDGES = [
    'Executable = "x"; CPUTime = 1e19;',
    'Executable = "x"; CPUTime = 9223372036854775807;',
    'Executable = "x"; MaxRAM = 2147483647;',
    'Executable = "x"; MaxRAM = 2147483648;',
    'Executable = "x"; MaxRAM = 9223372036854775807;',
]


@pytest.mark.parametrize("jdl", JDL_EDGES)
def test_jdl_values_beyond_the_columns_are_refused(seeded_app: Flask, jdl: str) -> None:
    response = seeded_app.test_client().post("/api/v1/jobs", data=jdl,
                                             content_type="text/plain", headers=bearer("user"))
    assert response.status_code == 422, response.get_data(as_text=True)
    assert "at most" in response.get_json()["detail"]


def test_a_token_with_a_control_character_in_a_claim_is_refused(seeded_app: Flask) -> None:
    forged = issue_token(SECRET, subject="al\u0000ice", role="user", vo=VO, group="lhcb_user",
                         lifetime=3600)
    response = seeded_app.test_client().get("/api/v1/jobs",
                                            headers={"Authorization": f"Bearer {forged}"})
    assert response.status_code == 401, response.get_data(as_text=True)


def test_a_huge_pilot_attribute_meets_an_expression_queue(seeded_app: Flask) -> None:
    """Once a queue with an expression is drawn, a pilot attribute beyond 64 bits is
    undefined for the expression, not a 500 on every match."""
    client = seeded_app.test_client()
    response = client.post("/api/v1/jobs", headers=bearer("user"), content_type="text/plain",
                           data='[Executable = "x"; Priority = 10; '
                                'Requirements = other.Disk > 3;]')
    assert response.status_code == 201, response.get_data(as_text=True)
    for _ in range(SEEDED_JOBS + 1):  # until only the expression's queue is left
        answer = client.post("/api/v1/pilots/match", headers=bearer("pilot"), json={
            "resource": {"vo": VO, "pilot_reference": "p", "Disk": 10**30}})
        assert answer.status_code == 200, answer.get_data(as_text=True)
    assert answer.get_json()["jobs"] == []


def test_a_long_kill_reason_still_kills(seeded_app: Flask) -> None:
    client = seeded_app.test_client()
    job = held_job(seeded_app)
    response = client.post(f"/api/v1/jobs/{job}/kill", headers=bearer("user"),
                           json={"reason": "r" * 240})
    assert response.status_code == 200, response.get_data(as_text=True)
    assert client.get(f"/api/v1/jobs/{job}", headers=bearer("user")).get_json()[
        "status"] == "Killed"
