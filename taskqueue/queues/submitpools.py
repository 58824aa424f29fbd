"""SubmitPools (RFC 7): jobs with identical requirements share one pool, keyed by a digest.

The canonical form of a requirements mapping is independent of key order, list order,
duplicates and number spelling (4000, 4000.0), and of the Python process that computes it, so
that the same requirements always name the same pool. Its sha256 hex digest is the pool's id.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, exists, select, tuple_, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from taskqueue.core.errors import InvalidRequirementsError
from taskqueue.core.states import PENDING_STATES
from taskqueue.db.bulk import insert_rows
from taskqueue.db.models import Job, SubmitPool, SubmitPoolQueue, submit_pool_queues_table

Scalar = str | int | float
Canonical = dict[str, Scalar | list[Scalar]]


def canonical_requirements(requirements: Mapping[str, Any]) -> Canonical:
    """The canonical form: keys sorted, lists sorted and de-duplicated (a one-element list is its
    element), integral numbers as integers."""
    if not isinstance(requirements, Mapping):
        raise InvalidRequirementsError(
            f"requirements must be a mapping of parameter to value, got {requirements!r}")
    result: Canonical = {}
    for key in sorted(requirements, key=lambda k: (str(k).lower(), str(k))):
        if not isinstance(key, str) or not key.strip():
            raise InvalidRequirementsError(
                f"requirement names must be non-empty strings, got {key!r}")
        if key.lower() in {k.lower() for k in result}:
            raise InvalidRequirementsError(
                f"requirement {key!r} is given twice (names are case-insensitive)")
        value = requirements[key]
        if isinstance(value, list | tuple | set | frozenset):
            items = sorted({_scalar(key, v) for v in value}, key=_order)
            if not items:
                raise InvalidRequirementsError(f"requirement {key!r} is an empty list")
            result[key] = items[0] if len(items) == 1 else items
        else:
            result[key] = _scalar(key, value)
    return result


def _scalar(key: str, value: Any) -> Scalar:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise InvalidRequirementsError(
            f"requirement {key!r} must be a string, a number or a list of them, got {value!r}")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidRequirementsError(f"requirement {key!r} must be finite, got {value!r}")
        if value.is_integer():
            return int(value)
    return value


def _order(v: Scalar) -> tuple[int, str, float]:
    # Numbers before strings; numbers by value, strings by text.
    return (1, v, 0.0) if isinstance(v, str) else (0, "", float(v))


def canonical_text(requirements: Mapping[str, Any]) -> str:
    return json.dumps(canonical_requirements(requirements), sort_keys=False,
                      separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def submit_pool_id(requirements: Mapping[str, Any]) -> str:
    """The SubmitPool id of ``requirements``: sha256 hex of their canonical JSON."""
    return hashlib.sha256(canonical_text(requirements).encode("ascii")).hexdigest()


def store_submit_pool(session: Session, requirements: Mapping[str, Any], *,
                      now: datetime) -> str:
    """Get or create the pool of ``requirements``, stamp its use, and return its id."""
    pool_id = submit_pool_id(requirements)
    if session.get(SubmitPool, pool_id) is None:
        session.add(SubmitPool(id=pool_id, requirements=canonical_text(requirements),
                               created_at=now, updated_at=now))
        try:
            with session.begin_nested():
                session.flush()
        except IntegrityError:
            # A concurrent submitter created it first: theirs is the same pool.
            session.expunge_all()
            if session.get(SubmitPool, pool_id) is None:
                raise
    else:
        session.execute(update(SubmitPool).where(SubmitPool.id == pool_id)
                        .values(updated_at=now))
    return pool_id


def set_pool_queues(session: Session, pool_id: str, queues: Iterable[tuple[str, str, str]], *,
                    now: datetime, replace: bool = True) -> None:
    """Replace the eligible (site, CE, queue) triples of a pool and stamp the refresh time;
    with ``replace`` False, add these to the pool's others (one VO's view of a pool that
    several VOs' jobs share)."""
    triples = sorted(set(queues))
    stale = delete(SubmitPoolQueue).where(SubmitPoolQueue.pool_id == pool_id)
    if not replace:
        stale = stale.where(tuple_(SubmitPoolQueue.site, SubmitPoolQueue.ce,
                                   SubmitPoolQueue.queue).in_(triples))
    if replace or triples:
        session.execute(stale)
    rows = [{"pool_id": pool_id, "site": s, "ce": c, "queue": q, "refreshed_at": now}
            for s, c, q in triples]
    insert_rows(session.connection(), submit_pool_queues_table, rows)


