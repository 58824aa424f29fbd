"""/ui/login and /ui/logout."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from functools import partial

from flask import Response, current_app, redirect, request, url_for

from matcher.dashboard import session as cookies
from matcher.dashboard.web import Page, bp, current_viewer, page, render, safe_next
from matcher.problems import Problem
from matcher.runtime import runtime_of
from taskqueue.signouts import record_sign_out

#: Longest token accepted in the form (a token from an identity provider is a few KB).
MAX_TOKEN = 16384


@bp.route("/login", methods=["GET", "POST"])
def login() -> Response:
    runtime = runtime_of(current_app)
    target = safe_next(request.values.get("next"))
    error, code = "", 200
    if request.method == "GET" and current_viewer() is not None:
        return redirect(target)  # type: ignore[return-value]
    if request.method == "POST":
        token = request.form.get("token", "").strip()
        if not cookies.same(request.form.get("csrf"), request.cookies.get(cookies.LOGIN_COOKIE)):
            error, code = "The sign-in form expired. Paste the token again.", 400
        elif not token:
            error, code = ("Paste a token: 'gridpilot token issue --role operator ...' makes "
                           "one."), 400
        elif len(token) > MAX_TOKEN:
            error, code = f"That is not a token: it is longer than {MAX_TOKEN} characters.", 400
        else:
            try:
                viewer = cookies.sign_in(token, runtime.secret,
                                         lifetime=runtime.settings.dashboard.session_lifetime,
                                         providers=runtime.providers)
            except Problem as exc:
                error, code = f"This token cannot sign in: {exc.detail}.", 401
            except ValueError as exc:
                error, code = f"This token cannot sign in: {exc}.", 403
            else:
                if not viewer.is_operator:
                    target = url_for("ui.jobs")
                response = redirect(target)
                cookies.set_session(response, request, viewer, runtime.secret)  # type: ignore[arg-type]
                return response  # type: ignore[return-value]
    value = secrets.token_urlsafe(24)
    response = render("login.html", code, error=error, csrf=value, next=target, viewer=None)
    cookies.set_login_cookie(response, request, value)
    return response


@bp.post("/logout")
@page()
def logout(p: Page) -> Response:
    p.runtime.transaction(partial(record_sign_out, session_id=p.viewer.session_id,
                                  expires_at=datetime.fromtimestamp(p.viewer.expires, UTC),
                                  now=p.now))
    response = redirect(url_for("ui.login"))
    cookies.clear_session(response)  # type: ignore[arg-type]
    return response  # type: ignore[return-value]
