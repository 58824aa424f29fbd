"""The grid of the acceptance scenario, deployed as docs/operations.md tells an operator: the
project's tools bring up the local ARC-CE, the local Slurm and the central service
(``tools/topology``), and what a client needs comes from their ``env`` commands only.

Everything started here is stopped by :meth:`Grid.down`, which the scenario calls in a
``finally`` (and on SIGINT/SIGTERM): the topology, the pilots it sent (through the operator's
pilot kill, then by their batch job ids and processes), and the CE token file.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "tools"
HERE = Path(__file__).resolve().parent
ARC_SITE, SLURM_SITE = "ARC.Accept.test", "SLURM.Accept.test"
ARC_SE, SLURM_SE = "ACCEPT-ARC-DISK", "ACCEPT-SLURM-DISK"
ARC_QUEUE = f"{ARC_SITE}/localhost/fork"
SLURM_QUEUE = f"{SLURM_SITE}/slurm-localhost/debug"
#: The agents' settings of the scenario: pilots leave 30 s after their last job, and a queue
#: whose CE failed is tried again after 5 s (the operator's defaults are minutes).
SETTINGS = ("agents.pilot_idle_timeout=30", "agents.failure_backoff=5",
            "agents.pilots_per_cycle=3", "agents.director_interval=5",
            "agents.pilot_status_interval=5")


class DeployError(Exception):
    """A tool failed; the message has its output."""


def run_tool(*command: str, env: Mapping[str, str] | None = None,
             timeout: float = 900) -> str:
    """Run one of the project's tools; its standard output, or DeployError with its output."""
    done = subprocess.run([str(TOOLS / command[0]), *command[1:]], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})},
                          stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise DeployError(f"tools/{' '.join(command)} exited {done.returncode}:\n"
                          f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done.stdout


def exports(text: str) -> dict[str, str]:
    """The variables of a tool's ``env`` output (``export NAME=VALUE`` lines, shell-quoted)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            name, _, value = words[1].partition("=")
            out[name] = value
    return out


@dataclass
class Grid:
    """The deployed grid and what its tools said of it."""

    folder: Path
    arc: dict[str, str] = field(default_factory=dict)
    slurm: dict[str, str] = field(default_factory=dict)
    client: dict[str, str] = field(default_factory=dict)
    up: bool = False
    #: Whether the central service's database is the highly available one (tools/pg-ha),
    #: and what its ``env`` said of it.
    ha: bool = False
    database: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.client["GRIDPILOT_URL"]

    @property
    def ca(self) -> str:
        return self.client["GRIDPILOT_CA_BUNDLE"]

    def topology(self, *args: str, timeout: float = 300) -> str:
        """tools/topology on this grid's deployment; its agents submit to the local Slurm,
        whose configuration they find in SLURM_CONF."""
        env = {"SLURM_CONF": self.slurm.get("SLURM_CONF", "")}
        if self.database:
            env["GRIDPILOT_TOPOLOGY_POSTGRES"] = self.database["GRIDPILOT_HA_URL"]
        return run_tool("topology", *args, "--dir", str(self.folder / "topology"), env=env,
                        timeout=timeout)

    def deploy(self, log: Log) -> None:
        log("starting the local Slurm (tools/slurm-localhost up)")
        run_tool("slurm-localhost", "up")
        self.slurm = exports(run_tool("slurm-localhost", "env"))
        if self.ha:
            log("starting the highly available PostgreSQL (tools/pg-ha up)")
            run_tool("pg-ha", "up")
            self.database = exports(run_tool("pg-ha", "env"))
            if not self.database.get("GRIDPILOT_HA_URL"):
                raise DeployError("tools/pg-ha env does not say GRIDPILOT_HA_URL")
        log("starting the local ARC-CE (tools/arc-localhost up)")
        run_tool("arc-localhost", "up")
        self.arc = exports(run_tool("arc-localhost", "env"))
        token = run_tool("arc-localhost", "token", "--lifetime", "7200").strip()
        token_file = self.folder / "arc-ce.token"
        token_file.unlink(missing_ok=True)
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(token + "\n")
        resources = self.folder / "resources.toml"
        resources.write_text((HERE / "grid.toml").read_text(encoding="utf-8").format(
            arc_site=ARC_SITE, arc_se=ARC_SE, slurm_site=SLURM_SITE, slurm_se=SLURM_SE,
            arc_endpoint=self.arc["GRIDPILOT_ARC_ENDPOINT"], arc_token_file=token_file,
            arc_ca=self.arc["GRIDPILOT_ARC_CA_BUNDLE"]), encoding="utf-8")
        log("deploying the central service (tools/topology up)")
        self.up = True
        self.topology("up", "--resources", str(resources), *[f"--set={s}" for s in SETTINGS],
                      timeout=600)
        self.client = exports(self.topology("env"))
        for name in ("GRIDPILOT_URL", "GRIDPILOT_CA_BUNDLE", "GRIDPILOT_TOKEN_FILE",
                     "GRIDPILOT_OPERATOR_TOKEN_FILE"):
            if not self.client.get(name):
                raise DeployError(f"tools/topology env does not say {name}")

    def down(self, log: Log) -> None:
        """Stop what the scenario started, also when it failed half-way."""
        if not self.up:
            return
        state_file = self.folder / "topology" / "state.json"
        pilots: list[dict[str, str]] = []
        if self.client:
            with contextlib.suppress(Exception):
                pilots = self._end_pilots(log)
        with contextlib.suppress(DeployError, subprocess.TimeoutExpired):
            self.topology("down", timeout=300)
        url = self.client.get("GRIDPILOT_URL")
        if url:
            # Pilots still alive (a CE that ignored a kill) have nobody to talk to now.
            subprocess.run(["pkill", "-KILL", "-f", "--", f"--matcher {url}"], check=False)
        slurm_ids = [p["native_id"] for p in pilots
                     if p.get("executor") == "slurm" and p.get("native_id")]
        if slurm_ids and self.slurm:
            subprocess.run(["scancel", *slurm_ids], check=False, capture_output=True,
                           env={**os.environ, **self.slurm})
        self._clean_arc([p["native_id"] for p in pilots
                         if p.get("executor") == "arc" and p.get("native_id")])
        (self.folder / "arc-ce.token").unlink(missing_ok=True)
        self.up = state_file.exists()

    def _end_pilots(self, log: Log) -> list[dict[str, str]]:
        """Kill the live pilots as the operator would, give the director a minute to pass it
        on; every pilot record, for the batch-level clean-up after."""
        http = requests.Session()
        http.verify = self.ca
        http.trust_env = False
        token = Path(self.client["GRIDPILOT_OPERATOR_TOKEN_FILE"]).read_text().strip()
        http.headers["Authorization"] = f"Bearer {token}"

        def listed() -> list[dict[str, str]]:
            answer = http.get(f"{self.url}/api/v1/pilots", params={"limit": 1000}, timeout=30)
            answer.raise_for_status()
            pilots: list[dict[str, str]] = answer.json()["pilots"]
            return pilots

        live = [p for p in listed() if p["status"] not in ("Done", "Failed", "Aborted", "Lost")]
        for p in live:
            http.post(f"{self.url}/api/v1/pilots/{p['reference']}/kill", timeout=30)
        deadline = time.monotonic() + 60
        while live and time.monotonic() < deadline:
            time.sleep(2)
            live = [p for p in listed()
                    if p["status"] not in ("Done", "Failed", "Aborted", "Lost")]
        if live:
            log(f"{len(live)} pilot(s) still alive after their kill; they are stopped by "
                "their batch ids and processes")
        return listed()

    def _clean_arc(self, ids: list[str]) -> None:
        if not ids or not self.arc:
            return
        token = run_tool("arc-localhost", "token").strip()
        with contextlib.suppress(requests.RequestException):
            for action in ("kill", "clean"):
                requests.post(f"{self.arc['GRIDPILOT_ARC_ENDPOINT']}/rest/1.0/jobs",
                              params={"action": action}, timeout=30,
                              verify=self.arc["GRIDPILOT_ARC_CA_BUNDLE"],
                              headers={"Authorization": f"Bearer {token}"},
                              json={"job": [{"id": i} for i in ids]})


class Log:
    """Timestamped lines on standard error, counted from the scenario's start."""

    def __init__(self) -> None:
        self.start = time.monotonic()

    def __call__(self, message: str) -> None:
        print(f"[{self.elapsed():6.1f} s] {message}", file=sys.stderr, flush=True)

    def elapsed(self) -> float:
        return time.monotonic() - self.start


def stop_on_signals() -> None:
    """SIGTERM ends the scenario as Ctrl-C does, so that its clean-up runs."""
    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupted)
