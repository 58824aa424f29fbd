"""The OpenAPI document and the service agree on requests the fuzzing found them to disagree
on: what the document allows, the service does; what the service refuses, the document does
not allow (a queue and a resource at once, an empty time, U+0000 in a query, an integer
beyond 64 bits in a query)."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from tests.api.helpers import Api

NUL = "a\u0000b"
JOB_QUEUE = "LCG.CERN.cern/ce503.cern.ch/condor"
RESOURCE = {"vo": "lhcb", "site": "LCG.CERN.cern"}

#: (who, method, the document's path, the path asked, query, JSON body, the document allows it)
CASES = [pytest.param(*case, id=name) for name, *case in [
    ("explain a queue", "user", "POST", "/api/v1/taskqueues/explain",
     "/api/v1/taskqueues/explain", None, {"job_id": 0, "queue": JOB_QUEUE}, True),
    ("explain a resource", "user", "POST", "/api/v1/taskqueues/explain",
     "/api/v1/taskqueues/explain", None, {"job_id": 0, "resource": RESOURCE}, True),
    ("explain a queue and a resource", "user", "POST", "/api/v1/taskqueues/explain",
     "/api/v1/taskqueues/explain", None,
     {"job_id": 0, "queue": JOB_QUEUE, "resource": RESOURCE}, False),
    ("jobs since a time", "user", "GET", "/api/v1/jobs", "/api/v1/jobs",
     {"since": "2026-11-23T08:00:00Z"}, None, True),
    ("jobs since nothing", "user", "GET", "/api/v1/jobs", "/api/v1/jobs", {"since": ""}, None,
     False),
    ("summary since nothing", "user", "GET", "/api/v1/jobs/summary", "/api/v1/jobs/summary",
     {"since": ""}, None, False),
    ("jobs of a site with NUL", "user", "GET", "/api/v1/jobs", "/api/v1/jobs", {"site": NUL},
     None, False),
    ("submit pools of a CE with NUL", "operator", "GET", "/api/v1/pilots/submitpools",
     "/api/v1/pilots/submitpools", {"site": "LCG.CERN.cern", "ce": NUL, "queue": "condor"},
     None, False),
    ("a page of 2^63 jobs", "user", "GET", "/api/v1/jobs", "/api/v1/jobs",
     {"limit": str(2**63)}, None, False),
    ("a page of 2^63-1 jobs", "user", "GET", "/api/v1/jobs", "/api/v1/jobs",
     {"limit": str(2**63 - 1)}, None, True),
]]


def _allowed(document: dict[str, Any], method: str, path: str, query: dict[str, str] | None,
             body: Any) -> bool:
    """Whether the document allows the request (its query and JSON body)."""
    operation = document["paths"][path][method.lower()]
    checker = jsonschema.Draft4Validator.FORMAT_CHECKER
    for param in operation.get("parameters", []):
        if param["in"] == "query" and query is not None and param["name"] in query:
            value: Any = query[param["name"]]
            if param["schema"]["type"] == "integer":
                value = int(value)
            if not jsonschema.Draft4Validator(param["schema"], format_checker=checker
                                              ).is_valid(value):
                return False
    if body is not None:
        schema = operation["requestBody"]["content"]["application/json"]["schema"]
        return bool(jsonschema.Draft4Validator(schema, format_checker=checker).is_valid(body))
    return True


@pytest.mark.parametrize(("who", "method", "documented", "path", "query", "body", "allowed"),
                         CASES)
def test_the_document_allows_what_the_service_does(
        client: Api, user_token: str, operator_token: str, who: str, method: str,
        documented: str, path: str, query: dict[str, str] | None, body: Any,
        allowed: bool) -> None:
    token = user_token if who == "user" else operator_token
    if body is not None and "job_id" in body:
        body = {**body, "job_id": client.submit_jdl(user_token)[0]}
    document = client.ok("GET", "/api/v1/openapi.json")
    assert _allowed(document, method, documented, query, body) is allowed
    answer = client.call(method, path, token, query=query, json_body=body)
    assert (answer.status_code < 400) is allowed, answer.get_data(as_text=True)


LIMIT = {"site": "LCG.CERN.cern", "attribute": "job_type", "value": "User"}
#: More requests on which the document and the service agree.
MORE = [pytest.param(*case, id=name) for name, *case in [
    ("replicas at a storage element", "user", "GET", "/api/v1/replicas", "/api/v1/replicas",
     {"se": "CERN-DST"}, None, True),
    ("replicas at an empty storage element", "user", "GET", "/api/v1/replicas",
     "/api/v1/replicas", {"se": ""}, None, False),
    ("replicas of a relative LFN", "user", "GET", "/api/v1/replicas", "/api/v1/replicas",
     {"lfn": "relative/f"}, None, False),
    ("register a relative LFN", "operator", "POST", "/api/v1/replicas", "/api/v1/replicas",
     None, {"replicas": [{"lfn": "0", "se": "CERN-DST"}]}, False),
    ("register at a storage element with a space", "operator", "POST", "/api/v1/replicas",
     "/api/v1/replicas", None, {"replicas": [{"lfn": "/lhcb/f", "se": "CERN DST"}]}, False),
    ("register an LFN with a Unicode space", "operator", "POST", "/api/v1/replicas",
     "/api/v1/replicas", None, {"replicas": [{"lfn": "/lhcb/a\u0085b", "se": "CERN-DST"}]},
     False),
    ("remove LFNs with an empty component", "operator", "POST", "/api/v1/replicas/remove",
     "/api/v1/replicas/remove", None, {"lfns": ["/lhcb//f"]}, False),
    ("a limit of max_running", "operator", "POST", "/api/v1/limits", "/api/v1/limits", None,
     {**LIMIT, "max_running": 3}, True),
    ("a limit of matching_delay", "operator", "POST", "/api/v1/limits", "/api/v1/limits", None,
     {**LIMIT, "matching_delay": 3}, True),
    ("a limit of nothing", "operator", "POST", "/api/v1/limits", "/api/v1/limits", None,
     LIMIT, False),
]]


@pytest.mark.parametrize(("who", "method", "documented", "path", "query", "body", "allowed"),
                         MORE)
def test_more_requests_where_the_document_and_the_service_agree(
        client: Api, user_token: str, operator_token: str, who: str, method: str,
        documented: str, path: str, query: dict[str, str] | None, body: Any,
        allowed: bool) -> None:
    token = user_token if who == "user" else operator_token
    document = client.ok("GET", "/api/v1/openapi.json")
    assert _allowed(document, method, documented, query, body) is allowed
    answer = client.call(method, path, token, query=query, json_body=body)
    assert (answer.status_code < 400) is allowed, answer.get_data(as_text=True)


@pytest.mark.parametrize("over", [0, 1])
def test_the_document_says_the_largest_upload(client: Api, user_token: str, over: int) -> None:
    """Up to [sandboxes] max_upload_bytes, an upload is taken; beyond, 413, and the document
    does not allow it."""
    size = client.settings.sandboxes.max_upload_bytes + over
    body = {"checksum": "0" * 64, "size": size}
    document = client.ok("GET", "/api/v1/openapi.json")
    assert _allowed(document, "POST", "/api/v1/sandboxes", None, body) is (over == 0)
    answer = client.call("POST", "/api/v1/sandboxes", user_token, json_body=body)
    assert answer.status_code == (413 if over else 200), answer.get_data(as_text=True)
