"""Which CAs the pilot and the client trust: --ca-bundle, then $GRIDPILOT_CA_BUNDLE, then (the
client) its config file's ca_bundle, then $X509_CERT_DIR, then the system's store; a bundle
that is missing is refused with where it was named."""

from __future__ import annotations

from pathlib import Path

import pytest

from client.config import ConfigError, resolve
from pilot.tls import CABundleError, trusted_cas


@pytest.fixture()
def bundles(tmp_path: Path) -> dict[str, str]:
    out = {}
    for name in ("option", "env", "config"):
        (tmp_path / f"{name}.pem").write_text("-----BEGIN CERTIFICATE-----\n")
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


def test_the_order_of_the_clients_sources(tmp_path: Path, bundles: dict[str, str]) -> None:
    config_file = tmp_path / "xdg" / "gridpilot" / "client.toml"
    everything = {"GRIDPILOT_CA_BUNDLE": bundles["env"], "X509_CERT_DIR": bundles["dir"]}
    assert _client(tmp_path, everything, bundles["option"], bundles["config"]) == (
        bundles["option"], "--ca-bundle")
    assert _client(tmp_path, everything, None, bundles["config"]) == (
        bundles["env"], "GRIDPILOT_CA_BUNDLE")
    # The config file's path counts from its folder, and comes before X509_CERT_DIR.
    (config_file.parent / "mine.pem").write_text("x")
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
