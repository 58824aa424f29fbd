"""Sandbox archives: how a job's files travel, packed as a tar.gz that the standard library reads,
named by the sha256 of the archive (``sb:sha256:<hex>``).

Standard library only: the pilot, the user's client and the matcher all use this module, so
that the three agree on the format by construction. Packing is deterministic (sorted names,
fixed times, owners and modes), so the same files give the same id and are stored once.
Unpacking trusts nothing: absolute names, ``..``, links that leave the folder, devices,
pipes, sparse files, too many members, too many bytes and oversized headers or names are
refused before anything lands outside the folder.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import posixpath
import re
import stat
import tarfile
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Self

PREFIX = "sb:sha256:"
ID_PATTERN = re.compile(r"sb:sha256:[0-9a-f]{64}")
#: Length of a sandbox id.
ID_LENGTH = len(PREFIX) + 64
#: Defaults for unpacking: at most this many bytes of files and this many members.
MAX_UNPACKED_BYTES = 1024 * 1024 * 1024
MAX_MEMBERS = 10_000
#: Most bytes one tar extension header (a PAX record set, a GNU long name or link) may hold,
#: and most such headers in a row: ``tarfile`` reads each into memory whole, so both are
#: checked on the header block that announces them, before a byte of them is read.
MAX_EXTENSION_BYTES = 64 * 1024
MAX_EXTENSIONS_IN_A_ROW = 8
#: Longest name of one path component, and of a whole member name (Linux's limits): a longer
#: name is refused as unsafe instead of failing later as an error of the file system.
MAX_COMPONENT_BYTES = 255
MAX_NAME_BYTES = 4095
_EXTENSION_TYPES = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE,
                    tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)


class UnsafeArchiveError(ValueError):
    """The archive cannot be unpacked safely or is not a sandbox archive; the message says
    which member and why."""


def sandbox_id(data: bytes) -> str:
    """The id of an archive: ``sb:sha256:`` and the hex digest of its bytes."""
    return PREFIX + hashlib.sha256(data).hexdigest()


def is_sandbox_id(text: str) -> bool:
    return ID_PATTERN.fullmatch(text) is not None


def checksum_of(sandbox: str) -> str:
    """The hex digest an id names."""
    if not is_sandbox_id(sandbox):
        raise ValueError(f"{sandbox!r} is not a sandbox id (sb:sha256: and 64 hex digits)")
    return sandbox[len(PREFIX):]


@dataclass(frozen=True)
class Member:
    """One file to pack: its name in the archive and its bytes; ``executable`` keeps the
    execute permission."""

    name: str
    data: bytes
    executable: bool = False


def pack(members: Iterable[Member]) -> bytes:
    """A deterministic tar.gz of ``members`` (sorted by name; one entry per name)."""
    seen: dict[str, Member] = {}
    for m in members:
        name = safe_name(m.name)
        if name in seen:
            raise ValueError(f"the file name {name!r} is given twice")
        seen[name] = m
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(seen):
            m = seen[name]
            info = tarfile.TarInfo(name)
            info.size = len(m.data)
            info.mode = 0o755 if m.executable else 0o644
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(m.data))
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0, compresslevel=6) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def pack_files(base: Path, names: Iterable[str]) -> bytes:
    """A tar.gz of the files ``names`` (relative to ``base``); raises ValueError naming a file
    that is missing, not a regular file, or outside ``base``."""
    members = [Member(safe_name(n), *read_inside(base, n)) for n in names]
    return pack(members)


def read_inside(base: Path, name: str) -> tuple[bytes, bool]:
    """The bytes and execute bit of the regular file ``name`` under ``base``; a symbolic
    link, a device, a folder or a file outside ``base`` is refused (ValueError)."""
    rel = safe_name(name)
    path = base / rel
    root = os.path.realpath(base)
    if not _inside(root, os.path.realpath(path.parent)):
        raise ValueError(f"{name} is outside the folder")
    try:
        st = os.lstat(path)
    except FileNotFoundError as exc:
        raise ValueError(f"{name} does not exist") from exc
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{name} is not a regular file")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        return f.read(), bool(st.st_mode & 0o100)


def safe_name(name: str) -> str:
    """``name`` as a relative path that stays inside its folder; ValueError otherwise."""
    if not name or "\x00" in name:
        raise ValueError(f"{name!r} is not a file name")
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        raise ValueError(f"{name} is an absolute path")
    parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".")]
    if not parts:
        raise ValueError(f"{name!r} names no file")
    if ".." in parts:
        raise ValueError(f"{name} leaves its folder (..)")
    return "/".join(parts)


def _inside(root: str, path: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


class _Limited(io.RawIOBase):
    """Reads from ``inner`` and refuses to hand out more than ``limit`` bytes in all: the
    decompressed stream of a gzip bomb is stopped, whatever the tar headers claim."""

    def __init__(self, inner: IO[bytes] | gzip.GzipFile, limit: int) -> None:
        self.inner, self.limit, self.count = inner, limit, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self.inner.read(len(buffer))
        self.count += len(data)
        if self.count > self.limit:
            raise UnsafeArchiveError(f"the archive unpacks to more than {self.limit} bytes")
        buffer[:len(data)] = data
        return len(data)


def _guarded_info() -> type[tarfile.TarInfo]:
    """A TarInfo class that refuses, on the header block itself, an extension header larger
    than MAX_EXTENSION_BYTES, more than MAX_EXTENSIONS_IN_A_ROW of them, and sparse members
    (whose maps ``tarfile`` also reads before anyone can look). One class per unpacking, as
    it counts."""
    in_a_row = 0

    class GuardedInfo(tarfile.TarInfo):
        @classmethod
        def frombuf(cls, buf: bytes | bytearray, encoding: str, errors: str) -> Self:
            nonlocal in_a_row
            info = super().frombuf(buf, encoding, errors)
            if info.type in _EXTENSION_TYPES:
                in_a_row += 1
                if info.size > MAX_EXTENSION_BYTES:
                    raise UnsafeArchiveError(f"the archive holds an extension header of "
                                             f"{info.size} bytes (at most "
                                             f"{MAX_EXTENSION_BYTES})")
                if in_a_row > MAX_EXTENSIONS_IN_A_ROW:
                    raise UnsafeArchiveError(f"the archive holds more than "
                                             f"{MAX_EXTENSIONS_IN_A_ROW} extension headers "
                                             "in a row")
            else:
                in_a_row = 0
                if info.type == tarfile.GNUTYPE_SPARSE:
                    raise UnsafeArchiveError(f"member {info.name} is a sparse file")
            return info

    return GuardedInfo


def unpack(data: bytes, dest: Path, *, max_bytes: int = MAX_UNPACKED_BYTES,
           max_members: int = MAX_MEMBERS) -> list[str]:
    """Unpack the tar.gz ``data`` into the folder ``dest``; return the names written.

    Raises :class:`UnsafeArchiveError` for an archive that is not a tar.gz, a member with an
    absolute name or ``..``, a link that leads outside ``dest``, a device or pipe, a name that
    already exists, more than ``max_members`` members or more than ``max_bytes`` of files.
    What was written before the error stays (the caller discards the folder).
    """
    dest.mkdir(parents=True, exist_ok=True)
    root = os.path.realpath(dest)
    # Headers cost 512 bytes or more a member, and tar pads its end to a 10 KiB record: the
    # stream may exceed the files by that much, not more.
    stream = _Limited(gzip.GzipFile(fileobj=io.BytesIO(data)),
                      max_bytes + 1536 * (max_members + 2) + 64 * 1024)
    written: list[str] = []
    total = 0
    try:
        with tarfile.open(fileobj=io.BufferedReader(stream), mode="r|",
                          tarinfo=_guarded_info()) as tar:
            for count, member in enumerate(tar, start=1):
                if count > max_members:
                    raise UnsafeArchiveError(f"the archive holds more than {max_members} "
                                             "members")
                name = _member_name(member)
                target = os.path.join(root, name)
                if not _inside(root, os.path.realpath(os.path.dirname(target))):
                    raise UnsafeArchiveError(f"member {member.name} would be written outside "
                                             "the folder (through a link)")
                if member.isdir():
                    os.makedirs(target, mode=0o755, exist_ok=True)
                elif member.isfile():
                    total += member.size
                    if total > max_bytes:
                        raise UnsafeArchiveError(f"the archive unpacks to more than {max_bytes}"
                                                 f" bytes (at member {member.name})")
                    _write_file(tar, member, target)
                elif member.issym():
                    link = posixpath.normpath(posixpath.join(posixpath.dirname(name),
                                                             member.linkname))
                    # Lexically, then as the file system resolves it through the links
                    # already unpacked ("d -> ." then "x -> d/.." is the folder's parent).
                    resolved = os.path.realpath(os.path.join(os.path.dirname(target),
                                                             member.linkname))
                    if member.linkname.startswith("/") or link == ".." or link.startswith(
                            "../") or not _inside(root, resolved):
                        raise UnsafeArchiveError(f"member {member.name} is a link to "
                                                 f"{member.linkname}, outside the folder")
                    _refuse_existing(target, member.name)
                    os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
                    os.symlink(member.linkname, target)
                elif member.islnk():
                    try:
                        source = safe_name(member.linkname)
                    except ValueError as exc:
                        raise UnsafeArchiveError(f"member {member.name} is a hard link to "
                                                 f"{member.linkname}: {exc}") from exc
                    src = os.path.join(root, source)
                    if (not _inside(root, os.path.realpath(src))
                            or not os.path.isfile(src) or os.path.islink(src)):
                        raise UnsafeArchiveError(f"member {member.name} is a hard link to "
                                                 f"{member.linkname}, not a file unpacked "
                                                 "before it")
                    _refuse_existing(target, member.name)
                    os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
                    os.link(src, target)
                else:
                    raise UnsafeArchiveError(f"member {member.name} is a device, pipe or other "
                                             "special file")
                written.append(name)
    except (tarfile.TarError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise UnsafeArchiveError(f"not a readable tar.gz archive: {exc}") from exc
    return written


def _member_name(member: tarfile.TarInfo) -> str:
    try:
        name = safe_name(member.name)
    except ValueError as exc:
        raise UnsafeArchiveError(f"member {member.name!r} is refused: {exc}") from exc
    if len(os.fsencode(name)) > MAX_NAME_BYTES:
        raise UnsafeArchiveError(f"member {name[:80]}... has a name longer than "
                                 f"{MAX_NAME_BYTES} bytes")
    if any(len(os.fsencode(part)) > MAX_COMPONENT_BYTES for part in name.split("/")):
        raise UnsafeArchiveError(f"member {name[:80]}... has a file or folder name longer "
                                 f"than {MAX_COMPONENT_BYTES} bytes")
    return name


def _refuse_existing(target: str, name: str) -> None:
    if os.path.lexists(target):
        raise UnsafeArchiveError(f"member {name} exists already in the folder")


def _write_file(tar: tarfile.TarFile, member: tarfile.TarInfo, target: str) -> None:
    os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
    mode = 0o755 if member.mode & 0o100 else 0o644
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    except FileExistsError as exc:
        raise UnsafeArchiveError(f"member {member.name} exists already in the folder") from exc
    source = tar.extractfile(member)
    assert source is not None
    with os.fdopen(fd, "wb") as out:
        while chunk := source.read(1024 * 1024):
            out.write(chunk)
