"""Bearer tokens: signed JWTs (HS256) that say who calls, in which role, VO and group.

Roles: ``user`` (submits and acts on its own jobs), ``pilot`` (matches jobs of its VO, and of
its site when the token names one; reports only on jobs it was given) and ``operator`` (acts on
every job of its VO and on the VO's site mask, limits and shares). A pilot token may also name
the one pilot reference it may speak for.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import jwt

from matcher import idp
from matcher.idp import IdentityProviders
from matcher.problems import Problem
from taskqueue.tokens import ALGORITHM, CLAIM_LIMITS, ISSUER, ROLES, issue_token

__all__ = ["ALGORITHM", "ISSUER", "OPERATOR", "PILOT", "ROLES", "USER", "VERIFIED", "Principal",
           "VerifiedTokens", "authorize", "issue_token", "principal_from_header", "require_role",
           "require_scope"]

USER, PILOT, OPERATOR = ROLES


@dataclass(frozen=True)
class Principal:
    subject: str
    role: str
    vo: str
    group: str
    #: Pilot tokens only: the site the pilot runs at, and the one reference it speaks for.
    site: str | None = None
    pilot: str | None = None
    #: Who issued the token (this service, or an identity provider) and when it expires.
    issuer: str = ISSUER
    expires_at: float | None = None
    #: When this service issued the token (its own tokens only).
    issued_at: float | None = None
    #: An identity provider's token: the WLCG compute scopes it grants (None: every one).
    scopes: frozenset[str] | None = None

    @property
    def name(self) -> str:
        return f"{self.role}:{self.subject}"


def principal_from_header(header: str | None, secret: str,
                          providers: IdentityProviders | None = None) -> Principal:
    """The caller named by an ``Authorization: Bearer`` header; 401 when there is none or it is
    not valid. Tokens of the configured identity ``providers`` are verified with their keys
    (matcher.idp), every other one as this service's own."""
    if not header:
        raise Problem(401, "this endpoint needs a token: send 'Authorization: Bearer <token>' "
                      "(gridpilot token issue makes one)")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Problem(401, "the Authorization header must be 'Bearer <token>'")
    token = token.strip()
    known = VERIFIED.get(token, secret)
    if known is not None:
        return known
    if providers and _issuer_of(token) not in (None, ISSUER):
        return _provider_principal(token, providers)
    try:
        claims = jwt.decode(token, secret, algorithms=[ALGORITHM], issuer=ISSUER,
                            options={"require": ["exp", "iat", "iss", "sub"]})
    except jwt.ExpiredSignatureError as exc:
        raise Problem(401, "the token has expired; ask for a new one") from exc
    except jwt.InvalidTokenError as exc:
        raise Problem(401, f"the token is not valid: {exc}") from exc
    principal = replace(_principal(claims), expires_at=float(claims["exp"]),
                        issued_at=float(claims["iat"]))
    VERIFIED.put(token, secret, principal)
    return principal


class VerifiedTokens:
    """This service's own tokens verified already, by token and secret: a pilot sends the
    same token with every request, and checking its signature and claims again would cost
    more than the rest of the request.

    An entry answers only while its token has not expired and for at most ``ttl`` seconds
    after it was verified, whichever ends first; then the token is verified again from
    scratch. A token the verifier accepted once stays acceptable until its ``exp`` (the
    checks of a signed token's other claims give the same answer later), so the cache never
    accepts a token the verifier would refuse; the short ``ttl`` bounds how long a changed
    rule of verification would take to reach a token already seen. At most ``size`` tokens
    are kept: a new one pushes out the oldest."""

    def __init__(self, ttl: float = 60.0, size: int = 10_000,
                 clock: Callable[[], float] = time.time) -> None:
        self.ttl = ttl
        self.size = size
        self._clock = clock
        self._entries: dict[tuple[str, str], tuple[float, Principal]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, token: str, secret: str) -> Principal | None:
        """The principal of ``token`` verified with ``secret``, if it still may be used."""
        known = self._entries.get((token, secret))
        if known is None:
            return None
        if known[0] > self._clock():
            return known[1]
        self._entries.pop((token, secret), None)
        return None

    def put(self, token: str, secret: str, principal: Principal) -> None:
        """Keep ``principal``, just verified from ``token`` (its ``expires_at`` set)."""
        assert principal.expires_at is not None
        # The verifier reads exp as an integer (a token is expired from that second on).
        until = min(float(int(principal.expires_at)), self._clock() + self.ttl)
        entries = self._entries
        entries.pop((token, secret), None)
        while len(entries) >= self.size:
            try:
                del entries[next(iter(entries))]  # the oldest
            except (StopIteration, KeyError, RuntimeError):  # emptied by another thread
                break
        entries[(token, secret)] = (until, principal)


