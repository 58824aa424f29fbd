"""What a pilot of a configured queue is given and so presents, built from the resources
configuration in one place: the site director starts its pilots with
:meth:`PilotLaunch.arguments` and :attr:`PilotLaunch.wall_minutes`, and everything that judges
what a queue's pilots could run (``explain``, the watchdog's unrunnable check, reach, the
director's count of waiting work) judges :meth:`PilotLaunch.description`, the description such
a pilot sends the matcher at its start (``pilot.loop.Pilot.match_request``).

CPU time: the batch system's wall limit of a pilot is the queue's ``WallTime``, else its
``MaxCPUTime`` (minutes), else :data:`DEFAULT_WALL_MINUTES`. The pilot is told that limit
(``--wall-limit``, real seconds) and the queue's CPU power (``--cpu-factor``, HS06 per core),
and offers per core the normalised CPU seconds that remain before the limit less its margin:
``(wall seconds - PILOT_MARGIN) * factor`` (a factor of 1 where the queue states none), the
unit of the task queues' CPU-time buckets.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from optimizers.resources import ResourcesConfig, Value
from taskqueue.core.resources import Resource, parse_resource

#: Seconds a director's pilot keeps free before its wall limit (its ``--margin``).
PILOT_MARGIN = 60
#: The batch system's wall limit, in minutes, of a queue that states neither WallTime nor
#: MaxCPUTime.
DEFAULT_WALL_MINUTES = 60
#: Queue parameters that are the director's or the CE's settings, or resource fields of their
#: own: not passed to pilots as node attributes for ClassAd expressions. Every CE parameter of
#: agents.ce.config.CE_PARAMETERS is among them (a unit test checks).
NOT_ATTRIBUTES = frozenset({
    "Executor", "Endpoint", "TokenFile", "ProxyFile", "Credentials", "CABundle",
    "MaxWaitingPilots", "MaxTotalPilots", "MachineFeatures", "JobFeatures",
    "JobStatusRoot", "BatchQueue", "Account", "WallTime", "VO", "Tags", "RequiredTags",
    "Platform", "NumberOfProcessors", "MaxRAM", "NumberOfGPUs"})


@dataclass(frozen=True)
class PilotLaunch:
    """What the site director gives each pilot of one queue (for one VO)."""

    vo: str
    site: str
    ce: str
    queue: str
    cores: int
    memory_mb: int | None
    #: The batch system's wall limit, which the pilot is told too.
    wall_minutes: int
    #: HS06 per core; None: the queue states no CPU power (the pilot then counts 1).
    cpu_factor: float | None
    #: Empty: the queue names none, and the pilot is given ANY (no platform condition).
    platforms: tuple[str, ...]
    #: The queue's tags, its required tags among them.
    tags: tuple[str, ...]
    required_tags: tuple[str, ...]
    #: Further parameters, for ClassAd Requirements expressions, as the pilot reads them.
    attributes: tuple[tuple[str, Any], ...]
    #: GPUs of one job slot (NumberOfGPUs): the pilot hands out devices 0..gpus-1.
    gpus: int = 0

    @property
    def wall_seconds(self) -> int:
        return self.wall_minutes * 60

    @property
    def cpu_time(self) -> int:
        """Normalised CPU seconds per core a pilot offers at its start (pilot.planning's
        what_to_ask with the whole wall limit left); 0 when the margin takes it all."""
        return max(0, int((self.wall_seconds - PILOT_MARGIN) * (self.cpu_factor or 1.0)))

    def arguments(self, submit_pools: Iterable[str] | None) -> list[str]:
        """The pilot's command-line arguments that make its resource description; pools None:
        the pilot asks the matcher for them."""
        out = ["--vo", self.vo, "--site", self.site, "--ce", self.ce, "--queue", self.queue,
               "--cores", str(self.cores), "--wall-limit", str(self.wall_seconds),
               "--margin", str(PILOT_MARGIN)]
        if self.cpu_factor is not None:
            out += ["--cpu-factor", repr(self.cpu_factor)]
        if self.memory_mb:
            out += ["--memory", str(self.memory_mb)]
        if self.gpus:
            out += ["--gpus", ",".join(map(str, range(self.gpus)))]
        if submit_pools is not None:
            out += ["--submit-pools", ",".join(submit_pools)]
        for platform in self.platforms or ("ANY",):
            out += ["--platform", platform]
        for name, value in self.attributes:
            out += ["--attribute", f"{name}={json.dumps(value)}"]
        for tag in self.tags:
            out += ["--tag", tag]
        for tag in self.required_tags:
            out += ["--required-tag", tag]
        return out

    def description(self, submit_pools: Iterable[str] = (), pilot_reference: str = ""
                    ) -> dict[str, Any]:
        """The resource description (JSON data) such a pilot sends the matcher at its start."""
        data: dict[str, Any] = dict(self.attributes)
        data.update({
            "vo": self.vo, "pilot_reference": pilot_reference, "site": self.site,
            "ce": self.ce, "queue": self.queue, "submit_pools": sorted(submit_pools),
            "tags": list(self.tags), "required_tags": list(self.required_tags),
            "platform": list(self.platforms or ("ANY",)), "processors": self.cores,
            "cpu_time": self.cpu_time})
        if self.memory_mb:
            data["memory"] = self.memory_mb
        if self.gpus:
            data["gpus"] = self.gpus
        return data


def pilot_launch(config: ResourcesConfig, site: str, ce: str, queue: str, vo: str
                 ) -> PilotLaunch:
    """The queue's parameters (inherited, for ``vo``) as what its pilots are given."""
    q = config.queue(site, ce, queue)
    params = q.parameters(vo)
    required = tuple(dict.fromkeys(labels(params.get("RequiredTags"))))
    tags = tuple(dict.fromkeys([*labels(params.get("Tags")), *required]))
    wall = _whole(params.get("WallTime")) or _whole(params.get("MaxCPUTime")) \
        or DEFAULT_WALL_MINUTES
    attributes = tuple((name, _plain(value)) for name, value in sorted(params.items())
                       if name not in NOT_ATTRIBUTES and value is not None)
    return PilotLaunch(
        vo=vo, site=site, ce=ce, queue=queue,
        cores=_whole(params.get("NumberOfProcessors")) or 1,
        memory_mb=_whole(params.get("MaxRAM")), wall_minutes=wall,
        cpu_factor=q.cpu_factor(vo),
        platforms=tuple(dict.fromkeys(labels(params.get("Platform")))),
        tags=tags, required_tags=required, attributes=attributes,
        gpus=_whole(params.get("NumberOfGPUs")) or 0)


def resource_for_queue(config: ResourcesConfig, site: str, ce: str, queue: str, vo: str, *,
                       submit_pools: Iterable[str] = (), pilot_reference: str = "") -> Resource:
    """What a pilot of the queue presents, as a matcher resource description."""
    return parse_resource(queue_resource_data(config, site, ce, queue, vo,
                                              submit_pools=submit_pools,
                                              pilot_reference=pilot_reference))


def queue_resource_data(config: ResourcesConfig, site: str, ce: str, queue: str, vo: str, *,
                        submit_pools: Iterable[str] = (), pilot_reference: str = ""
                        ) -> dict[str, Any]:
    """The same as JSON data, as a pilot of the queue sends it to the matcher."""
    return pilot_launch(config, site, ce, queue, vo).description(
        submit_pools, pilot_reference=pilot_reference)


def labels(value: Value | None) -> list[str]:
    """A parameter as a list of labels (a single value is a one-element list)."""
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, tuple) else [str(value)]


def _whole(value: Any) -> int | None:
    """A positive number parameter as whole units (None when absent, not a number or < 1)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 1:
        return int(value)
    return None


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value
