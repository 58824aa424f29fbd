"""Who may call what: every operation by every kind of caller, and the ownership rules (a user's
own jobs, an operator's own VO, a pilot's own site and reference)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any

import jwt
import pytest
from flask import Flask

import matcher.app  # noqa: F401  (registers every blueprint, so OPERATIONS is complete)
from matcher.api import OPERATIONS, Operation
from matcher.runtime import runtime_of
from pilot.archive import Member, pack, sandbox_id
from taskqueue.pilots.pilotlogs import pack_log, record_log
from taskqueue.pilots.records import (
    lock_director_queue,
    record_new_pilots,
    record_submission,
)
from tests.api.conftest import SECRET, TokenMaker
from tests.api.helpers import (
    HELLO_JDL,
    OTHER_SITE,
    OTHER_VO,
    PILOT_REF,
    SITE,
    VO,
    Api,
    assert_problem,
)

CERN_CONDOR = {"site": SITE, "ce": "ce503.cern.ch", "queue": "condor"}
#: The input sandbox of alice's matched job.
SANDBOX = pack([Member("data.txt", b"matrix\n")])
SANDBOX_ID = sandbox_id(SANDBOX)
BANNED = "LCG.RAL.uk"


@dataclass(frozen=True)
class World:
    """What the matrix's requests refer to: alice's jobs (one waiting, one matched to pilot-1
    at LCG.CERN.cern), a banned site, a site limit and an operator's share."""

    waiting: int
    matched: int
    limit_id: int


@dataclass(frozen=True)
class Req:
    path: str
    json_body: Any = None
    text: str | None = None
    query: dict[str, str | int] = field(default_factory=dict)
    #: A sandbox archive to upload.
    data: bytes | None = None


