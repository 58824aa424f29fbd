"""The pilot's token, kept where its payloads cannot read it.

Payloads run as the pilot's user, so whatever the pilot keeps in a place that user can read,
they can read too: its environment (the kernel shows a process's *initial* environment in
``/proc/<pid>/environ`` whatever the process does to ``os.environ`` later), its command line,
a file left on disk, its memory through ``/proc/<pid>/mem``. So the token reaches the pilot
only as a file that the pilot removes once read (readable by its owner alone) or as an
inherited descriptor, and the pilot marks itself not dumpable, which makes its ``/proc`` files
and its memory unreadable to processes of the same user (its payloads).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import stat
from pathlib import Path

#: The environment variable older pilots read the token from: now refused, see TokenError.
TOKEN_ENV = "GRIDPILOT_PILOT_TOKEN"
#: prctl(2) option: whether the process may be dumped (and read through /proc by its user).
PR_SET_DUMPABLE = 4
#: Longest token accepted (a signed token is a few hundred bytes).
MAX_TOKEN_BYTES = 64 * 1024


class TokenError(Exception):
    """The token cannot be had safely: says what is wrong and what to do."""


def token_from_environment(environ: dict[str, str] | os._Environ[str]) -> None:
    """Refuse a token given in the environment: it would stay readable by every payload."""
    if environ.get(TOKEN_ENV):
        raise TokenError(
            f"{TOKEN_ENV} is set: a token in the pilot's environment stays readable by its "
            f"payloads in /proc/<pid>/environ; pass it with --token-file (removed after "
            f"reading) or --token-fd instead, and unset {TOKEN_ENV}")


def read_token_file(path: Path) -> str:
    """Read the token from ``path``, which must be a regular file of this user readable by
    nobody else (mode 0600 or stricter), and remove the file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise TokenError(f"--token-file {path} cannot be read: {exc.strerror or exc}") from exc
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise TokenError(f"--token-file {path} is not a regular file")
        if info.st_uid != os.geteuid():
            raise TokenError(f"--token-file {path} belongs to another user (uid "
                             f"{info.st_uid})")
        if info.st_mode & 0o077:
            raise TokenError(f"--token-file {path} is readable by others (mode "
                             f"{stat.S_IMODE(info.st_mode):04o}); it must be 0600")
        data = f.read(MAX_TOKEN_BYTES + 1)
    try:
        path.unlink()
    except OSError as exc:
        raise TokenError(f"--token-file {path} cannot be removed after reading, so payloads "
                         f"could read it: {exc.strerror or exc}") from exc
    return _token(data, f"--token-file {path}")


def read_token_fd(fd: int) -> str:
    """Read the token from the inherited descriptor ``fd`` up to its end, then close it."""
    try:
        with os.fdopen(fd, "rb", closefd=True) as f:
            data = f.read(MAX_TOKEN_BYTES + 1)
    except OSError as exc:
        raise TokenError(f"--token-fd {fd} cannot be read: {exc.strerror or exc}") from exc
    return _token(data, f"--token-fd {fd}")


def _token(data: bytes, where: str) -> str:
    if len(data) > MAX_TOKEN_BYTES:
        raise TokenError(f"{where} holds more than {MAX_TOKEN_BYTES} bytes: not a token")
    try:
        text = data.decode("ascii").strip()
    except UnicodeDecodeError as exc:
        raise TokenError(f"{where} holds bytes that are not ASCII: not a token") from exc
    if not text or any(c.isspace() for c in text):
        raise TokenError(f"{where} holds no token (empty, or several words)")
    return text


def forbid_dumping() -> bool:
    """Make this process non-dumpable: its memory and most of its ``/proc`` files become
    unreadable to other processes of its user, and it cannot be traced by them. Its
    children get the usual setting back when they execute a program. Returns whether it
    worked (False off Linux)."""
    with contextlib.suppress(OSError, AttributeError, TypeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return bool(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0)
    return False
