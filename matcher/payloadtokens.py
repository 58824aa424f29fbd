"""Tokens for payloads, for the job's owner: the first comes with the match answer, beside
the job (matcher.pilots), the next ones a pilot asks for (``POST
/api/v1/pilots/jobs/<id>/token``); it writes them where ``$BEARER_TOKEN_FILE`` says; storage
services verify them with the keys the service publishes (``/.well-known/openid-configuration``
and its ``jwks_uri``).

The tokens follow the WLCG profile: ``iss`` (``[tokens] issuer``, else ``[matcher] url``),
``sub`` (the job's owner), ``aud``, ``scope`` (what the VO grants, ``[tokens]
storage_scopes``, narrowed by the job's own ``TokenScopes``), ``wlcg.ver``, ``wlcg.groups``
(the VO), a ``jti``, ``iat``/``nbf``/``exp`` (``[tokens] payload_lifetime``) and ``job_id``.
They are signed with ES256 by the key of taskqueue.signingkeys. A pilot never holds a refresh
token: it asks again, with its own token, before the payload's expires.

The issuing is one interface (:class:`PayloadTokenIssuer`): this service signs its own; a VO
with an identity provider that supports token exchange (RFC 8693) could have its tokens
exchanged there instead, behind the same call.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

import jwt
from flask import Blueprint

from matcher import schemas
from matcher.api import JSON, Call, endpoint
from matcher.auth import PILOT
from matcher.problems import Problem
from matcher.runtime import Runtime
from matcher.views import iso
from optimizers.chain import stored_description
from optimizers.description import JobDescription, JobDescriptionError
from taskqueue.core.scopes import granted_scopes, payload_scopes
from taskqueue.core.settings import Settings
from taskqueue.core.states import JobStatus
from taskqueue.db.database import Session
from taskqueue.db.models import Job
from taskqueue.pilots.records import pilot_stop_reason
from taskqueue.signingkeys import ALGORITHM, KeyCache, published_keys, signing_key

bp = Blueprint("payloadtokens", __name__)
api = Blueprint("payloadtokens_api", __name__, url_prefix="/api/v1/pilots")

JWKS_PATH = "/.well-known/jwks.json"
#: The job states in which its payload may get a token.
RUNNABLE = frozenset({JobStatus.MATCHED, JobStatus.RUNNING, JobStatus.COMPLETING})
#: Seconds a retired key stays published beyond its last token's lifetime (clock skew).
KEY_GRACE = 300
#: Seconds a process signs with the key it read before it reads the keys again (never past
#: the key's rotation). Below KEY_GRACE: a key another matcher retired meanwhile (its secret
#: changed) is still published for as long as any token it signed since is valid.
KEY_RECHECK = 60


def issuer_url(settings: Settings) -> str:
    return (settings.tokens.issuer or settings.matcher.url).rstrip("/")


@dataclass(frozen=True)
class PayloadGrant:
    """What a payload's token is for."""

    vo: str
    owner: str
    job_id: int
    scopes: tuple[str, ...]


@dataclass(frozen=True)
class IssuedToken:
    token: str
    expires_at: datetime
    scopes: tuple[str, ...]


class PayloadTokenIssuer(Protocol):
    """Makes a payload's token (in the session of the request that asks for it)."""

    def issue(self, session: Session, grant: PayloadGrant, now: datetime) -> IssuedToken: ...


class OwnIssuer:
    """This service as the payloads' token issuer (ES256 keys of taskqueue.signingkeys). With
    a ``cache`` (the process's), a key read from the database signs for KEY_RECHECK seconds
    without being read again: then the issue runs no statement."""

    def __init__(self, settings: Settings, secret: str, cache: KeyCache | None = None) -> None:
        self.settings = settings
        self.secret = secret
        self.cache = cache

    def issue(self, session: Session, grant: PayloadGrant, now: datetime) -> IssuedToken:
        t = self.settings.tokens
        kept = self.cache.get(now) if self.cache is not None else None
        key = kept or signing_key(session, secret=self.secret, now=now,
                                  rotation=t.key_rotation,
                                  keep_for=t.payload_lifetime + KEY_GRACE)
        issued = int(now.timestamp())
        audience: str | list[str] = (t.payload_audience[0] if len(t.payload_audience) == 1
                                     else list(t.payload_audience))
        claims: dict[str, Any] = {
            "iss": issuer_url(self.settings), "sub": grant.owner, "aud": audience,
            "scope": " ".join(grant.scopes), "wlcg.ver": "1.0",
            "wlcg.groups": [f"/{grant.vo}"], "jti": str(uuid.uuid4()),
            "iat": issued, "nbf": issued, "exp": issued + t.payload_lifetime,
            "job_id": grant.job_id}
        token = jwt.encode(claims, key.private_pem, algorithm=ALGORITHM,
                           headers={"kid": key.kid})
        if kept is None and self.cache is not None and not key.made:
            # Kept once it signed; not a key made now: its transaction may not commit.
            self.cache.keep(key, min(now + timedelta(seconds=KEY_RECHECK),
                                     key.created_at + timedelta(seconds=t.key_rotation)))
        return IssuedToken(token, now + timedelta(seconds=t.payload_lifetime), grant.scopes)


