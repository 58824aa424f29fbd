"""A payload's output files: named inside its job folder only, capped in size while it runs,
and removed with the folder once the report holds what it needs (the exit code, the CPU time,
the output's tail).

A job names its output files (``StdOutput``/``StdError``); the matcher refuses names that
leave the job folder, but the pilot does not rely on it: a name that is absolute, climbs out
(``..``), is empty or holds a NUL is replaced by the default name, and the file is opened
without following a link, so a file planted in the folder cannot send the output elsewhere.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
from pathlib import Path, PurePosixPath
from typing import Any

from pilot.logformat import concerning
from pilot.protocol import REPORT_TAIL_CHARS

log = logging.getLogger("pilot.output")

#: Bytes of output a payload may keep in its folder per stream while it runs (see cap_output).
MAX_OUTPUT_BYTES = 100 * 1024 * 1024
#: Longest output file name accepted.
MAX_NAME = 255
#: What the matcher cannot take in a text: NUL (PostgreSQL cannot store it) and the lone
#: surrogates (not characters; UTF-8 cannot encode them).
_NOT_TEXT = re.compile("[\x00\ud800-\udfff]")
_CUT = b"\n[gridpilot: output cut here, it grew beyond %d bytes; the end follows]\n"


def valid_text(text: str) -> str:
    """``text`` with every NUL and lone surrogate replaced by U+FFFD, so that the matcher
    takes it (output decoded with ``errors="replace"`` has no invalid UTF-8 left)."""
    return _NOT_TEXT.sub("\ufffd", text)


#: How often a refused final report is sent again, plainer each time, before it is dropped.
REPORT_REFUSALS = 2


def plainer_report(body: dict[str, Any], refusals: int, status: int) -> dict[str, Any]:
    """A final report the matcher refused (4xx) made plainer, so that the job still ends:
    after the first refusal every text is made valid and cut to its limit; after the second
    only the status, the exit code and the CPU time remain (``pilot_reference`` is kept)."""
    if refusals == 1:
        plain = {k: valid_text(v) if isinstance(v, str) else v for k, v in body.items()}
        if isinstance(plain.get("output_tail"), str):
            plain["output_tail"] = plain["output_tail"][-REPORT_TAIL_CHARS:]
        if isinstance(plain.get("minor_status"), str):
            plain["minor_status"] = plain["minor_status"][:255]
        return plain
    plain = {k: body[k] for k in ("pilot_reference", "status", "exit_code", "cpu_used")
             if k in body}
    plain["minor_status"] = f"Full report refused by the matcher ({status})"
    return plain


def output_path(directory: Path, name: str | None, default: str, *,
                job_id: int | None = None) -> Path:
    """Where the output named ``name`` goes: inside ``directory`` whatever ``name`` says
    (``job_id``: the job whose log record a refused name makes)."""
    if not name:
        return directory / default
    pure = PurePosixPath(name)
    if (pure.is_absolute() or ".." in pure.parts or "\x00" in name or len(name) > MAX_NAME
            or not pure.parts or pure.name in ("", ".")):
        log.warning("output file name %r leaves the job folder; %s is used instead", name,
                    default, extra=concerning(job_id))
        return directory / default
    return directory.joinpath(*pure.parts)


def open_output(path: Path, directory: Path) -> int:
    """Open (create, empty) an output file for appending, refusing links and anything that
    resolves outside ``directory``; returns the descriptor. Raises OSError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.parent.resolve().is_relative_to(directory.resolve()):
        raise OSError(f"{path.parent} is outside the job folder {directory}")
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_NOFOLLOW
                   | os.O_CLOEXEC, 0o644)


def cap_output(path: Path, limit: int = MAX_OUTPUT_BYTES, *,
               job_id: int | None = None) -> bool:
    """When the file has grown beyond ``limit`` bytes, keep its last ``limit // 2`` bytes after
    a line saying it was cut (the payload appends, so it goes on writing at the new end).
    Returns whether it was cut (``job_id``: the job whose log record that makes)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    with os.fdopen(fd, "r+b") as f:
        size = os.fstat(f.fileno()).st_size
        if size <= limit:
            return False
        # Read on to the end as it is now: what the payload appended while this read ran is
        # kept too, and the time between the last read and the cut, when what it writes
        # would be lost, is a few system calls. Never more than half the limit at a time:
        # from a payload that writes faster than this reads, the newest half is kept.
        half = limit // 2
        pos, end = size - half, b""
        for _ in range(8):
            now = os.fstat(f.fileno()).st_size
            if now - pos > half:
                pos, end = now - half, b""
            f.seek(pos)
            more = f.read(now - pos)
            end, pos = (end + more)[-half:], pos + len(more)
            if os.fstat(f.fileno()).st_size <= pos:
                break
        f.seek(0)
        f.truncate(0)
        f.write(_CUT % limit + end)
    log.warning("output %s grew beyond %d bytes; cut to its end", path, limit,
                extra=concerning(job_id))
    return True


def remove_folder(directory: Path) -> None:
    """Remove a finished job's folder, whatever the payload left in it (read-only folders
    included); links are removed, never followed."""
    try:
        shutil.rmtree(directory)
    except FileNotFoundError:
        return
    except OSError:
        with contextlib.suppress(OSError):
            os.chmod(directory, 0o700)
        for root, dirs, _files in os.walk(directory, followlinks=False):
            for name in dirs:
                with contextlib.suppress(OSError):
                    path = os.path.join(root, name)
                    if not os.path.islink(path):
                        os.chmod(path, 0o700)
        shutil.rmtree(directory, ignore_errors=True)
