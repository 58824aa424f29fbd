"""/healthz, /metrics and the OpenAPI document, on every database."""

from __future__ import annotations

import re
import secrets
import socket
from dataclasses import replace

from flask import Flask

from matcher.api import OPERATIONS
from matcher.app import create_app
from matcher.openapi import openapi_path
from matcher.runtime import runtime_of
from taskqueue.core.settings import DatabaseSettings, Settings
from tests.api.helpers import PILOT_REF, SITE, Api, assert_problem

IGNORED_METHODS = {"HEAD", "OPTIONS"}
SAMPLE = re.compile(r"^(?P<name>[a-z_]+)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$")


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """The samples of a Prometheus text exposition (every line not a comment must parse)."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        found = SAMPLE.match(line)
        assert found, f"not a Prometheus sample: {line!r}"
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', found["labels"] or ""))
        out.append((found["name"], labels, float(found["value"])))
    return out


def value(rows: list[tuple[str, dict[str, str], float]], name: str, **labels: str) -> float:
    found = [v for n, ls, v in rows if n == name and all(ls.get(k) == x
                                                         for k, x in labels.items())]
    assert found, f"no sample {name} {labels}"
    return sum(found)


def test_healthz_needs_no_token(client: Api) -> None:
    response = client.call("GET", "/healthz")
    assert response.status_code == 200
    assert response.get_json() == {"status": "ok", "database": "ok"}


def test_metrics(client: Api, user_token: str, operator_token: str,
                 site_pilot_token: str) -> None:
    client.submit_jdl(user_token)
    client.submit_jdl(user_token)
    client.submit_jdl(user_token, 'Executable = "x"; CPUTime = 100;')
    assert len(client.match(site_pilot_token, pilot_reference=PILOT_REF, cpu_time=10**6,
                            platform="ANY")["jobs"]) == 1
    assert client.match(site_pilot_token, pilot_reference=PILOT_REF,
                        cpu_time=1)["no_match"]["reason"] == "no_matching_job"
    client.ok("PUT", f"/api/v1/sitemask/{SITE}", operator_token, json_body={})
    assert client.match(site_pilot_token, pilot_reference=PILOT_REF)["no_match"][
        "reason"] == "site_banned"
    client.call("GET", "/api/v1/jobs/999999", user_token)

    response = client.call("GET", "/metrics", operator_token)
    assert response.status_code == 200
    assert response.mimetype == "text/plain"
    text = response.get_data(as_text=True)
    rows = samples(text)
    assert value(rows, "gridpilot_http_requests_total", endpoint="/api/v1/jobs",
                 method="POST", status="201") == 3
    assert value(rows, "gridpilot_http_requests_total",
                 endpoint="/api/v1/jobs/<int:job_id>", status="404") == 1
    assert value(rows, "gridpilot_no_matches_total", reason="no_matching_job") == 1
    assert value(rows, "gridpilot_no_matches_total", reason="site_banned") == 1
    assert value(rows, "gridpilot_jobs_matched_total") == 1
    waiting = [(ls, v) for n, ls, v in rows if n == "gridpilot_waiting_jobs"]
    # The match drew one of the two queues (the draw is unbiased): 2 + 1 jobs, one taken.
    assert sorted(v for _, v in waiting) in ([1, 1], [2])
    assert all(ls["vo"] == "lhcb" and ls["owner_group"] == "lhcb_user" for ls, _ in waiting)
    assert "# TYPE gridpilot_http_request_duration_seconds histogram" in text
    assert "# TYPE gridpilot_http_requests_total counter" in text
    match = {"endpoint": "/api/v1/pilots/match"}
    count = value(rows, "gridpilot_http_request_duration_seconds_count", **match)
    assert count == 3
    assert value(rows, "gridpilot_http_request_duration_seconds_bucket", le="+Inf",
                 **match) == count
    buckets = [(ls["le"], v) for n, ls, v in rows
               if n == "gridpilot_http_request_duration_seconds_bucket"
               and ls.get("endpoint") == match["endpoint"]]
    assert len(buckets) > 2
    counts = [v for _, v in buckets]
    assert counts == sorted(counts)  # cumulative
    assert value(rows, "gridpilot_http_request_duration_seconds_sum", **match) >= 0
    assert value(rows, "gridpilot_database_up") == 1


def test_metrics_say_when_the_database_does_not_answer(api_settings: Settings) -> None:
    """A scrape while the database is unreachable still answers, with the workers' counts and
    gridpilot_database_up 0: Prometheus tells a dead database from a dead service."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # nothing listens there once the socket is closed
    token = secrets.token_urlsafe(32)
    settings = replace(api_settings, database=DatabaseSettings(
        url=f"postgresql+psycopg://postgres@127.0.0.1:{closed}/gone", connect_timeout=1),
                       matcher=replace(api_settings.matcher, metrics_token=token))
    app = create_app(settings)
    try:
        http = app.test_client()
        assert http.get("/healthz").status_code == 503
        answer = http.get("/metrics", headers={"Authorization": "Bearer " + token})
        assert answer.status_code == 200
        rows = samples(answer.get_data(as_text=True))
        assert value(rows, "gridpilot_database_up") == 0
        assert value(rows, "gridpilot_http_requests_total", endpoint="/healthz",
                     status="503") == 1
        assert not [n for n, _, _ in rows if n == "gridpilot_waiting_jobs"]
    finally:
        runtime_of(app).dispose()


