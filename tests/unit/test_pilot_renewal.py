"""pilot.renewal: when a pilot renews its token, and when it knows the token has expired."""

from __future__ import annotations

import pytest

from pilot.renewal import MAX_RETRY, MIN_RETRY, TokenRenewal, token_times
from taskqueue.tokens import issue_token

SECRET = "a-test-secret-of-enough-length-0123456789"


def _token(lifetime: int, now: float) -> str:
    return issue_token(SECRET, subject="p", role="pilot", vo="lhcb", group="lhcb_pilot",
                       lifetime=lifetime, pilot="p-1", now=now)


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_token_times_reads_iat_and_exp() -> None:
    times = token_times(_token(45, 1_000_000.0))
    assert times is not None and (times.issued_at, times.expires_at) == (1_000_000, 1_000_045)


@pytest.mark.parametrize("text", ["", "abc", "a.b.c", "a.!!!.c", "a.bnVsbA.c",
                                  "a.eyJpYXQiOjF9.c", 'a.eyJleHAiOnRydWV9.c'])
def test_unreadable_tokens_are_never_renewed_nor_expired(text: str) -> None:
    renewal = TokenRenewal(text, wall=Clock(0.0))
    assert renewal.stopped and not renewal.due() and not renewal.expired()


@pytest.mark.parametrize("draw", [0.0, 0.5, 0.999])
def test_renewal_comes_between_half_and_seven_tenths_of_the_time_left(draw: float) -> None:
    clock = Clock(1_000_000.0)
    renewal = TokenRenewal(_token(100, 1_000_000.0), wall=clock, rng=lambda: draw)
    assert renewal.next_at is not None
    assert 1_000_050.0 <= renewal.next_at <= 1_000_070.0
    clock.t = renewal.next_at - 0.01
    assert not renewal.due()
    clock.t = renewal.next_at
    assert renewal.due() and not renewal.expired()


def test_a_token_started_late_is_renewed_on_what_it_has_left() -> None:
    # Issued by the director 80 s before the pilot started (it waited in a batch queue).
    clock = Clock(1_000_080.0)
    renewal = TokenRenewal(_token(100, 1_000_000.0), wall=clock, rng=lambda: 0.0)
    assert renewal.next_at == pytest.approx(1_000_090.0)
    assert renewal.left() == pytest.approx(20.0)


def test_a_renewed_token_moves_the_schedule_and_teaches_the_matchers_clock() -> None:
    clock = Clock(1_000_000.0)
    renewal = TokenRenewal(_token(40, 1_000_000.0), wall=clock, rng=lambda: 0.0)
    clock.t = 1_000_020.0
    # The matcher's clock is 5 s ahead of the node's.
    renewal.renewed(_token(40, 1_000_025.0))
    assert renewal.skew == pytest.approx(5.0) and renewal.renewals == 1
    assert renewal.left() == pytest.approx(40.0)
    assert renewal.next_at == pytest.approx(1_000_045.0)  # the matcher's time
    clock.t = 1_000_060.0  # the matcher's 1_000_065: the new token's end
    assert renewal.expired() and not renewal.due()


def test_failures_are_retried_sooner_as_the_end_nears() -> None:
    clock = Clock(1_000_000.0)
    renewal = TokenRenewal(_token(3600, 1_000_000.0), wall=clock, rng=lambda: 0.0)
    clock.t = renewal.next_at or 0.0
    assert renewal.failed() == MAX_RETRY
    clock.t = 1_000_000.0 + 3600 - 50
    assert renewal.failed() == pytest.approx(5.0)
    clock.t = 1_000_000.0 + 3600 - 2
    assert renewal.failed() == MIN_RETRY


def test_a_refusal_stops_the_renewals_but_not_the_expiry() -> None:
    clock = Clock(1_000_000.0)
    renewal = TokenRenewal(_token(10, 1_000_000.0), wall=clock)
    renewal.stop("403: pilot p-1 was killed")
    clock.t = 1_000_009.0
    assert not renewal.due() and not renewal.expired()
    clock.t = 1_000_010.0
    assert renewal.expired()


def test_a_machine_that_slept_sees_its_token_expired_at_once() -> None:
    clock = Clock(1_000_000.0)
    renewal = TokenRenewal(_token(60, 1_000_000.0), wall=clock)
    clock.t += 3600  # suspended for an hour
    assert renewal.expired() and not renewal.due()
