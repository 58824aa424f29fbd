"""The project's local ARC-CE (``tools/arc-localhost``) for tests: started once per test
session, what a client needs to reach it, tokens of its issuer (good ones, and the bad kinds a
CE must refuse), and waiting for jobs to reach a state.

A test module takes it through a session fixture of its own::

    @pytest.fixture(scope="session")
    def arc_ce() -> LocalCe:
        return local_ce()

When A-REX cannot be started the tests are skipped locally, but fail where CI,
GRIDPILOT_TEST_REQUIRE_SERVERS=1 or GRIDPILOT_TEST_REQUIRE_ARC=1 is set. ``tools/arc-localhost
up`` is idempotent and fast when the CE already runs (CI starts it before the tests).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jwt
import pytest
import requests
from cryptography.hazmat.primitives.asymmetric import rsa

from agents.ce.arcrest import FINAL_STATES, ArcRestClient

ROOT = Path(__file__).resolve().parents[2]
ARC_LOCALHOST = ROOT / "tools" / "arc-localhost"
#: The scopes of tools/arc-issuer's tokens, all of which the local CE requires.
COMPUTE_SCOPES = "compute.read compute.create compute.modify compute.cancel"
#: How long a test waits for a job's state (the CE's information provider refreshes every
#: 10 s there, and its fork back end notices an ended job within about 20 s).
STATE_TIMEOUT = 180.0


def arc_required() -> bool:
    return any(os.environ.get(name) not in (None, "", "0") for name in (
        "CI", "GRIDPILOT_TEST_REQUIRE_SERVERS", "GRIDPILOT_TEST_REQUIRE_ARC"))


@dataclass(frozen=True)
class LocalCe:
    """The local CE as ``tools/arc-localhost env`` describes it."""

    endpoint: str
    ca_bundle: Path
    ca_dir: Path
    user_cert: Path
    user_key: Path
    proxy: Path
    issuer: str
    issuer_dir: Path
    token_file: Path
    audience: str
    local_user: str
    work_dir: Path
    #: The Python a pilot runs with on this CE (its jobs cannot reach /root, where a
    #: virtualenv's interpreter may live).
    worker_python: str

    @property
    def host_port(self) -> str:
        """"host:port" of the CE's REST interface, as the CE's errors name it."""
        return urlsplit(self.endpoint).netloc

    @property
    def issuer_host_port(self) -> str:
        """"host:port" of the token issuer (an HTTPS server the CA bundle trusts)."""
        return urlsplit(self.issuer).netloc

    def signing_key(self, kid: str = "gridpilot-1") -> Path:
        return self.issuer_dir / "keys" / f"{kid}.pem"

    def token(self, *, lifetime: int = 3600, scope: str = COMPUTE_SCOPES,
              audience: str | None = None, kid: str = "gridpilot-1",
              key: rsa.RSAPrivateKey | None = None, **claims: Any) -> str:
        """A token as the issuer signs them; ``key`` signs with another key under ``kid``."""
        now = int(time.time())
        body: dict[str, Any] = {"iss": self.issuer, "sub": "gridpilot-tests",
                                "aud": audience or self.audience, "iat": now, "nbf": now,
                                "exp": now + lifetime, "scope": scope, "wlcg.ver": "1.0",
                                "wlcg.groups": ["/gridpilot/pilots"], "jti": str(uuid.uuid4())}
        body.update(claims)
        signer: Any = key if key is not None else self.signing_key(kid).read_bytes()
        return jwt.encode(body, signer, algorithm="RS256", headers={"kid": kid})

    def token_client(self, token_file: Path, **kwargs: Any) -> ArcRestClient:
        return ArcRestClient(self.endpoint, token_file=token_file, ca_bundle=self.ca_bundle,
                             **kwargs)

    def proxy_client(self, proxy_file: Path | None = None, **kwargs: Any) -> ArcRestClient:
        return ArcRestClient(self.endpoint, proxy_file=proxy_file or self.proxy,
                             ca_bundle=self.ca_bundle, **kwargs)


def write_secret(path: Path, text: str) -> Path:
    """A credential file (mode 0600), replaced whole (a new inode, as token refreshers do)."""
    new = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    new.write_text(text)
    new.chmod(0o600)
    new.replace(path)
    return path


def _run(*command: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                          check=False, cwd=ROOT)


@functools.cache
def _started() -> LocalCe | str:
    try:
        up = _run(str(ARC_LOCALHOST), "up", timeout=900)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{ARC_LOCALHOST} up failed: {type(exc).__name__}: {exc}"
    if up.returncode != 0:
        return f"{ARC_LOCALHOST} up failed ({up.returncode}): {up.stdout}{up.stderr}"
    lines = _run(str(ARC_LOCALHOST), "env", timeout=60).stdout.splitlines()
    env = dict(line.removeprefix("export ").split("=", 1) for line in lines if "=" in line)

    def get(key: str) -> str:
        return env[f"GRIDPILOT_ARC_{key}"]

    return LocalCe(endpoint=get("ENDPOINT"), ca_bundle=Path(get("CA_BUNDLE")),
                   ca_dir=Path(get("CA_DIR")), user_cert=Path(get("USER_CERT")),
                   user_key=Path(get("USER_KEY")), proxy=Path(get("PROXY")),
                   issuer=get("ISSUER"), issuer_dir=Path(get("ISSUER_DIR")),
                   token_file=Path(get("TOKEN_FILE")), audience=get("AUDIENCE"),
                   local_user=get("LOCAL_USER"), work_dir=Path(get("DIR")),
                   worker_python=get("WORKER_PYTHON"))


def local_ce() -> LocalCe:
    """The running local CE (started on first use), or a skip (a failure where required)."""
    started = _started()
    if isinstance(started, str):
        if arc_required():
            pytest.fail(started)
        pytest.skip(started)
    _end_leftovers(started)
    return started


@functools.cache
def _end_leftovers(ce: LocalCe) -> None:
    """Once a session: end and clean the jobs the test identities left on the CE (a run
    stopped half way leaves them, and with them delegations the CE will not remove while a
    job holds them), then their delegations, so that every session starts from an empty CE."""
    for client in (ce.proxy_client(), ce.token_client(ce.token_file)):
        try:
            left = list(client.statuses())
            if left:
                end_jobs(ce, client, left)
        finally:
            client.close()
    clear_delegations(ce)


def end_jobs(ce: LocalCe, client: ArcRestClient, ids: Iterable[str]) -> None:
    """Kill and clean the CE jobs ``ids`` (best effort: some may have ended) and end what
    they left running. The fork back end's kill ends a job's script, not what the script
    started (a pilot, its payloads), which run on in the job's session folder: once the CE
    says each job is over (or STATE_TIMEOUT has passed), those processes get SIGKILL."""
    wanted = list(ids)
    if not wanted:
        return
    client.kill(wanted)
    deadline = time.monotonic() + STATE_TIMEOUT
    while time.monotonic() < deadline:
        states = client.statuses(wanted)
        if all(states[j] in FINAL_STATES for j in wanted):
            break
        time.sleep(1)
    sessions = tuple(str(ce.work_dir / "session" / j) for j in wanted)
    inside = tuple(f"{s}/" for s in sessions)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cwd = os.readlink(entry / "cwd").removesuffix(" (deleted)")
        except OSError:
            continue
        if cwd in sessions or cwd.startswith(inside):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)
    client.clean(wanted)


def wait_for_states(client: ArcRestClient, ids: Iterable[str],
                    done: Callable[[str], bool], *, timeout: float = STATE_TIMEOUT
                    ) -> dict[str, str]:
    """Poll the jobs' states until ``done`` holds for each; fails with the last states."""
    wanted = list(ids)
    deadline = time.monotonic() + timeout
    while True:
        states = client.statuses(wanted)
        if all(done(states[j]) for j in wanted):
            return states
        if time.monotonic() > deadline:
            pytest.fail(f"jobs did not reach the state wanted within {timeout:.0f} s: {states}")
        time.sleep(1)


def clear_delegations(ce: LocalCe, *, patience: float = 60.0) -> None:
    """Remove the delegations the CE holds for its test user (the identity of ``ce.proxy``).
    One a job still holds cannot be removed until the job is cleaned, which the CE does a
    little after it is asked: tried again for up to ``patience`` seconds."""
    deadline = time.monotonic() + patience
    while True:
        left = ce.proxy_client().delegations()
        for delegation in left:
            requests.post(f"{ce.endpoint}/rest/1.0/delegations/{delegation}",
                          params={"action": "delete"}, cert=str(ce.proxy),
                          verify=str(ce.ca_bundle), timeout=30)
        if not left or time.monotonic() > deadline:
            return
        time.sleep(1)
