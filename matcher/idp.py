"""Tokens from a VO's identity provider: WLCG-profile JWTs signed with the provider's keys.

Each configured issuer (``[[auth.issuers]]``) publishes its public keys as a JWKS. A token
whose ``iss`` names one of them is verified with the key its header names (``kid``), fetched
through PyJWT's :class:`jwt.PyJWKClient` and kept for ``jwks_lifetime`` seconds; a key the
kept set does not hold makes one new fetch, at most every ``refetch_interval`` seconds (so a
stream of made-up key ids cannot turn the matcher into a client hammering the provider).
Only asymmetric algorithms are accepted, and only the one the key itself is for: an HS256
token signed with the public key, or an unsigned one, is refused.

The claims map onto a :class:`~matcher.auth.Principal`: the issuer's VO; the group from the
token's ``wlcg.groups`` (its first group the issuer's ``groups`` table maps); the role
operator or pilot for members of ``operator_groups`` / ``pilot_groups``, user otherwise;
and the WLCG compute scopes (``compute.read``, ``compute.create``, ``compute.modify``,
``compute.cancel``) bound what the token may do, operation by operation.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jwt

from taskqueue.core.settings import IssuerSettings

log = logging.getLogger(__name__)

READ, CREATE, MODIFY, CANCEL = ("compute.read", "compute.create", "compute.modify",
                                "compute.cancel")
COMPUTE_SCOPES = (READ, CREATE, MODIFY, CANCEL)

Clock = Callable[[], float]
#: Most verified tokens kept per process.
VERIFIED_MAX = 10_000


class TokenRefused(Exception):
    """A token this module will not accept; the message says why, for the caller."""


class KeySet:
    """One issuer's public keys, fetched from its JWKS URL and kept for a while."""

    def __init__(self, issuer: IssuerSettings, clock: Clock = time.monotonic) -> None:
        self.issuer = issuer
        self._clock = clock
        self._client = jwt.PyJWKClient(issuer.jwks_url, cache_keys=False, cache_jwk_set=False,
                                       timeout=max(1, math.ceil(issuer.timeout)),
                                       headers={"User-Agent": "gridpilot-matcher"})
        self._keys: dict[str, jwt.PyJWK] = {}
        self._fetched_at = -math.inf
        self._tried_at = -math.inf
        self._lock = threading.Lock()
        #: How many times the key set was fetched (or tried): for tests and logs.
        self.fetches = 0
        #: Changes with every key set fetched: what was verified with an older one is not
        #: taken on trust any more.
        self.generation = 0

    def current_generation(self) -> int:
        """The generation of the kept keys, fetching them again when they are too old."""
        with self._lock:
            now = self._clock()
            if now - self._fetched_at >= self.issuer.jwks_lifetime:
                self._fetch(now)
            return self.generation

    def key(self, kid: str) -> jwt.PyJWK:
        with self._lock:
            now = self._clock()
            if now - self._fetched_at >= self.issuer.jwks_lifetime:
                self._fetch(now)
            key = self._keys.get(kid)
            if key is None and now - self._tried_at >= self.issuer.refetch_interval:
                self._fetch(now)
                key = self._keys.get(kid)
        if key is None:
            raise TokenRefused(f"the token's key {kid!r} is not among the keys its issuer "
                               f"{self.issuer.issuer} publishes (unknown, rotated out or "
                               "revoked)")
        return key

    def _fetch(self, now: float) -> None:
        self._tried_at = now
        self.fetches += 1
        try:
            found = self._client.get_jwk_set(refresh=True)
        except jwt.PyJWKClientError as exc:
            if self._keys:
                # The keys fetched last stay in use; a fetch is tried again after
                # refetch_interval, or on the next key the set does not hold.
                log.warning("cannot fetch the keys of %s from %s, keeping the last ones: %s",
                            self.issuer.issuer, self.issuer.jwks_url, exc)
                return
            raise TokenRefused(f"the keys of the token's issuer {self.issuer.issuer} cannot "
                               f"be fetched: {exc}") from exc
        keys: dict[str, jwt.PyJWK] = {}
        for key in found.keys:
            if key.key_id and key.public_key_use in (None, "sig"):
                keys[key.key_id] = key
        self._keys = keys
        self._fetched_at = now
        self.generation += 1


