"""The pilot's side of the matcher's HTTP API (paths and payloads in pilot.protocol).

Every call either returns the answer or raises :class:`TransientError` (the matcher cannot be
reached, gave no complete answer within the timeout, answered 5xx/429, or answered something
that cannot be read: try again later) or :class:`RefusedError` (a 4xx: the
request itself is wrong or not allowed; trying again will not help). Back-off is the caller's,
with :class:`Backoff`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import requests

from pilot import protocol, transfer
from pilot.protocol import JobPayload

T = TypeVar("T")


class MatcherError(Exception):
    """A call to the matcher did not succeed."""


class TransientError(MatcherError):
    """The matcher could not answer now; the same call may succeed later. ``unreadable``: it
    answered, but not with anything the pilot can read (a broken or wrong server)."""

    def __init__(self, message: str, *, unreadable: bool = False) -> None:
        super().__init__(message)
        self.unreadable = unreadable


class RefusedError(MatcherError):
    """The matcher refused the call (4xx); ``status`` and ``detail`` say why."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"{status}: {detail}")
        self.status = status
        self.detail = detail


@dataclass(frozen=True)
class MatchAnswer:
    jobs: list[JobPayload]
    reason: str | None = None
    detail: str = ""
    #: The first token of each job's payload the answer carried, by job id.
    tokens: dict[int, str] = field(default_factory=dict)


