"""A client of an ARC-CE's REST interface (A-REX 6: REST 1.0; A-REX 7: 1.0 and 1.1): pilots
submitted in bulk, their states in one request, kill, clean, files into and out of their
session directories, and the X.509 delegation a proxy-authenticated client keeps on the CE.

Standard library, ``requests`` and ``cryptography`` only: the CE layer of the site director
builds on it, and it knows nothing of gridpilot's database.

Credentials. A client authenticates with a bearer token (a WLCG-profile JWT, read from its file
again whenever the file changes; one that expired, or whose audience is not this CE, is refused
before it is sent; one near its end that the file has not replaced is warned about,
:meth:`ArcRestClient.credential_warning`) or with an X.509 proxy file (TLS client certificate),
or with both: the token authenticates, the proxy is delegated (mode "both", for sites whose
jobs need a proxy for their data beside the token). A CE keeps jobs per identity: the jobs
submitted with a token (identity "issuer/subject") are not the jobs of a proxy (its certificate
subject), so one CE is always spoken to with one identity. A-REX 6.17 given both a TLS client
certificate and a bearer token maps the certificate and ignores the token: in mode "both" the
client therefore never presents the proxy in TLS; it signs the delegation with it, which A-REX
keeps under the token's identity like any other delegation.

Delegation. A job's delegated credential is what the CE (and the job) use on the submitter's
behalf, for data staging. With a proxy the client keeps one delegation per identity on the CE
(:meth:`ArcRestClient.keep_delegation`): it adopts the one the CE already holds for the
identity that ends last (another process's), removes the others, makes one (the CE sends a
certificate request, the client signs it with the proxy) only when none is valid, names it in
every job it submits, renews it by time whether or not it submits, and as soon as the proxy
file changes (a renewed proxy), and finds or makes another when the CE has lost it; a
submission refused because of its delegation is retried once with a new one. The same holds in
mode "both", under the token's identity. With a token alone no delegation is made (there is no
proxy to sign one; the pilots stage no data through the CE).

States. :data:`PILOT_STATUS` maps every ARC REST state to the project's pilot statuses; a job
the CE does not know (never had, or forgot) reads :data:`UNKNOWN` and maps to Lost. A job's
state in an answer to :meth:`ArcRestClient.statuses` with ids is what the CE's information
provider last saw (it refreshes every minute by default: a change shows up that much later,
and tells a job the batch system queues, QUEUING, from one it runs); the listing of all jobs
(``statuses(None)``) is the job manager's state now, where a job in the batch system reads
RUNNING whether it runs or waits there. :meth:`ArcRestClient.infos` gives, in one request for
many jobs, the information provider's record of each (GLUE2 ComputingActivity): its state
with its exit code and the CE's reason for a failure, which an ended job needs.

Answers of A-REX 6.17 to know about: a list of one element comes as the element itself, an
empty list as an empty body; errors carry their message in the HTTP reason phrase, not in the
body; per-job results carry their own "status-code" as a string.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import re
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import quote, urlsplit

import requests
from cryptography import x509

from agents.ce import adl, exchange
from agents.ce.base import CELoad, CELoads
from agents.ce.budget import TurnBudget
from agents.ce.reasons import innermost
from agents.ce.x509proxy import CredentialError, load_credential, sign_proxy_request

log = logging.getLogger(__name__)

#: A job the CE does not know: never submitted there, or forgotten (cleaned, wiped, lost).
UNKNOWN = "UNKNOWN"

#: Every state of A-REX's REST interface, and the pilot status it means. Before the batch
#: system has the job (ACCEPTING to SUBMITTING) it is Submitted; queued or held there,
#: Waiting: both count against a queue's cap of waiting pilots, so a CE that does not start
#: pilots stops getting new ones. A job that ended in the batch system but whose session the
#: CE still finishes (EXECUTED, FINISHING), or that is being killed, still runs: a pilot
#: status never moves back, so the final one waits for the CE's final state.
PILOT_STATUS: dict[str, str] = {
    "ACCEPTING": "Submitted",    # A-REX has the description (job manager: ACCEPTED)
    "ACCEPTED": "Submitted",     # ... and waits (for the client's input files, or a limit)
    "PREPARING": "Submitted",    # staging input data in
    "PREPARED": "Submitted",     # staged in, waiting for a submission slot
    "SUBMITTING": "Submitted",   # being handed to the batch system
    "QUEUING": "Waiting",        # in the batch system's queue
    "HELD": "Waiting",           # held in the batch system
    "RUNNING": "Running",        # running in the batch system
    "EXITINGLRMS": "Running",    # ending in the batch system
    "OTHER": "Running",          # in the batch system, in a state A-REX does not name
    "EXECUTED": "Running",       # out of the batch system, waiting to be finished
    "FINISHING": "Running",      # staging output data out
    "KILLING": "Running",        # being killed
    "FINISHED": "Done",          # ended; its exit code is the pilot's business
    "FAILED": "Failed",          # failed (its reason: diagnose(job, "failed"))
    "KILLED": "Aborted",         # killed on request
    "WIPED": "Lost",             # its session is gone: how it ended is not known any more
    UNKNOWN: "Lost",             # the CE does not know it
}
#: The states a job may hang in before it runs, by kind of wait (agents.ce.base): A-REX's own
#: steps (a stopped job manager keeps a job ACCEPTING for ever), held and queued in the batch
#: system.
WAITING_KINDS: dict[str, str] = {
    "ACCEPTING": "stage", "ACCEPTED": "stage", "PREPARING": "stage", "PREPARED": "stage",
    "SUBMITTING": "stage", "HELD": "held", "QUEUING": "queued"}
#: The states a job ends in.
FINAL_STATES = frozenset({"FINISHED", "FAILED", "KILLED", "WIPED", UNKNOWN})

#: The files A-REX keeps about a job in its control directory (REST: jobs/ID/diagnose/NAME).
DIAGNOSE_FILES = ("failed", "errors", "diag", "description", "local", "comment", "status",
                  "acl", "xml", "input", "output", "input_status", "output_status",
                  "statistics")

#: A delegation is renewed when it has less than this left, or less than half its life.
RENEW_BEFORE = timedelta(hours=1)
#: The WLCG token profile's audience of any service.
WLCG_ANY_AUDIENCE = "https://wlcg.cern.ch/jwt/v1/any"
#: A token is near its end, and warned about, with less than this left ...
TOKEN_WARN_SECONDS = 300
#: ... or less than this share of its life (``exp - iat``) left.
TOKEN_WARN_SHARE = 0.1
#: A-REX's reason for a credential it authenticated but could map to no authgroup.
UNMAPPED = "User can't be assigned configuration"
#: The longest delegation asked for (never longer than the proxy it comes from).
DELEGATION_LIFETIME = timedelta(hours=24)
#: How much of a file download() reads by default.
DOWNLOAD_LIMIT = 1024 * 1024
#: Most bytes of any other answer read (a listing of a few thousand jobs is well under).
MAX_ANSWER_BYTES = 16 * 1024 * 1024
#: Most jobs asked about in one ``info`` request (A-REX answers some 1.7 KB for each).
INFO_CHUNK = 500
_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+)$")


def pilot_status(arc_state: str) -> str | None:
    """The pilot status an ARC REST state means; None for a state this client does not know
    (a newer CE's), which should leave the pilot's record as it is."""
    return PILOT_STATUS.get(arc_state)


# -- errors -------------------------------------------------------------------------------------

class ArcError(Exception):
    """Something an ARC-CE did not do. ``retryable``: the same call may work later."""

    retryable = False

    def __init__(self, message: str, *, ce: str, status: int | None = None,
                 reason: str = "") -> None:
        super().__init__(message)
        self.ce = ce
        self.status = status
        #: What the CE said (its HTTP reason phrase or per-job reason), or "".
        self.reason = reason


class ArcUnreachable(ArcError):
    """No answer: connection refused or reset, timeout, a TLS handshake that failed."""

    retryable = True


class ArcTurnOver(ArcUnreachable):
    """The CE used its time for this turn (agents.ce.budget): it is asked nothing more until
    the next turn. Not a failure of the CE: it answered, slowly."""


class ArcUnavailable(ArcError):
    """The CE answered with a server error (5xx): broken or overloaded for now."""

    retryable = True


class ArcAuthError(ArcError):
    """The CE refused the credential (401/403), or the credential cannot be used at all (an
    expired token, an unreadable proxy): fix the credential, retrying does not help."""

    def __init__(self, message: str, *, ce: str, credential: Path | None,
                 status: int | None = None, reason: str = "") -> None:
        super().__init__(message, ce=ce, status=status, reason=reason)
        self.credential = credential


class ArcRefused(ArcError):
    """The CE refused the request (another 4xx, or a job it would not create)."""


class ArcUnknownJob(ArcError):
    """The CE does not know the job: never had it, or lost it."""

    def __init__(self, message: str, *, ce: str, job_id: str, status: int | None = None,
                 reason: str = "") -> None:
        super().__init__(message, ce=ce, status=status, reason=reason)
        self.job_id = job_id


@dataclass(frozen=True)
class CeInfo:
    """What a CE says about itself."""

    #: A-REX's version ("6.17.0"), from its information document ("" when it has none yet).
    version: str
    #: The REST interface versions it serves ("1.0"; A-REX 7: "1.0", "1.1").
    rest_versions: tuple[str, ...]
    #: Its queues (GLUE2 ComputingShare names).
    queues: tuple[str, ...]
    #: The jobs of each queue (its GLUE2 ComputingShare, by its Name and its MappingQueue)
    #: and of the CE as a whole (queue "").
    loads: CELoads = field(default_factory=lambda: CELoads(()))


@dataclass(frozen=True)
class JobInfo:
    """What the CE's information provider recorded of a job: its ARC REST state (UNKNOWN
    for a job the CE does not know), its exit code once it ended in the batch system, and the
    CE's reason for a failure ("" when none)."""

    state: str
    exit_code: int | None = None
    error: str = ""


