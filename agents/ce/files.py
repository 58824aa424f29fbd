"""Files of a pilot's folder on the director's host: the token handed over, the output read
back."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def write_private_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, readable by this user only (0600 whatever the umask); a
    file already there (a resubmission) is replaced, a link is not followed."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


def read_tail(path: Path, limit: int) -> tuple[bytes, bool]:
    """The last ``limit`` bytes of the file (empty when there is none), and whether its
    beginning was cut. Only a regular file is read, and a link is not followed: what runs in
    the pilot's folder must not make the director read another file of its host, or hang on
    a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except (FileNotFoundError, NotADirectoryError):
        return b"", False
    except OSError as exc:  # ELOOP (a link), EACCES ...
        return f"[{path.name} was not read: {exc.strerror}]\n".encode(), False
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            return f"[{path.name} is not a regular file]\n".encode(), False
        if info.st_size > limit:
            f.seek(info.st_size - limit)
        return f.read(limit), info.st_size > limit
