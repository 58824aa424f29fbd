"""Signing in to the dashboard: a bearer token is exchanged for a session cookie.

The token is checked by the matcher's own verification (:func:`matcher.auth.principal_from_header`),
so whatever tokens the API accepts, the sign-in accepts. The cookie holds the caller's identity,
an expiry (``dashboard.session_lifetime``, never past the token's own) and a random CSRF value,
signed (HS256) with a key derived from the service secret for this use only: a cookie is not a
token the API would accept, nor the reverse. It is HttpOnly, SameSite=Strict, Secure when the
page came over HTTPS. Being signed rather than stored, it is valid in every matcher process;
signing out records the session (taskqueue.signouts), and its cookie opens no page after that.

Every form that acts carries the CSRF value and is refused without it; the sign-in form itself
carries one bound to a short-lived cookie of its own.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from typing import Any

import jwt
from flask import Request, Response

from matcher import idp
from matcher.auth import Principal, principal_from_header
from matcher.idp import IdentityProviders

COOKIE = "gridpilot_session"
LOGIN_COOKIE = "gridpilot_login"
PATH = "/ui"
ISSUER = "gridpilot-dashboard"
ALGORITHM = "HS256"
#: Seconds the sign-in form stays valid.
LOGIN_FORM_LIFETIME = 900


@dataclass(frozen=True)
class Viewer:
    """Who is signed in, until when, and the value their forms must carry."""

    principal: Principal
    expires: int
    csrf: str

    @property
    def is_operator(self) -> bool:
        return self.principal.role == "operator"

    @property
    def session_id(self) -> str:
        """The session's id where sign-outs are recorded (a hash of its random value)."""
        return hashlib.sha256(self.csrf.encode()).hexdigest()


def session_key(secret: str) -> bytes:
    return hmac.new(secret.encode(), b"gridpilot dashboard session cookie",
                    hashlib.sha256).digest()


def sign_in(token: str, secret: str, *, lifetime: int, now: float | None = None,
            providers: IdentityProviders | None = None) -> Viewer:
    """The viewer a token makes (this service's or one of the identity ``providers``');
    raises the matcher's Problem (401) for a bad token and ValueError for a token that may not
    sign in."""
    principal = principal_from_header(f"Bearer {token.strip()}", secret, providers)
    if principal.scopes is not None and idp.READ not in principal.scopes:
        raise ValueError(f"the token does not grant {idp.READ}, which the dashboard needs")
    if principal.role not in ("user", "operator"):
        raise ValueError(f"a {principal.role} token cannot sign in to the dashboard; use a "
                         "user's or an operator's token")
    claims = jwt.decode(token.strip(), options={"verify_signature": False})
    now = time.time() if now is None else now
    expires = int(min(now + lifetime, float(claims.get("exp", now + lifetime))))
    return Viewer(principal, expires, secrets.token_urlsafe(24))


def encode(viewer: Viewer, secret: str) -> str:
    p = viewer.principal
    claims: dict[str, Any] = {"iss": ISSUER, "sub": p.subject, "role": p.role, "vo": p.vo,
                              "group": p.group, "exp": viewer.expires, "csrf": viewer.csrf}
    if p.scopes is not None:
        claims["scopes"] = sorted(p.scopes)
    return jwt.encode(claims, session_key(secret), algorithm=ALGORITHM)


def decode(value: str | None, secret: str) -> Viewer | None:
    """The viewer a cookie names, or None when it is missing, forged or expired."""
    if not value:
        return None
    try:
        claims = jwt.decode(value, session_key(secret), algorithms=[ALGORITHM], issuer=ISSUER,
                            options={"require": ["exp", "sub", "role", "vo", "group", "csrf"]})
    except jwt.InvalidTokenError:
        return None
    if claims["role"] not in ("user", "operator"):
        return None
    scopes = claims.get("scopes")
    return Viewer(Principal(claims["sub"], claims["role"], claims["vo"], claims["group"],
                            scopes=None if scopes is None else frozenset(map(str, scopes))),
                  int(claims["exp"]), str(claims["csrf"]))


def set_session(response: Response, request: Request, viewer: Viewer, secret: str) -> None:
    response.set_cookie(COOKIE, encode(viewer, secret), expires=viewer.expires, path=PATH,
                        httponly=True, secure=request.is_secure, samesite="Strict")
    response.delete_cookie(LOGIN_COOKIE, path=PATH)


def clear_session(response: Response) -> None:
    response.delete_cookie(COOKIE, path=PATH, httponly=True, samesite="Strict")


def set_login_cookie(response: Response, request: Request, value: str) -> None:
    """The sign-in form's CSRF value, also in a short-lived cookie of its own."""
    response.set_cookie(LOGIN_COOKIE, value, max_age=LOGIN_FORM_LIFETIME, path=PATH,
                        httponly=True, secure=request.is_secure, samesite="Strict")


def same(a: str | None, b: str | None) -> bool:
    """Constant-time comparison of two CSRF values; missing ones never match."""
    return bool(a) and bool(b) and hmac.compare_digest(str(a), str(b))
