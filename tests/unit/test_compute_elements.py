"""The compute-element layer's pure parts: a queue's CE parameters, the pilot log archive, a
pilot's own exit reason, and reading the end of a pilot's output safely."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest

from agents.ce.config import CEConfig, CEConfigError, ce_config
from agents.ce.files import read_tail, write_private_file
from optimizers.resources import parse_resources
from taskqueue.pilots.pilotlogs import exit_reason, pack_log, unpack_log

Q = "Site.A/ce.a/q"


def test_a_psij_executor_and_no_executor() -> None:
    assert ce_config(Q, "ce.a", {"Executor": "slurm", "MaxRAM": 2048}) == CEConfig(
        "psij", "slurm")
    assert ce_config(Q, "ce.a", {"MaxRAM": 2048}) is None


def test_an_arc_ce_with_a_token_or_a_proxy() -> None:
    token = ce_config(Q, "arc1.example.org", {"Executor": "ARC", "TokenFile": "/t"})
    assert token == CEConfig("arc", "arc", "https://arc1.example.org/arex", "/t", "", "",
                             "token")
    proxy = ce_config(Q, "ce.a", {"Executor": "arc", "ProxyFile": "/p", "CABundle": "/ca",
                                  "Endpoint": "https://arc.example.org:8443/arex/"})
    assert proxy == CEConfig("arc", "arc", "https://arc.example.org:8443/arex", "", "/p", "/ca",
                             "proxy")
    # Equal configurations are one CE; the name says which.
    assert token is not None and token.name == "arc:https://arc1.example.org/arex"


def test_an_arc_ce_with_both_files_takes_both_unless_credentials_says_which() -> None:
    both = {"Executor": "arc", "TokenFile": "/t", "ProxyFile": "/p"}
    found = ce_config(Q, "ce.a", both)
    assert found is not None
    assert (found.credentials, found.token_file, found.proxy_file) == ("both", "/t", "/p")
    # Credentials names the mode: the file it does not use is left out, so that two queues
    # of one CE in one mode share one client.
    token = ce_config(Q, "ce.a", {**both, "Credentials": "token"})
    proxy = ce_config(Q, "ce.a", {**both, "Credentials": "Proxy"})
    assert token == ce_config(Q, "ce.a", {"Executor": "arc", "TokenFile": "/t"})
    assert proxy == ce_config(Q, "ce.a", {"Executor": "arc", "ProxyFile": "/p"})
    assert ce_config(Q, "ce.a", {**both, "Credentials": "both"}) == found


@pytest.mark.parametrize(("params", "message"), [
    ({"Executor": "arc"}, "needs a credential: TokenFile, ProxyFile, or both (neither given)"),
    ({"Executor": "arc", "TokenFile": "/t", "Credentials": "both"},
     "Credentials = 'both' needs ProxyFile, which is not given"),
    ({"Executor": "arc", "Credentials": "both"},
     "Credentials = 'both' needs TokenFile and ProxyFile, which are not given"),
    ({"Executor": "arc", "TokenFile": "/t", "Credentials": "proxy"},
     "Credentials = 'proxy' needs ProxyFile"),
    ({"Executor": "arc", "TokenFile": "/t", "Credentials": "x509"},
     "Credentials must be one of 'token', 'proxy', 'both', got 'x509'"),
    ({"Executor": "arc", "TokenFile": "/t", "Credentials": ["token"]},
     "Credentials must be a non-empty string"),
    ({"Executor": "arc", "TokenFile": "/t", "Endpoint": "http://ce:80/arex"},
     "Endpoint must be an https:// URL"),
    ({"Executor": "arc", "TokenFile": ""}, "TokenFile must be a non-empty string"),
    ({"Executor": "arc", "TokenFile": ["/a", "/b"]}, "TokenFile must be a non-empty string"),
    ({"Executor": 3}, "Executor must be a non-empty string"),
    ({"Executor": "  "}, "Executor must be a non-empty string"),
])
def test_wrong_ce_parameters_name_the_queue_and_the_parameter(
        params: dict[str, object], message: str) -> None:
    with pytest.raises(CEConfigError) as caught:
        ce_config(Q, "ce.a", params)
    assert str(caught.value).startswith(f"{Q}: ")
    assert message in str(caught.value)


def test_the_log_archive_is_the_same_for_the_same_output_and_reads_back() -> None:
    log_id, packed = pack_log(b"out\n", "err \u00e9\n".encode())
    assert (log_id, packed) == pack_log(b"out\n", "err \u00e9\n".encode())
    assert log_id.startswith("sb:sha256:") and len(log_id) == 10 + 64
    assert pack_log(b"out\n", b"other")[0] != log_id
    log = unpack_log(packed, limit=1024)
    assert (log.stdout, log.stderr) == ("out\n", "err \u00e9\n")


def test_what_is_not_a_pilot_log_archive_is_refused() -> None:
    with pytest.raises(ValueError, match="not a pilot log archive"):
        unpack_log(b"plain bytes", limit=1024)
    # A bomb: far more than any kept log once decompressed.
    with pytest.raises(ValueError, match="larger than any pilot log kept"):
        unpack_log(gzip.compress(b"\0" * (4 * 1024 * 1024)), limit=1024)


@pytest.mark.parametrize(("stderr", "code", "reason"), [
    (b"log\ngridpilot-pilot: exit 5: the matcher was never reached\n\n", 5,
     "exit code 5: gridpilot-pilot: exit 5: the matcher was never reached"),
    (b"", 3, "exit code 3"),
    (b"anything\n", 0, ""),
    (b"anything\n", None, ""),
    (b"\xffbroken\n", 1, "exit code 1: \ufffdbroken"),
])
def test_a_pilot_s_own_reason_is_its_last_line_on_stderr(stderr: bytes, code: int | None,
                                                         reason: str) -> None:
    assert exit_reason(stderr, code) == reason


def test_the_end_of_a_file_is_read_and_cut_from_the_front(tmp_path: Path) -> None:
    f = tmp_path / "pilot.out"
    f.write_bytes(b"0123456789")
    assert read_tail(f, 4) == (b"6789", True)
    assert read_tail(f, 10) == (b"0123456789", False)
    assert read_tail(tmp_path / "missing", 4) == (b"", False)


def test_a_link_or_a_fifo_in_a_pilot_s_folder_is_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("the director's own secret")
    link = tmp_path / "pilot.out"
    link.symlink_to(secret)
    data, cut = read_tail(link, 100)
    assert b"secret" not in data and b"not read" in data and not cut
    fifo = tmp_path / "pilot.err"
    os.mkfifo(fifo)
    data, cut = read_tail(fifo, 100)  # returns at once: nothing writes to it
    assert data == b"[pilot.err is not a regular file]\n"


def test_a_private_file_is_the_owner_s_only_and_replaces_a_link(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("untouched")
    target = tmp_path / "pilot.token"
    target.symlink_to(elsewhere)
    previous = os.umask(0)
    try:
        write_private_file(target, "token\n")
    finally:
        os.umask(previous)
    assert not target.is_symlink() and target.read_text() == "token\n"
    assert target.stat().st_mode & 0o777 == 0o600
    assert elsewhere.read_text() == "untouched"


def test_one_vo_reaches_a_ce_with_a_token_where_another_uses_a_proxy() -> None:
    """Credentials in a VO section of the resources file: each VO's pilots go with its own."""
    config = parse_resources('''
[Sites."S"]
VO = ["lhcb", "belle"]
[Sites."S".CEs."arc.example.org"]
Executor = "arc"
TokenFile = "/t"
ProxyFile = "/p"
[Sites."S".CEs."arc.example.org".VOs.lhcb]
Credentials = "token"
[Sites."S".CEs."arc.example.org".Queues.grid.VOs.belle]
Credentials = "proxy"
''', "resources.toml")
    (queue,) = config.queues()
    modes = {}
    for vo in ("lhcb", "belle", "atlas"):
        found = ce_config(Q, queue.ce, dict(queue.parameters(vo)))
        assert found is not None
        modes[vo] = (found.credentials, found.token_file, found.proxy_file)
    assert modes == {"lhcb": ("token", "/t", ""), "belle": ("proxy", "", "/p"),
                     "atlas": ("both", "/t", "/p")}