#: One request per operation that its allowed roles can make successfully (2xx) in the World.
#: An operation without an entry here fails test_the_matrix_covers_every_operation.
REQUESTS: dict[tuple[str, str], Callable[[World], Req]] = {
    ("POST", "/api/v1/jobs"): lambda w: Req("/api/v1/jobs", text=HELLO_JDL),
    ("GET", "/api/v1/jobs"): lambda w: Req("/api/v1/jobs", query={"limit": 5}),
    ("GET", "/api/v1/jobs/summary"): lambda w: Req("/api/v1/jobs/summary",
                                                   query={"status": "Waiting"}),
    ("POST", "/api/v1/jobs/kill"):
        lambda w: Req("/api/v1/jobs/kill", json_body={"job_ids": [w.waiting]}),
    ("POST", "/api/v1/jobs/reschedule"):
        lambda w: Req("/api/v1/jobs/reschedule", json_body={"job_ids": [w.waiting]}),
    ("POST", "/api/v1/jobs/delete"):
        lambda w: Req("/api/v1/jobs/delete", json_body={"job_ids": [w.waiting]}),
    ("GET", "/api/v1/pilots"): lambda w: Req("/api/v1/pilots", query={"status": "Running"}),
    ("GET", "/api/v1/pilots/<reference>"): lambda w: Req(f"/api/v1/pilots/{PILOT_REF}"),
    ("GET", "/api/v1/pilots/<reference>/log"): lambda w: Req(f"/api/v1/pilots/{PILOT_REF}/log"),
    ("POST", "/api/v1/pilots/<reference>/kill"):
        lambda w: Req(f"/api/v1/pilots/{PILOT_REF}/kill"),
    ("GET", "/api/v1/jobs/<int:job_id>"): lambda w: Req(f"/api/v1/jobs/{w.waiting}"),
    ("GET", "/api/v1/jobs/<int:job_id>/output"):
        lambda w: Req(f"/api/v1/jobs/{w.waiting}/output"),
    ("POST", "/api/v1/jobs/<int:job_id>/kill"):
        lambda w: Req(f"/api/v1/jobs/{w.waiting}/kill", json_body={"reason": "auth test"}),
    ("POST", "/api/v1/jobs/<int:job_id>/reschedule"):
        lambda w: Req(f"/api/v1/jobs/{w.waiting}/reschedule", json_body={}),
    ("DELETE", "/api/v1/jobs/<int:job_id>"): lambda w: Req(f"/api/v1/jobs/{w.waiting}"),
    ("GET", "/api/v1/sitemask"): lambda w: Req("/api/v1/sitemask"),
    ("PUT", "/api/v1/sitemask/<site>"):
        lambda w: Req(f"/api/v1/sitemask/{OTHER_SITE}", json_body={"reason": "auth test"}),
    ("DELETE", "/api/v1/sitemask/<site>"): lambda w: Req(f"/api/v1/sitemask/{BANNED}"),
    ("GET", "/api/v1/director/queues"): lambda w: Req("/api/v1/director/queues"),
    ("POST", "/api/v1/director/queues/<site>/<ce>/<queue>/retry"):
        lambda w: Req(f"/api/v1/director/queues/{SITE}/{CERN_CONDOR['ce']}/"
                      f"{CERN_CONDOR['queue']}/retry"),
    ("GET", "/api/v1/limits"): lambda w: Req("/api/v1/limits"),
    ("POST", "/api/v1/limits"):
        lambda w: Req("/api/v1/limits", json_body={"site": OTHER_SITE, "attribute": "job_type",
                                                   "value": "User", "max_running": 3}),
    ("DELETE", "/api/v1/limits/<int:limit_id>"): lambda w: Req(f"/api/v1/limits/{w.limit_id}"),
    ("GET", "/api/v1/shares"): lambda w: Req("/api/v1/shares"),
    ("PUT", "/api/v1/shares/<group>"):
        lambda w: Req("/api/v1/shares/lhcb_user", json_body={"share": 2.5}),
    ("DELETE", "/api/v1/shares/<group>"): lambda w: Req("/api/v1/shares/lhcb_prod"),
    ("POST", "/api/v1/pilots/match"):
        lambda w: Req("/api/v1/pilots/match",
                      json_body={"resource": {"vo": VO, "pilot_reference": PILOT_REF}}),
    ("POST", "/api/v1/pilots/heartbeat"):
        lambda w: Req("/api/v1/pilots/heartbeat",
                      json_body={"pilot_reference": PILOT_REF,
                                 "jobs": [{"job_id": w.matched, "cpu_used": 1.0}]}),
    ("POST", "/api/v1/pilots/jobs/<int:job_id>/status"):
        lambda w: Req(f"/api/v1/pilots/jobs/{w.matched}/status",
                      json_body={"pilot_reference": PILOT_REF, "status": "Running"}),
    ("GET", "/api/v1/pilots/submitpools"):
        lambda w: Req("/api/v1/pilots/submitpools", query=dict(CERN_CONDOR)),
    ("PUT", "/api/v1/pilots/<reference>"):
        lambda w: Req(f"/api/v1/pilots/{PILOT_REF}",
                      json_body={**CERN_CONDOR, "status": "Running"}),
    ("POST", "/api/v1/pilots/jobs/<int:job_id>/token"):
        lambda w: Req(f"/api/v1/pilots/jobs/{w.matched}/token",
                      json_body={"pilot_reference": PILOT_REF}),
    ("GET", "/.well-known/openid-configuration"):
        lambda w: Req("/.well-known/openid-configuration"),
    ("GET", "/.well-known/jwks.json"): lambda w: Req("/.well-known/jwks.json"),
    ("POST", "/api/v1/pilots/<reference>/token"):
        lambda w: Req(f"/api/v1/pilots/{PILOT_REF}/token"),
    ("POST", "/api/v1/sandboxes"):
        lambda w: Req("/api/v1/sandboxes", json_body={
            "checksum": SANDBOX_ID.removeprefix("sb:sha256:"), "size": len(SANDBOX),
            "job_id": w.matched, "pilot_reference": PILOT_REF}),
    ("PUT", "/api/v1/sandboxes/<sandbox_id>"):
        lambda w: Req(f"/api/v1/sandboxes/{SANDBOX_ID}", data=SANDBOX,
                      query={"job_id": w.matched, "pilot_reference": PILOT_REF}),
    ("GET", "/api/v1/sandboxes/<sandbox_id>"):
        lambda w: Req(f"/api/v1/sandboxes/{SANDBOX_ID}", query={"pilot_reference": PILOT_REF}),
    ("GET", "/api/v1/sandboxes/usage"): lambda w: Req("/api/v1/sandboxes/usage"),
    ("GET", "/api/v1/replicas"): lambda w: Req("/api/v1/replicas", query={"se": "CERN-DST"}),
    ("POST", "/api/v1/replicas"):
        lambda w: Req("/api/v1/replicas", json_body={"replicas": [
            {"lfn": "/lhcb/auth/f1", "se": "CERN-DST"}]}),
    ("POST", "/api/v1/replicas/remove"):
        lambda w: Req("/api/v1/replicas/remove", json_body={"lfns": ["/lhcb/auth/f1"]}),
    ("GET", "/healthz"): lambda w: Req("/healthz"),
    ("GET", "/api/v1/whoami"): lambda w: Req("/api/v1/whoami"),
    ("GET", "/metrics"): lambda w: Req("/metrics"),
    ("GET", "/api/v1/taskqueues"): lambda w: Req("/api/v1/taskqueues"),
    ("POST", "/api/v1/taskqueues/matching"):
        lambda w: Req("/api/v1/taskqueues/matching",
                      json_body={"resource": {"vo": VO, "site": SITE}}),
    ("POST", "/api/v1/taskqueues/explain"):
        lambda w: Req("/api/v1/taskqueues/explain",
                      json_body={"job_id": w.waiting,
                                 "queue": "LCG.CERN.cern/ce503.cern.ch/condor"}),
}