class MatcherClient:
    def __init__(self, base_url: str, token: str, *, timeout: float = 30.0,
                 session: requests.Session | None = None,
                 verify: str | bool | None = None) -> None:
        """``verify``: the CAs to trust for https (pilot.tls.trusted_cas); None leaves the
        session's."""
        self.api = base_url.rstrip("/") + protocol.API_PREFIX
        self.timeout = timeout
        self.http = session or requests.Session()
        if verify is not None:
            self.http.verify = verify
        self.http.headers["Authorization"] = f"Bearer {token}"
        #: Whether the matcher ever gave this client an answer it could read (even a
        #: refusal), and why the last call that could not reach it failed.
        self.reached = False
        self.last_failure = ""
        self.last_failure_unreadable = False
        #: time.monotonic() of the first call that failed since the last readable answer
        #: (None while the last call was answered): how long the matcher has been silent.
        self.failing_since: float | None = None

    def match(self, resource: Mapping[str, Any], count: int = 1) -> MatchAnswer:
        def read(answer: dict[str, Any]) -> MatchAnswer:
            if not isinstance(answer["jobs"], list):
                raise ValueError("jobs is not a list")
            jobs = [JobPayload.from_dict(job) for job in answer["jobs"]]
            no_match = answer.get("no_match") or {}
            if not isinstance(no_match, dict):
                raise ValueError("no_match is not an object")
            tokens = {}
            for job, data in zip(jobs, answer["jobs"], strict=True):
                token = _first_token_of(data.get("token"))
                if token is not None:
                    tokens[job.job_id] = token
            return MatchAnswer(jobs, no_match.get("reason"), str(no_match.get("detail", "")),
                               tokens)

        return self._call("POST", protocol.MATCH_PATH, read,
                          {"resource": dict(resource), "count": count})

    def heartbeat(self, reference: str, beats: Sequence[Mapping[str, Any]]) -> dict[int, str]:
        """Commands by job id; the pilot's own (see protocol.WHOLE_PILOT) under key 0."""
        def read(answer: dict[str, Any]) -> dict[int, str]:
            commands = {int(c["job_id"]): str(c["command"]) for c in answer.get("commands", [])}
            if answer.get("pilot_command"):
                commands[protocol.WHOLE_PILOT] = str(answer["pilot_command"])
            return commands

        return self._call("POST", protocol.HEARTBEAT_PATH, read,
                          {"pilot_reference": reference, "jobs": list(beats)})

    def report(self, job_id: int, body: Mapping[str, Any]) -> str:
        return self._call("POST", protocol.JOB_STATUS_PATH.format(job_id=job_id),
                          lambda answer: str(answer.get("status", "")), dict(body))

    def submit_pools(self, site: str, ce: str, queue: str) -> list[str]:
        def read(answer: dict[str, Any]) -> list[str]:
            pools = answer["submit_pools"]
            if not isinstance(pools, list) or not all(isinstance(p, str) for p in pools):
                raise ValueError("submit_pools is not a list of names")
            return pools

        return self._call("GET", protocol.SUBMIT_POOLS_PATH, read,
                          params={"site": site, "ce": ce, "queue": queue})

    def start_upload(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST /sandboxes: whether the sandbox is stored already, or where to send it."""
        return self._call("POST", protocol.SANDBOXES_PATH, dict, dict(body))

    def register(self, reference: str, *, site: str, ce: str, queue: str, status: str,
                 isolation: str | None = None) -> None:
        """``isolation``: how its payloads are isolated ("bwrap 0.8.0", "none")."""
        body = {"site": site, "ce": ce, "queue": queue, "status": status}
        path = protocol.PILOT_PATH.format(reference=reference)
        if isolation:
            try:
                self._call("PUT", path, lambda answer: None, {**body, "isolation": isolation})
                return
            except RefusedError as exc:  # a matcher older than the field: without it
                if exc.status not in (400, 422):
                    raise
        self._call("PUT", path, lambda answer: None, body)

    def renew_token(self, reference: str) -> str:
        """The pilot's successor token, asked for with the current one."""
        return self._call("POST", protocol.TOKEN_PATH.format(reference=reference), _token_of)

    def payload_token(self, job_id: int, reference: str, *,
                      deadline: float | None = None) -> str:
        """A token for the payload of ``job_id``, for its owner (``deadline``: seconds for
        the exchange, when shorter than the client's own)."""
        return self._call("POST", protocol.PAYLOAD_TOKEN_PATH.format(job_id=job_id), _token_of,
                          {"pilot_reference": reference}, deadline=deadline)

    def use_token(self, token: str) -> None:
        """Send ``token`` with every request from now on."""
        self.http.headers["Authorization"] = f"Bearer {token}"

    def _call(self, method: str, path: str, read: Callable[[dict[str, Any]], T],
              body: Mapping[str, Any] | None = None,
              params: Mapping[str, str] | None = None, *,
              deadline: float | None = None) -> T:
        """The answer to one call, as ``read`` makes it of the decoded JSON object. The
        matcher counts as reached only once an answer could be read (a refusal included)."""
        try:
            data = self._request(method, path, body, params, deadline)
            try:
                result = read(data)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise TransientError(f"{method} {path}: the answer cannot be read: "
                                     f"{type(exc).__name__}: {exc}", unreadable=True) from exc
        except TransientError as exc:
            self.last_failure = str(exc)
            self.last_failure_unreadable = exc.unreadable
            if self.failing_since is None:
                self.failing_since = time.monotonic()
            raise
        except RefusedError:
            self.reached, self.failing_since = True, None
            raise
        self.reached, self.failing_since = True, None
        return result

    def _request(self, method: str, path: str, body: Mapping[str, Any] | None,
                 params: Mapping[str, str] | None,
                 deadline: float | None = None) -> dict[str, Any]:
        wait = self.timeout if deadline is None else min(deadline, self.timeout)
        try:
            response = transfer.request(self.http, method, self.api + path, json=body,
                                        params=params, deadline=wait)
        except transfer.InterruptedTransferError as exc:  # the pilot is stopping
            raise TransientError(str(exc)) from exc
        except transfer.TransferError as exc:  # it answered, too slowly, too much or away
            raise TransientError(f"{type(exc).__name__}: {exc}", unreadable=True) from exc
        except transfer.CertificateError as exc:  # the message says why and what to do
            raise TransientError(f"{method} {path}: {exc}") from exc
        except requests.RequestException as exc:
            raise TransientError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 500 or response.status_code == 429:
            raise TransientError(f"{method} {path}: {response.status_code} "
                                 f"{problem_detail(response)}")
        if response.status_code >= 400:
            raise RefusedError(response.status_code, problem_detail(response))
        try:
            data = response.json()
        except ValueError as exc:
            raise TransientError(f"{method} {path}: the answer is not JSON",
                                 unreadable=True) from exc
        if not isinstance(data, dict):
            raise TransientError(f"{method} {path}: the answer is not a JSON object",
                                 unreadable=True)
        return data


def _first_token_of(given: Any) -> str | None:
    """The payload's first token a job of the match answer carries, or None (none there, or
    not one: the pilot then asks the token endpoint for it)."""
    if not isinstance(given, dict):
        return None
    try:
        return _token_of(given)
    except (KeyError, ValueError):
        return None


def _token_of(answer: dict[str, Any]) -> str:
    """The signed token an answer carries (a pilot's or a payload's)."""
    token = answer["token"]
    if not isinstance(token, str) or token.count(".") != 2 or len(token) > 16384:
        raise ValueError("token is not a signed token")
    return token


def problem_detail(response: requests.Response) -> str:
    """What an error answer says: its problem ``detail``, else the start of its text."""
    try:
        data = response.json()
    except ValueError:
        return response.text[:200]
    if isinstance(data, dict) and "detail" in data:
        return str(data["detail"])
    return response.text[:200]


class Backoff:
    """Exponential back-off with full jitter: the n-th delay is uniform in
    [0, min(cap, base * 2^n)], so many pilots that failed together do not retry together."""

    def __init__(self, base: float = 1.0, cap: float = 60.0,
                 rng: random.Random | None = None) -> None:
        self.base, self.cap = base, cap
        self.failures = 0
        self.rng = rng or random.Random()

    def next_delay(self) -> float:
        delay = self.rng.uniform(0, min(self.cap, self.base * 2 ** self.failures))
        self.failures = min(self.failures + 1, 30)
        return max(delay, self.base / 10)

    def reset(self) -> None:
        self.failures = 0
