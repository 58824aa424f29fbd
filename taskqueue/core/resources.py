"""A pilot's resource description, validated, in the form the matcher's queries use.

Field rules (docs/ARCHITECTURE.md): a single string equals a one-element list; an absent field
or an empty list sets no condition, except ``tags`` (a resource naming no tags gets only untagged
queues); ``ANY`` in any letter case, alone or in a list, switches the field's check off.
An empty (or blank) string, alone or in a list, is not a value: ``tags: ""`` is no tags, as
DIRAC pilots send it. Required tags must be among the resource's own tags.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from taskqueue.core.errors import InvalidResourceError

ANY = "any"

#: Fields that hold a set of labels, with their meaning when absent.
_LIST_FIELDS = ("site", "platform", "job_type", "owner_group", "submit_pools", "tags",
                "required_tags")
_INT_FIELDS = ("cpu_time", "processors", "memory", "gpus")
_STR_FIELDS = ("vo", "owner", "pilot_reference", "ce", "queue")
#: Longest value of each field (the columns they are compared with or stored in), and the
#: largest number (the ClassAd library takes 64-bit integers).
_MAX_LENGTH = {"vo": 64, "owner": 255, "pilot_reference": 255, "ce": 255, "queue": 128}
_MAX_LABEL = 128
_MAX_NUMBER = 2**62
#: Characters no field may hold: the C0 controls and DEL (a NUL cannot even be stored).
_CONTROLS = frozenset(map(chr, [*range(32), 127]))


@dataclass(frozen=True)
class Resource:
    """What a worker node offers. ``None`` for a set means "no condition"."""

    vo: str
    pilot_reference: str = ""
    site: frozenset[str] | None = None
    ce: str | None = None
    queue: str | None = None
    platform: frozenset[str] | None = None
    job_type: frozenset[str] | None = None
    owner_group: frozenset[str] | None = None
    owner: str | None = None
    submit_pools: frozenset[str] | None = None
    #: The resource's tags; empty = only untagged queues; None (ANY) = tags not checked.
    tags: frozenset[str] | None = frozenset()
    required_tags: frozenset[str] = frozenset()
    #: Normalised CPU seconds the resource has left per core (a queue matches when its
    #: bucket of CPU time per core is at most this).
    cpu_time: int | None = None
    processors: int | None = None
    memory: int | None = None
    #: GPUs the resource has free. Unlike the other numbers, leaving it out offers none: a
    #: job that needs GPUs goes only to a resource that says it has them.
    gpus: int = 0
    #: Fields the matching rules do not use, kept for ClassAd Requirements expressions.
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def site_for_job(self) -> str | None:
        """The site recorded on a matched job: the resource's site when it names just one."""
        if self.site is not None and len(self.site) == 1:
            return next(iter(self.site))
        return None


def parse_resource(data: Mapping[str, Any]) -> Resource:
    """Validate a resource description (decoded JSON) into a :class:`Resource`."""
    if not isinstance(data, Mapping):
        raise InvalidResourceError(
            f"a resource description must be a JSON object, got {type(data).__name__}")
    kwargs: dict[str, Any] = {}
    for name in _STR_FIELDS:
        if name in data and data[name] is not None:
            value = data[name]
            if not isinstance(value, str):
                raise InvalidResourceError(
                    f"resource field '{name}' must be a string, got {value!r}")
            if len(value) > _MAX_LENGTH[name]:
                raise InvalidResourceError(
                    f"resource field '{name}' must be at most {_MAX_LENGTH[name]} characters")
            if not _CONTROLS.isdisjoint(value):
                raise InvalidResourceError(
                    f"resource field '{name}' must not hold control characters, got {value!r}")
            # a reference is compared stripped (reports strip theirs): store it so
            kwargs[name] = value.strip() if name == "pilot_reference" else value
    if not kwargs.get("vo"):
        raise InvalidResourceError("resource field 'vo' is required and must not be empty")
    for name in _INT_FIELDS:
        if name in data and data[name] is not None:
            kwargs[name] = _non_negative_int(name, data[name])
    for name in _LIST_FIELDS:
        values = _labels(name, data.get(name))
        if name == "tags":
            kwargs[name] = values
        elif name == "required_tags":
            if values is None:
                raise InvalidResourceError(
                    "resource field 'required_tags' cannot be ANY: it names tags a job must have")
            kwargs[name] = values
        else:
            kwargs[name] = values or None
    resource_tags = kwargs["tags"]
    if resource_tags is not None:
        missing = sorted(kwargs["required_tags"] - resource_tags)
        if missing:
            raise InvalidResourceError(
                f"resource field 'required_tags' names {', '.join(missing)}, which "
                "'tags' does not list; a resource must offer every tag it requires")
    known = set(_STR_FIELDS) | set(_INT_FIELDS) | set(_LIST_FIELDS)
    kwargs["extra"] = {k: v for k, v in data.items() if k not in known}
    return Resource(**kwargs)


def _labels(name: str, value: Any) -> frozenset[str] | None:
    """A label set (empty when absent or empty), or ``None`` for ANY."""
    if value is None:
        return frozenset()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        raise InvalidResourceError(
            f"resource field '{name}' must be a string or a list of strings, got {value!r}")
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise InvalidResourceError(
                f"resource field '{name}' item {i} must be a string, got {item!r}")
        if len(item) > _MAX_LABEL:
            raise InvalidResourceError(
                f"resource field '{name}' item {i} must be at most {_MAX_LABEL} characters")
        if not _CONTROLS.isdisjoint(item):
            raise InvalidResourceError(
                f"resource field '{name}' item {i} must not hold control characters, got "
                f"{item!r}")
    items = [item for item in items if item.strip()]  # "": not given
    if any(item.strip().lower() == ANY for item in items):
        return None
    return frozenset(item.strip() for item in items)


def _non_negative_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_NUMBER:
        raise InvalidResourceError(
            f"resource field '{name}' must be an integer from 0 to {_MAX_NUMBER}, got {value!r}")
    return value