ROLES = ("user", "pilot", "operator")
NO_ROLE = ("no token", "bad signature", "expired token")


def _op_id(op: Operation) -> str:
    return f"{op.method} {op.rule}"


@pytest.fixture()
def world(client: Api, app: Flask, user_token: str, own_pilot_token: str,
          operator_token: str) -> World:
    client.ok("PUT", f"/api/v1/sandboxes/{SANDBOX_ID}", user_token, status=201, data=SANDBOX,
              content_type="application/gzip")
    matched = client.submit_jdl(user_token, f'[Executable = "/bin/cat"; '
                                            f'InputSandbox = {{"{SANDBOX_ID}"}};]')[0]
    # pilot-1 was submitted by the site director (so an operator may kill it through its
    # CE), and a log of it is kept (which alice may read: it holds her job).
    runtime = runtime_of(app)
    now = datetime.now(UTC)
    runtime.transaction(partial(record_new_pilots, vo=VO, site=SITE, ce=CERN_CONDOR["ce"],
                                queue=CERN_CONDOR["queue"], executor="local",
                                references=[PILOT_REF], now=now))
    runtime.transaction(partial(record_submission, reference=PILOT_REF, native_id="1",
                                now=now))
    runtime.transaction(partial(lock_director_queue, site=SITE, ce=CERN_CONDOR["ce"],
                                queue=CERN_CONDOR["queue"], now=now))
    log_id, packed = pack_log(b"pilot output", b"")
    runtime.sandbox_store().put(log_id, packed)
    runtime.transaction(partial(record_log, vo=VO, reference=PILOT_REF, log_id=log_id,
                                size=len(packed), note="", now=now))
    client.ok("PUT", f"/api/v1/pilots/{PILOT_REF}", own_pilot_token,
              json_body={**CERN_CONDOR, "status": "Running"})
    assert [p["job_id"] for p in client.match(own_pilot_token)["jobs"]] == [matched]
    waiting = client.submit_jdl(user_token)[0]
    client.ok("PUT", f"/api/v1/sitemask/{BANNED}", operator_token, json_body={})
    made = client.ok("POST", "/api/v1/limits", operator_token,
                     json_body={"site": BANNED, "attribute": "job_type", "value": "User",
                                "max_running": 10})
    client.ok("PUT", "/api/v1/shares/lhcb_prod", operator_token, json_body={"share": 3})
    return World(waiting, matched, made["limit_id"])


@pytest.fixture()
def caller(user_token: str, own_pilot_token: str, operator_token: str, expired_token: str,
           forged_token: str) -> dict[str, str | None]:
    return {"user": user_token, "pilot": own_pilot_token, "operator": operator_token,
            "no token": None, "bad signature": forged_token, "expired token": expired_token}


def test_the_matrix_covers_every_operation() -> None:
    declared = {(op.method, op.rule) for op in OPERATIONS}
    assert len(declared) == len(OPERATIONS) >= 26
    missing = sorted(declared - set(REQUESTS))
    assert not missing, f"operations without an auth-matrix entry: {missing}"
    stale = sorted(set(REQUESTS) - declared)
    assert not stale, f"auth-matrix entries for no operation: {stale}"