class IdentityProviders:
    """The configured issuers and their key sets; one per matcher process."""

    def __init__(self, issuers: Sequence[IssuerSettings], clock: Clock = time.monotonic
                 ) -> None:
        self._sets = {i.issuer: KeySet(i, clock) for i in issuers}
        #: Tokens verified already (a pilot sends the same one with every request): good
        #: until they expire or their issuer's keys are fetched again.
        self._verified: dict[str, tuple[KeySet, int, IssuerSettings, dict[str, Any]]] = {}

    def __bool__(self) -> bool:
        return bool(self._sets)

    def key_set(self, issuer: str) -> KeySet | None:
        return self._sets.get(issuer)

    def verify(self, token: str) -> tuple[IssuerSettings, dict[str, Any]]:
        """The issuer and the verified claims of ``token``; TokenRefused when it is not
        valid. ``token`` must have been routed here by its (unverified) ``iss``."""
        known = self._verified.get(token)
        if known is not None:
            keys, generation, issuer, claims = known
            if (float(claims["exp"]) + issuer.leeway > time.time()
                    and keys.current_generation() == generation):
                return issuer, claims
            self._verified.pop(token, None)
        issuer, claims = self._verify(token)
        keys = self._sets[issuer.issuer]
        if len(self._verified) >= VERIFIED_MAX:
            self._verified.clear()
        self._verified[token] = (keys, keys.generation, issuer, claims)
        return issuer, claims

    def _verify(self, token: str) -> tuple[IssuerSettings, dict[str, Any]]:
        try:
            header = jwt.get_unverified_header(token)
            unverified = jwt.decode(token, options={"verify_signature": False})
        except jwt.InvalidTokenError as exc:
            raise TokenRefused(f"the token is not valid: {exc}") from exc
        keys = self._sets.get(str(unverified.get("iss")))
        if keys is None:
            raise TokenRefused(f"the token's issuer {unverified.get('iss')!r} is not trusted "
                               "here")
        issuer = keys.issuer
        alg = header.get("alg")
        if alg not in issuer.algorithms:
            raise TokenRefused(f"the token is signed with {alg!r}; tokens of {issuer.issuer} "
                               f"must use {' or '.join(issuer.algorithms)}")
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid:
            raise TokenRefused("the token's header names no key (kid)")
        key = keys.key(kid)
        if key.algorithm_name != alg:
            raise TokenRefused(f"the token is signed with {alg!r} but its key {kid!r} is for "
                               f"{key.algorithm_name}")
        try:
            claims: dict[str, Any] = jwt.decode(
                token, key, algorithms=[alg], issuer=issuer.issuer,
                audience=list(issuer.audiences), leeway=issuer.leeway,
                options={"require": ["exp", "iss", "aud", issuer.subject_claim]})
        except jwt.ExpiredSignatureError as exc:
            raise TokenRefused("the token has expired; ask your identity provider for a new "
                               "one") from exc
        except jwt.ImmatureSignatureError as exc:
            raise TokenRefused("the token is not valid yet (nbf or iat lies in the "
                               "future)") from exc
        except jwt.InvalidAudienceError as exc:
            raise TokenRefused(f"the token's audience is not one this service accepts "
                               f"({', '.join(issuer.audiences)})") from exc
        except jwt.InvalidTokenError as exc:
            raise TokenRefused(f"the token is not valid: {exc}") from exc
        return issuer, claims


def identity(issuer: IssuerSettings, claims: Mapping[str, Any]
             ) -> tuple[str, str, str, frozenset[str]]:
    """Subject, role, group and compute scopes of verified ``claims``."""
    subject = claims.get(issuer.subject_claim)
    if not isinstance(subject, str) or not subject.strip():
        raise TokenRefused(f"the token's claim {issuer.subject_claim!r} is missing or empty")
    groups = claims.get("wlcg.groups", [])
    if isinstance(groups, str):
        groups = [groups]
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        raise TokenRefused("the token's claim 'wlcg.groups' must be a list of group names")
    mapped = [issuer.groups[g] for g in groups if g in issuer.groups]
    if not mapped:
        raise TokenRefused(f"none of the token's groups ({', '.join(groups) or 'none'}) is "
                           f"one that {issuer.issuer} maps onto a group of VO {issuer.vo}")
    if any(g in issuer.operator_groups for g in groups):
        role = "operator"
    elif any(g in issuer.pilot_groups for g in groups):
        role = "pilot"
    else:
        role = "user"
    scope = claims.get("scope", "")
    if not isinstance(scope, str):
        raise TokenRefused("the token's claim 'scope' must be a string of space-separated "
                           "scopes")
    scopes = frozenset(s for s in scope.split() if s in COMPUTE_SCOPES)
    if not scopes:
        raise TokenRefused(f"the token grants none of the scopes {', '.join(COMPUTE_SCOPES)}")
    return subject, role, mapped[0], scopes


#: Operations sent as POST that only read: they answer a question and change nothing.
READ_ONLY_POSTS = frozenset({"/api/v1/taskqueues/explain", "/api/v1/taskqueues/matching"})
SANDBOXES = "/api/v1/sandboxes"


def scope_for(method: str, rule: str, role: str = "user") -> str:
    """The WLCG compute scope an operation needs: reading (explaining included), submitting
    (a user's or operator's upload of the input sandboxes a job takes in included),
    cancelling (kill, delete) or changing anything else (a pilot's upload of its job's
    output included)."""
    if method in ("GET", "HEAD") or (method == "POST" and rule in READ_ONLY_POSTS):
        return READ
    if method == "POST" and rule == "/api/v1/jobs":
        return CREATE
    if (rule == SANDBOXES or rule.startswith(SANDBOXES + "/")) and role != "pilot":
        return CREATE
    if (method == "DELETE" and rule.startswith("/api/v1/jobs")) or rule.endswith(
            ("/kill", "/delete")):
        return CANCEL
    return MODIFY
