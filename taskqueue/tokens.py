"""Issuing bearer tokens: JWTs signed with HS256, made with the standard library.

The matcher verifies them (matcher.auth, with PyJWT); the CLI issues them for people, and the
site director for each pilot it submits. The claims: ``iss`` (gridpilot), ``sub`` (who),
``role`` (user, pilot, operator), ``vo``, ``group``, ``iat``, ``exp``, and for pilots
optionally ``site`` (the one site it may match for) and ``pilot`` (the one pilot reference it
speaks for).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from typing import Any

ALGORITHM = "HS256"
ISSUER = "gridpilot"
ROLES: tuple[str, ...] = ("user", "pilot", "operator")
#: Longest value of each claim (the database columns they are stored in).
CLAIM_LIMITS = {"sub": 255, "role": 16, "vo": 64, "group": 128, "site": 128, "pilot": 255}


def issue_token(secret: str, *, subject: str, role: str, vo: str, group: str,
                lifetime: int, site: str | None = None, pilot: str | None = None,
                now: float | None = None) -> str:
    """A signed token for the claims given, valid for ``lifetime`` seconds; ValueError for
    claims the matcher would refuse."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    if (site or pilot) and role != "pilot":
        raise ValueError("only a pilot token names a site or a pilot reference")
    for name, claim, value in (("subject", "sub", subject), ("vo", "vo", vo),
                               ("group", "group", group), ("site", "site", site or ""),
                               ("pilot", "pilot", pilot or "")):
        if name in ("subject", "vo", "group") and not value.strip():
            raise ValueError(f"a token's {name} must not be empty")
        if len(value) > CLAIM_LIMITS[claim]:
            raise ValueError(f"a token's {name} must be at most {CLAIM_LIMITS[claim]} "
                             "characters")
    if lifetime < 1:
        raise ValueError(f"a token's lifetime must be at least one second, got {lifetime}")
    if not secret:
        raise ValueError("a token needs a signing secret")
    issued = int(now if now is not None else time.time())
    claims: dict[str, Any] = {"iss": ISSUER, "sub": subject, "role": role, "vo": vo,
                              "group": group, "iat": issued, "exp": issued + lifetime}
    if site:
        claims["site"] = site
    if pilot:
        claims["pilot"] = pilot
    header = _part({"alg": ALGORITHM, "typ": "JWT"})
    body = _part(claims)
    signature = hmac.new(secret.encode(), f"{header}.{body}".encode(), hashlib.sha256).digest()
    return f"{header}.{body}.{_b64(signature)}"


def _part(data: dict[str, Any]) -> str:
    return _b64(json.dumps(data, separators=(",", ":")).encode())


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()