@pytest.mark.parametrize("who", ROLES + NO_ROLE)
@pytest.mark.parametrize("op", OPERATIONS, ids=_op_id)
def test_auth_matrix(client: Api, world: World, caller: dict[str, str | None],
                     op: Operation, who: str) -> None:
    entry = REQUESTS.get((op.method, op.rule))
    if entry is None:
        pytest.fail(f"no auth-matrix entry for {op.method} {op.rule}")
    req = entry(world)
    response = client.call(op.method, req.path, caller[who], json_body=req.json_body,
                           text=req.text, query=req.query, data=req.data,
                           content_type="application/gzip" if req.data else None)
    body = response.get_data().decode("utf-8", errors="replace")
    if op.roles is None or who in op.roles:
        assert 200 <= response.status_code < 300, f"{who}: {response.status_code} {body}"
    elif who in NO_ROLE:
        problem = assert_problem(response, 401)
        assert response.headers.get("WWW-Authenticate", "").startswith("Bearer")
        if who == "expired token":
            assert "expired" in problem["detail"]
    else:
        problem = assert_problem(response, 403, who, *op.roles)
        assert problem["title"] == "Forbidden"


def test_refusals_change_nothing(client: Api, world: World, user_token: str,
                                 own_pilot_token: str, forged_token: str) -> None:
    assert_problem(client.call("POST", f"/api/v1/jobs/{world.waiting}/kill", own_pilot_token,
                               json_body={}), 403)
    assert_problem(client.call("POST", f"/api/v1/jobs/{world.waiting}/kill", forged_token,
                               json_body={}), 401)
    assert_problem(client.call("PUT", f"/api/v1/sitemask/{SITE}", user_token,
                               json_body={}), 403)
    assert client.job(user_token, world.waiting)["status"] == "Waiting"
    assert len(client.match(own_pilot_token, site=SITE)["jobs"]) == 1


@pytest.mark.parametrize("header", [
    "Basic YWxpY2U6c2VjcmV0", "Bearer", "Bearer ", "Token abc", "Bearer not-a-jwt"])
def test_malformed_authorization_headers_are_401(client: Api, header: str) -> None:
    response = client.client.get("/api/v1/jobs", headers={"Authorization": header})
    assert_problem(response, 401)


@pytest.mark.parametrize("claims", [
    {"role": "admin"}, {"vo": ""}, {"vo": None}, {"group": None}, {"sub": "  "},
    {"iss": "someone-else"}, {"site": 7, "role": "pilot"}])
def test_tokens_with_bad_claims_are_401(client: Api, claims: dict[str, Any]) -> None:
    now = int(time.time())
    base: dict[str, Any] = {"iss": "gridpilot", "sub": "alice", "role": "user", "vo": VO,
                            "group": "lhcb_user", "iat": now, "exp": now + 600}
    base.update(claims)
    token = jwt.encode({k: v for k, v in base.items() if v is not None}, SECRET,
                       algorithm="HS256")
    assert_problem(client.call("GET", "/api/v1/jobs", token), 401)


def test_a_token_signed_with_none_is_401(client: Api) -> None:
    now = int(time.time())
    token = jwt.encode({"iss": "gridpilot", "sub": "alice", "role": "operator", "vo": VO,
                        "group": "g", "iat": now, "exp": now + 600}, None, algorithm="none")
    assert_problem(client.call("GET", "/api/v1/jobs", token), 401)


# -- a user's own jobs, an operator's own VO ------------------------------------------------

JOB_ACTIONS: list[tuple[str, str, Any]] = [
    ("GET", "/api/v1/jobs/{id}", None),
    ("GET", "/api/v1/jobs/{id}/output", None),
    ("POST", "/api/v1/jobs/{id}/kill", {}),
    ("POST", "/api/v1/jobs/{id}/reschedule", {}),
    ("DELETE", "/api/v1/jobs/{id}", None),
]


@pytest.mark.parametrize(("method", "path", "body"), JOB_ACTIONS)
def test_a_user_cannot_touch_another_users_job(client: Api, user_token: str,
                                               other_user_token: str, method: str, path: str,
                                               body: Any) -> None:
    job_id = client.submit_jdl(user_token)[0]
    response = client.call(method, path.format(id=job_id), other_user_token, json_body=body)
    assert_problem(response, 403, "another user")
    job = client.job(user_token, job_id)
    assert job["status"] == "Waiting" and job["reschedule_count"] == 0


