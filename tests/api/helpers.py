"""Small builders shared by the API tests: requests with a token, job submission, matching."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flask.testing import FlaskClient
from werkzeug.test import TestResponse

from taskqueue.core.settings import Settings

PROBLEM = "application/problem+json"
VO = "lhcb"
OTHER_VO = "belle"
GROUP = "lhcb_user"
SITE = "LCG.CERN.cern"
OTHER_SITE = "LCG.CNAF.it"
PILOT_REF = "pilot-1"
HELLO_JDL = 'Executable = "/bin/hostname";'


def bearer(token: str | None) -> dict[str, str]:
    return {} if token is None else {"Authorization": f"Bearer {token}"}


@dataclass(frozen=True)
class Api:
    """The Flask test client of one app, with the settings it was built from."""

    client: FlaskClient
    settings: Settings
    secret: str

    def call(self, method: str, path: str, token: str | None = None, *,
             json_body: Any = None, text: str | None = None, data: bytes | None = None,
             content_type: str | None = None,
             query: Mapping[str, str | int] | None = None) -> TestResponse:
        """One request; ``json_body`` is sent as application/json, ``text`` as text/plain."""
        kwargs: dict[str, Any] = {"headers": bearer(token)}
        if query is not None:
            kwargs["query_string"] = dict(query)
        if json_body is not None:
            kwargs["data"] = json.dumps(json_body)
            kwargs["content_type"] = content_type or "application/json"
        elif text is not None:
            kwargs["data"] = text.encode("utf-8")
            kwargs["content_type"] = content_type or "text/plain"
        elif data is not None:
            kwargs["data"] = data
            if content_type is not None:
                kwargs["content_type"] = content_type
        elif content_type is not None:
            kwargs["content_type"] = content_type
        return self.client.open(path, method=method, **kwargs)

    def ok(self, method: str, path: str, token: str | None = None, *, status: int = 200,
           **kwargs: Any) -> Any:
        """The decoded JSON answer of a request that must answer ``status``."""
        response = self.call(method, path, token, **kwargs)
        assert response.status_code == status, (
            f"{method} {path}: {response.status_code} {response.get_data(as_text=True)}")
        return response.get_json()

    # -- jobs --------------------------------------------------------------------------------

    def submit_jdl(self, token: str, jdl: str = HELLO_JDL) -> list[int]:
        answer = self.ok("POST", "/api/v1/jobs", token, status=201, text=jdl)
        ids: list[int] = answer["job_ids"]
        return ids

    def submit_json(self, token: str, body: Any) -> list[int]:
        answer = self.ok("POST", "/api/v1/jobs", token, status=201, json_body=body)
        ids: list[int] = answer["job_ids"]
        return ids

    def job(self, token: str, job_id: int) -> dict[str, Any]:
        answer: dict[str, Any] = self.ok("GET", f"/api/v1/jobs/{job_id}", token)
        return answer

    # -- pilots ------------------------------------------------------------------------------

    def match(self, token: str, count: int | None = None, **resource: Any) -> dict[str, Any]:
        resource.setdefault("vo", VO)
        body: dict[str, Any] = {"resource": resource}
        if count is not None:
            body["count"] = count
        answer: dict[str, Any] = self.ok("POST", "/api/v1/pilots/match", token,
                                         json_body=body)
        return answer

    def report(self, token: str, job_id: int, status: str, reference: str = PILOT_REF,
               **extra: Any) -> TestResponse:
        return self.call("POST", f"/api/v1/pilots/jobs/{job_id}/status", token,
                         json_body={"pilot_reference": reference, "status": status, **extra})


def assert_problem(response: TestResponse, status: int, *fragments: str) -> dict[str, Any]:
    """The response is an RFC 9457 problem with ``status`` whose detail holds ``fragments``."""
    text = response.get_data(as_text=True)
    assert response.status_code == status, f"{response.status_code} {text}"
    assert response.mimetype == PROBLEM, f"{response.content_type}: {text}"
    body = json.loads(text)
    assert isinstance(body, dict)
    assert body["status"] == status
    detail = body.get("detail")
    assert isinstance(detail, str) and detail.strip(), body
    for fragment in fragments:
        assert fragment in detail, f"{fragment!r} not in {detail!r}"
    return body
