"""Where the client finds the service and its token: flags, then the environment, then a small
config file in the user's config folder, then the WLCG bearer-token discovery locations.

The config file (``$GRIDPILOT_CLIENT_CONFIG``, else ``$XDG_CONFIG_HOME/gridpilot/client.toml``,
else ``~/.config/gridpilot/client.toml``) holds::

    url = "https://wms.example.org"
    token_file = "token"        # relative paths count from the file's own folder
    ca_bundle = "ca.crt"        # the service's CA: a PEM file or a folder of hashed ones
    timeout = 30

The CAs trusted for an https URL: ``--ca-bundle``, ``$GRIDPILOT_CA_BUNDLE``, the config
file's ``ca_bundle``, ``$X509_CERT_DIR``, else the system's store (see pilot.tls).

A token is looked for in: ``--token``/``--token-file``, ``$GRIDPILOT_TOKEN``,
``$GRIDPILOT_TOKEN_FILE``, the config file's ``token``/``token_file``, then the WLCG bearer
token discovery order: ``$BEARER_TOKEN``, ``$BEARER_TOKEN_FILE``,
``$XDG_RUNTIME_DIR/bt_u<uid>``, ``/tmp/bt_u<uid>``.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pilot.tls import CABundleError, trusted_cas


class ConfigError(Exception):
    """The client's settings are missing or wrong; the message says what to do."""


@dataclass(frozen=True)
class ClientConfig:
    url: str
    token: str
    timeout: float = 30.0
    #: Where the token came from (for messages; never the token itself).
    token_source: str = ""
    #: The CAs trusted for https (``requests``' verify: a path, or True for the system's).
    verify: str | bool = True
    verify_source: str = ""


def config_path(environ: Mapping[str, str]) -> Path:
    explicit = environ.get("GRIDPILOT_CLIENT_CONFIG")
    if explicit:
        return Path(explicit)
    base = environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "gridpilot" / "client.toml"


def read_config_file(path: Path) -> dict[str, Any]:
    """The file's settings, with relative paths resolved against its folder; {} if absent."""
    if not path.is_file():
        return {}
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the client config {path}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"the client config {path} is not valid TOML: {exc}") from exc
    known = {"url", "token", "token_file", "timeout", "ca_bundle"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{path}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")
    for key in ("url", "token", "token_file", "ca_bundle"):
        if key in data and not isinstance(data[key], str):
            raise ConfigError(f"{path}: {key} must be a string")
    if "timeout" in data and (isinstance(data["timeout"], bool)
                              or not isinstance(data["timeout"], int | float)
                              or data["timeout"] <= 0):
        raise ConfigError(f"{path}: timeout must be a positive number of seconds")
    for key in ("token_file", "ca_bundle"):
        if data.get(key):
            data[key] = str(path.parent / Path(data[key]).expanduser())
    return data


def resolve(*, url: str | None, token: str | None, token_file: str | None,
            timeout: float | None, environ: Mapping[str, str],
            ca_bundle: str | None = None) -> ClientConfig:
    """The service URL, token and CAs from the flags, the environment and the config
    file."""
    path = config_path(environ)
    file = read_config_file(path)
    found_url = url or environ.get("GRIDPILOT_URL") or file.get("url")
    if not found_url:
        raise ConfigError(
            "no service URL: pass --url, set GRIDPILOT_URL, or put url = \"https://...\" in "
            f"{path}")
    if not found_url.startswith(("http://", "https://")):
        raise ConfigError(f"the service URL must start with http:// or https://, got "
                          f"{found_url!r}")
    value, source = _token(token, token_file, environ, file, path)
    try:
        verify, verify_source = trusted_cas(ca_bundle, environ,
                                            configured=(f"{path} ca_bundle",
                                                        file.get("ca_bundle")))
    except CABundleError as exc:
        raise ConfigError(str(exc)) from exc
    return ClientConfig(found_url.rstrip("/"), value,
                        float(timeout or file.get("timeout") or 30.0), source, verify,
                        verify_source)


def _token(token: str | None, token_file: str | None, environ: Mapping[str, str],
           file: Mapping[str, Any], path: Path) -> tuple[str, str]:
    uid = os.getuid()
    candidates: list[tuple[str, str | None, str | None]] = [
        ("--token", token, None), ("--token-file", None, token_file),
        ("GRIDPILOT_TOKEN", environ.get("GRIDPILOT_TOKEN"), None),
        ("GRIDPILOT_TOKEN_FILE", None, environ.get("GRIDPILOT_TOKEN_FILE")),
        (f"{path} token", file.get("token"), None),
        (f"{path} token_file", None, file.get("token_file")),
        ("BEARER_TOKEN", environ.get("BEARER_TOKEN"), None),
        ("BEARER_TOKEN_FILE", None, environ.get("BEARER_TOKEN_FILE")),
    ]
    runtime_dir = environ.get("XDG_RUNTIME_DIR")
    discovered = ([f"{runtime_dir}/bt_u{uid}"] if runtime_dir else []) + [f"/tmp/bt_u{uid}"]
    for source, value, file_name in candidates:
        if value:
            return value.strip(), source
        if file_name:
            return _read_token(Path(file_name).expanduser(), source), source
    for name in discovered:
        if Path(name).is_file():
            return _read_token(Path(name), name), name
    raise ConfigError(
        "no token: pass --token-file, set GRIDPILOT_TOKEN or BEARER_TOKEN(_FILE), or put "
        f"token_file = \"...\" in {path} (your VO's operator or identity provider issues one)")


def _read_token(path: Path, source: str) -> str:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the token file {path} ({source}): {exc}") from exc
    if not text:
        raise ConfigError(f"the token file {path} ({source}) is empty")
    return text.split()[0]
