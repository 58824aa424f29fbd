"""Which CAs the pilot and the client trust: --ca-bundle, then $GRIDPILOT_CA_BUNDLE, then (the
client) its config file's ca_bundle, then $X509_CERT_DIR, then the system's store; a bundle
that is missing, or no file of certificates, is refused with where it was named."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from client.cli import cli
from client.config import ConfigError, resolve
from pilot.tls import CABundleError, trusted_cas


@pytest.fixture(scope="module")
def pem(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A CA certificate, as OpenSSL makes one."""
    folder = tmp_path_factory.mktemp("ca")
    done = subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "1",
         "-subj", "/CN=gridpilot bundle test CA"],
        cwd=folder, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return (folder / "ca.crt").read_text()


@pytest.fixture()
def bundles(tmp_path: Path, pem: str) -> dict[str, str]:
    out = {}
    for name in ("option", "env", "config"):
        (tmp_path / f"{name}.pem").write_text(pem)
        out[name] = str(tmp_path / f"{name}.pem")
    (tmp_path / "certificates").mkdir()
    out["dir"] = str(tmp_path / "certificates")
    return out


def test_the_order_of_the_pilots_sources(bundles: dict[str, str]) -> None:
    env = {"GRIDPILOT_CA_BUNDLE": bundles["env"], "X509_CERT_DIR": bundles["dir"]}
    assert trusted_cas(bundles["option"], env) == (bundles["option"], "--ca-bundle")
    assert trusted_cas(None, env) == (bundles["env"], "GRIDPILOT_CA_BUNDLE")
    assert trusted_cas("", {"X509_CERT_DIR": bundles["dir"]}) == (bundles["dir"],
                                                                   "X509_CERT_DIR")
    assert trusted_cas(None, {"GRIDPILOT_CA_BUNDLE": ""}) == (True, "the system's store")


def test_a_missing_bundle_is_refused_with_where_it_was_named(tmp_path: Path) -> None:
    with pytest.raises(CABundleError, match=r"^X509_CERT_DIR: the CA bundle .*/nowhere does "
                                            r"not exist$"):
        trusted_cas(None, {"X509_CERT_DIR": str(tmp_path / "nowhere")})
    # The first one set is the one used: a broken later one does not matter.
    assert trusted_cas(str(tmp_path), {"X509_CERT_DIR": "/nowhere"})[1] == "--ca-bundle"


def _client(tmp_path: Path, env: dict[str, str], option: str | None = None,
            config: str | None = None) -> tuple[str | bool, str]:
    folder = tmp_path / "xdg" / "gridpilot"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "client.toml").write_text(f'ca_bundle = "{config}"\n' if config else "")
    found = resolve(url="https://wms.example.org", token="t", token_file=None, timeout=None,
                    environ={"XDG_CONFIG_HOME": str(tmp_path / "xdg"), **env},
                    ca_bundle=option)
    return found.verify, found.verify_source


def test_the_order_of_the_clients_sources(tmp_path: Path, bundles: dict[str, str],
                                          pem: str) -> None:
    config_file = tmp_path / "xdg" / "gridpilot" / "client.toml"
    everything = {"GRIDPILOT_CA_BUNDLE": bundles["env"], "X509_CERT_DIR": bundles["dir"]}
    assert _client(tmp_path, everything, bundles["option"], bundles["config"]) == (
        bundles["option"], "--ca-bundle")
    assert _client(tmp_path, everything, None, bundles["config"]) == (
        bundles["env"], "GRIDPILOT_CA_BUNDLE")
    # The config file's path counts from its folder, and comes before X509_CERT_DIR.
    (config_file.parent / "mine.pem").write_text(pem)
    assert _client(tmp_path, {"X509_CERT_DIR": bundles["dir"]}, None, "mine.pem") == (
        str(config_file.parent / "mine.pem"), f"{config_file} ca_bundle")
    assert _client(tmp_path, {"X509_CERT_DIR": bundles["dir"]}) == (bundles["dir"],
                                                                    "X509_CERT_DIR")
    assert _client(tmp_path, {}) == (True, "the system's store")


def test_the_client_refuses_a_missing_or_wrong_ca_bundle(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"client.toml ca_bundle: the CA bundle .*/gone.pem "
                                          r"does not exist"):
        _client(tmp_path, {}, None, "gone.pem")
    (tmp_path / "xdg" / "gridpilot" / "client.toml").write_text("ca_bundle = 3\n")
    with pytest.raises(ConfigError, match="ca_bundle must be a string"):
        resolve(url="https://wms.example.org", token="t", token_file=None, timeout=None,
                environ={"XDG_CONFIG_HOME": str(tmp_path / "xdg")})


def _odd_bundles(tmp_path: Path) -> dict[str, Path]:
    """What a careless hand may give as a CA bundle."""
    odd = {"empty": tmp_path / "empty.pem", "text": tmp_path / "notes.txt",
           "header only": tmp_path / "cut.pem", "fifo": tmp_path / "fifo",
           "device": Path("/dev/zero"), "loop": tmp_path / "loop.pem"}
    odd["empty"].write_text("")
    odd["text"].write_text("not a certificate\n" * 1000)
    odd["header only"].write_text("-----BEGIN CERTIFICATE-----\n")
    os.mkfifo(odd["fifo"])
    odd["loop"].symlink_to(odd["loop"])
    return odd


def test_a_bundle_with_no_certificate_is_refused_with_where_it_was_named(
        tmp_path: Path) -> None:
    odd = _odd_bundles(tmp_path)
    for name in ("empty", "text", "header only"):
        with pytest.raises(CABundleError, match=rf"--ca-bundle: the CA bundle {odd[name]} "
                                                "holds no PEM certificate that can be read"):
            trusted_cas(str(odd[name]), {})
    with pytest.raises(CABundleError, match=r"^GRIDPILOT_CA_BUNDLE: .* holds no PEM"):
        trusted_cas(None, {"GRIDPILOT_CA_BUNDLE": str(odd["text"])})
    for name in ("fifo", "device"):
        with pytest.raises(CABundleError, match="is neither a file nor a folder"):
            trusted_cas(str(odd[name]), {})
    with pytest.raises(CABundleError, match="does not exist"):
        trusted_cas(str(odd["loop"]), {})


@pytest.mark.parametrize("name", ["empty", "text", "fifo", "device", "loop"])
def test_the_pilot_and_the_client_end_with_a_usage_error_on_an_odd_bundle(
        tmp_path: Path, name: str) -> None:
    bundle = str(_odd_bundles(tmp_path)[name])
    token = tmp_path / "token"
    token.write_text("t")
    token.chmod(0o600)
    run = subprocess.run([sys.executable, "-m", "pilot.cli", "--matcher", "https://127.0.0.1:9",
                          "--vo", "lhcb", "--token-file", str(token), "--ca-bundle", bundle],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert run.returncode == 2, run.stderr
    assert f"gridpilot-pilot: --ca-bundle: the CA bundle {bundle} " in run.stderr
    assert "Traceback" not in run.stderr
    result = CliRunner().invoke(cli, ["--url", "https://127.0.0.1:9", "--token", "t",
                                      "--ca-bundle", bundle, "whoami"],
                                env={"XDG_CONFIG_HOME": str(tmp_path / "xdg")})
    assert result.exit_code == 2, result.output
    assert f"the CA bundle {bundle} " in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
