"""Each payload's own token, in the file ``$BEARER_TOKEN_FILE`` names (WLCG bearer token
discovery): the first one carried by the match answer beside the job (or, from a matcher
that did not put it there, fetched by the pilot with its own token before the payload
starts), and replaced before it expires for as long as the payload runs (pilot.renewal's
schedule).

The file is in the payload's folder (``.bearer_token``, mode 0600), written whole and renamed
into place, so that the payload never reads half a token; it is never packed into the output
sandbox. A payload whose token could not be had yet finds ``$BEARER_TOKEN_FILE`` set and the
file missing; the pilot keeps trying.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Callable, Collection
from pathlib import Path

from pilot.client import RefusedError, TransientError
from pilot.logformat import concerning
from pilot.renewal import MAX_RETRY, MIN_RETRY, TokenRenewal

log = logging.getLogger(__name__)

#: The file's name in the payload's folder.
TOKEN_FILE_NAME = ".bearer_token"
#: The variable that names it (WLCG Bearer Token Discovery).
TOKEN_FILE_VARIABLE = "BEARER_TOKEN_FILE"


def write_token(path: Path, token: str) -> None:
    """Put ``token`` in ``path`` whole (a new file renamed over it), readable by its owner
    only; a file or link the payload left at the temporary name is never followed."""
    temporary = path.with_name(f"{path.name}.{secrets.token_hex(8)}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as file:
            file.write(token + "\n")
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


class PayloadToken:
    """One payload's token file and when to fetch its next token."""

    def __init__(self, directory: Path, wall: Callable[[], float] = time.time) -> None:
        self.path = directory / TOKEN_FILE_NAME
        self._wall = wall
        self.renewal: TokenRenewal | None = None
        self._next_try = wall()
        self._failures = 0
        #: Why no more tokens are asked for ("" while they are).
        self.stopped = ""

    def due(self) -> bool:
        if self.stopped:
            return False
        if self.renewal is None or self.renewal.expired():
            return self._wall() >= self._next_try
        return self.renewal.due()

    def got(self, token: str) -> None:
        write_token(self.path, token)
        if self.renewal is None:
            self.renewal = TokenRenewal(token, wall=self._wall)
        else:
            self.renewal.renewed(token)
        self._failures = 0

    def failed(self) -> float:
        """A request did not get through: the delay before the next one."""
        if self.renewal is not None and not self.renewal.expired():
            return self.renewal.failed()
        self._failures += 1
        delay: float = min(MAX_RETRY, MIN_RETRY * float(2 ** min(self._failures, 6)))
        self._next_try = self._wall() + delay
        return delay

    def stop(self, why: str) -> None:
        self.stopped = why


class PayloadTokens:
    """The token files of the payloads a pilot runs, by job id, and whether the matcher gives
    payloads tokens at all. ``fetch(job_id)`` asks the matcher for one (raising the pilot
    client's TransientError or RefusedError)."""

    def __init__(self, fetch: Callable[[int], str],
                 wall: Callable[[], float] = time.time) -> None:
        self._fetch = fetch
        self._wall = wall
        self.tokens: dict[int, PayloadToken] = {}
        #: Why payloads get no token from this matcher ("" while they do).
        self.off = ""

    def first(self, job_id: int, directory: Path, given: str | None = None) -> Path | None:
        """The file the payload's token goes in, with its first token: ``given`` (the one the
        match answer carried), else fetched (None when the matcher gives payloads no token).
        A token that is late is asked for again later: the payload starts without it."""
        token = PayloadToken(directory, wall=self._wall)
        if given is not None:
            self.off = ""  # the matcher gives payloads tokens (again)
            try:
                token.got(given)
            except OSError as exc:  # the folder is not writable: asked for, as without one
                log.warning("job %d: cannot write its payload's token: %s", job_id, exc,
                            extra=concerning(job_id))
                self._ask(job_id, token)
            self.tokens[job_id] = token
            return token.path
        if self.off:
            return None
        self._ask(job_id, token)
        if self.off:
            return None
        self.tokens[job_id] = token
        return token.path

    def renew(self, running: Collection[int]) -> None:
        """Replace the tokens that are due of the payloads still ``running``; forget the
        others."""
        for job_id, token in list(self.tokens.items()):
            if job_id not in running:
                del self.tokens[job_id]
            elif token.due():
                self._ask(job_id, token)

    def finished(self, job_id: int) -> None:
        """The payload ended: its token is renewed no more, and its file goes."""
        token = self.tokens.pop(job_id, None)
        if token is not None:
            token.path.unlink(missing_ok=True)

    def _ask(self, job_id: int, token: PayloadToken) -> None:
        try:
            token.got(self._fetch(job_id))
        except TransientError as exc:
            delay = token.failed()
            log.warning("job %d: no token for its payload yet (%s); trying again in %.0f s",
                        job_id, exc, delay, extra=concerning(job_id))
        except RefusedError as exc:
            if exc.status == 404 and "does not exist" not in exc.detail and not self.tokens:
                self.off = exc.detail
                log.info("payloads get no token from this matcher: %s", exc.detail)
            else:
                log.warning("job %d: its payload gets no more tokens: %s", job_id, exc,
                            extra=concerning(job_id))
            token.stop(str(exc))
        except OSError as exc:  # the folder went (the payload ended meanwhile)
            token.stop(f"cannot write {token.path}: {exc}")