def get_submit_pools_for_queue(session: Session, site: str, ce: str, queue: str) -> list[str]:
    """Ids of the pools whose jobs the given queue may run."""
    return list(session.scalars(
        select(SubmitPoolQueue.pool_id)
        .where(SubmitPoolQueue.site == site, SubmitPoolQueue.ce == ce,
               SubmitPoolQueue.queue == queue)
        .order_by(SubmitPoolQueue.pool_id)
    ))


def submit_pools_by_queue(session: Session) -> dict[tuple[str, str, str], list[str]]:
    """Ids of the pools each queue (site, CE, queue) may run jobs of, for every queue that has
    any: :func:`get_submit_pools_for_queue` for all queues in one statement."""
    out: dict[tuple[str, str, str], list[str]] = {}
    for row in session.execute(
            select(SubmitPoolQueue.site, SubmitPoolQueue.ce, SubmitPoolQueue.queue,
                   SubmitPoolQueue.pool_id)
            .order_by(SubmitPoolQueue.site, SubmitPoolQueue.ce, SubmitPoolQueue.queue,
                      SubmitPoolQueue.pool_id)):
        out.setdefault((row.site, row.ce, row.queue), []).append(row.pool_id)
    return out


def delete_unused_submit_pools(session: Session, *, now: datetime,
                               grace: timedelta) -> list[str]:
    """Delete pools that no pending job uses and that were not used within ``grace``."""
    pending = exists().where(Job.submit_pool == SubmitPool.id,
                             Job.status.in_([s.value for s in PENDING_STATES]))
    doomed = list(session.scalars(
        select(SubmitPool.id).where(SubmitPool.updated_at <= now - grace, ~pending)
        .order_by(SubmitPool.id).with_for_update(skip_locked=True)
    ))
    if doomed:
        session.execute(delete(SubmitPool).where(SubmitPool.id.in_(doomed), ~pending)
                        .execution_options(synchronize_session=False))
    return doomed


@dataclass(frozen=True)
class PoolInUse:
    """A SubmitPool as its refresh sees it: its requirements read back, and the VOs whose
    jobs use it (those of its pending jobs, else those of any of its jobs; none if no job
    uses it)."""

    id: str
    requirements: dict[str, Any]
    vos: tuple[str, ...]


def lock_submit_pools(session: Session, *, limit: int, after: str = "") -> list[PoolInUse]:
    """Up to ``limit`` pools with ids above ``after``, by id, locked for this transaction (a
    pool another transaction holds, e.g. a submission storing it, is skipped), for the
    refresh of their eligible queues (``set_pool_queues``)."""
    rows = session.execute(
        select(SubmitPool.id, SubmitPool.requirements).where(SubmitPool.id > after)
        .order_by(SubmitPool.id).limit(limit).with_for_update(skip_locked=True)).all()
    if not rows:
        return []
    ids = [r.id for r in rows]
    vos: dict[str, set[str]] = {pool_id: set() for pool_id in ids}
    for pool_id, vo in session.execute(
            select(Job.submit_pool, Job.vo).distinct()
            .where(Job.submit_pool.in_(ids), Job.status.in_([s.value for s in PENDING_STATES]))):
        vos[str(pool_id)].add(vo)
    idle = [pool_id for pool_id in ids if not vos[pool_id]]
    if idle:
        for pool_id, vo in session.execute(
                select(Job.submit_pool, Job.vo).distinct().where(Job.submit_pool.in_(idle))):
            vos[str(pool_id)].add(vo)
    return [PoolInUse(r.id, json.loads(r.requirements), tuple(sorted(vos[r.id])))
            for r in rows]


def queues_of_pool(session: Session, pool_id: str) -> list[SubmitPoolQueue]:
    """The queues eligible for a SubmitPool, by name."""
    return list(session.scalars(
        select(SubmitPoolQueue).where(SubmitPoolQueue.pool_id == pool_id)
        .order_by(SubmitPoolQueue.site, SubmitPoolQueue.ce, SubmitPoolQueue.queue)))
