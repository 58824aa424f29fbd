"""Which compute element a queue's pilots go to, read from the queue's parameters in the
resources configuration.

    Executor = "slurm"      a PSI/J executor of this host: local, slurm, pbs, lsf, flux, cobalt
    Executor = "arc"        an ARC-CE, through its REST interface:
      Endpoint  = "https://arc1.example.org:443/arex"   (default: https://<CE name>/arex)
      TokenFile = "/etc/gridpilot/tokens/arc1.token"    a token, re-read when the file changes
      ProxyFile = "/etc/gridpilot/proxy.pem"            or an X.509 proxy instead
      CABundle  = "/etc/grid-security/certificates"     the CAs to trust (a file or a folder)
      BatchQueue = "grid"                               the CE's queue

The kinds are built by agents.ce.registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
