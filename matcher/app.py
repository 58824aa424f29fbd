"""The application factory."""

from __future__ import annotations

import time
from pathlib import Path

from flask import Flask, Response, current_app, g, request

from matcher import (
    bulkjobs,
    dashboard,
    directorqueues,
    jobs,
    operator,
    payloadtokens,
    pilots,
    problems,
    replicas,
    sandboxes,
    service,
    taskqueues,
    whoami,
)
from matcher.idp import IdentityProviders
from matcher.metrics import Metrics, private_directory
from matcher.proxies import TrustedProxies
from matcher.runtime import EXTENSION, Runtime, runtime_of
from taskqueue.core.settings import Settings


def create_app(settings: Settings) -> Flask:
    """The matcher service for ``settings``; refuses to start without a signing secret."""
    secret = settings.auth.signing_secret()
    app = Flask("gridpilot.matcher")
    # Sandbox uploads may be larger than other bodies (matcher.api holds those to theirs).
    app.config.update(MAX_CONTENT_LENGTH=max(settings.matcher.max_body_bytes,
                                             settings.sandboxes.max_upload_bytes),
                      JSON_SORT_KEYS=False)
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.extensions[EXTENSION] = Runtime(settings, secret, Metrics(metrics_dir(settings)),
                                          IdentityProviders(settings.auth.issuers))
    for bp in (jobs.bp, bulkjobs.bp, pilots.bp, taskqueues.bp, operator.bp, service.bp,
               whoami.bp, dashboard.bp, sandboxes.bp, replicas.bp, directorqueues.bp,
               payloadtokens.bp, payloadtokens.api):
        app.register_blueprint(bp)
    problems.install(app)
    app.before_request(_start_clock)
    app.after_request(_count)
    if settings.matcher.trusted_proxies:
        app.wsgi_app = TrustedProxies(  # type: ignore[method-assign]
            app.wsgi_app, settings.matcher.trusted_proxies)
    return app


def metrics_dir(settings: Settings) -> Path:
    """Where this host's worker processes leave their metrics: the setting, or "metrics"
    beside an SQLite database, or else a new private temporary folder (``gridpilot serve``
    makes it once, before its workers start); always a folder only the service can use."""
    if settings.matcher.metrics_dir:
        return private_directory(Path(settings.matcher.metrics_dir))
    url = settings.database.url
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        return private_directory(Path(url.removeprefix("sqlite:///")).parent / "metrics")
    return private_directory(None)


def _start_clock() -> None:
    g.started = time.perf_counter()


def _count(response: Response) -> Response:
    runtime = runtime_of(current_app)
    rule = request.url_rule.rule if request.url_rule is not None else "unmatched"
    labels = {"endpoint": rule, "method": request.method, "status": str(response.status_code)}
    runtime.metrics.inc("gridpilot_http_requests_total", labels)
    started = g.get("started")
    if started is not None:
        runtime.metrics.observe("gridpilot_http_request_duration_seconds", {"endpoint": rule},
                                time.perf_counter() - started)
    runtime.metrics.flush()
    return response
