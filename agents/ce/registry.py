"""Which compute element a queue's pilots go to, read from the queue's parameters in the
resources configuration, and the CEs an agent process keeps.

    Executor = "slurm"      a PSI/J executor of this host: local, slurm, pbs, lsf, flux, cobalt
    Executor = "arc"        an ARC-CE, through its REST interface:
      Endpoint  = "https://arc1.example.org:443/arex"   (default: https://<CE name>/arex)
      TokenFile = "/etc/gridpilot/tokens/arc1.token"    a token, re-read when the file changes
      ProxyFile = "/etc/gridpilot/proxy.pem"            or an X.509 proxy instead
      CABundle  = "/etc/grid-security/certificates"     the CAs to trust (a file or a folder)
      BatchQueue = "grid"                               the CE's queue

Kinds are registered in ``KINDS``; a new kind (HTCondor-CE) is a module with a class that
implements agents.ce.base.ComputeElement and a line there: the director does not change.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.ce.base import ComputeElement

ARC = "arc"
#: The kinds whose worker nodes do not share the director's installation: their pilots take
#: the pilot bundle along (agents.ce.bundle) unless ``[agents] pilot_command`` says otherwise.
SHIP_PILOT = frozenset({ARC})
#: Queue parameters that configure the CE, not the worker nodes.
CE_PARAMETERS = frozenset({"Executor", "Endpoint", "TokenFile", "ProxyFile", "CABundle"})


class CEConfigError(ValueError):
    """A queue's CE parameters are wrong; the message names the queue and the parameter."""


@dataclass(frozen=True)
class CEConfig:
    """Where a queue's pilots go. Equal configurations share one CE object."""

    kind: str
    #: The PSI/J executor's name (the PSI/J kind), or "arc".
    executor: str
    endpoint: str = ""
    token_file: str = ""
    proxy_file: str = ""
    ca_bundle: str = ""

    @property
    def name(self) -> str:
        return f"{self.kind}:{self.endpoint}" if self.endpoint else f"psij:{self.executor}"


def ce_config(queue_name: str, ce: str, params: dict[str, Any]) -> CEConfig | None:
    """The CE configuration of a queue (``site/ce/queue``, for messages), or None when it
    names no Executor (its pilots come from elsewhere)."""
    executor = params.get("Executor")
    if executor is None:
        return None

    def text(key: str) -> str:
        value = params.get(key)
        if value is None:
            return ""
        if not isinstance(value, str) or not value.strip():
            raise CEConfigError(f"{queue_name}: {key} must be a non-empty string, "
                                f"got {value!r}")
        return value.strip()

    executor = text("Executor")
    if executor.lower() != ARC:
        return CEConfig("psij", executor)
    endpoint = text("Endpoint") or f"https://{ce}/arex"
    if not endpoint.startswith("https://"):
        raise CEConfigError(f"{queue_name}: Endpoint must be an https:// URL of the CE's "
                            f"REST interface, got {endpoint!r}")
    token_file, proxy_file = text("TokenFile"), text("ProxyFile")
    if bool(token_file) == bool(proxy_file):
        raise CEConfigError(f"{queue_name}: an ARC CE needs one credential, TokenFile or "
                            f"ProxyFile ({'both' if token_file else 'neither'} given)")
    return CEConfig(ARC, ARC, endpoint.rstrip("/"), token_file, proxy_file, text("CABundle"))


#: How each kind is built: (config, pilot folders' parent, the agents' settings) → a CE.
Builder = Callable[[CEConfig, Path, Any], ComputeElement]


def _psij(config: CEConfig, workdir: Path, agents: Any) -> ComputeElement:
    from agents.ce.psij import PsijCE

    return PsijCE(config.executor, workdir,
                  polling_interval=max(1, min(30, agents.pilot_status_interval)))


def _arc(config: CEConfig, workdir: Path, agents: Any) -> ComputeElement:
    from agents.ce.arc import ArcCE

    return ArcCE(config, timeout=agents.ce_timeout)


KINDS: dict[str, Builder] = {"psij": _psij, ARC: _arc}


class ComputeElements:
    """The CEs of one agent process, each built once and kept (a PSI/J executor watches its
    pilots for the life of the process), and each CE's back-off after it failed."""

    def __init__(self, workdir: Path, agents: Any, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.workdir = workdir
        self.agents = agents
        self.clock = clock
        self._built: dict[CEConfig, ComputeElement] = {}
        #: CE name → (failures in a row, monotonic time before which it is left alone).
        self._backoff: dict[str, tuple[int, float]] = {}

    def get(self, config: CEConfig) -> ComputeElement:
        if config not in self._built:
            self._built[config] = KINDS[config.kind](config, self.workdir, self.agents)
        return self._built[config]

    def resting(self, config: CEConfig) -> bool:
        """Whether the CE failed lately and is left alone for now."""
        entry = self._backoff.get(config.name)
        return entry is not None and self.clock() < entry[1]

    def failed(self, config: CEConfig) -> int:
        """Note a failure of the CE: it is left alone for ``failure_backoff`` seconds,
        doubling per failure in a row (at most 16 times); returns the failures in a row."""
        failures = self._backoff.get(config.name, (0, 0.0))[0] + 1
        pause = self.agents.failure_backoff * min(16, 2 ** (failures - 1))
        self._backoff[config.name] = (failures, self.clock() + pause)
        return failures

    def answered(self, config: CEConfig) -> None:
        self._backoff.pop(config.name, None)