def test_metrics_count_requests_across_scrapes(client: Api, operator_token: str) -> None:
    client.call("GET", "/healthz")
    first = value(samples(client.call("GET", "/metrics", operator_token).get_data(
        as_text=True)), "gridpilot_http_requests_total", endpoint="/healthz")
    client.call("GET", "/healthz")
    client.call("GET", "/healthz")
    second = value(samples(client.call("GET", "/metrics", operator_token).get_data(
        as_text=True)), "gridpilot_http_requests_total", endpoint="/healthz")
    assert (first, second) == (1, 3)


def test_metrics_needs_an_operator(client: Api, user_token: str, pilot_token: str) -> None:
    assert_problem(client.call("GET", "/metrics"), 401)
    assert_problem(client.call("GET", "/metrics", user_token), 403, "operator")
    assert_problem(client.call("GET", "/metrics", pilot_token), 403, "operator")


def test_every_route_is_in_the_openapi_document(app: Flask, client: Api) -> None:
    response = client.call("GET", "/api/v1/openapi.json")
    assert response.status_code == 200
    doc = response.get_json()
    assert isinstance(doc["openapi"], str) and doc["openapi"].startswith("3.")
    paths = doc["paths"]
    checked = 0
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static" or rule.endpoint.startswith("ui."):
            continue  # the dashboard's web pages are not part of the HTTP API
        path = openapi_path(rule.rule)
        assert path in paths, f"{rule.rule} ({rule.endpoint}) is not documented"
        methods = set(rule.methods or ()) - IGNORED_METHODS
        assert methods, rule.rule
        for method in methods:
            assert method.lower() in paths[path], f"{method} {rule.rule} is not documented"
            checked += 1
    assert checked >= len(OPERATIONS)


def test_every_documented_operation_is_served(app: Flask, client: Api) -> None:
    doc = client.call("GET", "/api/v1/openapi.json").get_json()
    served = {(openapi_path(r.rule), m.lower()) for r in app.url_map.iter_rules()
              if r.endpoint != "static" and not r.endpoint.startswith("ui.")
              for m in (r.methods or ()) if m not in IGNORED_METHODS}
    documented = {(p, m) for p, ops in doc["paths"].items() for m in ops}
    assert documented == served


def test_every_operation_has_responses(client: Api) -> None:
    doc = client.call("GET", "/api/v1/openapi.json").get_json()
    ids = []
    for path, operations in doc["paths"].items():
        for method, op in operations.items():
            assert op.get("responses"), f"{method} {path} documents no response"
            codes = set(op["responses"])
            assert any(c.startswith("2") for c in codes), f"{method} {path}"
            for code, answer in op["responses"].items():
                assert answer.get("description"), f"{method} {path} {code}"
            ids.append(op["operationId"])
            assert op.get("summary"), f"{method} {path}"
            for param in op.get("parameters", []):
                if param["in"] == "path":
                    assert "{" + param["name"] + "}" in path
    assert len(ids) == len(set(ids)), "operationIds must be unique"


def test_secured_operations_document_401_and_403(client: Api) -> None:
    doc = client.call("GET", "/api/v1/openapi.json").get_json()
    for op in OPERATIONS:
        documented = doc["paths"][openapi_path(op.rule)][op.method.lower()]
        codes = set(documented["responses"])
        if op.roles is None:
            assert documented["security"] == []
        else:
            assert {"401", "403"} <= codes, f"{op.method} {op.rule}"
            assert all(role in documented["description"] for role in op.roles)
        if op.body is not None:
            assert set(documented["requestBody"]["content"]) == set(op.body)


def test_the_document_and_the_service_agree_on_limits(client: Api, user_token: str) -> None:
    doc = client.call("GET", "/api/v1/openapi.json").get_json()
    upload = doc["paths"]["/api/v1/sandboxes/{sandbox_id}"]["put"]
    (param,) = [p for p in upload["parameters"] if p["name"] == "sandbox_id"]
    most = param["schema"]["maxLength"]
    assert most == 80
    assert "414" in upload["responses"] and "413" in upload["responses"]
    longer = "sb:sha256:" + "a" * (most - 9)
    assert_problem(client.call("GET", f"/api/v1/sandboxes/{longer}", user_token), 422,
                   f"at most {most}")
    start = doc["paths"]["/api/v1/sandboxes"]["post"]
    body = start["requestBody"]["content"]["application/json"]["schema"]
    assert body["properties"]["checksum"]["pattern"] == "^[0-9a-f]{64}$"


def test_allow_names_only_documented_methods(client: Api, user_token: str) -> None:
    doc = client.call("GET", "/api/v1/openapi.json").get_json()
    response = client.call("DELETE", "/api/v1/whoami", user_token)
    assert response.status_code == 405
    allowed = {m.strip().lower() for m in response.headers["Allow"].split(",")}
    assert allowed == set(doc["paths"]["/api/v1/whoami"])


def test_the_document_says_texts_hold_no_nul_as_the_service_does(client: Api,
                                                                  user_token: str) -> None:
    doc = client.call("GET", "/api/v1/openapi.json").get_json()
    explain = doc["paths"]["/api/v1/taskqueues/explain"]["post"]
    queue = explain["requestBody"]["content"]["application/json"]["schema"]["properties"][
        "queue"]
    assert re.fullmatch(queue["pattern"], "condor") and not re.search(queue["pattern"],
                                                                      "con\x00dor")
    assert_problem(client.call("POST", "/api/v1/taskqueues/explain", user_token,
                               json_body={"job_id": 1, "queue": "con\x00dor"}), 422, "NUL")
    (reference,) = doc["paths"]["/api/v1/pilots/{reference}/log"]["get"]["parameters"]
    assert reference["schema"]["pattern"] == queue["pattern"]