@pytest.mark.parametrize(("method", "path", "body"), JOB_ACTIONS)
def test_an_operator_of_another_vo_cannot_touch_a_job(client: Api, user_token: str,
                                                      other_vo_operator_token: str,
                                                      method: str, path: str,
                                                      body: Any) -> None:
    job_id = client.submit_jdl(user_token)[0]
    response = client.call(method, path.format(id=job_id), other_vo_operator_token,
                           json_body=body)
    # 404, as for a job that does not exist: another VO's ids are not revealed
    body_404 = assert_problem(response, 404, f"job {job_id} does not exist")
    unknown = client.call(method, path.format(id=job_id + 1000), other_vo_operator_token,
                          json_body=body)
    assert assert_problem(unknown, 404)["detail"] == body_404["detail"].replace(
        str(job_id), str(job_id + 1000))
    assert client.job(user_token, job_id)["status"] == "Waiting"


def test_explain_of_another_users_job_is_403(client: Api, user_token: str,
                                             other_user_token: str,
                                             other_vo_operator_token: str) -> None:
    job_id = client.submit_jdl(user_token)[0]
    for token, status in ((other_user_token, 403), (other_vo_operator_token, 404)):
        response = client.call("POST", "/api/v1/taskqueues/explain", token,
                               json_body={"job_id": job_id,
                                          "queue": "LCG.CERN.cern/ce503.cern.ch/condor"})
        assert_problem(response, status)


def test_listings_hide_other_users_and_vos(client: Api, user_token: str,
                                           other_user_token: str,
                                           other_vo_operator_token: str) -> None:
    client.submit_jdl(user_token)
    assert client.ok("GET", "/api/v1/jobs", other_user_token)["jobs"] == []
    assert client.ok("GET", "/api/v1/jobs", other_vo_operator_token)["jobs"] == []


def test_same_user_name_in_another_vo_cannot_touch_the_job(client: Api, user_token: str,
                                                          token: TokenMaker) -> None:
    job_id = client.submit_jdl(user_token)[0]
    twin = token("alice", "user", vo=OTHER_VO, group="belle_user")
    assert_problem(client.call("GET", f"/api/v1/jobs/{job_id}", twin), 404, "does not exist")


def test_an_operator_of_another_vo_cannot_change_this_vos_shares(
        client: Api, user_token: str, operator_token: str,
        other_vo_operator_token: str) -> None:
    """Shares are the VO's (matcher/auth.py): a belle operator must not move lhcb's queues."""
    client.submit_jdl(user_token)

    def lhcb_priority() -> float:
        queues = client.ok("GET", "/api/v1/taskqueues", operator_token)["task_queues"]
        return float(queues[0]["priority"])

    before = lhcb_priority()
    client.call("PUT", "/api/v1/shares/lhcb_user", other_vo_operator_token,
                json_body={"share": 50})
    assert lhcb_priority() == before
    assert client.ok("GET", "/api/v1/shares", operator_token)["shares"] == []


def test_an_operator_of_another_vo_cannot_reset_this_vos_share(
        client: Api, user_token: str, operator_token: str,
        other_vo_operator_token: str) -> None:
    client.submit_jdl(user_token)
    client.ok("PUT", "/api/v1/shares/lhcb_user", operator_token, json_body={"share": 7})
    client.call("DELETE", "/api/v1/shares/lhcb_user", other_vo_operator_token)
    shares = client.ok("GET", "/api/v1/shares", operator_token)["shares"]
    assert shares == [{"owner_group": "lhcb_user", "share": 7.0, "source": "operator"}]


def test_an_operator_of_another_vo_cannot_update_this_vos_pilot(
        client: Api, pilot_token: str, other_vo_operator_token: str) -> None:
    client.ok("PUT", "/api/v1/pilots/pilot-9", pilot_token,
              json_body={**CERN_CONDOR, "status": "Running"})
    theirs = client.ok("PUT", "/api/v1/pilots/pilot-9", other_vo_operator_token,
                       json_body={**CERN_CONDOR, "status": "Aborted"})
    assert theirs["vo"] == OTHER_VO  # their own pilot-9: references are unique per VO
    assert client.ok("GET", "/api/v1/pilots/pilot-9", pilot_token)["status"] == "Running"


# -- a pilot's own site and reference --------------------------------------------------------