def _count(value: Any) -> int | None:
    """A GLUE2 count as A-REX's JSON gives it ("3"), None when it is not one."""
    text = str(value).strip() if isinstance(value, str | int) else ""
    return int(text) if text.isdigit() else None


def _load(name: str, entity: dict[str, Any]) -> CELoad | None:
    """The load of a GLUE2 ComputingShare (or of the ComputingService, ``name`` ""): what
    waits is what is in the batch system's queue and what the CE accepted and has not yet
    handed to it (PreLRMSWaitingJobs); None when it publishes no RunningJobs."""
    running = _count(entity.get("RunningJobs"))
    if running is None:
        return None
    waiting = (_count(entity.get("WaitingJobs")) or 0) + (
        _count(entity.get("PreLRMSWaitingJobs")) or 0)
    mapped = entity.get("MappingQueue")
    return CELoad(
        queue=name, running=running, waiting=waiting,
        total=_count(entity.get("TotalJobs")) or running + waiting,
        free_slots=_count(entity.get("FreeSlots")),
        max_running=_count(entity.get("MaxRunningJobs")),
        max_total=_count(entity.get("MaxTotalJobs")),
        aliases=(str(mapped),) if isinstance(mapped, str) and mapped else ())


def _ce_info(data: dict[str, Any], versions: tuple[str, ...]) -> CeInfo:
    """The CE's information document (A-REX's GLUE2 as JSON) as CeInfo."""
    service: Any = data
    for key in ("Domains", "AdminDomain", "Services", "ComputingService"):
        service = service.get(key) if isinstance(service, dict) else None
    service = service if isinstance(service, dict) else {}
    version = ""
    for endpoint in _as_list(service.get("ComputingEndpoint")):
        if isinstance(endpoint, dict) and endpoint.get("ImplementationVersion"):
            version = str(endpoint["ImplementationVersion"])
            break
    shares = [share for share in _as_list(service.get("ComputingShare"))
              if isinstance(share, dict) and share.get("Name")]
    queues = tuple(str(share.get("Name")) for share in shares)
    loads = [_load("", service)] + [_load(str(share["Name"]), share) for share in shares]
    return CeInfo(version, versions, queues, CELoads(tuple(x for x in loads if x is not None)))


