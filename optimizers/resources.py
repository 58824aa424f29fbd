"""The resources configuration (sites → computing elements → queues) and RFC 7 eligibility.

``conf/resources.toml`` documents the layout. In short: ``[JobDescription]`` declares the type of
each parameter ("string", "list" or "number"); ``[Sites.<site>]`` holds a site's parameters, its
``CEs.<ce>`` tables hold a CE's, their ``Queues.<queue>`` tables a queue's, and any of these may
have ``VOs.<vo>`` tables of VO-specific parameters. A queue's parameters are inherited, later
overriding earlier::

    site < site VOs.<vo> < CE < CE VOs.<vo> < queue < queue VOs.<vo>

so the nearer node always wins, and within one node its VO section wins. Parameter names are
case-insensitive, as in SubmitPool requirements (``maxram`` is ``MaxRAM``); a declared name is
stored with its declared spelling. Values are case-sensitive.

A queue is eligible for requirements when every required parameter is present in its inherited
parameters and: for a "list" parameter, any one required value is among the queue's values; for a
"number", the queue's capacity is ≥ the requirement; for a "string", the queue's value equals one
of the required values. An undeclared parameter is compared as a number when both sides are single
numbers, otherwise as a list. With a VO, only queues that serve it count (see :func:`serves_vo`).

Normalised CPU time, in HS06 seconds (the unit of the task queues' CPU-time buckets), is
``MaxCPUTime`` (minutes, as the reference system states it) * 60 * CPU factor, where the factor is
the ``HS06`` of the nearest node that states a CPU power, or its ``SI00`` / 250 when it states
only SI00.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, NoReturn, overload

from taskqueue.core.errors import ConfigurationError, InvalidRequirementsError, NotFoundError

Scalar = str | int | float
Value = Scalar | tuple[Scalar, ...]
Level = Literal["site", "ce", "queue"]

TYPES = ("string", "list", "number")
#: Capacities and CPU powers: positive numbers, whatever [JobDescription] says.
CAPACITIES = ("MaxCPUTime", "NumberOfProcessors", "MaxRAM", "HS06", "SI00")
#: The reference system's conversion: CPU factor = SI00 / 250.
SI00_PER_HS06 = 250
#: The parameter that lists the VOs a node serves.
VO_PARAMETER = "VO"


@dataclass(frozen=True)
class Layer:
    """The parameters one node states itself, and its VO-specific sections."""

    values: Mapping[str, Value]
    vos: Mapping[str, Mapping[str, Value]]

    def sections(self, vo: str | None) -> tuple[Mapping[str, Value], ...]:
        if vo is not None and vo in self.vos:
            return (self.values, self.vos[vo])
        return (self.values,)


class _Inheriting:
    """Parameter lookup through the layers from the site down to this node."""

    layers: tuple[Layer, ...]

    def _sections(self, vo: str | None) -> list[Mapping[str, Value]]:
        return [section for layer in self.layers for section in layer.sections(vo)]

    def _resolved(self, vo: str | None) -> dict[str, tuple[str, Value]]:
        merged: dict[str, tuple[str, Value]] = {}
        for section in self._sections(vo):
            for name, value in section.items():
                merged[name.lower()] = (name, value)
        return merged

    def parameters(self, vo: str | None = None) -> Mapping[str, Value]:
        """The inherited parameters (with ``vo``'s sections), lists as tuples."""
        return MappingProxyType(dict(self._resolved(vo).values()))

    def parameter(self, name: str, vo: str | None = None) -> Value | None:
        """One inherited parameter by case-insensitive name, or None."""
        found = self._resolved(vo).get(name.lower())
        return None if found is None else found[1]


@dataclass(frozen=True)
class Queue(_Inheriting):
    """A queue of a CE, where pilots are submitted; ``layers`` are its site's, CE's and own."""

    site: str
    ce: str
    name: str
    layers: tuple[Layer, ...] = field(repr=False)

    def cpu_factor(self, vo: str | None = None) -> float | None:
        """HS06 of the nearest section stating a CPU power (HS06 before SI00 / 250)."""
        for section in reversed(self._sections(vo)):
            if "HS06" in section:
                return float(_number(section["HS06"]))
            if "SI00" in section:
                return _number(section["SI00"]) / SI00_PER_HS06
        return None

    def normalised_cpu_time(self, vo: str | None = None) -> int | None:
        """MaxCPUTime in HS06 seconds, rounded to whole seconds; None when either part is
        unknown."""
        minutes = self.parameter("MaxCPUTime", vo)
        factor = self.cpu_factor(vo)
        if minutes is None or factor is None:
            return None
        return round(_number(minutes) * 60 * factor)


@dataclass(frozen=True)
class ComputingElement(_Inheriting):
    """A computing element of a site and its queues, in file order."""

    site: str
    name: str
    layers: tuple[Layer, ...] = field(repr=False)
    queues: Mapping[str, Queue]


@dataclass(frozen=True)
class Site(_Inheriting):
    """A site and its CEs, in file order."""

    name: str
    layers: tuple[Layer, ...] = field(repr=False)
    ces: Mapping[str, ComputingElement]

    def queues(self) -> Iterator[Queue]:
        for ce in self.ces.values():
            yield from ce.queues.values()


@dataclass(frozen=True)
class ResourcesConfig:
    """The whole validated tree; build it with :func:`load_resources`."""

    #: The file it was read from, for messages.
    origin: str
    sites: Mapping[str, Site]
    #: [JobDescription] as declared (capacities with their canonical spelling).
    job_description_types: Mapping[str, str]

    def parameter_type(self, name: str) -> str | None:
        """The declared type of a parameter (capacities are numbers), or None."""
        key = name.lower()
        for declared, kind in self.job_description_types.items():
            if declared.lower() == key:
                return kind
        return "number" if key in {c.lower() for c in CAPACITIES} else None

    def queues(self) -> Iterator[Queue]:
        for site in self.sites.values():
            yield from site.queues()

    def queue(self, site: str, ce: str, queue: str) -> Queue:
        if site not in self.sites:
            raise NotFoundError(f"{self.origin} has no site {site!r}")
        if ce not in self.sites[site].ces:
            raise NotFoundError(f"{self.origin}: site {site!r} has no CE {ce!r}")
        queues = self.sites[site].ces[ce].queues
        if queue not in queues:
            raise NotFoundError(f"{self.origin}: CE {ce!r} of site {site!r} has no queue {queue!r}")
        return queues[queue]


# --- loading -------------------------------------------------------------------------------


def load_resources(path: Path) -> ResourcesConfig:
    """Read and validate a resources file; every error names the file, the place and why."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigurationError(f"resources file {path} does not exist") from exc
    except OSError as exc:
        raise ConfigurationError(f"resources file {path} cannot be read: {exc}") from exc
    return parse_resources(text, str(path))


def parse_resources(text: str, origin: str) -> ResourcesConfig:
    """Validate the text of a resources file; ``origin`` names it in messages."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(f"resources file {origin} is not valid TOML: {exc}") from exc
    return _Parser(origin).config(raw)


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _key(name: str) -> str:
    """A key as TOML would spell it in a dotted path."""
    return name if _BARE_KEY.fullmatch(name) else json.dumps(name, ensure_ascii=False)


class _Parser:
    def __init__(self, origin: str) -> None:
        self.origin = origin
        #: lower-case name → (stored spelling, type)
        self.types: dict[str, tuple[str, str]] = {c.lower(): (c, "number") for c in CAPACITIES}

    def fail(self, path: str, reason: str) -> NoReturn:
        raise ConfigurationError(f"{self.origin}: {path} {reason}")

    def config(self, raw: dict[str, Any]) -> ResourcesConfig:
        for key in raw:
            if key not in ("JobDescription", "Sites"):
                self.fail(_key(key), "is not a section of a resources file "
                                     "(there are JobDescription and Sites)")
        declared = self.job_description(raw.get("JobDescription", {}))
        sites = self.table("Sites", raw.get("Sites", {}), "sites")
        return ResourcesConfig(
            origin=self.origin,
            sites=MappingProxyType({name: self.site(name, value)
                                    for name, value in sites.items()}),
            job_description_types=MappingProxyType(declared),
        )

    def unique(self, where: str, name: str, written: dict[str, str]) -> None:
        """Parameter names are case-insensitive: one table may not spell one name twice."""
        first = written.setdefault(name.lower(), name)
        if first != name:
            self.fail(where, f"repeats {first} (parameter names are case-insensitive)")

    def table(self, path: str, raw: Any, of: str) -> dict[str, Any]:
        if not isinstance(raw, dict):
            self.fail(path, f"must be a table of {of}, got {raw!r}")
        for name in raw:
            if not name.strip():
                self.fail(f"{path}.{_key(name)}", "must have a non-empty name")
        return raw

    def job_description(self, raw: Any) -> dict[str, str]:
        declared: dict[str, str] = {}
        written: dict[str, str] = {}
        for name, kind in self.table("JobDescription", raw, "parameter = type").items():
            where = f"JobDescription.{_key(name)}"
            self.unique(where, name, written)
            if kind not in TYPES:
                self.fail(where, f'must be "string", "list" or "number", got {kind!r}')
            spelling = self.types.get(name.lower(), (name, ""))[0]
            if spelling in CAPACITIES and kind != "number":
                self.fail(where, f'must be "number" ({spelling} is a capacity), got {kind!r}')
            self.types[name.lower()] = (spelling, kind)
            declared[spelling] = kind
        return declared

    def site(self, name: str, raw: Any) -> Site:
        path = f"Sites.{_key(name)}"
        layer, children = self.node(path, raw, "CEs", "computing elements", "a site")
        ces: dict[str, ComputingElement] = {}
        for ce, ce_raw in children.items():
            ce_path = f"{path}.CEs.{_key(ce)}"
            ce_layer, queues = self.node(ce_path, ce_raw, "Queues", "queues", "a CE")
            ces[ce] = ComputingElement(name, ce, (layer, ce_layer), MappingProxyType({
                queue: Queue(name, ce, queue, (layer, ce_layer, self.node(
                    f"{ce_path}.Queues.{_key(queue)}", q_raw, None, "", "a queue")[0]))
                for queue, q_raw in queues.items()
            }))
        return Site(name, (layer,), MappingProxyType(ces))

    def node(self, path: str, raw: Any, child_key: str | None, children_are: str,
             what: str) -> tuple[Layer, dict[str, Any]]:
        """A node's own layer and the raw tables of its children."""
        if not isinstance(raw, dict):
            self.fail(path, f"must be a table, got {raw!r}")
        structural = ("VOs",) if child_key is None else (child_key, "VOs")
        values = self.section(path, raw, structural, what)
        vos = self.table(f"{path}.VOs", raw.get("VOs", {}), "VO sections")
        layer = Layer(values, MappingProxyType({
            vo: self.section(f"{path}.VOs.{_key(vo)}", section, (), "a VO section")
            for vo, section in vos.items()
        }))
        children = {} if child_key is None else self.table(
            f"{path}.{child_key}", raw.get(child_key, {}), children_are)
        return layer, children

    def section(self, path: str, raw: Any, structural: tuple[str, ...],
                what: str) -> Mapping[str, Value]:
        """The parameters of one table; the keys in ``structural`` are left to the caller."""
        if not isinstance(raw, dict):
            self.fail(path, f"must be a table, got {raw!r}")
        values: dict[str, Value] = {}
        written: dict[str, str] = {}
        for name, value in raw.items():
            if name in structural:
                continue
            where = f"{path}.{_key(name)}"
            if isinstance(value, dict) and structural:
                self.fail(where, f"is a table, but only {' and '.join(structural)} may be "
                                 f"tables in {what}")
            if isinstance(value, dict):
                self.fail(where, f"is a table, but {what} holds only parameters")
            if not name.strip():
                self.fail(where, "must have a non-empty name")
            self.unique(where, name, written)
            spelling, kind = self.types.get(name.lower(), (name, ""))
            values[spelling] = self.value(where, spelling, kind, value)
        return MappingProxyType(values)

    def value(self, where: str, name: str, kind: str, raw: Any) -> Value:
        if kind == "number":
            number = self.number(where, raw)
            if name in CAPACITIES and number <= 0:
                self.fail(where, f"must be a positive number, got {raw!r}")
            return number
        if kind == "string":
            if not isinstance(raw, str):
                self.fail(where, f"must be a string, got {raw!r}")
            return raw
        if isinstance(raw, list):
            return tuple(self.scalar(f"{where}[{i}]", item, "must be a string or a number")
                         for i, item in enumerate(raw))
        scalar = self.scalar(where, raw, "must be a string, a number or a list of them")
        return (scalar,) if kind == "list" else scalar

    def number(self, where: str, raw: Any) -> int | float:
        if isinstance(raw, bool) or not isinstance(raw, int | float):
            self.fail(where, f"must be a number, got {raw!r}")
        if not math.isfinite(raw):
            self.fail(where, f"must be a finite number, got {raw!r}")
        return raw

    def scalar(self, where: str, raw: Any, reason: str) -> Scalar:
        if isinstance(raw, str):
            return raw
        if isinstance(raw, bool) or not isinstance(raw, int | float):
            self.fail(where, f"{reason}, got {raw!r}")
        return self.number(where, raw)


def _number(value: Value) -> int | float:
    # Capacities are validated as numbers at load; this narrows the type.
    assert isinstance(value, int | float), value
    return value


# --- eligibility ---------------------------------------------------------------------------

CESelect = Callable[[ComputingElement], bool]
QueueSelect = Callable[[Queue], bool]
Tree = Mapping[str, Mapping[str, tuple[str, ...]]]


def serves_vo(vo: str) -> QueueSelect:
    """A predicate: the queue serves ``vo`` when its inherited ``VO`` parameter names it, or
    when no node above or at the queue sets ``VO`` (open to every VO, as in the reference
    system)."""
    def select(queue: Queue) -> bool:
        served = queue.parameter(VO_PARAMETER, vo)
        return served is None or vo in _values(served)
    return select


@dataclass(frozen=True)
class _Need:
    """One requirement, validated against the declared types."""

    name: str
    kind: str  # "" when the parameter is not declared
    values: tuple[Scalar, ...]

    def numeric(self, have: Value | None = None) -> bool:
        """Compared as a capacity: declared a number, or undeclared and a single number
        (against a queue value that is a single number too, when ``have`` is given)."""
        if self.kind:
            return self.kind == "number"
        return (len(self.values) == 1 and not isinstance(self.values[0], str)
                and not isinstance(have, str | tuple))

    def met_by(self, have: Value | None) -> bool:
        if have is None:
            return False
        if self.numeric(have):
            return _number(have) >= _number(self.values[0])
        return any(v in _values(have) for v in self.values)

    def wanted(self, numeric: bool) -> str:
        if numeric:
            return f"≥ {_show(self.values[0])}"
        shown = ", ".join(_show(v) for v in self.values)
        return shown if len(self.values) == 1 else f"one of {shown}"

    def phrase(self) -> str:
        """The requirement as a person reads it: ``MaxRAM ≥ 4000``, ``Tags 'GPU'``."""
        return f"{self.name} {self.wanted(self.numeric())}"


def _values(value: Value) -> tuple[Scalar, ...]:
    return value if isinstance(value, tuple) else (value,)


def _show(value: Value) -> str:
    if isinstance(value, tuple):
        return ", ".join(_show(v) for v in value) if value else "no values"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return repr(value) if isinstance(value, str) else str(value)


def _needs(config: ResourcesConfig, requirements: Mapping[str, Any]) -> list[_Need]:
    if not isinstance(requirements, Mapping):
        raise InvalidRequirementsError(
            f"requirements must be a mapping of parameter to value, got {requirements!r}")
    needs: list[_Need] = []
    for name, raw in requirements.items():
        if not isinstance(name, str) or not name.strip():
            raise InvalidRequirementsError(
                f"requirement names must be non-empty strings, got {name!r}")
        if any(n.name.lower() == name.lower() for n in needs):
            raise InvalidRequirementsError(
                f"requirement {name!r} is given twice (names are case-insensitive)")
        items = list(raw) if isinstance(raw, list | tuple) else (
            sorted(raw, key=lambda v: (isinstance(v, str), str(v)))
            if isinstance(raw, set | frozenset) else [raw])
        if not items:
            raise InvalidRequirementsError(f"requirement {name!r} is an empty list")
        values: list[Scalar] = []
        for item in items:
            if isinstance(item, bool) or not isinstance(item, str | int | float):
                raise InvalidRequirementsError(
                    f"requirement {name!r} must be a string, a number or a list of them, "
                    f"got {raw!r}")
            if isinstance(item, float) and not math.isfinite(item):
                raise InvalidRequirementsError(f"requirement {name!r} must be finite, got {raw!r}")
            if item not in values:
                values.append(item)
        kind = config.parameter_type(name) or ""
        if kind == "number" and (len(values) != 1 or isinstance(values[0], str)):
            raise InvalidRequirementsError(
                f"requirement {name!r} must be one number (a number in {config.origin}), "
                f"got {raw!r}")
        if kind == "string" and not all(isinstance(v, str) for v in values):
            raise InvalidRequirementsError(
                f"requirement {name!r} must be a string or a list of strings (a string in "
                f"{config.origin}), got {raw!r}")
        needs.append(_Need(name, kind, tuple(values)))
    return needs


def _candidates(config: ResourcesConfig, vo: str | None, ce_select: CESelect | None,
                queue_select: QueueSelect | None) -> list[Queue]:
    """The queues considered, in file order: selected, and serving ``vo`` when one is given."""
    for_vo = serves_vo(vo) if vo is not None else None
    return [queue for site in config.sites.values() for ce in site.ces.values()
            if ce_select is None or ce_select(ce)
            for queue in ce.queues.values()
            if (for_vo is None or for_vo(queue)) and (queue_select is None or queue_select(queue))]


def _met(queues: Sequence[Queue], needs: Sequence[_Need], vo: str | None) -> list[list[bool]]:
    """Per queue, per requirement: does the queue meet it?"""
    table = []
    for queue in queues:
        resolved = queue._resolved(vo)
        table.append([need.met_by(resolved.get(need.name.lower(), ("", None))[1])
                      for need in needs])
    return table


def eligible_queues(config: ResourcesConfig, requirements: Mapping[str, Any], *,
                    vo: str | None = None, ce_select: CESelect | None = None,
                    queue_select: QueueSelect | None = None) -> list[tuple[str, str, str]]:
    """The (site, CE, queue) triples that meet every requirement, in file order.

    ``vo`` selects the VO sections and restricts to the queues that serve it; ``ce_select``
    and ``queue_select`` restrict further (a queue of a CE that is not selected never counts).
    Raises :class:`InvalidRequirementsError` for requirements that cannot be compared.
    """
    needs = _needs(config, requirements)
    queues = _candidates(config, vo, ce_select, queue_select)
    return [(q.site, q.ce, q.name) for q, row in zip(queues, _met(queues, needs, vo), strict=True)
            if all(row)]


@overload
def get_eligible_nodes(config: ResourcesConfig, requirements: Mapping[str, Any], *,
                       vo: str | None = ..., level: Literal["queue"] = ...,
                       ce_select: CESelect | None = ..., queue_select: QueueSelect | None = ...
                       ) -> Tree: ...
@overload
def get_eligible_nodes(config: ResourcesConfig, requirements: Mapping[str, Any], *,
                       vo: str | None = ..., level: Literal["ce"],
                       ce_select: CESelect | None = ..., queue_select: QueueSelect | None = ...
                       ) -> Mapping[str, tuple[str, ...]]: ...
@overload
def get_eligible_nodes(config: ResourcesConfig, requirements: Mapping[str, Any], *,
                       vo: str | None = ..., level: Literal["site"],
                       ce_select: CESelect | None = ..., queue_select: QueueSelect | None = ...
                       ) -> tuple[str, ...]: ...
@overload
def get_eligible_nodes(config: ResourcesConfig, requirements: Mapping[str, Any], *,
                       vo: str | None = ..., level: Level,
                       ce_select: CESelect | None = ..., queue_select: QueueSelect | None = ...
                       ) -> Tree | Mapping[str, tuple[str, ...]] | tuple[str, ...]: ...
def get_eligible_nodes(config: ResourcesConfig, requirements: Mapping[str, Any], *,
                       vo: str | None = None, level: Level = "queue",
                       ce_select: CESelect | None = None, queue_select: QueueSelect | None = None
                       ) -> Tree | Mapping[str, tuple[str, ...]] | tuple[str, ...]:
    """The eligible tree, cut at ``level``, in file order.

    "queue": site → CE → queue names; "ce": site → CE names; "site": site names. Requirements
    are always judged on queues (a queue may add what its CE lacks), so a CE or a site is
    eligible when at least one of its considered queues is; one without queues never is.
    """
    tree: dict[str, dict[str, list[str]]] = {}
    for site, ce, queue in eligible_queues(config, requirements, vo=vo, ce_select=ce_select,
                                           queue_select=queue_select):
        tree.setdefault(site, {}).setdefault(ce, []).append(queue)
    if level == "queue":
        return MappingProxyType({site: MappingProxyType({ce: tuple(qs) for ce, qs in ces.items()})
                                 for site, ces in tree.items()})
    if level == "ce":
        return MappingProxyType({site: tuple(ces) for site, ces in tree.items()})
    if level == "site":
        return tuple(tree)
    raise ValueError(f"level must be 'site', 'ce' or 'queue', got {level!r}")


def explain_requirements(config: ResourcesConfig, requirements: Mapping[str, Any], site: str,
                         ce: str, queue: str, vo: str | None = None
                         ) -> list[tuple[str, bool, str]]:
    """Per requirement, in the order given: its name, whether the queue meets it, and why
    (``MaxRAM: needs ≥ 4000, queue offers 2000``). With a VO, a first ``VO`` line says whether
    the queue serves it (a queue that does not is never eligible for that VO)."""
    found = config.queue(site, ce, queue)
    needs = _needs(config, requirements)
    lines: list[tuple[str, bool, str]] = []
    if vo is not None:
        served = found.parameter(VO_PARAMETER, vo)
        lines.append((VO_PARAMETER, serves_vo(vo)(found), f"VO: needs {vo!r}, queue serves "
                      + ("every VO" if served is None else _show(served))))
    resolved = found._resolved(vo)
    for need in needs:
        _spelling, have = resolved.get(need.name.lower(), ("", None))
        if have is None:
            lines.append((need.name, False,
                          f"{need.name}: needs {need.wanted(need.numeric())}, "
                          f"queue does not define it"))
        else:
            lines.append((need.name, need.met_by(have),
                          f"{need.name}: needs {need.wanted(need.numeric(have))}, "
                          f"queue offers {_show(have)}"))
    return lines


def unmet_requirements(config: ResourcesConfig, requirements: Mapping[str, Any], *,
                       vo: str | None = None, ce_select: CESelect | None = None,
                       queue_select: QueueSelect | None = None) -> list[str]:
    """The names of the requirements that no considered queue meets even on its own, in the
    order given: each of them alone makes the job ineligible everywhere.

    Empty when a queue is eligible, and also when every requirement is met by some queue but
    no queue meets them all: :func:`conflicting_requirements` names those. With no queue to
    consider, every requirement is unmet.
    """
    needs = _needs(config, requirements)
    table = _met(_candidates(config, vo, ce_select, queue_select), needs, vo)
    if any(all(row) for row in table):
        return []
    return [need.name for i, need in enumerate(needs) if not any(row[i] for row in table)]


def conflicting_requirements(config: ResourcesConfig, requirements: Mapping[str, Any], *,
                             vo: str | None = None, ce_select: CESelect | None = None,
                             queue_select: QueueSelect | None = None) -> list[str]:
    """A set of requirements that no considered queue meets together, minimal by inclusion:
    drop any one and some queue meets the rest (a requirement no queue meets alone is such a
    set by itself). Earlier requirements are kept in preference to later ones. Empty when a
    queue is eligible."""
    needs = _needs(config, requirements)
    table = _met(_candidates(config, vo, ce_select, queue_select), needs, vo)
    return [needs[i].name for i in _conflict(table, len(needs))]


def _conflict(table: list[list[bool]], count: int) -> list[int]:
    def met_together(indices: list[int]) -> bool:
        return any(all(row[i] for i in indices) for row in table)

    kept = list(range(count))
    if met_together(kept):
        return []
    for i in reversed(range(count)):
        without = [j for j in kept if j != i]
        if not met_together(without):
            kept = without
    return kept


def no_match_reason(config: ResourcesConfig, requirements: Mapping[str, Any], *,
                    vo: str | None = None, ce_select: CESelect | None = None,
                    queue_select: QueueSelect | None = None) -> str | None:
    """Why no queue is eligible, for a person; None when one is.

    ``no queue offers SoftwareTag 'VO-lhcb-x'`` when no queue meets a requirement even alone
    (one clause each, joined by "; "); ``no queue offers Platform 'aarch64-el9' together with
    Tags 'GPU'`` when the requirements are met only apart (the conflicting set, as
    :func:`conflicting_requirements` finds it).
    """
    needs = _needs(config, requirements)
    queues = _candidates(config, vo, ce_select, queue_select)
    if not queues:
        return ("no queue is configured or selected" if vo is None
                else f"no configured or selected queue serves VO {vo!r}")
    table = _met(queues, needs, vo)
    if any(all(row) for row in table):
        return None
    alone = [need for i, need in enumerate(needs) if not any(row[i] for row in table)]
    if alone:
        return "; ".join(f"no queue offers {need.phrase()}" for need in alone)
    conflict = [needs[i].phrase() for i in _conflict(table, len(needs))]
    return f"no queue offers {', '.join(conflict[:-1])} together with {conflict[-1]}"
