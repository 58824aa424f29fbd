"""The dashboard's blueprint and what every page shares: who is signed in, the role a page
needs, CSRF checks on every action, HTML error pages, and the security headers."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any
from urllib.parse import urlencode, urlsplit

from flask import Blueprint, Response, current_app, g, redirect, render_template, request, url_for

from matcher.api import MAX_ID
from matcher.auth import require_scope
from matcher.dashboard import session as cookies
from matcher.dashboard.session import Viewer
from matcher.idp import CANCEL, MODIFY
from matcher.problems import Problem, status_of
from matcher.runtime import Runtime, runtime_of
from taskqueue.core.buckets import memory_text
from taskqueue.core.errors import GridpilotError
from taskqueue.signouts import is_signed_out

bp = Blueprint("ui", __name__, url_prefix="/ui", template_folder="templates",
               static_folder="static")

#: Content-Security-Policy of every page: only the package's own script and style.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")


@dataclass
class Page:
    """What a view gets: the viewer, the service, and the time of the request."""

    viewer: Viewer
    runtime: Runtime
    now: datetime

    @property
    def vo(self) -> str:
        return self.viewer.principal.vo

    @property
    def page_size(self) -> int:
        return self.runtime.settings.dashboard.page_size


View = Callable[..., Any]


def page(*, operator: bool = False) -> Callable[[View], View]:
    """A dashboard view: signed-in viewers only (operators only, when ``operator``); a POST
    must carry the viewer's CSRF value."""
    def wrap(view: View) -> View:
        @functools.wraps(view)
        def handle(**kwargs: Any) -> Any:
            runtime = runtime_of(current_app)
            viewer = current_viewer()
            if viewer is None:
                if request.method != "GET":
                    raise Problem(401, "your session has ended; sign in again")
                return redirect(url_for("ui.login", next=request.full_path.rstrip("?")))
            g.viewer = viewer
            for name, value in kwargs.items():
                if isinstance(value, int) and value > MAX_ID:
                    raise Problem(404, f"{name.replace('_', ' ')} {value} does not exist")
            if operator and not viewer.is_operator:
                raise Problem(403, "this page is for the VO's operators; a user sees their "
                              "own jobs")
            if request.method == "POST":
                check_csrf(viewer.csrf)
                if request.endpoint != "ui.logout":
                    # An identity provider's token acts only within its scopes.
                    needed = CANCEL if kwargs.get("action") == "kill" else MODIFY
                    require_scope(viewer.principal, needed)
            return view(Page(viewer, runtime, datetime.now(UTC)), **kwargs)
        return handle
    return wrap


def current_viewer() -> Viewer | None:
    """The viewer the request's session cookie names, unless it was signed out."""
    runtime = runtime_of(current_app)
    viewer = cookies.decode(request.cookies.get(cookies.COOKIE), runtime.secret)
    if viewer is None or runtime.transaction(partial(is_signed_out,
                                                     session_id=viewer.session_id)):
        return None
    return viewer


def check_csrf(expected: str) -> None:
    """Refuse a form that does not carry the expected CSRF value, or that comes from
    another site."""
    origin = request.headers.get("Origin")
    if origin and origin != "null" and urlsplit(origin).netloc != request.host:
        raise Problem(403, "this form was sent from another site")
    if not cookies.same(request.form.get("csrf"), expected):
        raise Problem(403, "this form has expired or was not made by this page; reload the "
                      "page and try again")


def render(template: str, code: int = 200, **context: Any) -> Response:
    """A page from the dashboard's templates, with HTTP status ``code``."""
    return Response(render_template(f"ui/{template}", **context), status=code,
                    mimetype="text/html")


def safe_next(target: str | None) -> str:
    """Where to go after signing in: a dashboard page of this service, nothing else."""
    if target and target.startswith("/ui/") and not target.startswith("//") \
            and "\\" not in target and re.fullmatch(r"[\x21-\x7e]*", target):
        return target
    return url_for("ui.overview")


def query_url(endpoint: str, args: dict[str, Any], **changes: Any) -> str:
    """The URL of ``endpoint`` with the current filters ``args`` and ``changes`` (None or ""
    drops a parameter)."""
    merged = {k: v for k, v in {**args, **changes}.items() if v not in (None, "")}
    base = url_for(endpoint)
    return f"{base}?{urlencode(merged)}" if merged else base


@bp.after_app_request
def _headers(response: Response) -> Response:
    """The security headers of every answer under /ui, those of no view included (a path
    no page serves answers 404 outside the blueprint)."""
    if request.path != bp.url_prefix and not request.path.startswith(f"{bp.url_prefix}/"):
        return response
    response.headers.setdefault("Content-Security-Policy", CSP)
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "same-origin"
    response.headers["X-Frame-Options"] = "DENY"
    if response.mimetype == "text/html":
        response.headers["Cache-Control"] = "no-store"
    return response


@bp.errorhandler(Problem)
def _problem(exc: Problem) -> Response:
    return _error_page(exc.status, exc.detail)


@bp.errorhandler(GridpilotError)
def _domain(exc: GridpilotError) -> Response:
    return _error_page(status_of(exc), exc.message)


def _error_page(status: int, detail: str) -> Response:
    titles = {400: "Bad request", 401: "Signed out", 403: "Not allowed", 404: "Not found",
              409: "Not possible now", 422: "Invalid input"}
    return render("error.html", status, title=titles.get(status, "Error"), status=status,
                  detail=detail, viewer=g.get("viewer"))


@bp.app_template_filter("when")
def _when(value: datetime | None) -> str:
    """A UTC time for tables: date and time to the second."""
    return "—" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


@bp.app_template_filter("ago")
def _ago(value: datetime | None) -> str:
    """How long ago, in words a person reads at a glance."""
    if value is None:
        return "never"
    seconds = int((datetime.now(UTC) - value).total_seconds())
    if seconds < 0:
        return "just now"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit} ago"
    return f"{seconds} s ago"


@bp.app_template_filter("lasting")
def _lasting(value: datetime | None) -> str:
    """How long since ``value``, as a length of time ("12 min")."""
    return "" if value is None else _ago(value).removesuffix(" ago")


@bp.app_template_filter("num")
def _num(value: int | float | None) -> str:
    if value is None:
        return "—"
    return f"{value:,}" if isinstance(value, int) else f"{value:,.3g}"


@bp.app_template_filter("memory")
def _memory(value: int | None) -> str:
    return memory_text(value)


@bp.app_template_filter("pct")
def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.0f}%"
