"""The pilot's token, renewed before it expires.

A pilot lives longer than its token may: the director gives it one of ``[agents]
pilot_token_lifetime``. Before that token expires, the pilot asks the matcher for its successor
with it (``POST /pilots/<reference>/token``), at a share of the time the token has left plus a
random part (so that pilots started together do not all ask at once), and keeps working with
the new one, for any number of lifetimes. A failed request is tried again sooner and sooner as
the end comes near; a refusal (the pilot was killed, its record ended, the service does not
know it) ends the renewals, and the pilot works on until its token expires.

Times are the wall clock's (a token's ``exp`` is), corrected by the matcher's clock as read from
each new token's ``iat``: a suspended machine that wakes after its token expired sees it at
once. The token is read, not verified: the pilot only needs to know when it ends.
"""

from __future__ import annotations

import base64
import binascii
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

#: The token is renewed once this share of the time it had left has passed, plus up to
#: ``JITTER`` more of it.
SHARE = 0.5
JITTER = 0.2
#: A failed renewal is tried again after this share of the time left (at least MIN_RETRY s,
#: at most MAX_RETRY s).
RETRY_SHARE = 0.1
MIN_RETRY, MAX_RETRY = 1.0, 60.0


@dataclass(frozen=True)
class TokenTimes:
    """When a token was issued and when it expires (seconds since the epoch, issuer's clock)."""

    issued_at: float
    expires_at: float


def token_times(token: str) -> TokenTimes | None:
    """The ``iat`` and ``exp`` of a JWT, None when it has none or cannot be read."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    body = parts[1] + "=" * (-len(parts[1]) % 4)
    try:
        claims = json.loads(base64.urlsafe_b64decode(body.encode("ascii")))
    except (ValueError, binascii.Error, UnicodeError):
        return None
    if not isinstance(claims, dict):
        return None
    iat, exp = claims.get("iat"), claims.get("exp")
    if not isinstance(exp, int | float) or isinstance(exp, bool):
        return None
    if not isinstance(iat, int | float) or isinstance(iat, bool):
        iat = exp
    return TokenTimes(float(iat), float(exp))


class TokenRenewal:
    """When the pilot's token is next renewed, and whether it has expired.

    ``wall`` is the node's clock; ``skew`` (the matcher's clock minus the node's) is learnt
    from each token renewed, whose ``iat`` is the matcher's now."""

    def __init__(self, token: str, *, wall: Callable[[], float] = time.time,
                 rng: Callable[[], float] = random.random) -> None:
        self._wall = wall
        self._rng = rng
        self.skew = 0.0
        self.renewals = 0
        #: Why the pilot stopped renewing ("" while it renews).
        self.stopped = ""
        self.times = token_times(token)
        self.next_at: float | None = None
        if self.times is None:
            self.stopped = "its token says nothing of when it expires"
        else:
            self._schedule()

    def now(self) -> float:
        """The matcher's clock, as the node sees it."""
        return self._wall() + self.skew

    def left(self) -> float:
        """Seconds before the current token expires (0 when it has)."""
        return 0.0 if self.times is None else max(0.0, self.times.expires_at - self.now())

    def expired(self) -> bool:
        return self.times is not None and self.now() >= self.times.expires_at

    def due(self) -> bool:
        return (not self.stopped and self.next_at is not None and not self.expired()
                and self.now() >= self.next_at)

    def renewed(self, token: str) -> None:
        """The matcher gave ``token``: learn its clock from it, and when to renew it."""
        times = token_times(token)
        if times is None:
            self.stopped = "the matcher's new token says nothing of when it expires"
            return
        self.skew = times.issued_at - self._wall()
        self.times = times
        self.renewals += 1
        self._schedule()

    def failed(self) -> float:
        """A renewal did not get through: when to try again (returns the delay)."""
        delay = min(MAX_RETRY, max(MIN_RETRY, self.left() * RETRY_SHARE))
        self.next_at = self.now() + delay
        return delay

    def stop(self, why: str) -> None:
        self.stopped = why

    def _schedule(self) -> None:
        assert self.times is not None
        now = self.now()
        left = max(0.0, self.times.expires_at - now)
        self.next_at = now + left * (SHARE + JITTER * self._rng())