def payload_token_issuer(runtime: Runtime) -> PayloadTokenIssuer:
    """The issuer of this service's payloads' tokens (with the process's kept key)."""
    return OwnIssuer(runtime.settings, runtime.secret, runtime.signing_keys)


def described_scopes(read: Callable[[str, str, int | None], JobDescription], text: str,
                     fmt: str, bulk_index: int | None) -> tuple[str, ...]:
    """The scopes a job's stored description asks for (``TokenScopes``), read by ``read``
    (optimizers.chain.stored_description, or a cache of it); none for a text that no longer
    reads (it was accepted once: the VO's grant then)."""
    try:
        return read(text, fmt, bulk_index).token_scopes
    except (JobDescriptionError, IndexError):
        return ()


def payload_grant(settings: Settings, vo: str, owner: str, job_id: int,
                  asked: Sequence[str]) -> PayloadGrant:
    """What the token of job ``job_id``'s payload is for: the scopes the job ``asked`` for
    that the VO still grants its owner, else all the VO grants (taskqueue.core.scopes). One
    rule for the token endpoint and the match answer's first token."""
    return PayloadGrant(vo, owner, job_id, payload_scopes(
        asked, granted_scopes(settings.tokens, vo, owner)))


def token_answer(issued: IssuedToken) -> dict[str, Any]:
    """A payload's token as the API gives it (schemas.PAYLOAD_TOKEN)."""
    return {"token": issued.token, "expires_at": iso(issued.expires_at),
            "scope": " ".join(issued.scopes)}


@endpoint(bp, "GET", "/.well-known/openid-configuration", tag="service", roles=None,
          summary="Where the keys of the payloads' token issuer are (no token needed)",
          responses={200: ("The issuer's configuration", schemas.OPENID_CONFIGURATION)})
def openid_configuration(call: Call) -> dict[str, Any]:
    issuer = issuer_url(call.runtime.settings)
    return {"issuer": issuer, "jwks_uri": issuer + JWKS_PATH,
            "id_token_signing_alg_values_supported": [ALGORITHM],
            "token_endpoint_auth_methods_supported": ["none"],
            "claims_supported": ["iss", "sub", "aud", "scope", "wlcg.ver", "wlcg.groups",
                                 "jti", "iat", "nbf", "exp", "job_id"]}


@endpoint(bp, "GET", JWKS_PATH, tag="service", roles=None,
          summary="The public keys that sign payloads' tokens, while a token they signed may "
                  "be valid (no token needed)",
          responses={200: ("A JWK set", schemas.JWKS)})
def jwks(call: Call) -> dict[str, Any]:
    return {"keys": call.runtime.transaction(lambda s: published_keys(s, now=call.now))}


@endpoint(api, "POST", "/jobs/<int:job_id>/token", tag="pilots", roles=(PILOT,),
          summary="A token for the payload of one of the pilot's jobs, for the job's owner "
                  "(WLCG profile, ES256): asked for before the payload starts and again "
                  "before the last one expires",
          body={JSON: schemas.PILOT_REFERENCE},
          responses={200: ("The payload's token", schemas.PAYLOAD_TOKEN),
                     403: ("Not this pilot's job, or the pilot must stop", schemas.PROBLEM),
                     404: ("No such job, or no payload tokens here", schemas.PROBLEM),
                     409: ("The job has ended", schemas.PROBLEM)})
def payload_token(call: Call, job_id: int) -> dict[str, Any]:
    settings = call.runtime.settings
    if not settings.tokens.payload_tokens:
        raise Problem(404, "this service gives payloads no tokens ([tokens] payload_tokens "
                           "= false)")
    p = call.principal
    reference = call.body["pilot_reference"]
    if p.pilot is not None and reference != p.pilot:
        raise Problem(403, f"this token speaks for pilot {p.pilot} only, not {reference}")
    issuer = payload_token_issuer(call.runtime)

    def work(session: Session) -> IssuedToken:
        job = session.get(Job, job_id)
        if job is None or job.vo != p.vo:
            raise Problem(404, f"job {job_id} does not exist in VO {p.vo}")
        if job.pilot_reference != reference:
            raise Problem(403, f"job {job_id} is not pilot {reference}'s to run")
        if job.status not in RUNNABLE:
            raise Problem(409, f"job {job_id} is {job.status}: its payload gets no token")
        stop = pilot_stop_reason(session, p.vo, reference, now=call.now)
        if stop:
            raise Problem(403, f"{stop}: its payloads get no token")
        asked = described_scopes(stored_description, job.description, job.description_format,
                                 job.bulk_index)
        return issuer.issue(session, payload_grant(settings, job.vo, job.owner, job.id, asked),
                            call.now)

    return token_answer(call.runtime.transaction(work))
