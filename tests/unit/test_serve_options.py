"""``gridpilot serve``'s gunicorn options follow the [matcher] settings: one thread per
worker keeps the sync workers, more (the default) choose the threaded (gthread) workers."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gridpilot.server import gunicorn_options
from taskqueue.errors import ConfigurationError
from taskqueue.settings import MatcherSettings, Settings


def test_one_thread_per_worker_runs_sync_workers() -> None:
    settings = Settings()
    settings = replace(settings, matcher=replace(settings.matcher, threads=1))
    options = gunicorn_options(settings)
    assert options["worker_class"] == "sync"
    assert options["threads"] == 1


def test_the_default_is_four_threads_per_worker() -> None:
    options = gunicorn_options(Settings())
    assert (options["worker_class"], options["threads"]) == ("gthread", 4)


def test_more_threads_run_threaded_workers() -> None:
    settings = Settings()
    settings = replace(settings, matcher=replace(settings.matcher, threads=4))
    options = gunicorn_options(settings, workers=3)
    assert (options["worker_class"], options["threads"], options["workers"]) == ("gthread", 4, 3)


def test_no_threads_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"matcher\.threads"):
        MatcherSettings(threads=0)
