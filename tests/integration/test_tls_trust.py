"""The pilot and ``gridpilot-client`` against an https service whose certificate a CA made here
signed: without that CA they refuse, saying the certificate could not be verified (with the URL
and the fix), never "connection refused"; they succeed with it given as ``--ca-bundle`` (a PEM
file), as ``$GRIDPILOT_CA_BUNDLE``, or through ``$X509_CERT_DIR`` (a folder of OpenSSL-hashed
CA certificates, made by ``openssl rehash``), and ``--ca-bundle`` wins over the
``$REQUESTS_CA_BUNDLE`` that ``requests`` would otherwise put in its place.

The service is a real HTTPS server on loopback (the standard library's, TLS by ``ssl``) that
answers the few calls a pilot and ``whoami`` make; the pilot is a real subprocess."""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests
from click.testing import CliRunner

from client.cli import EXIT_UNREACHABLE, cli
from pilot.loop import EXIT_OK
from pilot.loop import EXIT_UNREACHABLE as PILOT_UNREACHABLE

ROOT = Path(__file__).resolve().parents[2]
TRUST_ENV = ("GRIDPILOT_CA_BUNDLE", "X509_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
             "SSL_CERT_FILE", "SSL_CERT_DIR")
HINT = "give the CA with --ca-bundle or GRIDPILOT_CA_BUNDLE"


@dataclass
class Service:
    url: str
    ca: Path
    ca_dir: Path
    paths: list[str] = field(default_factory=list)


