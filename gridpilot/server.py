"""``gridpilot serve``: the matcher under gunicorn, configured from the settings."""

from __future__ import annotations

import gc
from dataclasses import replace
from typing import Any

from flask import Flask
from gunicorn.app.base import BaseApplication

from matcher import create_app
from matcher.app import metrics_dir
from taskqueue.settings import Settings


class MatcherServer(BaseApplication):  # type: ignore[misc]
    """gunicorn running the matcher: each worker builds its own app (and database engine)
    after the fork, so nothing is shared between workers but the database."""

    def __init__(self, settings: Settings, options: dict[str, Any]) -> None:
        self.settings = settings
        self.options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            self.cfg.set(key, value)

    def load(self) -> Flask:
        return worker_app(self.settings)


def worker_app(settings: Settings) -> Flask:
    """The app one worker serves, built after the fork.

    Everything built so far (modules, the app, SQLAlchemy's tables: over 100,000 objects
    the collector tracks) lives as long as the worker, so it is moved out of the garbage
    collector's sight (``gc.freeze``). Otherwise each full collection, which the allocations
    of a bulk submission set off every few requests, walks all of it again: that was a
    quarter of the time of a 1,000-job JSON bulk (17 ms of 61 in process) and is now gone.
    """
    app = create_app(settings)
    gc.freeze()
    return app


def gunicorn_options(settings: Settings, *, bind: str | None = None,
                     workers: int | None = None) -> dict[str, Any]:
    m = settings.matcher
    return {
        "bind": bind or m.bind,
        "workers": workers or m.workers,
        "worker_class": "gthread" if m.threads > 1 else "sync",
        "threads": m.threads,
        "timeout": m.timeout,
        "graceful_timeout": m.timeout,
        "max_requests": m.max_requests,
        # Spread restarts so that the workers are not all recycled at once.
        "max_requests_jitter": max(1, m.max_requests // 10),
        # What proxies say about a request is believed from [matcher] trusted_proxies only
        # (matcher.proxies), never from gunicorn's own default list (loopback).
        "forwarded_allow_ips": "",
        "secure_scheme_headers": {},
        "accesslog": None,
        "errorlog": "-",
        "loglevel": "warning",
        "proc_name": "gridpilot-matcher",
    }


def serve(settings: Settings, *, bind: str | None = None, workers: int | None = None) -> None:
    # One metrics folder for all the workers, made (or checked) here, before they start.
    settings = replace(settings, matcher=replace(settings.matcher,
                                                 metrics_dir=str(metrics_dir(settings))))
    create_app(settings)  # fail here, with a clear message, rather than in every worker
    MatcherServer(settings, gunicorn_options(settings, bind=bind, workers=workers)).run()
