"""The deployment of tools/topology, once per test session: nginx (TLS) → HAProxy → three
matcher instances → PgBouncer (transaction mode) → a database of its own on the PostgreSQL
server the tests use, the agents, Prometheus and Alertmanager. The highly available
PostgreSQL of tools/pg-ha (Patroni, etcd, HAProxy), also once per session."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.conftest import SERVER_ENV
from tests.integration.pilots import stop_started_pilots

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "topology"


@dataclass
class Topology:
    """What tools/topology brought up (its state file) and ways to use it."""

    folder: Path
    state: dict[str, Any]

    @property
    def url(self) -> str:
        return str(self.state["url"])

    @property
    def ca(self) -> str:
        return str(self.state["ca"])

    def password(self, user: str) -> str:
        """A password tools/topology made: PgBouncer's users, HAProxy's stats."""
        return str(self.state.get("passwords", {}).get(user, ""))

    def port(self, name: str) -> int:
        return int(self.state["ports"][name])

    def http(self) -> requests.Session:
        """A client of the public URL that trusts the topology's CA."""
        session = requests.Session()
        session.verify = self.ca
        session.trust_env = False  # REQUESTS_CA_BUNDLE would win over verify
        return session

    def tool(self, *args: str) -> None:
        """Run tools/topology on this topology (e.g. "kill", "matcher-2")."""
        done = subprocess.run([sys.executable, str(TOOL), *args, "--dir", str(self.folder)],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        self.state = json.loads((self.folder / "state.json").read_text())

    def admin(self, command: str) -> list[list[str]]:
        """A command of PgBouncer's admin console (SHOW POOLS ...), its rows split."""
        done = subprocess.run(
            ["psql", "-X", "-A", "-t", "-F", "\t", "-h", "127.0.0.1", "-p",
             str(self.port("pgbouncer")), "-U", "gpadmin", "-d", "pgbouncer", "-c", command],
            capture_output=True, text=True, timeout=60,
            env={**os.environ, "PGPASSWORD": self.password("gpadmin")})
        assert done.returncode == 0, done.stderr
        return [line.split("\t") for line in done.stdout.splitlines() if line]

    def balancer(self, command: str) -> str:
        """A command of HAProxy's admin socket (e.g. "show stat")."""
        import socket

        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(10)
            s.connect(str(self.folder / "haproxy" / "admin.sock"))
            s.sendall(command.encode() + b"\n")
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def server_states(self) -> dict[str, str]:
        """HAProxy's view of each matcher instance: UP, DOWN, ..."""
        lines = self.balancer("show stat").splitlines()
        header = lines[0].lstrip("# ").split(",")
        rows = [dict(zip(header, line.split(","), strict=False)) for line in lines[1:] if line]
        return {row["svname"]: row["status"] for row in rows
                if row.get("pxname") == "matchers" and row["svname"].startswith("matcher-")}


@pytest.fixture(scope="session")
def topology() -> Iterator[Topology]:
    postgres = os.environ.get(SERVER_ENV["postgresql"])
    if not postgres:
        # Only reached outside CI: with GRIDPILOT_TEST_REQUIRE_SERVERS=1 conftest refuses to
        # start without PostgreSQL.
        pytest.skip(f"{SERVER_ENV['postgresql']} is not set")
    # A folder the daemons (run as nobody) can reach: not under pytest's 0700 folders.
    folder = Path(tempfile.mkdtemp(prefix="gridpilot-topology-"))
    folder.chmod(0o755)
    up = subprocess.run([sys.executable, str(TOOL), "up", "--dir", str(folder), "--postgres",
                         postgres], capture_output=True, text=True, timeout=900)
    try:
        if up.returncode != 0:
            pytest.fail(f"tools/topology up failed: {up.stderr}")
        yield Topology(folder, json.loads((folder / "state.json").read_text()))
    finally:
        subprocess.run([sys.executable, str(TOOL), "down", "--dir", str(folder)],
                       capture_output=True, timeout=300)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(autouse=True, scope="session")
def _payloads_see_the_test_folders(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The test payloads' scripts and records are in the tests' temporary folders, and many
    run this Python (``sys.executable``): pilots started here let their (isolated) payloads
    see them, as a site shows its shared areas (--isolation-bind), the Python and the
    checkout read-only (a checkout under /tmp would be hidden by the payload's private
    /tmp); the pilot's work folder stays hidden."""
    name = "GRIDPILOT_ISOLATION_BIND"
    before = os.environ.get(name)
    python = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix)}
    read_only = sorted({*python, Path(__file__).resolve().parents[2]})
    os.environ[name] = ":".join([str(tmp_path_factory.getbasetemp()),
                                 *(f"{p}:ro" for p in read_only)])
    yield
    if before is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = before


@pytest.fixture(autouse=True)
def _no_pilot_outlives_its_test() -> Iterator[None]:
    """Pilots started through tests.integration.pilots.start_pilot end with their test."""
    yield
    stop_started_pilots()


# -- the highly available PostgreSQL of tools/pg-ha -------------------------------------------

PG_HA = ROOT / "tools" / "pg-ha"


def _ha_required() -> bool:
    return any(os.environ.get(name) not in (None, "", "0") for name in (
        "CI", "GRIDPILOT_TEST_REQUIRE_SERVERS", "GRIDPILOT_TEST_REQUIRE_PGHA"))


@dataclass
class HACluster:
    """What tools/pg-ha brought up: its `env` lines as a mapping, and its commands."""

    env: dict[str, str]

    @property
    def url(self) -> str:
        """The SQLAlchemy URL of the database ``postgres`` through HAProxy."""
        return self.env["GRIDPILOT_HA_URL"]

    def tool(self, *args: str) -> str:
        """Run tools/pg-ha (e.g. "kill", "primary"); its output."""
        done = subprocess.run([str(PG_HA), *args], capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, f"tools/pg-ha {' '.join(args)}: {done.stderr}"
        return done.stdout.strip()

    def members(self) -> dict[str, str]:
        """Patroni's roles now: member name -> leader, sync_standby or replica."""
        state = json.loads(self.tool("status"))
        return {m["name"]: m["role"] for m in state["cluster"]}


@pytest.fixture(scope="session")
def ha_cluster() -> Iterator[HACluster]:
    """tools/pg-ha's cluster, started once per session (left running if it was up before:
    .ci/run starts it); skipped when it cannot start, except in CI."""
    was_up = subprocess.run([str(PG_HA), "env"], capture_output=True, timeout=60
                            ).returncode == 0
    up = subprocess.run([str(PG_HA), "up"], capture_output=True, text=True, timeout=900)
    if up.returncode != 0:
        message = f"tools/pg-ha up failed: {up.stderr[-3000:]}"
        if _ha_required():
            pytest.fail(message)
        pytest.skip(message)
    env = dict(line.removeprefix("export ").split("=", 1) for line in subprocess.run(
        [str(PG_HA), "env"], capture_output=True, text=True, check=True, timeout=60
    ).stdout.splitlines())
    try:
        yield HACluster({k: shlex.split(v)[0] for k, v in env.items()})
    finally:
        if not was_up:
            subprocess.run([str(PG_HA), "down"], capture_output=True, timeout=300)
