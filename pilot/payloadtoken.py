"""Each payload's own token, in the file ``$BEARER_TOKEN_FILE`` names (WLCG bearer token
discovery): fetched by the pilot with its own token before the payload starts, and replaced
before it expires for as long as the payload runs (pilot.renewal's schedule).

The file is in the payload's folder (``.bearer_token``, mode 0600), written whole and renamed
into place, so that the payload never reads half a token; it is never packed into the output
sandbox. A payload whose token could not be had yet finds ``$BEARER_TOKEN_FILE`` set and the
file missing; the pilot keeps trying.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path

from pilot.renewal import MAX_RETRY, MIN_RETRY, TokenRenewal

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
