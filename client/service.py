"""The matcher's HTTP API as the job submitter uses it: one method per call, answers as
decoded JSON, errors as :class:`ServiceError` carrying the problem's ``detail``."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import quote, urlsplit

import requests

import pilot.transfer as transfer
from pilot.protocol import API_PREFIX
from pilot.tls import causes

#: Most jobs one bulk request may name (the service's limit): larger lists are split.
BULK_CHUNK = 1000
#: Seconds a read (GET) waits out answers of 503 or 429 that say when to come back
#: (``Retry-After``: a database failing over, every matcher instance restarting) before
#: the service's answer is the error; and the longest single wait.
UNAVAILABLE_WAIT = 30.0
LONGEST_RETRY_AFTER = 10.0


class ServiceError(Exception):
    """The service refused or failed a request; ``status`` is its HTTP status (0: it could
    not be reached) and the message is the problem's detail."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        #: Seconds the service said to wait before asking again (None: it did not say).
        self.retry_after: float | None = None


class Service:
    """One user's view of a gridpilot matcher."""

    def __init__(self, url: str, token: str, *, timeout: float = 30.0,
                 session: requests.Session | None = None,
                 verify: str | bool | None = None,
                 unavailable_wait: float = UNAVAILABLE_WAIT) -> None:
        """``verify``: the CAs to trust for https (pilot.tls.trusted_cas); None leaves the
        session's. ``unavailable_wait``: see UNAVAILABLE_WAIT (0: no wait)."""
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.unavailable_wait = unavailable_wait
        self.http = session or requests.Session()
        if verify is not None:
            self.http.verify = verify
        self.http.headers["Authorization"] = f"Bearer {token}"
        self.http.headers["User-Agent"] = "gridpilot-client"

    # -- jobs ----------------------------------------------------------------------------

    def submit(self, text: str, fmt: str) -> dict[str, Any]:
        """Submit one description ("jdl" or "json"); the new jobs with their status."""
        media = "application/json" if fmt == "json" else "text/plain"
        answer = self.call("POST", "/jobs", data=text.encode("utf-8"),
                           headers={"Content-Type": f"{media}; charset=utf-8"})
        self._shaped(answer, "POST /jobs", jobs=list)
        for job in answer["jobs"]:
            self._shaped(job, "POST /jobs", job_id=int, status=str)
        return answer

    def job(self, job_id: int) -> dict[str, Any]:
        return self._shaped(self.call("GET", f"/jobs/{job_id}"), f"GET /jobs/{job_id}",
                            job_id=int, status=str)

    def output(self, job_id: int) -> dict[str, Any]:
        return self.call("GET", f"/jobs/{job_id}/output")

    def jobs(self, filters: Mapping[str, Any], *, newest_first: bool = True,
             page_size: int = 100, limit: int | None = None) -> Iterator[dict[str, Any]]:
        """The jobs the filters select, page after page, until ``limit`` (None: all)."""
        after: int | None = None
        given = 0
        while True:
            query = {k: v for k, v in filters.items() if v is not None}
            query["order"] = "desc" if newest_first else "asc"
            query["limit"] = page_size if limit is None else min(page_size, limit - given)
            if after is not None:
                query["after"] = after
            page = self._shaped(self.call("GET", "/jobs", params=query), "GET /jobs",
                                jobs=list)
            for job in page["jobs"]:
                self._shaped(job, "GET /jobs", job_id=int, status=str)
                yield job
                given += 1
                if limit is not None and given >= limit:
                    return
            after = page.get("next_after")
            if after is None:
                return

    def summary(self, filters: Mapping[str, Any]) -> dict[str, Any]:
        return self.call("GET", "/jobs/summary",
                         params={k: v for k, v in filters.items() if v is not None})

    def bulk(self, action: str, job_ids: Sequence[int], reason: str | None = None
             ) -> dict[str, list[dict[str, Any]]]:
        """kill, reschedule or delete many jobs, BULK_CHUNK per request; every job acted on,
        and every job refused with its reason."""
        out: dict[str, list[dict[str, Any]]] = {"jobs": [], "errors": []}
        ids = list(dict.fromkeys(job_ids))
        for start in range(0, len(ids), BULK_CHUNK):
            body: dict[str, Any] = {"job_ids": ids[start:start + BULK_CHUNK]}
            if reason:
                body["reason"] = reason
            answer = self._shaped(self.call("POST", f"/jobs/{action}", json=body),
                                  f"POST /jobs/{action}", jobs=list, errors=list)
            out["jobs"] += answer["jobs"]
            out["errors"] += answer["errors"]
        return out

    def explain(self, job_id: int, *, queue: str | None = None,
                resource: Mapping[str, Any] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"job_id": job_id}
        if queue is not None:
            body["queue"] = queue
        if resource is not None:
            body["resource"] = dict(resource)
        return self._shaped(self.call("POST", "/taskqueues/explain", json=body, reads=True),
                            "POST /taskqueues/explain", can_run=bool)

    def whoami(self) -> dict[str, Any]:
        return self._shaped(self.call("GET", "/whoami"), "GET /whoami", subject=str,
                            role=str, vo=str, group=str)

    # -- pilots --------------------------------------------------------------------------

    def pilot_log(self, reference: str) -> dict[str, Any]:
        return self.call("GET", f"/pilots/{quote(reference, safe='')}/log")

    def kill_pilot(self, reference: str) -> dict[str, Any]:
        return self.call("POST", f"/pilots/{quote(reference, safe='')}/kill")

    # -- the transport -------------------------------------------------------------------

    def call(self, method: str, path: str, *, reads: bool = False, **kwargs: Any
             ) -> dict[str, Any]:
        """One request to ``/api/v1`` + ``path``, all of it within the timeout and its answer
        at most MAX_ANSWER_BYTES; the decoded answer, or ServiceError. A read the service
        answers "unavailable, come back in N s" is sent again after N s, for up to
        ``unavailable_wait`` seconds in all (``reads``: a POST that only reads, too); a change
        never is: it may have been stored, and the caller looks before sending it again."""
        give_up = time.monotonic() + self.unavailable_wait
        while True:
            try:
                return self._call_once(method, path, **kwargs)
            except ServiceError as exc:
                wait = exc.retry_after
                if not (method == "GET" or reads) or wait is None \
                        or time.monotonic() + wait > give_up:
                    raise
            time.sleep(wait)

    def _call_once(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        try:
            try:
                response = transfer.request(self.http, method, self.url + API_PREFIX + path,
                                            deadline=self.timeout, **kwargs)
            except requests.ConnectionError as exc:
                if not _stale_connection(exc):
                    raise
                # The service closed a kept-alive connection as the request went out on it
                # (it had not read it): once more, on a new connection.
                response = transfer.request(self.http, method, self.url + API_PREFIX + path,
                                            deadline=self.timeout, **kwargs)
        except (transfer.TransferError, transfer.CertificateError) as exc:
            raise ServiceError(0, str(exc)) from exc
        except requests.RequestException as exc:
            raise ServiceError(0, f"cannot reach {self.url}: {_reason(exc, self.url)}") from exc
        if response.status_code >= 400:
            error = ServiceError(response.status_code, problem_detail(response))
            if response.status_code in (429, 503):
                error.retry_after = _retry_after(response)
            raise error
        try:
            data = response.json()
        except ValueError as exc:
            raise ServiceError(response.status_code,
                               f"{self.url} answered {method} {path} with something that is "
                               "not JSON: is this a gridpilot matcher?") from exc
        if not isinstance(data, dict):
            raise ServiceError(response.status_code, f"unexpected answer to {method} {path}")
        return data

    def _shaped(self, answer: dict[str, Any], what: str, **fields: type | tuple[type, ...]
                ) -> dict[str, Any]:
        """``answer``, once each of ``fields`` is there with its type (the items of a list
        field must be objects); ServiceError otherwise."""
        for name, kind in fields.items():
            value = answer.get(name)
            if not isinstance(value, kind) or (isinstance(value, bool) and kind is int) or (
                    isinstance(value, list) and not all(isinstance(v, dict) for v in value)):
                raise ServiceError(200, f"unexpected answer to {what} from {self.url}: "
                                   f"{name!r} is missing or not what a gridpilot service "
                                   "sends")
        return answer


def problem_detail(response: requests.Response) -> str:
    """What a problem+json answer says went wrong (its detail), or the status line."""
    try:
        data = response.json()
    except ValueError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("detail"), str):
        return str(data["detail"])
    text = response.text.strip()
    return f"HTTP {response.status_code} {response.reason}" + (f": {text[:200]}" if text
                                                               else "")


def _retry_after(response: requests.Response) -> float | None:
    """The seconds of a ``Retry-After: N`` header, at most LONGEST_RETRY_AFTER (None: no
    header, or a date, which gridpilot's services do not send)."""
    try:
        seconds = float(response.headers.get("Retry-After", ""))
    except ValueError:
        return None
    return min(max(seconds, 0.0), LONGEST_RETRY_AFTER) if seconds == seconds else None


def _stale_connection(exc: BaseException) -> bool:
    """Whether the connection was dropped by the other end under the request (a kept-alive
    connection the service closed), rather than refused or never made."""
    return any(isinstance(e, ConnectionResetError | BrokenPipeError)
               or type(e).__name__ == "RemoteDisconnected" for e in causes(exc))


def _reason(exc: requests.RequestException, url: str) -> str:
    if isinstance(exc, requests.Timeout):
        return "no answer in time"
    if any(isinstance(e, socket.gaierror) or type(e).__name__ == "NameResolutionError"
           for e in causes(exc)):
        return f"the name {urlsplit(url).hostname} does not resolve (is the URL right?)"
    if isinstance(exc, requests.ConnectionError):
        return "connection refused or no route (is the URL right and the service up?)"
    return f"{type(exc).__name__}: {exc}"