#: The process's verified tokens.
VERIFIED = VerifiedTokens()


def _issuer_of(token: str) -> str | None:
    """The token's ``iss`` before any check (to choose how to verify it), None if unreadable."""
    try:
        iss = jwt.decode(token, options={"verify_signature": False}).get("iss")
    except jwt.InvalidTokenError:
        return None
    return iss if isinstance(iss, str) else None


def _provider_principal(token: str, providers: IdentityProviders) -> Principal:
    try:
        issuer, claims = providers.verify(token)
        subject, role, group, scopes = idp.identity(issuer, claims)
    except idp.TokenRefused as exc:
        raise Problem(401, str(exc)) from exc
    for name, value in (("sub", subject), ("vo", issuer.vo), ("group", group)):
        if len(value) > CLAIM_LIMITS[name]:
            raise Problem(401, f"the token's {name} is longer than {CLAIM_LIMITS[name]} "
                          "characters")
    return Principal(subject, role, issuer.vo, group, issuer=issuer.issuer,
                     expires_at=float(claims["exp"]), scopes=scopes)


def require_scope(principal: Principal, needed: str) -> None:
    """403 when an identity provider's token does not grant the compute scope ``needed``
    (:func:`matcher.idp.scope_for` names an API operation's)."""
    if principal.scopes is not None and needed not in principal.scopes:
        raise Problem(403, f"the token does not grant the scope {needed} that this needs "
                      f"(it grants {', '.join(sorted(principal.scopes))})")


def _principal(claims: Mapping[str, Any]) -> Principal:
    fields = {}
    for name in ("sub", "role", "vo", "group"):
        value = claims.get(name)
        if not isinstance(value, str) or not value.strip():
            raise Problem(401, f"the token's claim {name!r} is missing or empty")
        fields[name] = value
    for name, limit in CLAIM_LIMITS.items():
        value = claims.get(name)
        if isinstance(value, str) and len(value) > limit:
            raise Problem(401, f"the token's claim {name!r} is longer than {limit} characters")
        if isinstance(value, str) and any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise Problem(401, f"the token's claim {name!r} holds a control character")
    if fields["role"] not in ROLES:
        raise Problem(401, f"the token's role {fields['role']!r} is not one of "
                      f"{', '.join(ROLES)}")
    optional = {}
    for name in ("site", "pilot"):
        value = claims.get(name)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise Problem(401, f"the token's claim {name!r} must be a non-empty string")
        optional[name] = value
    return Principal(fields["sub"], fields["role"], fields["vo"], fields["group"],
                     optional["site"], optional["pilot"])


def authorize(header: str | None, secret: str, providers: IdentityProviders | None,
              roles: tuple[str, ...], method: str, rule: str) -> Principal:
    """The caller of ``method`` ``rule`` named by an ``Authorization`` header, holding one of
    ``roles`` and the scope the operation needs; Problem 401 or 403 otherwise."""
    principal = principal_from_header(header, secret, providers)
    require_role(principal, roles)
    require_scope(principal, idp.scope_for(method, rule, principal.role))
    return principal


def require_role(principal: Principal, roles: tuple[str, ...]) -> None:
    if principal.role not in roles:
        raise Problem(403, f"a {principal.role} token may not do this; it needs the role "
                      f"{' or '.join(roles)}")
