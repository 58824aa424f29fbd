"""/api/v1/whoami: who the caller's token says it is, as the service understood it (role, VO
and group, also for identity-provider tokens, whose scopes and groups are mapped)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from flask import Blueprint

from matcher import schemas
from matcher.api import Call, endpoint
from matcher.auth import ROLES
from matcher.views import iso

bp = Blueprint("whoami", __name__, url_prefix="/api/v1")


@endpoint(bp, "GET", "/whoami", tag="service", roles=ROLES,
          summary="Who the token says the caller is: subject, role, VO, group, issuer, expiry",
          responses={200: ("The caller", schemas.WHOAMI)})
def whoami(call: Call) -> dict[str, Any]:
    p = call.principal
    expires = (None if p.expires_at is None
               else iso(datetime.fromtimestamp(p.expires_at, UTC)))
    return {"subject": p.subject, "role": p.role, "vo": p.vo, "group": p.group,
            "site": p.site, "pilot": p.pilot, "issuer": p.issuer, "expires_at": expires,
            "scopes": None if p.scopes is None else sorted(p.scopes)}
