"""``gridpilot serve``: the matcher under gunicorn, configured from the settings."""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from flask import Flask
from gunicorn.app.base import BaseApplication
from sqlalchemy.engine import make_url

from gridpilot.listening import check_port_free, split_bind
from matcher import create_app
from matcher.app import metrics_dir
from taskqueue.core.settings import Settings


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
                     workers: int | None = None, access_log: str | None = None) -> dict[str, Any]:
    m = settings.matcher
    log = m.access_log if access_log is None else access_log
    return {
        "bind": bind or m.bind,
        "workers": workers or m.workers,
        # gthread with a thread kept for /healthz (gridpilot.worker).
        "worker_class": "gridpilot.worker.MatcherWorker" if m.threads > 1 else "sync",
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
        "accesslog": log or None,
        "errorlog": "-",
        "loglevel": "warning",
        "proc_name": "gridpilot-matcher",
    }


def startup_line(settings: Settings, options: dict[str, Any]) -> str:
    """What ``gridpilot serve`` says once it listens: where, with which database (its
    password hidden), and the URL pilots are given."""
    host, port = split_bind(options["bind"])
    shown = f"[{host}]" if ":" in host else host
    database = make_url(settings.database.url).render_as_string(hide_password=True)
    workers = (f"{options['workers']} worker(s) of {options['threads']} threads"
               if options["threads"] > 1 else f"{options['workers']} worker(s)")
    return (f"gridpilot serve: listening on http://{shown}:{port} ({workers}), database "
            f"{database}; pilots are given {settings.matcher.url}")


def _when_ready(settings: Settings, options: dict[str, Any]) -> Callable[[Any], None]:
    def when_ready(_arbiter: Any) -> None:
        print(startup_line(settings, options), flush=True)
        # In a process of its own: the arbiter forks the workers next, and a thread of it
        # would be copied into each half-way through its requests.
        subprocess.Popen([sys.executable, "-m", "gridpilot.listening", options["bind"],
                          settings.matcher.url], stdin=subprocess.DEVNULL)
    return when_ready


def serve(settings: Settings, *, bind: str | None = None, workers: int | None = None,
          access_log: str | None = None) -> None:
    # One metrics folder for all the workers, made (or checked) here, before they start.
    settings = replace(settings, matcher=replace(settings.matcher,
                                                 metrics_dir=str(metrics_dir(settings))))
    options = gunicorn_options(settings, bind=bind, workers=workers, access_log=access_log)
    check_port_free(options["bind"])
    create_app(settings)  # fail here, with a clear message, rather than in every worker
    options["when_ready"] = _when_ready(settings, options)
    MatcherServer(settings, options).run()
