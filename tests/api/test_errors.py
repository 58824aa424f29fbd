"""Every error is a precise 4xx application/problem+json with a detail, never a 500: bad JSON,
wrong types, unknown objects, illegal state changes, oversized bodies, wrong media types,
unknown query parameters, routes and methods, and values at and beyond the edges."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import jwt
import pytest
from flask import Flask

from matcher.auth import issue_token
from taskqueue.core.settings import Settings
from tests.api.conftest import SECRET
from tests.api.helpers import HELLO_JDL, PILOT_REF, SITE, VO, Api, assert_problem

HUGE = 10**30  # beyond any database integer
LONG = "x" * 300  # beyond any name column


def test_malformed_json_is_400(client: Api, user_token: str, pilot_token: str) -> None:
    problem = assert_problem(client.call("POST", "/api/v1/jobs", user_token,
                                         data=b'{"executable": "x",}',
                                         content_type="application/json"),
                             400, "not valid JSON", "line 1")
    assert problem["title"] == "Bad request"
    assert_problem(client.call("POST", "/api/v1/pilots/match", pilot_token, data=b"{",
                               content_type="application/json"), 400, "not valid JSON")
    assert_problem(client.call("POST", "/api/v1/pilots/match", pilot_token, data=b"",
                               content_type="application/json"), 400, "not valid JSON")


def test_deeply_nested_json_is_400(client: Api, pilot_token: str) -> None:
    body = b"[" * 100000 + b"]" * 100000
    assert_problem(client.call("POST", "/api/v1/pilots/match", pilot_token, data=body,
                               content_type="application/json"), 400)


def test_body_that_is_not_utf8_is_400(client: Api, user_token: str) -> None:
    assert_problem(client.call("POST", "/api/v1/jobs", user_token, data=b"\xff\xfe",
                               content_type="text/plain"), 400, "UTF-8")


@pytest.mark.parametrize(("body", "fragment"), [
    ({"resource": {"vo": VO, "pilot_reference": "p", "cpu_time": "long"}},
     "body.resource.cpu_time"),
    ({"resource": {"vo": VO, "pilot_reference": "p", "processors": -1}},
     "body.resource.processors"),
    ({"resource": {"vo": VO, "pilot_reference": "p", "memory": 1.5}}, "body.resource.memory"),
    ({"resource": {"vo": VO, "pilot_reference": "p", "cpu_time": True}},
     "body.resource.cpu_time"),
    ({"resource": {"vo": VO, "pilot_reference": "p", "site": 7}}, "body.resource.site"),
    ({"resource": {"vo": VO, "pilot_reference": "p", "tags": [1]}}, "body.resource.tags"),
    ({"resource": {"vo": 5}}, "body.resource.vo"),
    ({"resource": {"pilot_reference": "p"}}, "body.resource.vo"),
    ({"resource": "lhcb"}, "body.resource"),
    ({}, "body.resource"),
    ({"resource": {"vo": VO, "pilot_reference": "p"}, "count": "2"}, "body.count"),
    ({"resource": {"vo": VO, "pilot_reference": "p"}, "colour": "red"}, "body.colour"),
    ([], "body"),
])
def test_wrong_types_in_a_match_are_422_naming_the_field(client: Api, pilot_token: str,
                                                         body: Any, fragment: str) -> None:
    response = client.call("POST", "/api/v1/pilots/match", pilot_token, json_body=body)
    problem = assert_problem(response, 422, fragment)
    assert problem["title"] == "Invalid input"


@pytest.mark.parametrize(("body", "fragment"), [
    ({"pilot_reference": PILOT_REF, "jobs": [{"job_id": "1"}]}, "body.jobs[0].job_id"),
    ({"pilot_reference": PILOT_REF, "jobs": [{"job_id": 1, "cpu_used": -1}]},
     "body.jobs[0].cpu_used"),
    ({"pilot_reference": PILOT_REF, "jobs": {"job_id": 1}}, "body.jobs"),
    ({"pilot_reference": ""}, "body.pilot_reference"),
    ({"jobs": []}, "body.pilot_reference"),
])
def test_wrong_types_in_a_heartbeat_are_422(client: Api, pilot_token: str, body: Any,
                                            fragment: str) -> None:
    response = client.call("POST", "/api/v1/pilots/heartbeat", pilot_token, json_body=body)
    assert_problem(response, 422, fragment)


@pytest.mark.parametrize(("body", "fragment"), [
    ({"pilot_reference": PILOT_REF, "status": "Matched"}, "body.status"),
    ({"pilot_reference": PILOT_REF, "status": "Done", "exit_code": 256}, "body.exit_code"),
    ({"pilot_reference": PILOT_REF, "status": "Done", "exit_code": "0"}, "body.exit_code"),
    ({"status": "Done"}, "body.pilot_reference"),
])
def test_wrong_types_in_a_status_report_are_422(client: Api, pilot_token: str, body: Any,
                                                fragment: str) -> None:
    response = client.call("POST", "/api/v1/pilots/jobs/1/status", pilot_token,
                           json_body=body)
    assert_problem(response, 422, fragment)


def test_wrong_types_elsewhere_are_422(client: Api, user_token: str,
                                       operator_token: str) -> None:
    assert_problem(client.call("POST", "/api/v1/taskqueues/explain", user_token,
                               json_body={"job_id": "7", "queue": "a/b/c"}), 422,
                   "body.job_id")
    assert_problem(client.call("POST", "/api/v1/limits", operator_token,
                               json_body={"site": SITE, "attribute": "job_type",
                                          "value": "User", "max_running": -1}), 422,
                   "body.max_running")
    assert_problem(client.call("POST", "/api/v1/limits", operator_token,
                               json_body={"site": "", "attribute": "job_type",
                                          "value": "User", "max_running": 1}), 422,
                   "body.site")
    assert_problem(client.call("PUT", f"/api/v1/sitemask/{SITE}", operator_token,
                               json_body={"reason": 5}), 422, "body.reason")
    assert_problem(client.call("POST", "/api/v1/jobs/1/kill", user_token,
                               json_body={"reason": ["a"]}), 422, "body.reason")
    assert_problem(client.call("POST", "/api/v1/jobs", user_token, json_body="x"), 422,
                   "body")
    assert_problem(client.call("POST", "/api/v1/jobs", user_token, text=""), 422, "body")


@pytest.mark.parametrize(("method", "path", "body"), [
    ("GET", "/api/v1/jobs/424242", None),
    ("GET", "/api/v1/jobs/424242/output", None),
    ("POST", "/api/v1/jobs/424242/kill", {}),
    ("POST", "/api/v1/jobs/424242/reschedule", {}),
    ("DELETE", "/api/v1/jobs/424242", None),
])
def test_unknown_job_is_404(client: Api, user_token: str, operator_token: str, method: str,
                            path: str, body: Any) -> None:
    for token in (user_token, operator_token):
        assert_problem(client.call(method, path, token, json_body=body), 404, "424242")


def test_unknown_limit_share_and_ban_are_404(client: Api, operator_token: str) -> None:
    assert_problem(client.call("DELETE", "/api/v1/limits/424242", operator_token), 404,
                   "424242")
    assert_problem(client.call("DELETE", "/api/v1/shares/nobody", operator_token), 404,
                   "nobody")
    assert_problem(client.call("DELETE", "/api/v1/sitemask/NO.SITE.org", operator_token),
                   404, "NO.SITE.org")


def test_illegal_state_changes_are_409(client: Api, user_token: str,
                                       pilot_token: str) -> None:
    job_id = client.submit_jdl(user_token)[0]
    client.match(pilot_token, pilot_reference=PILOT_REF)
    client.report(pilot_token, job_id, "Done", exit_code=0)
    problem = assert_problem(client.call("POST", f"/api/v1/jobs/{job_id}/kill", user_token,
                                         json_body={}), 409, str(job_id), "Done")
    assert problem["title"] == "Conflict"
    client.ok("DELETE", f"/api/v1/jobs/{job_id}", user_token)
    assert_problem(client.call("POST", f"/api/v1/jobs/{job_id}/reschedule", user_token,
                               json_body={}), 409, "Deleted")
    assert_problem(client.call("POST", f"/api/v1/jobs/{job_id}/kill", user_token,
                               json_body={}), 409, "Deleted")
    assert client.job(user_token, job_id)["status"] == "Deleted"


def test_body_over_the_limit_is_413(make_app: Callable[[Settings], Flask],
                                    api_settings: Settings, user_token: str,
                                    pilot_token: str) -> None:
    settings = replace(api_settings, matcher=replace(api_settings.matcher,
                                                     max_body_bytes=2000))
    api = Api(make_app(settings).test_client(), settings, SECRET)
    fits = 'Executable = "x"; Arguments = "' + "a" * 1900 + '";'
    assert len(fits) <= 2000
    assert len(api.submit_jdl(user_token, fits)) == 1
    big = 'Executable = "x"; Arguments = "' + "a" * 2000 + '";'
    problem = assert_problem(api.call("POST", "/api/v1/jobs", user_token, text=big), 413,
                             "2000")
    assert problem["title"] == "Request body too large"
    resource = {"vo": VO, "pilot_reference": "p", "padding": "b" * 3000}
    assert_problem(api.call("POST", "/api/v1/pilots/match", pilot_token,
                            json_body={"resource": resource}), 413)
    assert len(api.ok("GET", "/api/v1/jobs", user_token)["jobs"]) == 1


def test_body_over_the_default_limit_is_413(client: Api, user_token: str) -> None:
    size = client.settings.matcher.max_body_bytes + 1
    assert_problem(client.call("POST", "/api/v1/jobs", user_token, data=b"x" * size,
                               content_type="text/plain"), 413, str(size - 1))


@pytest.mark.parametrize(("path", "content_type", "fragments"), [
    ("/api/v1/jobs", "application/xml", ("application/json", "text/plain",
                                         "application/xml")),
    ("/api/v1/jobs", None, ("no Content-Type",)),
    ("/api/v1/jobs", "application/x-www-form-urlencoded", ("application/json",)),
    ("/api/v1/pilots/match", "text/plain", ("application/json", "text/plain")),
])
def test_unsupported_media_type_is_415(client: Api, user_token: str, pilot_token: str,
                                       path: str, content_type: str | None,
                                       fragments: tuple[str, ...]) -> None:
    token = pilot_token if "pilots" in path else user_token
    response = client.call("POST", path, token, data=HELLO_JDL.encode(),
                           content_type=content_type)
    problem = assert_problem(response, 415, *fragments)
    assert problem["title"] == "Unsupported media type"


@pytest.mark.parametrize(("path", "query", "fragments"), [
    ("/api/v1/jobs", {"colour": "red"}, ("colour", "status")),
    ("/api/v1/jobs", {"Status": "Waiting"}, ("Status",)),
    ("/api/v1/taskqueues", {"vo": "belle"}, ("vo",)),
    ("/api/v1/sitemask", {"site": SITE}, ("site",)),
    ("/healthz", {"verbose": "1"}, ("verbose",)),
])
def test_unknown_query_parameter_is_400(client: Api, operator_token: str, path: str,
                                        query: dict[str, str],
                                        fragments: tuple[str, ...]) -> None:
    response = client.call("GET", path, operator_token, query=query)
    assert_problem(response, 400, "unknown query parameter", *fragments)


@pytest.mark.parametrize(("query", "fragment"), [
    ({"status": "Bogus"}, "status"),
    ({"limit": "0"}, "limit"),
    ({"limit": "ten"}, "limit"),
    ({"after": "-1"}, "after"),
    ({"after": "1.5"}, "after"),
    ({"after": "9" * 40}, "after"),
])
def test_bad_query_values_are_400(client: Api, user_token: str, query: dict[str, str],
                                  fragment: str) -> None:
    assert_problem(client.call("GET", "/api/v1/jobs", user_token, query=query), 400,
                   fragment)


@pytest.mark.parametrize("path", ["/api/v1/nothing", "/api/v1/jobs/abc", "/api/v2/jobs",
                                  "/api/v1/jobs/1/frobnicate", "/"])
def test_unknown_route_is_404(client: Api, user_token: str, path: str) -> None:
    problem = assert_problem(client.call("GET", path, user_token), 404, "openapi.json")
    assert problem["title"] == "Not found"


@pytest.mark.parametrize(("method", "path", "allowed"), [
    ("GET", "/api/v1/pilots/match", {"POST"}),
    ("PUT", "/api/v1/jobs", {"GET", "POST"}),
    ("POST", "/api/v1/jobs/1", {"GET", "DELETE"}),
    ("DELETE", "/healthz", {"GET"}),
    ("PATCH", "/api/v1/shares/lhcb_user", {"PUT", "DELETE"}),
])
def test_wrong_method_is_405(client: Api, operator_token: str, method: str, path: str,
                             allowed: set[str]) -> None:
    response = client.call(method, path, operator_token)
    problem = assert_problem(response, 405, "method")
    assert problem["title"] == "Method not allowed"
    assert allowed <= {m.strip() for m in response.headers["Allow"].split(",")}


def test_errors_have_no_traceback(client: Api, user_token: str) -> None:
    response = client.call("POST", "/api/v1/jobs", user_token, data=b"{",
                           content_type="application/json")
    assert "Traceback" not in response.get_data(as_text=True)
    assert set(response.get_json()) >= {"type", "title", "status", "detail"}


# -- never a 500: values at and beyond the edges ------------------------------------------

@dataclass(frozen=True)
class Edge:
    """A request that must be answered with one of ``expected`` (a problem when >= 400)."""

    method: str
    path: str
    role: str
    expected: frozenset[int]
    json_body: Any = None
    data: bytes | None = None
    content_type: str | None = None
    query: dict[str, str] = field(default_factory=dict)


EDGES: dict[str, Edge] = {
    "job id beyond 64 bits in the path": Edge(
        "GET", "/api/v1/jobs/99999999999999999999", "user", frozenset({404})),
    "job id 2**63 in the path": Edge(
        "GET", "/api/v1/jobs/9223372036854775808", "user", frozenset({404})),
    "kill of a job id beyond 64 bits": Edge(
        "POST", f"/api/v1/jobs/{HUGE}/kill", "operator", frozenset({404}), json_body={}),
    "status report on a job id beyond 64 bits": Edge(
        "POST", f"/api/v1/pilots/jobs/{HUGE}/status", "pilot", frozenset({404}),
        json_body={"pilot_reference": PILOT_REF, "status": "Running"}),
    "limit id beyond 64 bits": Edge(
        "DELETE", f"/api/v1/limits/{HUGE}", "operator", frozenset({404})),
    "heartbeat for a job id beyond 64 bits": Edge(
        "POST", "/api/v1/pilots/heartbeat", "pilot", frozenset({200, 422}),
        json_body={"pilot_reference": PILOT_REF, "jobs": [{"job_id": HUGE}]}),
    "explain of a job id beyond 64 bits": Edge(
        "POST", "/api/v1/taskqueues/explain", "user", frozenset({404, 422}),
        json_body={"job_id": HUGE, "queue": "LCG.CERN.cern/ce503.cern.ch/condor"}),
    "max_running beyond the column": Edge(
        "POST", "/api/v1/limits", "operator", frozenset({422}),
        json_body={"site": SITE, "attribute": "job_type", "value": "User",
                   "max_running": HUGE}),
    "resource cpu_time beyond 64 bits": Edge(
        "POST", "/api/v1/pilots/match", "pilot", frozenset({200, 422}),
        json_body={"resource": {"vo": VO, "pilot_reference": "p", "cpu_time": HUGE}}),
    "resource processors beyond 64 bits": Edge(
        "POST", "/api/v1/pilots/match", "pilot", frozenset({200, 422}),
        json_body={"resource": {"vo": VO, "pilot_reference": "p", "processors": HUGE}}),
    "resource memory beyond 64 bits": Edge(
        "POST", "/api/v1/taskqueues/matching", "operator", frozenset({200, 422}),
        json_body={"resource": {"vo": VO, "memory": HUGE}}),
    "a JSON number of 5000 digits": Edge(
        "POST", "/api/v1/jobs", "user", frozenset({400, 422}),
        data=b'{"executable": "x", "priority": ' + b"1" * 5000 + b"}",
        content_type="application/json"),
    "NaN is not JSON": Edge(
        "POST", "/api/v1/pilots/heartbeat", "pilot", frozenset({400, 422}),
        data=b'{"pilot_reference": "pilot-1", "jobs": [{"job_id": 1, "cpu_used": NaN}]}',
        content_type="application/json"),
    "Infinity is not JSON": Edge(
        "PUT", "/api/v1/shares/lhcb_user", "operator", frozenset({400, 422}),
        data=b'{"share": Infinity}', content_type="application/json"),
    "a site name longer than any column in the site mask": Edge(
        "PUT", f"/api/v1/sitemask/{LONG}", "operator", frozenset({400, 422}), json_body={}),
    "a group name longer than any column in the shares": Edge(
        "PUT", f"/api/v1/shares/{LONG}", "operator", frozenset({400, 422}),
        json_body={"share": 1}),
    "a pilot reference longer than its column": Edge(
        "PUT", f"/api/v1/pilots/{LONG}", "operator", frozenset({400, 422}),
        json_body={"site": SITE, "ce": "ce503.cern.ch", "queue": "condor",
                   "status": "Running"}),
    "a limit's site longer than its column": Edge(
        "POST", "/api/v1/limits", "operator", frozenset({422}),
        json_body={"site": "s" * 200, "attribute": "job_type", "value": "User",
                   "max_running": 1}),
    "a resource's site longer than any column": Edge(
        "POST", "/api/v1/pilots/match", "pilot", frozenset({200, 422}),
        json_body={"resource": {"vo": VO, "pilot_reference": "p", "site": LONG}}),
}


@pytest.mark.parametrize("name", sorted(EDGES))
def test_never_a_500(client: Api, user_token: str, pilot_token: str, operator_token: str,
                     name: str) -> None:
    edge = EDGES[name]
    client.submit_jdl(user_token)
    token = {"user": user_token, "pilot": pilot_token, "operator": operator_token}[edge.role]
    response = client.call(edge.method, edge.path, token, json_body=edge.json_body,
                           data=edge.data, content_type=edge.content_type, query=edge.query)
    text = response.get_data(as_text=True)
    assert response.status_code in edge.expected, f"{response.status_code}: {text}"
    if response.status_code >= 400:
        assert_problem(response, response.status_code)


def test_nan_cpu_time_is_not_stored(client: Api, user_token: str, pilot_token: str) -> None:
    job_id = client.submit_jdl(user_token)[0]
    client.match(pilot_token, pilot_reference=PILOT_REF)
    body = (f'{{"pilot_reference": "{PILOT_REF}", '
            f'"jobs": [{{"job_id": {job_id}, "cpu_used": NaN}}]}}').encode()
    response = client.call("POST", "/api/v1/pilots/heartbeat", pilot_token, data=body,
                           content_type="application/json")
    assert_problem(response, 400)
    assert client.job(user_token, job_id)["cpu_used"] is None


@pytest.mark.parametrize("claim", ["sub", "group", "vo"])
def test_overlong_token_claims_are_refused(client: Api, claim: str) -> None:
    """Claims longer than the columns they are stored in (owner, owner_group, vo): a 401,
    never a 500; and issue_token refuses to make such a token."""
    now = int(time.time())
    claims = {"iss": "gridpilot", "sub": "alice", "role": "user", "vo": "lhcb",
              "group": "lhcb_user", "iat": now, "exp": now + 600, claim: "c" * 300}
    forged = jwt.encode(claims, SECRET, algorithm="HS256")
    response = client.call("POST", "/api/v1/jobs", forged, text=HELLO_JDL)
    assert_problem(response, 401, "longer than")
    names = {"sub": "subject", "group": "group", "vo": "vo"}
    kwargs = {"subject": "alice", "role": "user", "vo": "lhcb", "group": "lhcb_user",
              names[claim]: "c" * 300}
    with pytest.raises(ValueError, match="at most"):
        issue_token(SECRET, lifetime=600, **kwargs)


@pytest.mark.parametrize(("method", "path", "body", "query"), [
    ("POST", "/api/v1/limits", {"site": "S", "attribute": "job_type", "value": "a\u0000b",
                                "max_running": 1}, None),
    ("PUT", "/api/v1/sitemask/a%00b", {}, None),
    ("GET", "/api/v1/jobs", None, {"site": "a\u0000b"}),
], ids=["in a body", "in the path", "in the query"])
def test_a_nul_character_is_refused(client: Api, operator_token: str, method: str, path: str,
                                    body: Any, query: dict[str, str] | None) -> None:
    """No text may hold U+0000 (PostgreSQL cannot store it): a 422 naming where, on every
    database."""
    response = client.call(method, path, operator_token, json_body=body, query=query)
    assert_problem(response, 422, "NUL")


@pytest.mark.parametrize("resource", [
    {"vo": VO, "pilot_reference": PILOT_REF, "site": SITE, "note": {"deep": ["x", "a\u0000"]}},
    {"vo": VO, "pilot_reference": PILOT_REF, "site": SITE, "no\u0000te": 1},
], ids=["in a nested value", "in a key"])
def test_a_nul_character_anywhere_in_a_match_body_is_refused(
        client: Api, pilot_token: str, resource: dict[str, Any]) -> None:
    response = client.call("POST", "/api/v1/pilots/match", pilot_token,
                           json_body={"resource": resource})
    assert_problem(response, 422, "NUL")


def test_an_escaped_backslash_before_u0000_is_no_nul(client: Api, pilot_token: str) -> None:
    """The text \\u0000 in JSON is a backslash followed by "u0000", not U+0000."""
    response = client.call("POST", "/api/v1/pilots/match", pilot_token, json_body={
        "resource": {"vo": VO, "pilot_reference": PILOT_REF, "site": SITE,
                     "note": "\\u0000"}})
    assert response.status_code == 200, response.get_data(as_text=True)


def test_a_pilot_cannot_be_named_like_an_endpoint(client: Api, pilot_token: str) -> None:
    response = client.call("PUT", "/api/v1/pilots/match", pilot_token,
                           json_body={"site": SITE, "ce": "ce", "queue": "q",
                                      "status": "Running"})
    assert_problem(response, 422, "another endpoint")


def test_the_largest_id_is_a_valid_after(client: Api, user_token: str) -> None:
    answer = client.ok("GET", "/api/v1/jobs", user_token, query={"after": 2**63 - 1})
    assert answer["jobs"] == []
    assert_problem(client.call("GET", "/api/v1/jobs", user_token, query={"after": 2**63}),
                   400, "after")


def test_banning_a_site_the_resources_file_does_not_know_is_refused(
        client: Api, operator_token: str) -> None:
    assert_problem(client.call("PUT", "/api/v1/sitemask/LCG.NOPE.xx", operator_token,
                               json_body={}), 422, "LCG.NOPE.xx", "not in the resources file")
    assert_problem(client.call("PUT", "/api/v1/sitemask/LCG.CERN.ch", operator_token,
                               json_body={}), 422, "did you mean LCG.CERN.cern")
    assert client.ok("GET", "/api/v1/sitemask", operator_token)["banned"] == []
