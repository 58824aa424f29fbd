"""What the pilot tells the matcher about its worker node (the resource description)."""

from __future__ import annotations

import platform as _platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The largest memory (MB) and CPU time (s) a match request may offer.
MAX_MEMORY_MB = 2**31 - 1
MAX_CPU_TIME = 2**62


def detect_platform(os_release: Path = Path("/etc/os-release")) -> str:
    """The node's platform as grid sites name it: architecture and OS, e.g. ``x86_64-el9``
    (Enterprise Linux rebuilds), ``x86_64-debian12``, ``aarch64-ubuntu24``."""
    arch = _platform.machine() or "unknown"
    fields: dict[str, str] = {}
    try:
        for line in os_release.read_text(encoding="utf-8").splitlines():
            key, sep, value = line.partition("=")
            if sep:
                fields[key.strip()] = value.strip().strip('"')
    except OSError:
        return f"{arch}-{_platform.system().lower() or 'unknown'}"
    os_id = fields.get("ID", "linux").lower()
    major = fields.get("VERSION_ID", "").split(".")[0]
    like = fields.get("ID_LIKE", "").lower().split()
    if os_id in ("rhel", "centos", "almalinux", "rocky", "ol") or "rhel" in like:
        os_id = "el"
    return f"{arch}-{os_id}{major}"


@dataclass(frozen=True)
class NodeDescription:
    """The fixed part of the description: where the pilot runs and what the node offers."""

    vo: str
    reference: str
    site: str | None = None
    ce: str | None = None
    queue: str | None = None
    #: Platform labels of the node (detected, or as the site director says).
    platforms: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    required_tags: tuple[str, ...] = ()
    #: None: not known (the matcher then only gives jobs without RFC 7 requirements).
    submit_pools: tuple[str, ...] | None = None
    owner_group: str | None = None
    #: Further attributes of the node (the queue's parameters, e.g. CPUModel or
    #: SoftwareTag), for the ClassAd Requirements expressions of jobs.
    attributes: tuple[tuple[str, Any], ...] = ()

    def resource(self, *, free_cores: int, free_memory_mb: int | None,
                 cpu_time_left: int | None, free_gpus: int = 0) -> dict[str, Any]:
        """The description for one match request, with what is free right now."""
        data: dict[str, Any] = dict(self.attributes)
        data.update({"vo": self.vo, "pilot_reference": self.reference,
                     "tags": list(self.tags),
                     "required_tags": list(self.required_tags),
                     "processors": free_cores})
        if self.platforms:
            data["platform"] = list(self.platforms)
        for key, value in (("site", self.site), ("ce", self.ce), ("queue", self.queue),
                           ("owner_group", self.owner_group)):
            if value:
                data[key] = value
        if self.submit_pools is not None:
            data["submit_pools"] = list(self.submit_pools)
        # Never more than the matcher takes: an absurd limit offers "a lot", not a refusal.
        if free_memory_mb is not None:
            data["memory"] = min(free_memory_mb, MAX_MEMORY_MB)
        if cpu_time_left is not None:
            data["cpu_time"] = min(cpu_time_left, MAX_CPU_TIME)
        if free_gpus:
            data["gpus"] = free_gpus
        return data
