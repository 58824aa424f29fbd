"""The resource description a pilot of a configured queue presents, built from the resources
configuration: what ``gridpilot explain --queue`` and the demo match jobs against."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from optimizers.resources import ResourcesConfig, Value
from taskqueue.resources import Resource, parse_resource


def resource_for_queue(config: ResourcesConfig, site: str, ce: str, queue: str, vo: str, *,
                       submit_pools: Iterable[str] = (), pilot_reference: str = "") -> Resource:
    """The queue's parameters (inherited, for ``vo``) as a matcher resource description."""
    return parse_resource(queue_resource_data(config, site, ce, queue, vo,
                                              submit_pools=submit_pools,
                                              pilot_reference=pilot_reference))


def queue_resource_data(config: ResourcesConfig, site: str, ce: str, queue: str, vo: str, *,
                        submit_pools: Iterable[str] = (), pilot_reference: str = ""
                        ) -> dict[str, Any]:
    """The same as JSON data, as a pilot of the queue would send it to the matcher."""
    q = config.queue(site, ce, queue)
    params = q.parameters(vo)
    description: dict[str, Any] = {
        "vo": vo, "site": site, "ce": ce, "queue": queue, "pilot_reference": pilot_reference,
        "submit_pools": sorted(submit_pools),
        "tags": labels(params.get("Tags")),
        "required_tags": labels(params.get("RequiredTags")),
    }
    if params.get("Platform") is not None:
        description["platform"] = labels(params.get("Platform"))
    cpu = q.normalised_cpu_time(vo)
    if cpu is not None:
        description["cpu_time"] = int(cpu)
    for key, field in (("NumberOfProcessors", "processors"), ("MaxRAM", "memory")):
        value = params.get(key)
        if isinstance(value, int | float):
            description[field] = int(value)
    known = {"Tags", "RequiredTags", "Platform", "NumberOfProcessors", "MaxRAM", "VO"}
    for key, value in params.items():  # kept for ClassAd Requirements expressions
        if key not in known:
            description[key] = list(value) if isinstance(value, tuple) else value
    return description


def labels(value: Value | None) -> list[str]:
    """A parameter as a list of labels (a single value is a one-element list)."""
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, tuple) else [str(value)]
