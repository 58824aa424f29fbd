"""Sandbox archives: deterministic packing, and every hostile archive refused on unpacking."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
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
    # A member whose extended header is megabytes long claims no file bytes at all.
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("b")
        info.pax_headers = {"comment": "x" * (5 * 1024 * 1024)}
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(UnsafeArchiveError, match="unpacks to more than"):
        unpack(gzip.compress(raw.getvalue()), tmp_path / "pax", max_bytes=1024, max_members=2)
    assert unpack(pack([Member("a", b"1")]), tmp_path / "small", max_bytes=1,
                  max_members=1) == ["a"]


@pytest.mark.parametrize("junk", [b"", b"not an archive", gzip.compress(b"not a tar" * 100)])
def test_garbage_is_not_an_archive(tmp_path: Path, junk: bytes) -> None:
    with pytest.raises(UnsafeArchiveError, match=r"not a readable tar\.gz"):
        unpack(junk, tmp_path)