def _openssl(folder: Path, *args: str) -> None:
    done = subprocess.run(["openssl", *args], cwd=folder, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr


def _make_pki(folder: Path) -> tuple[Path, Path, Path, Path]:
    """A CA, a server certificate for localhost it signed, and a folder holding the CA
    under its OpenSSL subject hash (``openssl rehash``)."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    _openssl(folder, "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "1",
             "-subj", "/CN=gridpilot TLS test CA",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    _openssl(folder, "req", *ec, "-keyout", "server.key", "-out", "server.csr",
             "-subj", "/CN=localhost")
    (folder / "server.ext").write_text(
        "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n")
    _openssl(folder, "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "server.crt", "-days", "1", "-extfile", "server.ext")
    certificates = folder / "certificates"
    certificates.mkdir()
    shutil.copy(folder / "ca.crt", certificates / "gridpilot-test-ca.pem")
    _openssl(certificates, "rehash", ".")
    hashed = [p for p in certificates.iterdir() if p.name.endswith(".0")]
    assert len(hashed) == 1 and hashed[0].is_symlink(), list(certificates.iterdir())
    return folder / "ca.crt", certificates, folder / "server.crt", folder / "server.key"


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    folder = tmp_path_factory.mktemp("tls")
    ca, ca_dir, cert, key = _make_pki(folder)
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            seen.append(f"{self.command} {self.path.split('?')[0]}")
            if self.path.endswith("/pilots/match"):
                body: dict[str, object] = {"jobs": [], "no_match": {
                    "reason": "no_waiting_jobs", "detail": "nothing waits"}}
            elif self.path.endswith("/whoami"):
                body = {"subject": "alice", "role": "user", "vo": "lhcb",
                        "group": "lhcb_user"}
            else:
                body = {}
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = _answer

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Service(f"https://localhost:{server.server_address[1]}", ca, ca_dir, seen)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)


def _clean_environ(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in TRUST_ENV and not k.startswith("GRIDPILOT_")}
    return {**env, **extra}


def _pilot(service: Service, tmp_path: Path, *args: str,
           **env: str) -> subprocess.CompletedProcess[str]:
    token = tmp_path / "pilot.token"
    token.write_text("not-checked-here\n")
    token.chmod(0o600)
    return subprocess.run(
        [sys.executable, "-m", "pilot.cli", "--matcher", service.url, "--vo", "lhcb",
         "--site", "LCG.CERN.cern", "--ce", "ce", "--queue", "q", "--submit-pools", "",
         "--token-file", str(token), "--workdir", str(tmp_path / "work"), "--cores", "1",
         "--idle-timeout", "1", "--request-timeout", "10", "--backoff-cap", "0.5",
         "--report-timeout", "2", *args],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env=_clean_environ(**env))


def test_a_pilot_without_the_ca_says_the_certificate_could_not_be_verified(
        service: Service, tmp_path: Path) -> None:
    done = _pilot(service, tmp_path)
    assert done.returncode == PILOT_UNREACHABLE, done.stderr
    reason = done.stderr.strip().splitlines()[-1]
    assert f"the certificate of {service.url} could not be verified: unable to get " \
           f"local issuer certificate" in reason, reason
    assert HINT in reason and "refused" not in reason, reason


@pytest.mark.parametrize("how", ["option", "GRIDPILOT_CA_BUNDLE", "X509_CERT_DIR",
                                 "option over REQUESTS_CA_BUNDLE"])
def test_a_pilot_given_the_ca_reaches_the_service(service: Service, tmp_path: Path,
                                                  how: str) -> None:
    args: list[str] = []
    env: dict[str, str] = {}
    if how.startswith("option"):
        args = ["--ca-bundle", str(service.ca)]
        if how.endswith("REQUESTS_CA_BUNDLE"):
            env["REQUESTS_CA_BUNDLE"] = requests.certs.where()
    elif how == "GRIDPILOT_CA_BUNDLE":
        env["GRIDPILOT_CA_BUNDLE"] = str(service.ca)
    else:
        env["X509_CERT_DIR"] = str(service.ca_dir)
    before = len(service.paths)
    done = _pilot(service, tmp_path, *args, **env)
    assert done.returncode == EXIT_OK, done.stderr
    assert "POST /api/v1/pilots/match" in service.paths[before:]


def test_the_pilot_refuses_a_ca_bundle_that_does_not_exist(service: Service,
                                                           tmp_path: Path) -> None:
    done = _pilot(service, tmp_path, GRIDPILOT_CA_BUNDLE=str(tmp_path / "nope.pem"))
    assert done.returncode == 2
    assert (f"gridpilot-pilot: GRIDPILOT_CA_BUNDLE: the CA bundle {tmp_path / 'nope.pem'} does "
            "not exist") in done.stderr
    assert "Traceback" not in done.stderr


def _client(service: Service, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *args: str,
            **env: str) -> tuple[int, str]:
    for name in list(os.environ):
        if name in TRUST_ENV or name.startswith(("GRIDPILOT_", "BEARER_TOKEN")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    result = CliRunner().invoke(cli, ["--url", service.url, "--token", "t", *args, "whoami"],
                                catch_exceptions=False)
    return result.exit_code, result.output


def test_the_client_without_the_ca_says_the_certificate_could_not_be_verified(
        service: Service, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    code, output = _client(service, monkeypatch, tmp_path)
    assert code == EXIT_UNREACHABLE, output
    assert f"the certificate of {service.url} could not be verified: unable to get " \
           f"local issuer certificate" in output, output
    assert HINT in output and "connection refused" not in output, output


@pytest.mark.parametrize("how", ["option", "GRIDPILOT_CA_BUNDLE", "X509_CERT_DIR",
                                 "config file", "option over REQUESTS_CA_BUNDLE"])
def test_the_client_given_the_ca_reaches_the_service(
        service: Service, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, how: str) -> None:
    args: list[str] = []
    env: dict[str, str] = {}
    if how.startswith("option"):
        args = ["--ca-bundle", str(service.ca)]
        if how.endswith("REQUESTS_CA_BUNDLE"):
            env["REQUESTS_CA_BUNDLE"] = requests.certs.where()
    elif how == "GRIDPILOT_CA_BUNDLE":
        env["GRIDPILOT_CA_BUNDLE"] = str(service.ca)
    elif how == "X509_CERT_DIR":
        env["X509_CERT_DIR"] = str(service.ca_dir)
    else:
        config = tmp_path / "config" / "gridpilot"
        config.mkdir(parents=True)
        shutil.copy(service.ca, config / "ca.crt")
        (config / "client.toml").write_text('ca_bundle = "ca.crt"\n')
    code, output = _client(service, monkeypatch, tmp_path, *args, **env)
    assert code == 0, output
    assert "alice" in output


@pytest.mark.parametrize("bundle", ["empty folder", "other CA folder", "X509_CERT_DIR empty"])
def test_a_folder_without_the_ca_says_the_certificate_could_not_be_verified(
        service: Service, tmp_path: Path, bundle: str) -> None:
    """A folder is taken as it is (OpenSSL reads it lazily): one without the service's CA
    fails as a missing CA does, exit 5 with the URL and the fix, never a hang or a
    traceback."""
    folder = tmp_path / "certificates"
    folder.mkdir()
    if bundle == "other CA folder":
        (folder / "junk.0").write_text("not a certificate\n")
    args = [] if bundle.startswith("X509") else ["--ca-bundle", str(folder)]
    env = {"X509_CERT_DIR": str(folder)} if bundle.startswith("X509") else {}
    done = _pilot(service, tmp_path, *args, **env)
    assert done.returncode == PILOT_UNREACHABLE, done.stderr
    reason = done.stderr.strip().splitlines()[-1]
    assert f"the certificate of {service.url} could not be verified" in reason, reason
    assert HINT in reason and "Traceback" not in done.stderr


def test_a_pilot_given_a_file_that_is_no_pem_ends_at_once(service: Service,
                                                          tmp_path: Path) -> None:
    bundle = tmp_path / "ca.pem"
    bundle.write_bytes(service.ca.read_bytes()[:40])  # a certificate cut short
    before = len(service.paths)
    done = _pilot(service, tmp_path, "--ca-bundle", str(bundle))
    assert done.returncode == 2, done.stderr
    assert f"--ca-bundle: the CA bundle {bundle} holds no PEM certificate" in done.stderr
    assert service.paths[before:] == []
