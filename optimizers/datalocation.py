"""Where a job's input data is, and so where it can run: the optimizer chain's data step.

As in DIRAC, a job with input files (InputData, and the LFN: entries of its InputSandbox) runs
only at a site that reaches a replica of every one of them: a replica at one of the site's own
storage elements (``SE``) or at one it reads from (``CloseSE``, DIRAC's SiteLocalSEMapping),
both given per site in the resources configuration (in its VO sections for one VO). A job
whose files have no replica at all fails, naming them.

Replicas are looked up through :class:`ReplicaCatalogue`: gridpilot's own catalogue in its
database (:class:`DatabaseCatalogue`, taskqueue.files.replicas) is the one there is; another (Rucio)
is a class with the same method, chosen where the chain's context is built.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from optimizers.resources import ResourcesConfig, Site
from taskqueue.core.settings import CatalogueSettings
from taskqueue.db.database import Session
from taskqueue.files.replicas import replica_sites

#: Site parameters: the storage elements at the site, and those it reads from nearby.
LOCAL_SE = "SE"
CLOSE_SE = "CloseSE"
#: Files named in one message, at most.
_SHOWN = 3


class ReplicaCatalogue(Protocol):
    """Where the replicas of files are."""

    @property
    def name(self) -> str:
        """Named in messages: where the replicas were looked up."""
        ...

    def locate(self, session: Session, vo: str, lfns: Sequence[str]
               ) -> Mapping[str, frozenset[str]]:
        """The storage elements holding a replica of each file (LFN without ``LFN:``); a file
        with none may be absent from the answer."""
        ...


@dataclass(frozen=True)
class DatabaseCatalogue:
    """gridpilot's replica catalogue, in its database (taskqueue.files.replicas)."""

    name: str = "gridpilot's replica catalogue"

    def locate(self, session: Session, vo: str, lfns: Sequence[str]
               ) -> Mapping[str, frozenset[str]]:
        return replica_sites(session, vo, lfns)


def catalogue_for(settings: CatalogueSettings) -> ReplicaCatalogue:
    """The catalogue ``[catalogue] backend`` names (Rucio's client is imported only then)."""
    if settings.backend == "rucio":
        from optimizers.ruciocatalogue import RucioCatalogue

        return RucioCatalogue(settings)
    return DatabaseCatalogue()


def site_storage(site: Site, vo: str) -> frozenset[str]:
    """The storage elements a site's jobs read from: its own and its close ones."""
    found: set[str] = set()
    for name in (LOCAL_SE, CLOSE_SE):
        value = site.parameter(name, vo)
        if value is not None:
            found.update(str(v) for v in (value if isinstance(value, tuple) else (value,)))
    return frozenset(found)


def unknown_storage(config: ResourcesConfig, vo: str, ses: Iterable[str]) -> list[str]:
    """A warning for each storage element no configured site reads from (for ``vo``): its
    replicas let no job run anywhere until one does."""
    known = frozenset().union(*(site_storage(site, vo) for site in config.sites.values()))
    return [f"no site of {config.origin} lists the storage element {se} (SE or CloseSE): "
            "jobs cannot use its replicas" for se in sorted(set(ses) - known)]


@dataclass(frozen=True)
class DataPlacement:
    """Where a job's files let it run: ``sites``, or why nowhere (``reason``)."""

    sites: frozenset[str]
    reason: str | None = None


def storage_of(config: ResourcesConfig, vo: str) -> dict[str, frozenset[str]]:
    """Each configured site's storage elements (its own and its close ones) for ``vo``."""
    return {name: site_storage(site, vo) for name, site in config.sites.items()}


def place(storage: Mapping[str, frozenset[str]], lfns: Sequence[str],
          replicas: Mapping[str, frozenset[str]], catalogue: str) -> DataPlacement:
    """The sites (of ``storage``: :func:`storage_of`) that reach a replica of every file of
    ``lfns``."""
    missing = [lfn for lfn in lfns if not replicas.get(lfn)]
    if missing:
        return DataPlacement(frozenset(), f"no replica of {_files(missing)} in {catalogue}")
    sites = frozenset(name for name, ses in storage.items()
                      if all(replicas[lfn] & ses for lfn in lfns))
    if sites:
        return DataPlacement(sites)
    unreached = [lfn for lfn in lfns
                 if not any(replicas[lfn] & ses for ses in storage.values())]
    if unreached:
        lfn = unreached[0]
        return DataPlacement(frozenset(), (
            f"no configured site reads from the storage elements holding {_files(unreached)}"
            f" ({lfn} is at {', '.join(sorted(replicas[lfn]))})"))
    return DataPlacement(frozenset(), (
        "no one site reaches a replica of every input file: "
        + "; ".join(f"{lfn} is reached from {', '.join(_reaching(replicas[lfn], storage))}"
                    for lfn in lfns[:_SHOWN])))


def _reaching(ses: frozenset[str], storage: Mapping[str, frozenset[str]]) -> list[str]:
    return sorted(site for site, own in storage.items() if ses & own)


def _files(lfns: Sequence[str]) -> str:
    shown = ", ".join(lfns[:_SHOWN])
    more = len(lfns) - _SHOWN
    return shown + (f" and {more} more file{'s' if more > 1 else ''}" if more > 0 else "")


def locate_jobs(session: Session, catalogue: ReplicaCatalogue, config: ResourcesConfig,
                jobs: Iterable[tuple[str, tuple[str, ...]]]
                ) -> dict[tuple[str, tuple[str, ...]], DataPlacement]:
    """The placement of each distinct (VO, files) of ``jobs``, with one lookup per VO."""
    wanted: dict[str, set[str]] = {}
    keys = set()
    for vo, lfns in jobs:
        if lfns:
            wanted.setdefault(vo, set()).update(lfns)
            keys.add((vo, lfns))
    found = {vo: catalogue.locate(session, vo, sorted(lfns)) for vo, lfns in wanted.items()}
    storage = {vo: storage_of(config, vo) for vo in wanted}
    return {(vo, lfns): place(storage[vo], lfns, found[vo], catalogue.name)
            for vo, lfns in keys}


def explain_site(config: ResourcesConfig, vo: str, site: str, lfns: Sequence[str],
                 replicas: Mapping[str, frozenset[str]]) -> tuple[bool, str]:
    """Whether ``site`` reaches a replica of every file, and what a person should read."""
    known = config.sites.get(site)
    ses = site_storage(known, vo) if known is not None else frozenset()
    unreached = [lfn for lfn in lfns if not replicas.get(lfn, frozenset()) & ses]
    if not unreached:
        return True, (f"InputData: every input file ({len(lfns)}) has a replica that {site} "
                      f"reads ({', '.join(sorted(ses))})")
    lfn = unreached[0]
    where = ", ".join(sorted(replicas.get(lfn, ()))) or "no storage element (no replica)"
    reads = ", ".join(sorted(ses)) or "no storage element"
    return False, (f"InputData: {site} reads from {reads}, which holds no replica of "
                   f"{_files(unreached)} ({lfn} is at {where})")
