"""The scopes of a payload's token (WLCG profile): what a VO grants its jobs' owners, and a
job's own narrower request.

A storage scope is ``name:path`` (``storage.read:/lhcb/data``); it covers the same name on its
path and below it (``storage.read:/`` covers ``storage.read:/lhcb/data``, not
``storage.read:/lhcbx``). A scope without a path covers only itself.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable

from taskqueue.core.settings import TokenSettings

#: At most this many scopes a job may ask for, each at most this long.
MAX_SCOPES, MAX_SCOPE_LENGTH = 32, 512


def granted_scopes(tokens: TokenSettings, vo: str, owner: str) -> tuple[str, ...]:
    """The scopes a payload of ``owner`` in ``vo`` is granted."""
    scopes = tokens.vo_storage_scopes.get(vo, tokens.storage_scopes)
    return tuple(s.replace("{vo}", vo).replace("{owner}", owner) for s in scopes)


def _split(scope: str) -> tuple[str, str | None]:
    name, colon, path = scope.partition(":")
    return name, (path if colon else None)


def covers(granted: str, requested: str) -> bool:
    """Whether ``granted`` allows all that ``requested`` asks."""
    g_name, g_path = _split(granted)
    r_name, r_path = _split(requested)
    if g_name != r_name:
        return False
    if g_path is None or r_path is None:
        return g_path == r_path
    if not r_path.startswith("/") or ".." in r_path.split("/"):
        return False
    g, r = posixpath.normpath(g_path or "/"), posixpath.normpath(r_path)
    return g == "/" or r == g or r.startswith(g.rstrip("/") + "/")


def scope_problem(requested: Iterable[str], granted: Iterable[str]) -> str | None:
    """Why a job's requested scopes cannot be had (a wider one, a malformed one), or None."""
    asked = list(requested)
    allowed = list(granted)
    if len(asked) > MAX_SCOPES:
        return f"TokenScopes asks for {len(asked)} scopes; at most {MAX_SCOPES}"
    for scope in asked:
        if not scope or len(scope) > MAX_SCOPE_LENGTH or any(c.isspace() for c in scope):
            return (f"TokenScopes: {scope[:80]!r} is not a scope (one word of at most "
                    f"{MAX_SCOPE_LENGTH} characters, e.g. storage.read:/path)")
        if not any(covers(g, scope) for g in allowed):
            return (f"TokenScopes: {scope!r} is not within what the VO grants its jobs "
                    f"({' '.join(allowed) or 'nothing'}): a job may narrow its token's scopes, "
                    "never widen them")
    return None


def payload_scopes(requested: Iterable[str], granted: Iterable[str]) -> tuple[str, ...]:
    """The scopes of a payload's token: those the job asked for that are still granted (the
    VO's grant may have narrowed since it was submitted), else all that is granted."""
    asked = tuple(dict.fromkeys(requested))
    allowed = tuple(granted)
    if not asked:
        return allowed
    return tuple(s for s in asked if any(covers(g, s) for g in allowed))
