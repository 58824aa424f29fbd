"""The Date header of gridpilot.worker: gunicorn's text, formatted once a second."""

from __future__ import annotations

import email.utils
import time

from gunicorn import util

from gridpilot.worker import HttpDate


def gunicorn_date(at: float) -> str:
    return email.utils.formatdate(at, localtime=False, usegmt=True)


def test_the_same_text_as_gunicorn_within_a_second_and_after() -> None:
    now = [1_790_000_000.25]
    date = HttpDate(lambda: now[0])
    assert date() == gunicorn_date(now[0]) == util.http_date(now[0])
    now[0] = 1_790_000_000.99
    assert date() == gunicorn_date(now[0])
    now[0] = 1_790_000_001.0  # the next second: a new text
    assert date() == gunicorn_date(now[0]) != gunicorn_date(1_790_000_000.99)
    now[0] = 1_790_000_061.5
    assert date() == gunicorn_date(now[0])


def test_a_clock_that_goes_back_is_followed() -> None:
    now = [1_790_000_100.5]
    date = HttpDate(lambda: now[0])
    date()
    now[0] = 1_790_000_050.5
    assert date() == gunicorn_date(now[0])


def test_a_given_time_is_formatted_as_gunicorn_does() -> None:
    date = HttpDate(lambda: 0.0)
    assert date(1_700_000_000.7) == util.http_date(1_700_000_000.7)


def test_the_worker_installs_it_for_gunicorn_responses() -> None:
    from gunicorn.http import wsgi

    from gridpilot import worker

    original = util.http_date
    try:
        worker.install_http_date()
        assert isinstance(wsgi.util.http_date, HttpDate)
        before = time.time()
        text = wsgi.util.http_date()
        assert text in {gunicorn_date(before), gunicorn_date(time.time())}
    finally:
        util.http_date = original
