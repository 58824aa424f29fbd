"""The per-process cache of verified tokens: it answers only while the token is valid, for a
short time after its verification, and never holds more than its size."""

from __future__ import annotations

import time

import pytest

from matcher.auth import VERIFIED, Principal, VerifiedTokens, issue_token, principal_from_header
from matcher.problems import Problem

SECRET = "token-cache-test-secret-0123456789abcdef"


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _principal(expires_at: float) -> Principal:
    return Principal("p1", "pilot", "lhcb", "lhcb_pilot", expires_at=expires_at)


def test_a_cached_token_is_refused_from_its_expiry_on() -> None:
    clock = Clock(1000.0)
    cache = VerifiedTokens(ttl=60, clock=clock)
    cache.put("tok", SECRET, _principal(1010.0))
    clock.now = 1009.5
    assert cache.get("tok", SECRET) == _principal(1010.0)
    clock.now = 1010.0  # the verifier refuses a token whose exp is now
    assert cache.get("tok", SECRET) is None
    assert len(cache) == 0


def test_a_fractional_expiry_counts_from_its_whole_second() -> None:
    clock = Clock(1000.0)
    cache = VerifiedTokens(ttl=60, clock=clock)
    cache.put("tok", SECRET, _principal(1010.9))
    clock.now = 1010.2  # the verifier reads exp 1010.9 as 1010: expired
    assert cache.get("tok", SECRET) is None


def test_a_long_lived_token_is_verified_again_after_the_ttl() -> None:
    clock = Clock(1000.0)
    cache = VerifiedTokens(ttl=60, clock=clock)
    cache.put("tok", SECRET, _principal(1000.0 + 86400))
    clock.now = 1059.0
    assert cache.get("tok", SECRET) is not None
    clock.now = 1060.0
    assert cache.get("tok", SECRET) is None


def test_an_entry_is_for_its_secret_only() -> None:
    cache = VerifiedTokens(clock=Clock(1000.0))
    cache.put("tok", SECRET, _principal(2000.0))
    assert cache.get("tok", "another-secret-0123456789abcdef012345") is None


def test_the_cache_keeps_at_most_its_size_and_drops_the_oldest() -> None:
    cache = VerifiedTokens(size=3, clock=Clock(1000.0))
    for i in range(5):
        cache.put(f"tok{i}", SECRET, _principal(2000.0))
    assert len(cache) == 3
    assert cache.get("tok0", SECRET) is None and cache.get("tok1", SECRET) is None
    assert all(cache.get(f"tok{i}", SECRET) is not None for i in (2, 3, 4))


def test_a_token_used_once_is_refused_once_it_has_expired() -> None:
    """Through the real verifier: the second use comes after the token's exp (the test waits
    for that second to pass) and is answered 401 "expired", not from the cache."""
    token = issue_token(SECRET, subject="p1", role="pilot", vo="lhcb", group="lhcb_pilot",
                        lifetime=1)
    principal = principal_from_header(f"Bearer {token}", SECRET)
    assert VERIFIED.get(token, SECRET) == principal
    assert principal.expires_at is not None
    while time.time() < principal.expires_at:
        time.sleep(principal.expires_at - time.time() + 0.01)
    with pytest.raises(Problem) as refused:
        principal_from_header(f"Bearer {token}", SECRET)
    assert refused.value.status == 401
    assert "expired" in refused.value.detail
