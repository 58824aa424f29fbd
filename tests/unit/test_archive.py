"""Sandbox archives: deterministic packing, and every hostile archive refused on unpacking."""

from __future__ import annotations

import gzip
import io
import os
import subprocess
import sys
import tarfile
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from pilot.archive import (
    Member,
    UnsafeArchiveError,
    checksum_of,
    is_sandbox_id,
    pack,
    pack_files,
    read_inside,
    sandbox_id,
    unpack,
)


def _tar(add: Callable[[tarfile.TarFile], None]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        add(tar)
    return gzip.compress(raw.getvalue())


def _file(tar: tarfile.TarFile, name: str, data: bytes = b"x") -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _special(tar: tarfile.TarFile, name: str, kind: bytes, link: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    tar.addfile(info)


def test_same_files_give_the_same_id_whatever_the_order() -> None:
    a = pack([Member("b.txt", b"2"), Member("a.txt", b"1")])
    b = pack([Member("a.txt", b"1"), Member("b.txt", b"2")])
    assert a == b
    assert is_sandbox_id(sandbox_id(a))
    assert checksum_of(sandbox_id(a)) == sandbox_id(a).removeprefix("sb:sha256:")
    assert sandbox_id(a) != sandbox_id(pack([Member("a.txt", b"1")]))


def test_round_trip_keeps_content_folders_and_the_execute_bit(tmp_path: Path) -> None:
    data = pack([Member("run.sh", b"#!/bin/sh\necho hi\n", executable=True),
                 Member("sub/data.txt", b"payload")])
    names = unpack(data, tmp_path / "job")
    assert sorted(names) == ["run.sh", "sub/data.txt"]
    assert (tmp_path / "job/sub/data.txt").read_bytes() == b"payload"
    assert os.access(tmp_path / "job/run.sh", os.X_OK)
    assert not os.access(tmp_path / "job/sub/data.txt", os.X_OK)


def test_pack_files_names_what_is_missing_or_not_a_file(tmp_path: Path) -> None:
    (tmp_path / "ok.txt").write_text("fine")
    (tmp_path / "link").symlink_to("/etc/passwd")
    assert pack_files(tmp_path, ["ok.txt"])
    with pytest.raises(ValueError, match=r"missing\.txt does not exist"):
        pack_files(tmp_path, ["missing.txt"])
    with pytest.raises(ValueError, match="link is not a regular file"):
        read_inside(tmp_path, "link")
    with pytest.raises(ValueError, match=r"leaves its folder"):
        read_inside(tmp_path, "../etc/passwd")
    with pytest.raises(ValueError, match="absolute"):
        read_inside(tmp_path, "/etc/passwd")


def test_a_folder_link_cannot_smuggle_a_file_out(tmp_path: Path) -> None:
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "up").symlink_to(tmp_path)
    (tmp_path / "secret").write_text("no")
    with pytest.raises(ValueError, match="outside the folder"):
        read_inside(tmp_path / "job", "up/secret")


HOSTILE: dict[str, tuple[Callable[[tarfile.TarFile], None], str]] = {
    "absolute path": (lambda t: _file(t, "/tmp/evil"), "absolute"),
    "dot-dot": (lambda t: _file(t, "../evil"), r"leaves its folder"),
    "dot-dot inside": (lambda t: _file(t, "a/../../evil"), r"leaves its folder"),
    "symlink out (absolute)": (lambda t: _special(t, "l", tarfile.SYMTYPE, "/etc"),
                               "outside the folder"),
    "symlink out (relative)": (lambda t: _special(t, "a/l", tarfile.SYMTYPE, "../../x"),
                               "outside the folder"),
    "write through a symlink": (
        lambda t: (_special(t, "d", tarfile.SYMTYPE, "."), _special(
            t, "e", tarfile.SYMTYPE, "d/.."), _file(t, "e/evil")),
        "outside the folder"),
    "link out through a link": (
        lambda t: (_special(t, "d", tarfile.SYMTYPE, "."), _special(
            t, "x", tarfile.SYMTYPE, "d/..")),
        "outside the folder"),
    "link out through a link in a folder": (
        lambda t: (_special(t, "a/up", tarfile.SYMTYPE, ".."), _special(
            t, "a/b", tarfile.SYMTYPE, "up/..")),
        "outside the folder"),
    "hard link out": (lambda t: _special(t, "h", tarfile.LNKTYPE, "/etc/passwd"),
                      "hard link"),
    "hard link to nothing": (lambda t: _special(t, "h", tarfile.LNKTYPE, "nope"),
                             "not a file unpacked before it"),
    "character device": (lambda t: _special(t, "null", tarfile.CHRTYPE), "device"),
    "block device": (lambda t: _special(t, "sda", tarfile.BLKTYPE), "device"),
    "fifo": (lambda t: _special(t, "pipe", tarfile.FIFOTYPE), "device, pipe"),
    "duplicate name": (lambda t: (_file(t, "a"), _file(t, "a")), "exists already"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_archives_are_refused_and_nothing_lands_outside(tmp_path: Path,
                                                                  case: str) -> None:
    build, message = HOSTILE[case]
    dest = tmp_path / "box" / "job"
    with pytest.raises(UnsafeArchiveError, match=message):
        unpack(_tar(build), dest)
    assert sorted(p.name for p in (tmp_path / "box").iterdir()) == ["job"]
    assert not Path("/tmp/evil").exists()


def test_an_internal_symlink_is_allowed(tmp_path: Path) -> None:
    data = _tar(lambda t: (_file(t, "data/real.txt", b"r"),
                           _special(t, "alias.txt", tarfile.SYMTYPE, "data/real.txt")))
    unpack(data, tmp_path)
    assert (tmp_path / "alias.txt").read_bytes() == b"r"


def test_too_many_members(tmp_path: Path) -> None:
    data = pack([Member(f"f{i}", b"") for i in range(20)])
    with pytest.raises(UnsafeArchiveError, match="more than 10 members"):
        unpack(data, tmp_path, max_members=10)


def test_a_decompression_bomb_is_stopped(tmp_path: Path) -> None:
    data = pack([Member("zeros", bytes(50 * 1024 * 1024))])
    assert len(data) < 200 * 1024
    with pytest.raises(UnsafeArchiveError, match="more than 1048576 bytes"):
        unpack(data, tmp_path, max_bytes=1024 * 1024)
    assert not (tmp_path / "zeros").exists()


def test_a_header_only_bomb_is_stopped_by_the_stream_limit(tmp_path: Path) -> None:
    # Padding after the end marker: no member claims bytes, but the stream is huge.
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        _file(tar, "a", b"1")
    data = gzip.compress(raw.getvalue() + bytes(20 * 1024 * 1024))
    assert unpack(data, tmp_path / "ok", max_bytes=1024, max_members=2) == ["a"]
    # Members whose extended headers are each within the limit claim no file bytes at all.
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in ("b", "c"):
            info = tarfile.TarInfo(name)
            info.pax_headers = {"comment": "x" * (60 * 1024)}
            tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(UnsafeArchiveError, match="unpacks to more than"):
        unpack(gzip.compress(raw.getvalue()), tmp_path / "pax", max_bytes=1024, max_members=2)
    assert unpack(pack([Member("a", b"1")]), tmp_path / "small", max_bytes=1,
                  max_members=1) == ["a"]


@pytest.mark.parametrize("junk", [b"", b"not an archive", gzip.compress(b"not a tar" * 100)])
def test_garbage_is_not_an_archive(tmp_path: Path, junk: bytes) -> None:
    with pytest.raises(UnsafeArchiveError, match=r"not a readable tar\.gz"):
        unpack(junk, tmp_path)


def _header(name: str, kind: bytes, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.type, info.size = kind, size
    return info.tobuf(format=tarfile.GNU_FORMAT)


def _streamed_bomb(kind: bytes, size: int) -> bytes:
    """A tar.gz whose first header is an extension of ``kind`` announcing ``size`` bytes
    (a PAX record or a GNU long name), followed by one small file; compressed piece by piece
    so that the test itself never holds the expanded bytes."""
    if kind in (tarfile.XHDTYPE, tarfile.XGLTYPE):
        head, tail = f"{size} comment=", "\n"
        filler = size - len(head) - len(tail)
    else:
        head, tail, filler = "", "\0", size - 1
    z = zlib.compressobj(6, zlib.DEFLATED, 31)
    out = [z.compress(_header("././@LongLink", kind, size)), z.compress(head.encode())]
    chunk = b"x" * (1024 * 1024)
    while filler > 0:
        out.append(z.compress(chunk[:filler]))
        filler -= len(chunk)
    out.append(z.compress(tail.encode()))
    out.append(z.compress(bytes(-size % 512)))
    body = b"1"
    out.append(z.compress(_header("f", tarfile.REGTYPE, len(body)) + body + bytes(511)))
    out.append(z.compress(bytes(1024)))
    out.append(z.flush())
    return b"".join(out)


@pytest.mark.parametrize("kind", [tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.GNUTYPE_LONGNAME,
                                  tarfile.GNUTYPE_LONGLINK])
def test_a_huge_extension_header_is_refused_before_it_is_read(tmp_path: Path,
                                                              kind: bytes) -> None:
    data = _streamed_bomb(kind, 200 * 1024 * 1024)
    assert len(data) < 400 * 1024
    with pytest.raises(UnsafeArchiveError, match="extension header of 209715200 bytes"):
        unpack(data, tmp_path / "job")
    assert not (tmp_path / "job" / "f").exists()


def test_the_header_bomb_never_costs_its_size_in_memory(tmp_path: Path) -> None:
    # In a child held to 256 MB of address space beyond what it has at the start: reading
    # a 400 MB record would fail with MemoryError, refusing it does not.
    bomb = tmp_path / "bomb.tar.gz"
    bomb.write_bytes(_streamed_bomb(tarfile.XHDTYPE, 400 * 1024 * 1024))
    script = (
        "import resource, sys\n"
        "from pathlib import Path\n"
        "from pilot.archive import UnsafeArchiveError, unpack\n"
        "data = Path(sys.argv[1]).read_bytes()\n"
        "resource.setrlimit(resource.RLIMIT_DATA, (256 * 1024 * 1024,) * 2)\n"
        "try:\n"
        "    unpack(data, Path(sys.argv[2]))\n"
        "except UnsafeArchiveError as exc:\n"
        "    print('refused:', exc)\n")
    done = subprocess.run([sys.executable, "-c", script, str(bomb), str(tmp_path / "job")],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("refused: ")


def test_a_long_name_within_the_header_limit_is_refused_without_an_os_error(
        tmp_path: Path) -> None:
    data = _tar(lambda t: _file(t, "d/" + "n" * 300))
    with pytest.raises(UnsafeArchiveError, match="longer than 255 bytes"):
        unpack(data, tmp_path)
    data = _tar(lambda t: _file(t, "/".join(["d" * 200] * 30)))
    with pytest.raises(UnsafeArchiveError, match="longer than 4095 bytes"):
        unpack(data, tmp_path)


def test_a_sparse_member_is_refused(tmp_path: Path) -> None:
    data = _tar(lambda t: _special(t, "s", tarfile.GNUTYPE_SPARSE))
    with pytest.raises(UnsafeArchiveError, match="sparse"):
        unpack(data, tmp_path)


def test_a_chain_of_extension_headers_is_refused(tmp_path: Path) -> None:
    raw = b"".join(_header("././@PaxHeader", tarfile.XHDTYPE, 0) for _ in range(5000))
    raw += _header("f", tarfile.REGTYPE, 0) + bytes(1024)
    with pytest.raises(UnsafeArchiveError, match="extension headers in a row"):
        unpack(gzip.compress(raw), tmp_path)
