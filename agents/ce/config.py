"""Which compute element a queue's pilots go to, read from the queue's parameters in the
resources configuration.

    Executor = "slurm"      a PSI/J executor of this host: local, slurm, pbs, lsf, flux, cobalt
    Executor = "arc"        an ARC-CE, through its REST interface:
      Endpoint  = "https://arc1.example.org:443/arex"   (default: https://<CE name>/arex)
      TokenFile = "/etc/gridpilot/tokens/arc1.token"    a token, re-read when the file changes
      ProxyFile = "/etc/gridpilot/proxy.pem"            an X.509 proxy, re-read alike
      Credentials = "token" | "proxy" | "both"          which of them pilots are submitted with
      CABundle  = "/etc/grid-security/certificates"     the CAs to trust (a file or a folder)
      BatchQueue = "grid"                               the CE's queue

Credentials: "token" authenticates with the token; "proxy" with the proxy (the TLS client
certificate) and delegates it to the CE for the pilots; "both" authenticates with the token and
delegates the proxy (sites whose jobs need a proxy beside the token, for data staging). Without
Credentials, the files given say it: TokenFile alone is "token", ProxyFile alone "proxy", both
files "both". Like every parameter it may be set per site, CE or queue and in their VO sections,
so one VO's pilots may reach a CE with a token and another's with a proxy; the file a mode does
not use is ignored.

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
CE_PARAMETERS = frozenset({"Executor", "Endpoint", "TokenFile", "ProxyFile", "Credentials",
                           "CABundle"})
#: The credential modes of an ARC CE, and the files each needs.
TOKEN, PROXY, BOTH = "token", "proxy", "both"
CREDENTIAL_FILES: dict[str, tuple[str, ...]] = {
    TOKEN: ("TokenFile",), PROXY: ("ProxyFile",), BOTH: ("TokenFile", "ProxyFile")}


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
    #: An ARC CE's credential mode: TOKEN, PROXY or BOTH ("" for a PSI/J executor).
    credentials: str = ""

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
    files = {"TokenFile": text("TokenFile"), "ProxyFile": text("ProxyFile")}
    mode = text("Credentials").lower()
    if not mode:
        if not any(files.values()):
            raise CEConfigError(f"{queue_name}: an ARC CE needs a credential: TokenFile, "
                                f"ProxyFile, or both (neither given)")
        mode = BOTH if all(files.values()) else TOKEN if files["TokenFile"] else PROXY
    elif mode not in CREDENTIAL_FILES:
        raise CEConfigError(f"{queue_name}: Credentials must be one of "
                            f"{', '.join(repr(m) for m in CREDENTIAL_FILES)}, "
                            f"got {params.get('Credentials')!r}")
    missing = [key for key in CREDENTIAL_FILES[mode] if not files[key]]
    if missing:
        verb = "is" if len(missing) == 1 else "are"
        raise CEConfigError(f"{queue_name}: Credentials = {mode!r} needs "
                            f"{' and '.join(missing)}, which {verb} not given")
    used = CREDENTIAL_FILES[mode]
    return CEConfig(ARC, ARC, endpoint.rstrip("/"),
                    files["TokenFile"] if "TokenFile" in used else "",
                    files["ProxyFile"] if "ProxyFile" in used else "", text("CABundle"), mode)
