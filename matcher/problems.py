"""Errors as RFC 9457 problem details: ``application/problem+json`` with a ``detail`` a person
can act on. Views raise :class:`Problem` (or a taskqueue error, mapped here); nothing else
reaches the client, and never a traceback."""

from __future__ import annotations

import logging
from typing import Any

from flask import Flask, Response, json
from werkzeug.exceptions import HTTPException

from taskqueue.core.errors import (
    ConfigurationError,
    ConflictError,
    DatabaseUnavailableError,
    ForbiddenError,
    GridpilotError,
    IllegalTransitionError,
    InvalidInputError,
    NotFoundError,
)

PROBLEM_TYPE = "application/problem+json"
#: Seconds a 503 answer asks the client to wait before it tries again.
RETRY_AFTER = "5"
log = logging.getLogger(__name__)

_TITLES = {400: "Bad request", 401: "Unauthorized", 403: "Forbidden", 404: "Not found",
           405: "Method not allowed", 409: "Conflict", 413: "Request body too large",
           415: "Unsupported media type", 422: "Invalid input", 500: "Internal error",
           503: "Service unavailable"}


class Problem(Exception):
    """An HTTP error with a human detail; ``extra`` members join the problem document."""

    def __init__(self, status: int, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.extra = extra


def problem_response(status: int, detail: str, **extra: Any) -> Response:
    body = {"type": "about:blank", "title": _TITLES.get(status, "Error"), "status": status,
            "detail": detail, **extra}
    response = Response(json.dumps(body), status=status, mimetype=PROBLEM_TYPE)
    if status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="gridpilot"'
    if status == 503:  # the database, or this instance, cannot serve now: soon again
        response.headers["Retry-After"] = RETRY_AFTER
    return response


def status_of(exc: GridpilotError) -> int:
    """The HTTP status for a taskqueue/optimizers error."""
    if isinstance(exc, NotFoundError):
        return 404
    if isinstance(exc, ForbiddenError):
        return 403
    if isinstance(exc, IllegalTransitionError | ConflictError):
        return 409
    if isinstance(exc, InvalidInputError):
        return 422
    if isinstance(exc, DatabaseUnavailableError):
        return 503
    if isinstance(exc, ConfigurationError):
        return 500
    return 500


def install(app: Flask) -> None:
    """Route every error through :func:`problem_response`."""

    @app.errorhandler(Problem)
    def _problem(exc: Problem) -> Response:
        return problem_response(exc.status, exc.detail, **exc.extra)

    @app.errorhandler(GridpilotError)
    def _domain(exc: GridpilotError) -> Response:
        status = status_of(exc)
        if status >= 500:
            log.error("request failed: %s", exc)
        return problem_response(status, exc.message)

    @app.errorhandler(HTTPException)
    def _http(exc: HTTPException) -> Response:
        status = exc.code or 500
        detail = {
            404: "nothing here: no such endpoint or object (the API is described at "
                 "/api/v1/openapi.json)",
            405: "this endpoint does not accept that method",
            413: f"the request body is larger than the {app.config['MAX_CONTENT_LENGTH']} "
                 "bytes accepted",
        }.get(status, exc.description or _TITLES.get(status, "error"))
        response = problem_response(status, detail)
        allowed = getattr(exc, "valid_methods", None)
        if status == 405 and allowed:
            # The methods the API documents: not the HEAD and OPTIONS Flask adds to each route.
            response.headers["Allow"] = ", ".join(sorted(set(allowed) - {"HEAD", "OPTIONS"}))
        return response

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception) -> Response:
        log.exception("unexpected error")
        return problem_response(500, "the service failed to handle this request; the error is "
                                "in its log")