def test_a_site_pilot_cannot_match_for_another_site(client: Api, user_token: str,
                                                    site_pilot_token: str) -> None:
    client.submit_jdl(user_token)
    for site in (OTHER_SITE, [OTHER_SITE], [SITE, OTHER_SITE]):
        response = client.call("POST", "/api/v1/pilots/match", site_pilot_token,
                               json_body={"resource": {"vo": VO, "pilot_reference": "p",
                                                       "site": site}})
        assert_problem(response, 403, SITE)
    response = client.call("POST", "/api/v1/taskqueues/matching", site_pilot_token,
                           json_body={"resource": {"vo": VO, "site": OTHER_SITE}})
    assert_problem(response, 403, SITE)
    own = client.match(site_pilot_token, pilot_reference="p", site=SITE)
    assert len(own["jobs"]) == 1


def test_a_site_pilot_is_held_to_its_site(client: Api, user_token: str,
                                          site_pilot_token: str) -> None:
    """A resource naming no site (or ANY) is the token's site: jobs for elsewhere stay."""
    client.submit_jdl(user_token, f'Executable = "x"; Site = "{OTHER_SITE}";')
    for site in (None, "ANY"):
        resource: dict[str, Any] = {} if site is None else {"site": site}
        answer = client.match(site_pilot_token, pilot_reference="p", **resource)
        assert answer["jobs"] == [], site
        assert answer["no_match"]["reason"] == "no_matching_job"


def test_a_site_pilot_cannot_read_or_register_elsewhere(client: Api,
                                                        site_pilot_token: str) -> None:
    response = client.call("GET", "/api/v1/pilots/submitpools", site_pilot_token,
                           query={"site": OTHER_SITE, "ce": "ce01-htc.cr.cnaf.infn.it",
                                  "queue": "htc"})
    assert_problem(response, 403, SITE)
    response = client.call("PUT", "/api/v1/pilots/p-cnaf", site_pilot_token,
                           json_body={"site": OTHER_SITE, "ce": "ce01-htc.cr.cnaf.infn.it",
                                      "queue": "htc", "status": "Running"})
    assert_problem(response, 403, SITE)


def test_a_pilot_of_another_vo_cannot_match_or_report(client: Api, user_token: str,
                                                      pilot_token: str,
                                                      token: TokenMaker) -> None:
    job_id = client.submit_jdl(user_token)[0]
    belle = token("belle-pilot", "pilot", vo=OTHER_VO, group="belle_pilot")
    response = client.call("POST", "/api/v1/pilots/match", belle,
                           json_body={"resource": {"vo": VO, "pilot_reference": PILOT_REF}})
    assert_problem(response, 403, OTHER_VO)
    assert client.match(belle, pilot_reference=PILOT_REF, vo=OTHER_VO)["jobs"] == []
    client.match(pilot_token, pilot_reference=PILOT_REF)
    assert_problem(client.report(belle, job_id, "Done", exit_code=0), 404)
    assert client.job(user_token, job_id)["status"] == "Matched"


def test_a_pilot_token_speaks_for_its_own_reference_only(client: Api, user_token: str,
                                                         pilot_token: str,
                                                         own_pilot_token: str) -> None:
    mine = client.submit_jdl(user_token)[0]
    assert [p["job_id"] for p in client.match(own_pilot_token)["jobs"]] == [mine]
    theirs = client.submit_jdl(user_token)[0]
    assert [p["job_id"] for p in client.match(pilot_token, pilot_reference="pilot-2")[
        "jobs"]] == [theirs]

    report = client.report(own_pilot_token, theirs, "Done", reference="pilot-2", exit_code=0)
    assert_problem(report, 403, PILOT_REF)
    beat = client.call("POST", "/api/v1/pilots/heartbeat", own_pilot_token,
                       json_body={"pilot_reference": "pilot-2", "jobs": [{"job_id": theirs}]})
    assert_problem(beat, 403, PILOT_REF)
    match = client.call("POST", "/api/v1/pilots/match", own_pilot_token,
                        json_body={"resource": {"vo": VO, "pilot_reference": "pilot-2"}})
    assert_problem(match, 403, PILOT_REF)
    register = client.call("PUT", "/api/v1/pilots/pilot-2", own_pilot_token,
                           json_body={**CERN_CONDOR, "status": "Running"})
    assert_problem(register, 403, PILOT_REF)
    assert client.job(user_token, theirs)["status"] == "Matched"
    # its own reference works, named or not
    assert client.report(own_pilot_token, mine, "Running").status_code == 200
    assert client.report(own_pilot_token, mine, "Done", exit_code=0).get_json()[
        "status"] == "Done"
