"""[matcher] ca_bundle as the director reads it every cycle: a FIFO or a device is refused
before it is opened (neither blocks nor fills the director), a file past the bound is refused
with its size, a large bundle within it is shipped whole."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from agents.director import MAX_CA_BUNDLE_BYTES, pilot_ca_bundle
from taskqueue.core.errors import ConfigurationError

PEM = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def _refusal(path: str) -> str:
    """What pilot_ca_bundle says of ``path``, read in a thread so that a read that blocks
    fails the test instead of holding it."""
    said: list[str] = []

    def read() -> None:
        try:
            pilot_ca_bundle(path)
        except ConfigurationError as exc:
            said.append(str(exc))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(60)
    assert not reader.is_alive(), f"reading {path} did not end"
    assert said, f"{path} was accepted"
    return said[0]


def test_a_fifo_or_a_device_is_refused_unopened(tmp_path: Path) -> None:
    fifo = tmp_path / "ca.pem"
    os.mkfifo(fifo)
    assert _refusal(str(fifo)) == (f"matcher.ca_bundle {fifo} is not a regular file: it must be "
                                   "a PEM file of the CA certificates of matcher.url")
    assert "is not a regular file" in _refusal("/dev/zero")
    assert "is not a regular file" in _refusal(str(tmp_path))


def test_a_file_past_the_bound_is_refused_with_its_size(tmp_path: Path) -> None:
    huge = tmp_path / "huge.pem"
    with huge.open("wb") as file:
        file.write(PEM)
        file.truncate(MAX_CA_BUNDLE_BYTES + 1)  # sparse: no disk spent
    assert _refusal(str(huge)) == (
        f"matcher.ca_bundle {huge} has {MAX_CA_BUNDLE_BYTES + 1} bytes, more than the "
        f"{MAX_CA_BUNDLE_BYTES} a file of CA certificates shipped with every pilot may have: "
        "give only the CAs of matcher.url")


def test_a_large_bundle_within_the_bound_is_shipped_whole(tmp_path: Path) -> None:
    large = tmp_path / "large.pem"
    large.write_bytes(PEM * (2 * 1024 * 1024 // len(PEM)))
    assert pilot_ca_bundle(str(large)) == large.read_bytes()
    assert pilot_ca_bundle("") is None


@pytest.mark.parametrize("text", [b"", b"hello\n"])
def test_a_file_without_a_certificate_is_refused(tmp_path: Path, text: bytes) -> None:
    bad = tmp_path / "bad.pem"
    bad.write_bytes(text)
    assert "holds no PEM certificate" in _refusal(str(bad))