def _as_list(value: Any) -> list[Any]:
    """A-REX's JSON: a list of one comes as the element, an empty list as nothing."""
    if value is None or value == "":
        return []
    return value if isinstance(value, list) else [value]


def _is_count(text: str) -> bool:
    """Whether ``text`` is a whole number int() takes (ASCII digits only: "²" is a digit)."""
    return text.isascii() and text.isdigit()


def _token_claims(token: str) -> dict[str, Any]:
    """The claims of a JWT, read without verifying it (the CE verifies); {} when unreadable."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError):
        return {}
    return claims if isinstance(claims, dict) else {}


def _token_expiry(token: str) -> int | None:
    """The ``exp`` claim of a JWT, read without verifying it (the CE verifies)."""
    exp = _token_claims(token).get("exp")
    return exp if isinstance(exp, int) else None


def _token_issued(token: str) -> int | None:
    """The ``iat`` claim of a JWT, read without verifying it."""
    iat = _token_claims(token).get("iat")
    return iat if isinstance(iat, int) else None


def token_near_end(token: str, now: float) -> str:
    """Why a token is near its end (less than TOKEN_WARN_SECONDS or TOKEN_WARN_SHARE of its
    life left), "" when it is not, has expired already or says no end."""
    exp = _token_expiry(token)
    if exp is None or exp <= now:
        return ""
    left = exp - now
    iat = _token_issued(token)
    life = exp - iat if iat is not None and iat < exp else None
    if left >= TOKEN_WARN_SECONDS and (life is None or left >= TOKEN_WARN_SHARE * life):
        return ""
    when = datetime.fromtimestamp(exp, UTC)
    share = f" of its {life} s" if life is not None else ""
    return (f"it expires at {when:%Y-%m-%d %H:%M:%S} UTC, {int(left)} s{share} left, and its "
            "file has not been replaced by a newer one")


def _token_audiences(token: str) -> list[str] | None:
    """The ``aud`` claim of a JWT as a list (it may be a string or a list); None when the token
    has none (the CE decides then)."""
    aud = _token_claims(token).get("aud")
    if aud is None:
        return None
    return [str(a) for a in aud] if isinstance(aud, list) else [str(aud)]


def endpoint_audiences(endpoint: str) -> frozenset[str]:
    """The audiences a token for the CE at ``endpoint`` may name: the endpoint's URL (what
    A-REX's ``authtokens`` rules usually name, with or without a trailing slash), its origin
    (``https://host:port``, the port left out when it is 443), ``host:port``, the host alone,
    and the WLCG profile's audience of any service, WLCG_ANY_AUDIENCE."""
    parts = urlsplit(endpoint)
    host = parts.hostname or ""
    port = parts.port or 443
    path = parts.path.rstrip("/")
    forms = {WLCG_ANY_AUDIENCE, host, f"{host}:{port}"}
    for origin in {f"https://{host}:{port}"} | ({f"https://{host}"} if port == 443 else set()):
        forms |= {origin, f"{origin}/", f"{origin}{path}", f"{origin}{path}/"}
    return frozenset(f for f in forms if f)


def audience_accepted(audiences: Sequence[str] | None, endpoint: str) -> bool:
    """Whether a token's audiences (None: it names none) let it be sent to ``endpoint``."""
    return audiences is None or not endpoint_audiences(endpoint).isdisjoint(
        a.strip() for a in audiences)


@dataclass
class _FileState:
    """A credential file and what it held when last read."""

    path: Path
    stamp: tuple[int, int, int] | None = None
    value: str = ""


class ArcRestClient:
    """One ARC-CE, reached at ``endpoint`` (``https://host:port/arex``; a URL with no path gets
    ``/arex``), with a token file, a proxy file, or both (the token authenticates, the proxy is
    delegated: see the module's notes), checking the CE's
    certificate against ``ca_bundle`` (a PEM file; None: the system's CAs). ``timeout`` bounds
    each exchange as a whole (connecting, redirects within the CE, the whole answer), in
    seconds; with a ``budget``, no longer than what the CE has left of it for this turn, and
    nothing is asked once it is spent (ArcTurnOver). Threads may share a client; when the
    credential file changes,
    the connections are closed, and a request of another thread still on one of them fails as
    ArcUnreachable (retryable)."""

    def __init__(self, endpoint: str, *, token_file: Path | None = None,
                 proxy_file: Path | None = None, ca_bundle: Path | None = None,
                 timeout: float = 30.0, budget: TurnBudget | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        if token_file is None and proxy_file is None:
            raise ValueError("an ARC-CE client needs a token_file, a proxy_file or both")
        parts = urlsplit(endpoint)
        if parts.scheme != "https" or not parts.hostname:
            raise ValueError(f"an ARC-CE endpoint is an https URL, not {endpoint!r}")
        self.endpoint = endpoint.rstrip("/") if parts.path not in ("", "/") else (
            endpoint.rstrip("/") + "/arex")
        self.ce = parts.netloc
        self.timeout = timeout
        self.budget = budget
        self._clock = clock
        self._verify: str | bool = str(ca_bundle) if ca_bundle is not None else True
        self._token = _FileState(token_file) if token_file is not None else None
        self._proxy = _FileState(proxy_file) if proxy_file is not None else None
        self._lock = threading.RLock()
        self._session = requests.Session()
        self._rest_version: str | None = None
        self._delegation: tuple[str, datetime, datetime] | None = None
        #: The proxy file's stamp when it signed the delegation in use: a proxy file changed
        #: since makes the delegation due for renewal.
        self._signed_with: tuple[int, int, int] | None = None
        self._proxy_end: datetime | None = None
        #: Why the token is near its end ("" when it is not), and the token last warned of.
        self._token_warning = ""
        self._warned_token = ""

    @property
    def credentials(self) -> str:
        """The client's credential mode: "token", "proxy" or "both"."""
        if self._token is not None:
            return "both" if self._proxy is not None else "token"
        return "proxy"

    @property
    def credential_file(self) -> Path:
        """The file of the credential that authenticates (the token's in mode "both")."""
        state = self._token or self._proxy
        assert state is not None
        return state.path

    def credential_warning(self) -> str:
        """Why the credential will soon stop working: the token near its end (less than
        TOKEN_WARN_SECONDS or TOKEN_WARN_SHARE of its life left) as last read, and not
        replaced in its file since; "" otherwise. Read again from the file here (no request)."""
        with self._lock:
            if self._token is None:
                return ""
            try:
                self._reread_token()
            except ArcAuthError as exc:
                return str(exc)
            self._check_token_end()
            if not self._token_warning:
                return ""
            return f"the token in {self._token.path} is near its end: {self._token_warning}"

    def close(self) -> None:
        self._session.close()

    def _new_session(self) -> None:
        """Close the connections made with the old credential; keep the response hooks."""
        hooks = self._session.hooks
        self._session.close()
        self._session = requests.Session()
        self._session.hooks = hooks

    # -- credentials ----------------------------------------------------------------------

    def _reread(self, state: _FileState) -> bool:
        """Read the file again if it changed since; returns whether it did."""
        try:
            st = state.path.stat()
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
            if stamp == state.stamp:
                return False
            state.value = state.path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ArcAuthError(f"{self.ce}: cannot read the credential file {state.path}: "
                               f"{exc}", ce=self.ce, credential=state.path) from exc
        state.stamp = stamp
        return True

    def _reread_token(self) -> None:
        assert self._token is not None
        if self._reread(self._token):
            # A-REX keeps the identity it mapped for the life of a connection: a new
            # token is only looked at on a new connection.
            self._new_session()

    def _check_token_end(self) -> None:
        """Note (and log once per token) a token near its end."""
        assert self._token is not None
        token = self._token.value
        self._token_warning = token_near_end(token, self._clock())
        if self._token_warning and token != self._warned_token:
            self._warned_token = token
            log.warning("%s: the token in %s is near its end: %s", self.ce, self._token.path,
                        self._token_warning)

    def _reread_proxy(self) -> None:
        """Read the proxy file again if it changed (a new one closes the connections made
        with the old one when it authenticates); refuse an expired proxy."""
        assert self._proxy is not None
        if self._reread(self._proxy):
            self._proxy_end = self._load_proxy().not_after
            if self._token is None:
                self._new_session()
        if self._proxy_end is not None and self._proxy_end.timestamp() <= self._clock():
            raise ArcAuthError(f"{self.ce}: the proxy in {self._proxy.path} expired at "
                               f"{self._proxy_end:%Y-%m-%d %H:%M:%S} UTC", ce=self.ce,
                               credential=self._proxy.path)

    def _auth(self) -> dict[str, Any]:
        """The request arguments that authenticate: a bearer header (also in mode "both":
        A-REX would map the TLS certificate instead), or the proxy as the TLS client
        certificate (a new proxy file closes the connections made with the old one)."""
        with self._lock:
            if self._token is not None:
                self._reread_token()
                token = self._token.value
                if not token:
                    raise ArcAuthError(f"{self.ce}: the token file {self._token.path} is empty",
                                       ce=self.ce, credential=self._token.path)
                exp = _token_expiry(token)
                if exp is not None and exp <= self._clock():
                    when = datetime.fromtimestamp(exp, UTC)
                    raise ArcAuthError(f"{self.ce}: the token in {self._token.path} expired at "
                                       f"{when:%Y-%m-%d %H:%M:%S} UTC; its file was not "
                                       "replaced by a newer one", ce=self.ce,
                                       credential=self._token.path)
                self._check_token_end()
                audiences = _token_audiences(token)
                if not audience_accepted(audiences, self.endpoint):
                    raise ArcAuthError(
                        f"{self.ce}: the token in {self._token.path} is for the audience "
                        f"{', '.join(audiences or [])}, not for this CE: a token it takes names "
                        f"{self.endpoint} (or {WLCG_ANY_AUDIENCE}) in its 'aud'", ce=self.ce,
                        credential=self._token.path)
                return {"headers": {"Authorization": f"Bearer {token}"}}
            assert self._proxy is not None
            self._reread_proxy()
            return {"cert": str(self._proxy.path)}

    # -- HTTP -----------------------------------------------------------------------------

    def _url(self, path: str) -> str:
        return f"{self.endpoint}/rest/{path}" if path else f"{self.endpoint}/rest"

    def _request(self, method: str, path: str, *, versioned: bool = True,
                 job_id: str | None = None, expect: Sequence[int] = (200, 201, 202, 204),
                 max_bytes: int = MAX_ANSWER_BYTES, truncate: bool = False,
                 **kwargs: Any) -> requests.Response:
        """One exchange, within ``timeout`` seconds in all and reading at most ``max_bytes``
        of answer (with ``truncate``, its first ``max_bytes`` are the answer), following
        redirects only within the CE's origin; an answer outside ``expect`` becomes the
        matching ArcError."""
        if versioned:
            path = f"{self.rest_version()}/{path}"
        with self._lock:
            auth = self._auth()
            session = self._session
        headers = {"Accept": "application/json", **auth.pop("headers", {}),
                   **kwargs.pop("headers", {})}
        deadline = self.timeout
        budget = self.budget
        if budget is not None:
            left = budget.left()
            if left <= 0:
                raise self._turn_over()
            deadline = min(deadline, left)
        counted = budget.request() if budget is not None else contextlib.nullcontext()
        try:
            with counted:
                response = exchange.request(
                    session, method, self._url(path), headers=headers, verify=self._verify,
                    deadline=deadline, max_bytes=max_bytes, truncate=truncate, **auth,
                    **kwargs)
        except exchange.DeadlineError as exc:
            if deadline < self.timeout:
                raise self._turn_over() from exc
            raise ArcUnreachable(f"{self.ce}: {exc}", ce=self.ce) from exc
        except exchange.AnswerTooLargeError as exc:
            raise ArcUnavailable(f"{self.ce}: {exc}", ce=self.ce) from exc
        except exchange.RedirectRefusedError as exc:
            raise ArcRefused(f"{self.ce}: {exc}", ce=self.ce) from exc
        except requests.exceptions.SSLError as exc:
            raise self._tls_error(exc) from exc
        except (requests.exceptions.ConnectionError, requests.exceptions.Timeout) as exc:
            raise ArcUnreachable(f"{self.ce}: {innermost(exc)}; no answer from "
                                 f"{self.endpoint} ({exc})", ce=self.ce) from exc
        except requests.exceptions.RequestException as exc:
            raise ArcUnreachable(f"{self.ce}: {innermost(exc)}; request to {self.endpoint} "
                                 f"failed ({exc})", ce=self.ce) from exc
        if response.status_code in expect:
            return response
        self._raise_for(response, method, path, job_id)

    def _turn_over(self) -> ArcTurnOver:
        assert self.budget is not None
        return ArcTurnOver(f"{self.ce}: it used its {self.budget.seconds:g} s for this turn "
                           "([agents] ce_turn_budget); the rest waits for the next turn",
                           ce=self.ce)

    def _tls_error(self, exc: requests.exceptions.SSLError) -> ArcError:
        """A TLS handshake that failed: the CE's certificate not trusted, or (with a proxy)
        the CE refusing the proxy, which it does in the handshake (an alert, or closing)."""
        text = str(exc)
        if "CERTIFICATE_VERIFY_FAILED" in text:
            bundle = Path(self._verify) if isinstance(self._verify, str) else None
            return ArcAuthError(f"{self.ce}: its certificate is not trusted by "
                                f"{bundle or 'the system CAs'} ({text})", ce=self.ce,
                                credential=bundle)
        if self._token is None and self._proxy is not None and (
                "ALERT" in text or "EOF" in text):
            return ArcAuthError(f"{self.ce} refused the proxy in {self._proxy.path} during the "
                                f"TLS handshake ({text})", ce=self.ce,
                                credential=self._proxy.path)
        return ArcUnreachable(f"{self.ce}: TLS with {self.endpoint} failed ({text})",
                              ce=self.ce)

    def _raise_for(self, response: requests.Response, method: str, path: str,
                   job_id: str | None) -> NoReturn:
        status, reason = response.status_code, (response.reason or "").strip()
        if reason.upper() == "OK":  # A-REX's 404 for a job it does not know says "OK"
            reason = ""
        said = reason or response.text[:200].strip() or "no reason given"
        where = f"{self.ce}: {method} {urlsplit(response.url).path or path}"
        if status in (401, 403) or said == UNMAPPED:
            kind = "token" if self._token is not None else "proxy"
            why = ""
            if said == UNMAPPED:
                why = ("; it took the credential but could put it in none of its authgroups: "
                       + ("the token's audience is not one the CE's rules name, its issuer "
                          "is not trusted there, or no authgroup allows its subject, groups "
                          "and scopes" if self._token is not None else
                          "no authgroup allows the proxy's subject or VOMS attributes"))
            raise ArcAuthError(f"{self.ce} refused the {kind} in {self.credential_file} "
                               f"({status} {said}){why}", ce=self.ce,
                               credential=self.credential_file, status=status, reason=said)
        if status == 404 and job_id is not None and not self._job_known(job_id):
            raise ArcUnknownJob(f"{self.ce} does not know job {job_id} ({said})", ce=self.ce,
                                job_id=job_id, status=status, reason=said)
        if status >= 500:
            raise ArcUnavailable(f"{where}: {status} {said}", ce=self.ce, status=status,
                                 reason=said)
        raise ArcRefused(f"{where}: {status} {said}", ce=self.ce, status=status, reason=said)

    def _json(self, response: requests.Response) -> dict[str, Any]:
        if not response.content.strip():
            return {}
        try:
            data = response.json()
        except ValueError as exc:
            raise ArcUnavailable(f"{self.ce}: {response.request.method} {response.url} answered "
                                 f"{response.headers.get('Content-Type', 'something')}, not "
                                 f"JSON: {response.text[:200]!r}", ce=self.ce,
                                 status=response.status_code) from exc
        return data if isinstance(data, dict) else {}

    def rest_version(self) -> str:
        """The REST version spoken: 1.1 where the CE serves it, else 1.0 (asked once)."""
        with self._lock:
            if self._rest_version is None:
                versions = self._versions()
                self._rest_version = "1.1" if "1.1" in versions else "1.0"
            return self._rest_version

    def _versions(self) -> tuple[str, ...]:
        data = self._json(self._request("GET", "", versioned=False))
        return tuple(str(v) for v in _as_list(data.get("version")))

    # -- the CE ---------------------------------------------------------------------------

    def info(self) -> CeInfo:
        """The CE's version, REST versions, queues and their loads (two requests)."""
        versions = self._versions()
        return _ce_info(self._json(self._request("GET", "info")), versions)

    def loads(self) -> CELoads:
        """What the CE says of its queues' jobs (one request, once the REST version is
        known)."""
        return _ce_info(self._json(self._request("GET", "info")), ()).loads

    # -- delegation -----------------------------------------------------------------------

    def delegation(self) -> str | None:
        """The delegation jobs are submitted with (see :meth:`keep_delegation`), checked to be
        still on the CE first (one request): A-REX 6 takes a job naming a delegation it lost,
        and gives it no proxy."""
        return self._delegation_now(check=True)

    def keep_delegation(self) -> str | None:
        """Keep this identity's one delegation on the CE valid, whether or not jobs are
        submitted: None with a token alone; with a proxy (alone, or beside the token), the
        delegation in use, which is

        - found on the CE when this client has none yet: of the delegations the CE holds for
          the identity (another process's, an earlier run's), the unexpired one that ends
          last is adopted (its end read on the CE), and the others (expired, never
          completed, superseded) are removed; a new one is made when none is left;
        - renewed once half its life or all but RENEW_BEFORE has passed (signed with the
          proxy file as it is then, so a renewed proxy file makes it longer again), and the
          stale ones removed then too; renewed too once the proxy file changed since it was
          signed (a renewed proxy, perhaps with other VOMS attributes);
        - found again, or made again, when the CE lost it.

        Cheap: no request while the delegation is far from its end."""
        return self._delegation_now(check=False)

    def _delegation_now(self, *, check: bool) -> str | None:
        if self._proxy is None:
            return None
        with self._lock:
            self._reread_proxy()
            now = datetime.fromtimestamp(self._clock(), UTC)
            if self._delegation is None:
                return self._adopt(now)
            delegation_id, made, ends = self._delegation
            renewed_proxy = self._signed_with is not None and self._signed_with != \
                self._proxy.stamp
            if renewed_proxy:
                log.info("%s: the proxy in %s changed since it signed delegation %s: renewing "
                         "it", self.ce, self._proxy.path, delegation_id)
            due = renewed_proxy or ends - now <= max(RENEW_BEFORE, (ends - made) / 2)
            if not (check or due):
                return delegation_id
            held = self.delegations()
            if delegation_id not in held:
                log.info("%s: the CE lost delegation %s; looking for another", self.ce,
                         delegation_id)
                self._delegation = None
                return self._adopt(now, held)
            if not due:
                return delegation_id
            try:
                self._renew(delegation_id)
            except (ArcRefused, ArcUnavailable) as exc:
                log.info("%s: delegation %s could not be renewed (%s); making a new one",
                         self.ce, delegation_id, exc)
                self._delegation = None
                return self._adopt(now, [d for d in held if d != delegation_id])
            self._remove_stale(held)
            return delegation_id

    def _adopt(self, now: datetime, held: list[str] | None = None) -> str:
        """The best delegation of the identity on the CE made this client's (renewed when its
        end is near or unknown), the others removed; a new one when none is valid."""
        if held is None:
            held = self.delegations()
        spans = {d: self._span(d) for d in held}
        valid = [(span[1], d, span[0]) for d, span in spans.items()
                 if span is not None and span[1] is not None and span[1] > now]
        unknown = [d for d, span in spans.items() if span is not None and span[1] is None]
        if valid:
            ends, chosen, made = max(valid)
            self._delegation = (chosen, made, ends)
            self._signed_with = self._proxy.stamp if self._proxy is not None else None
            log.info("%s: delegation %s adopted (it ends %s)", self.ce, chosen,
                     f"{ends:%Y-%m-%d %H:%M:%S} UTC")
            self._remove_stale(held)
            return self._delegation_now(check=False) or chosen
        if unknown:
            # Its end cannot be read: renewing it makes it known.
            chosen = unknown[0]
            try:
                self._renew(chosen)
            except (ArcRefused, ArcUnavailable) as exc:
                log.info("%s: delegation %s could not be renewed (%s)", self.ce, chosen, exc)
            else:
                self._remove_stale(held)
                return chosen
        created = self._create_delegation()
        self._remove_stale(held)
        return created

    def _span(self, delegation_id: str) -> tuple[datetime, datetime | None] | None:
        """When a delegation of the CE starts and ends, read from its certificate (REST:
        action=get, the chain without its key); None for one never completed (no
        certificate), the end None when the CE would not say."""
        try:
            response = self._request("POST", f"delegations/{quote(delegation_id, safe='')}",
                                     params={"action": "get"}, expect=(200,),
                                     headers={"Accept": "application/x-pem-file"})
        except ArcRefused as exc:
            if exc.status == 404:
                return None  # gone since it was listed
            return (datetime.fromtimestamp(self._clock(), UTC), None)
        try:
            first = x509.load_pem_x509_certificates(response.content)[0]
        except (ValueError, IndexError):
            return None
        return (first.not_valid_before_utc, first.not_valid_after_utc)

    def _remove_stale(self, held: Iterable[str]) -> None:
        """Remove the identity's delegations but the one in use (REST: action=delete). A-REX
        keeps one a job of the CE still uses: that one stays until the job is cleaned."""
        keep = self._delegation[0] if self._delegation is not None else None
        for delegation_id in held:
            if delegation_id == keep:
                continue
            try:
                self._request("POST", f"delegations/{quote(delegation_id, safe='')}",
                              params={"action": "delete"}, expect=(200, 202, 204))
            except (ArcRefused, ArcUnavailable) as exc:
                log.info("%s: stale delegation %s not removed: %s", self.ce, delegation_id,
                         exc)
            else:
                log.info("%s: stale delegation %s removed", self.ce, delegation_id)

    def delegations(self) -> list[str]:
        """The ids of the delegations the CE holds for this client's identity."""
        data = self._json(self._request("GET", "delegations"))
        return [str(d["id"]) for d in _as_list(data.get("delegation"))
                if isinstance(d, dict) and "id" in d]

    def _load_proxy(self) -> Any:
        assert self._proxy is not None
        try:
            return load_credential(self._proxy.path)
        except CredentialError as exc:
            raise ArcAuthError(f"{self.ce}: the proxy {self._proxy.path} cannot be used: {exc}",
                               ce=self.ce, credential=self._proxy.path) from exc

    def _sign(self, request_pem: bytes, delegation_id: str) -> str:
        assert self._proxy is not None
        self._reread_proxy()
        stamp = self._proxy.stamp
        proxy = self._load_proxy()
        now = datetime.fromtimestamp(self._clock(), UTC)
        try:
            chain = sign_proxy_request(request_pem, proxy, lifetime=DELEGATION_LIFETIME, now=now)
        except CredentialError as exc:
            raise ArcAuthError(f"{self.ce}: cannot sign delegation {delegation_id} with "
                               f"{self.credential_file}: {exc}", ce=self.ce,
                               credential=self.credential_file) from exc
        self._request("PUT", f"delegations/{quote(delegation_id, safe='')}", data=chain,
                      headers={"Content-Type": "application/x-pem-file"})
        ends = min(now + DELEGATION_LIFETIME, proxy.not_after)
        self._delegation = (delegation_id, now, ends)
        self._signed_with = stamp
        return delegation_id

    def _create_delegation(self) -> str:
        response = self._request("POST", "delegations", params={"action": "new"},
                                 expect=(201,))
        location = response.headers.get("Location", "")
        delegation_id = location.rstrip("/").rsplit("/", 1)[-1]
        if not delegation_id:
            raise ArcRefused(f"{self.ce}: a new delegation came without its id (Location "
                             f"{location!r})", ce=self.ce)
        self._sign(response.content, delegation_id)
        log.info("%s: delegation %s made", self.ce, delegation_id)
        return delegation_id

    def _renew(self, delegation_id: str) -> str:
        response = self._request("POST", f"delegations/{quote(delegation_id, safe='')}",
                                 params={"action": "renew"}, expect=(200, 201))
        self._sign(response.content, delegation_id)
        log.info("%s: delegation %s renewed", self.ce, delegation_id)
        return delegation_id

    def forget_delegation(self) -> None:
        """Make the next submission use another delegation (found on the CE, or made)."""
        with self._lock:
            self._delegation = None

    def _new_delegation(self) -> str:
        """A new delegation in place of the one in use (which the CE would not take): made,
        then the old one removed."""
        with self._lock:
            old = self._delegation[0] if self._delegation is not None else None
            made = self._create_delegation()
            if old is not None:
                self._remove_stale([old])
            return made

    # -- jobs -----------------------------------------------------------------------------

    def submit(self, descriptions: Sequence[str]) -> list[str | ArcError]:
        """Create jobs from ADL descriptions (see :mod:`agents.ce.adl`), in one request: for
        each description, in order, the new job's id or the error that refused it. A job
        refused because of its delegation is submitted once more with a new delegation. An
        error for the whole request (the CE unreachable, the credential refused) is raised."""
        if not descriptions:
            return []
        results = self._submit(list(descriptions), self.delegation())
        retry = [i for i, r in enumerate(results)
                 if isinstance(r, ArcRefused) and "delegation" in r.reason.lower()]
        if retry and self._proxy is not None:
            log.info("%s: %d job(s) refused for their delegation (%s); submitting them again "
                     "with a new one", self.ce, len(retry), results[retry[0]])
            again = self._submit([descriptions[i] for i in retry], self._new_delegation())
            for i, result in zip(retry, again, strict=True):
                results[i] = result
        return results

    def _submit(self, descriptions: list[str], delegation_id: str | None
                ) -> list[str | ArcError]:
        params: dict[str, str] = {"action": "new"}
        if delegation_id is not None:
            if self.rest_version() == "1.0":
                descriptions = [adl.with_delegation(d, delegation_id) for d in descriptions]
            else:
                params["delegation_id"] = delegation_id
        body = adl.bulk(descriptions)
        response = self._request("POST", "jobs", params=params, data=body.encode(),
                                 headers={"Content-Type": "application/xml"}, expect=(201,))
        answers = _as_list(self._json(response).get("job"))
        if len(answers) != len(descriptions):
            # A-REX answers one error for a bulk it could not read at all.
            reason = "; ".join(str(a.get("reason", "")) for a in answers
                               if isinstance(a, dict)) or "no answer per job"
            return [ArcRefused(f"{self.ce} refused the submission: {reason}", ce=self.ce,
                               reason=reason) for _ in descriptions]
        results: list[str | ArcError] = []
        for answer in answers:
            code, reason = str(answer.get("status-code", "")), str(answer.get("reason", ""))
            if code == "201" and answer.get("id"):
                results.append(str(answer["id"]))
            else:
                results.append(ArcRefused(f"{self.ce} refused a job: {code} {reason}",
                                          ce=self.ce, status=int(code) if _is_count(code)
                                          else None, reason=reason))
        return results

    def _manage(self, action: str, ids: Sequence[str]) -> list[dict[str, Any]]:
        body = {"job": [{"id": job_id} for job_id in ids]}
        response = self._request("POST", "jobs", params={"action": action}, json=body,
                                 expect=(201,))
        answers = [a for a in _as_list(self._json(response).get("job")) if isinstance(a, dict)]
        if len(answers) != len(ids):
            raise ArcRefused(f"{self.ce}: {action} of {len(ids)} job(s) answered "
                             f"{len(answers)}", ce=self.ce)
        return answers

    def _job_known(self, job_id: str) -> bool:
        """Whether the CE knows the job (its 404 for a job's file says "Not found" either
        way)."""
        return str(self._manage("status", [job_id])[0].get("status-code")) != "404"

    def statuses(self, ids: Iterable[str] | None = None) -> dict[str, str]:
        """ARC REST states in one request: of the jobs ``ids`` (the information provider's
        view; a job the CE does not know reads UNKNOWN), or of every job of this client's
        identity when ``ids`` is None (the job manager's view, see the module's notes)."""
        if ids is None:
            response = self._request("GET", "jobs", params={"state": ",".join(
                s for s in PILOT_STATUS if s != UNKNOWN)})
            return {str(j["id"]): str(j.get("state", "")) for j in _as_list(
                self._json(response).get("job")) if isinstance(j, dict) and "id" in j}
        wanted = list(dict.fromkeys(ids))
        if not wanted:
            return {}
        found: dict[str, str] = {}
        for job_id, answer in zip(wanted, self._manage("status", wanted), strict=True):
            code = str(answer.get("status-code", ""))
            state = str(answer.get("state", ""))
            found[job_id] = UNKNOWN if code == "404" or state in ("", "None") else state
        return found

    def infos(self, ids: Iterable[str]) -> dict[str, JobInfo]:
        """The information provider's record of each job (see :class:`JobInfo`), in one
        request per INFO_CHUNK jobs."""
        wanted = list(dict.fromkeys(ids))
        found: dict[str, JobInfo] = {}
        for start in range(0, len(wanted), INFO_CHUNK):
            chunk = wanted[start:start + INFO_CHUNK]
            for job_id, answer in zip(chunk, self._manage("info", chunk), strict=True):
                found[job_id] = self._job_info(job_id, answer)
        return found

    def _job_info(self, job_id: str, answer: dict[str, Any]) -> JobInfo:
        if str(answer.get("status-code", "")) == "404":
            return JobInfo(UNKNOWN)
        document = answer.get("info_document")
        activity = document.get("ComputingActivity") if isinstance(document, dict) else None
        if not isinstance(activity, dict):
            return JobInfo("")  # no record yet: no news
        state = next((str(s).removeprefix("arcrest:") for s in _as_list(activity.get("State"))
                      if str(s).startswith("arcrest:")), "")
        code = str(activity.get("ExitCode", "")).strip()
        if code and not _is_count(code.removeprefix("-")):
            raise ArcUnavailable(f"{self.ce}: the record of job {job_id} gives the exit code "
                                 f"{code[:40]!r}, not a number", ce=self.ce)
        error = next((str(e).strip() for e in _as_list(activity.get("Error"))
                      if str(e).strip()), "")
        return JobInfo(state, int(code) if code else None, error)

    def _outcomes(self, action: str, ids: Iterable[str]) -> dict[str, ArcError | None]:
        wanted = list(dict.fromkeys(ids))
        if not wanted:
            return {}
        outcome: dict[str, ArcError | None] = {}
        for job_id, answer in zip(wanted, self._manage(action, wanted), strict=True):
            code, reason = str(answer.get("status-code", "")), str(answer.get("reason", ""))
            if code.startswith("2"):
                outcome[job_id] = None
            elif code == "404":
                outcome[job_id] = ArcUnknownJob(f"{self.ce} does not know job {job_id} "
                                                f"({reason})", ce=self.ce, job_id=job_id,
                                                status=404, reason=reason)
            else:
                outcome[job_id] = ArcRefused(f"{self.ce} would not {action} job {job_id}: "
                                             f"{code} {reason}", ce=self.ce, reason=reason,
                                             status=int(code) if _is_count(code) else None)
        return outcome

    def kill(self, ids: Iterable[str]) -> dict[str, ArcError | None]:
        """Ask the CE to kill the jobs (one request); per job None (queued for killing) or
        the error (unknown job, or a job that cannot be killed any more)."""
        return self._outcomes("kill", ids)

    def clean(self, ids: Iterable[str]) -> dict[str, ArcError | None]:
        """Ask the CE to remove ended jobs and their session directories (one request); per
        job None or the error. A job that has not ended cannot be cleaned: kill it first."""
        return self._outcomes("clean", ids)

    # -- session directories --------------------------------------------------------------

    def _session_path(self, job_id: str, name: str = "") -> str:
        path = f"jobs/{quote(job_id, safe='')}/session"
        return f"{path}/{quote(adl.check_file_name(name))}" if name else path

    def upload(self, job_id: str, name: str, data: bytes) -> None:
        """Write a file into the job's session directory (an input file its description
        declares: the CE starts the job once all of them are there)."""
        self._request("PUT", self._session_path(job_id, name), job_id=job_id, data=data,
                      headers={"Content-Type": "application/octet-stream"})

    def session_files(self, job_id: str) -> dict[str, int]:
        """The files of the job's session directory (top level) and their sizes."""
        response = self._request("GET", self._session_path(job_id), job_id=job_id,
                                 headers={"Accept": "application/xml"})
        if not response.content.strip():
            return {}
        try:
            root = ET.fromstring(response.content)
        except ET.ParseError as exc:
            raise ArcRefused(f"{self.ce}: the listing of job {job_id}'s session directory "
                             f"is not XML ({exc})", ce=self.ce) from exc
        files: dict[str, int] = {}
        for f in root.iter("file"):
            if not f.text:
                continue
            size = (f.get("size") or "0").strip()
            if not _is_count(size):
                raise ArcUnavailable(f"{self.ce}: the listing of job {job_id}'s session "
                                     f"directory gives file {f.text[:80]!r} the size "
                                     f"{size[:40]!r}, not a number", ce=self.ce)
            files[str(f.text)] = int(size)
        return files

    def download(self, job_id: str, name: str, limit: int = DOWNLOAD_LIMIT) -> bytes:
        """A file of the job's session directory (its stdout, stderr), at most its last
        ``limit`` bytes."""
        return self.tail(job_id, name, limit)[0]

    def tail(self, job_id: str, name: str, limit: int = DOWNLOAD_LIMIT) -> tuple[bytes, int]:
        """The last ``limit`` bytes of a file of the job's session directory, and the file's
        size: one request when the file is no longer than ``limit`` (the first ``limit``
        bytes are asked for, and are all of it), two otherwise (A-REX 6 takes no range
        counted from the end)."""
        if limit < 1:
            raise ValueError(f"a download limit is at least one byte, not {limit}")
        path = self._session_path(job_id, name)
        first = self._request("GET", path, job_id=job_id, expect=(200, 206, 416),
                              headers={"Accept": "*/*", "Range": f"bytes=0-{limit - 1}"},
                              max_bytes=limit, truncate=True)
        if first.status_code == 416:  # nothing in the range: an empty file
            return b"", 0
        size = self._file_size(first, job_id, name)
        if size <= limit:
            return first.content, size
        rest = self._request("GET", path, job_id=job_id, expect=(200, 206), max_bytes=limit,
                             truncate=True, headers={
                                 "Accept": "*/*", "Range": f"bytes={size - limit}-{size - 1}"})
        return rest.content[:limit], size

    def _file_size(self, response: requests.Response, job_id: str, name: str) -> int:
        """The whole size of a session file, from a ranged answer (Content-Range) or a whole
        one (Content-Length, else what came)."""
        if response.status_code == 206:
            given = response.headers.get("Content-Range", "").strip()
            match = _CONTENT_RANGE.match(given)
            if match is None:
                raise ArcUnavailable(f"{self.ce}: GET of file {name!r} of job {job_id} answered "
                                     f"Content-Range {given[:60]!r}, not a range of a size",
                                     ce=self.ce)
            return int(match.group(3))
        declared = response.headers.get("Content-Length", "").strip()
        if not declared:
            return len(response.content)
        if not _is_count(declared):
            raise ArcUnavailable(f"{self.ce}: GET of file {name!r} of job {job_id} answered "
                                 f"Content-Length {declared[:40]!r}, not a size", ce=self.ce)
        return int(declared)

    def diagnose(self, job_id: str, name: str = "failed", limit: int = 65536) -> str:
        """One of A-REX's own files about the job (``failed``: why it failed; ``errors``: the
        job manager's log of it; ``diag``: its resource usage and exit code; the others of
        DIAGNOSE_FILES)."""
        if name not in DIAGNOSE_FILES:
            raise ValueError(f"A-REX keeps no {name!r} file about a job; it keeps "
                             f"{', '.join(DIAGNOSE_FILES)}")
        response = self._request("GET", f"jobs/{quote(job_id, safe='')}/diagnose/{name}",
                                 job_id=job_id, headers={"Accept": "text/plain"},
                                 max_bytes=limit, truncate=True)
        return response.content[:limit].decode("utf-8", "replace")

