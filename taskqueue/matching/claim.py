"""Match-and-claim: which task queues a resource can serve, and handing out their jobs.

The draw. Every task queue carries ``draw_key``, the next event of an exponential clock whose
rate is the queue's priority. A claim takes, among the active queues that match the resource,
the one with the smallest key, then advances that key by a fresh Exp(priority) variate. For a
set of queues that are all eligible, this is the race of independent Poisson processes: each
draw picks queue *i* with probability priority_i / Σ priority, independently of earlier draws
(the memoryless property), which is the unbiased weighted draw, and it costs one index range
scan on (active, vo, draw_key) that stops at the first eligible queue, whatever the number of
queues. A queue that other pilots could not serve keeps its old key and so is served first by
the next pilot that can: over time, every queue receives resources in proportion to its
priority.

Exactly once. The job's row of ``task_queue_jobs`` is taken with ``FOR UPDATE SKIP LOCKED`` (two
claimers never wait for each other and never get the same row), and the job's status moves
from Waiting to Matched with an UPDATE guarded by that status and a row-count check. SQLite
drops the locking clause; its transactions take the write lock at BEGIN, so claims run one at a
time there.

No false "no match". Candidate queues are read in key order, in batches, until one yields a job
or none is left; only a queue whose jobs are all being claimed at this instant is passed over.
A queue found empty is marked inactive then (under its row lock, see
taskqueue.queues.taskqueues), so the next claims do not look at it again; the claim that takes a
queue's last job does not check, which keeps that check off the common path.

The statements here are Core statements on the tables, built once, because a claim is the
hottest path of the system.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BindParameter,
    ColumnElement,
    Connection,
    Select,
    Table,
    and_,
    bindparam,
    delete,
    func,
    literal_column,
    or_,
    select,
    update,
)
from sqlalchemy.orm import Session

from taskqueue.core.errors import ConflictError
from taskqueue.core.resources import Resource
from taskqueue.core.states import JobStatus
from taskqueue.db.models import (
    jobs_table,
    task_queues_table,
    tq_banned_sites_table,
    tq_ces_table,
    tq_jobs_table,
    tq_platforms_table,
    tq_sites_table,
    tq_tags_table,
)
from taskqueue.matching.rules import MANY_SITES, RULES, RULES_BY_NAME, Compare, Rule
from taskqueue.queues.jobs import apply_transition, status_change_ctes, transition_parameters

#: Candidate queues read by the first query of a walk: the first one nearly always yields a job,
#: and each candidate read costs its checks (a walk past queues the resource cannot serve).
FIRST_BATCH = 2
#: Candidate queues read per query after that, while looking for one with a claimable job.
CANDIDATE_BATCH = 16
#: The minor status of a job handed to a pilot.
MATCHED_MINOR = "Assigned to pilot"

tq = task_queues_table.c
tqj = tq_jobs_table.c

_NEXT_JOB = (
    select(tqj.job_id).where(tqj.tq_id == bindparam("tq_id"))
    .order_by(tqj.rank, tqj.job_id).limit(1).with_for_update(skip_locked=True)
)
#: Take the queue's best unlocked job in one statement (PostgreSQL, SQLite).
_TAKE_JOB = delete(tq_jobs_table).where(tqj.job_id == _NEXT_JOB.scalar_subquery()).returning(
    tqj.job_id)
_DROP_JOB = delete(tq_jobs_table).where(tqj.job_id == bindparam("job_id"))
_LOCK_QUEUE = (select(tq.id).where(tq.id == bindparam("tq_id"))
               .with_for_update(skip_locked=True))
_ANY_JOB_LEFT = select(tqj.job_id).where(tqj.tq_id == bindparam("tq_id")).limit(1)
#: Advancing a queue's clock records where it was drawn (MariaDB assigns left to right, so
#: the clock comes first and reads the old key, as the other databases always do).
_ADVANCE = (update(task_queues_table).where(tq.id == bindparam("tq_id"))
            .ordered_values((tq.draw_clock, tq.draw_key),
                            (tq.draw_key, tq.draw_key + bindparam("step"))))
_TAKEN = _TAKE_JOB.cte("taken")
#: PostgreSQL: take the job, and if one was taken advance the queue's clock unless another
#: transaction holds the queue's row, all in one statement.
_TAKE_AND_ADVANCE = select(_TAKEN.c.job_id).add_cte(
    update(task_queues_table)
    .where(tq.id == _LOCK_QUEUE.scalar_subquery(), select(_TAKEN.c.job_id).exists())
    .ordered_values((tq.draw_clock, tq.draw_key), (tq.draw_key, tq.draw_key + bindparam("step")))
    .returning(tq.id)
    .cte("advanced")
)
_DEACTIVATE = (update(task_queues_table).where(tq.id == bindparam("tq_id"))
               .values(active=0, emptied_at=bindparam("now")))


@dataclass(frozen=True)
class Claim:
    job_id: int
    tq_id: int


@dataclass(frozen=True)
class Exclusions:
    """Queue attribute values held back from a claim (by site limits, see
    taskqueue.matching.limits)."""

    job_types: frozenset[str] = frozenset()
    owner_groups: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.job_types or self.owner_groups)


NO_EXCLUSIONS = Exclusions()


@dataclass(frozen=True)
class QueueCount:
    tq_id: int
    priority: float
    waiting: int


def queue_conditions(resource: Resource, *, with_expressions: bool = False,
                     exclusions: Exclusions = NO_EXCLUSIONS) -> list[ColumnElement[bool]]:
    """SQL conditions on ``task_queues`` that hold when a queue matches ``resource``, but for
    the queue's ClassAd expression (queues with one are left out unless ``with_expressions``).
    The values are bound parameters: pass :func:`condition_parameters` when executing."""
    return list(_conditions(_shape(resource, with_expressions, exclusions), ""))


def condition_parameters(resource: Resource, exclusions: Exclusions = NO_EXCLUSIONS
                         ) -> dict[str, Any]:
    """The values of the parameters of :func:`queue_conditions` for ``resource``."""
    params: dict[str, Any] = {}
    if exclusions.job_types:
        params["x_types"] = sorted(exclusions.job_types)
    if exclusions.owner_groups:
        params["x_groups"] = sorted(exclusions.owner_groups)
    for rule in RULES:
        params.update(rule.parameters(resource))
    return params


@dataclass(frozen=True)
class _Shape:
    """What the SQL of a resource's conditions depends on: whether queues with a ClassAd
    expression are included, which attributes limits exclude, and each rule's shape
    (taskqueue.matching.rules.Rule.shape: which fields the resource sets, how many sites and
    required tags it names). Statements are built and compiled once per shape."""

    with_expressions: bool
    excluded_types: bool
    excluded_groups: bool
    #: (rule name, its shape) for every rule of taskqueue.matching.rules.RULES, in order.
    rules: tuple[tuple[str, bool | int | str], ...]


def _shape(r: Resource, with_expressions: bool, exclusions: Exclusions = NO_EXCLUSIONS
           ) -> _Shape:
    return _Shape(with_expressions, bool(exclusions.job_types), bool(exclusions.owner_groups),
                  tuple((rule.name, rule.shape(r)) for rule in RULES))


@functools.lru_cache(maxsize=256)
def _conditions(shape: _Shape, fence: str) -> tuple[ColumnElement[bool], ...]:
    """The conditions of a resource shape. With a ``fence`` (the draw on PostgreSQL and
    MariaDB), each check of a queue's value tables is a correlated subquery run for that queue
    alone (see :func:`_exists`), so that a walk in draw order that stops after a few queues
    costs a few index probes per queue, however many queues there are."""
    conds: list[ColumnElement[bool]] = []
    for name, of_rule in shape.rules:
        conds.extend(_rule_conditions(RULES_BY_NAME[name], of_rule, fence))
        if name == "VO":  # then the limits' exclusions and the expressions, as before
            if shape.excluded_types:
                conds.append(tq.job_type.not_in(bindparam("x_types", expanding=True)))
            if shape.excluded_groups:
                conds.append(tq.owner_group.not_in(bindparam("x_groups", expanding=True)))
            if not shape.with_expressions:
                conds.append(tq.expression.is_(None))
    return tuple(conds)


#: The value tables a rule may name (taskqueue.matching.rules.Rule.queue).
_VALUE_TABLES = {t.name: t for t in (tq_ces_table, tq_platforms_table, tq_sites_table,
                                     tq_tags_table)}


def _rule_conditions(rule: Rule, shape: bool | int | str, fence: str
                     ) -> list[ColumnElement[bool]]:
    """The SQL of one rule for a resource of this ``shape`` (see Rule.shape); none when the
    rule does not constrain it."""
    compare = rule.compare
    if compare is Compare.SITE:
        assert isinstance(shape, int)
        if shape > MANY_SITES:
            return [_sites_allow(bindparam(rule.param, expanding=True),
                                 bindparam(f"{rule.param}_count"), fence)]
        if shape >= 0:
            return [or_(*(_site_allows(bindparam(f"{rule.param}_{i}"), fence)
                          for i in range(shape)))]
        return []
    if compare is Compare.LISTS_EACH:
        assert isinstance(shape, int)
        table = _VALUE_TABLES[rule.queue].c
        return [_exists(fence, table.tq_id == tq.id,
                        table.value == bindparam(f"{rule.param}_{i}")) for i in range(shape)]
    if compare is Compare.LISTS_ONLY:
        if shape == "any":
            return []
        table = _VALUE_TABLES[rule.queue].c
        held = [table.tq_id == tq.id]
        if shape == "some":
            held.append(table.value.not_in(bindparam(rule.param, expanding=True)))
        return [~_exists(fence, *held)]
    if compare is Compare.UNSET_OR_ONE_OF:
        column = tq[rule.queue]
        if shape:
            return [or_(column.is_(None), column.in_(bindparam(rule.param, expanding=True)))]
        return [column.is_(None)]
    if not shape:
        return []
    if compare is Compare.LISTS_NONE_OR_ONE_OF:
        return [_value_allows(_VALUE_TABLES[rule.queue],
                              bindparam(rule.param, expanding=True), fence)]
    if compare is Compare.LISTS_NONE_OR_EQUAL:
        table = _VALUE_TABLES[rule.queue].c
        return [or_(~_exists(fence, table.tq_id == tq.id),
                    _exists(fence, table.tq_id == tq.id, table.value == bindparam(rule.param)))]
    column = tq[rule.queue]
    if compare is Compare.EQUAL:
        return [column == bindparam(rule.param)]
    if compare is Compare.ONE_OF:
        return [column.in_(bindparam(rule.param, expanding=True))]
    if compare is Compare.AT_MOST:
        return [column <= bindparam(rule.param)]
    raise AssertionError(compare)


def _exists(fence: str, *where: ColumnElement[bool]) -> ColumnElement[bool]:
    """A row of a value table holds ``where`` (correlated to the queue).

    For the draw, the check must stay a probe of the (tq_id, value) key for each queue the walk
    reaches: planners otherwise answer it for all queues at once, reading the whole value table
    every claim for a walk that stops after a few queues. ``fence`` says how to keep them from
    it: "offset" (PostgreSQL: with OFFSET 0 the planner neither makes the EXISTS a join nor a
    hashed subplan), "scalar" (MariaDB turns EXISTS into IN and materialises it; a scalar
    subquery stays a dependent one), or "" (plain EXISTS: SQLite, and listings).
    """
    query: Select[Any] = select(literal_column("1")).where(*where)
    if fence == "scalar":
        return query.limit(1).scalar_subquery().is_not(None)
    if fence == "offset":
        query = query.offset(literal_column("0"))
    return query.exists()


def _site_allows(site: BindParameter[Any], fence: str) -> ColumnElement[bool]:
    """The queue names no site or names ``site``, and does not ban it."""
    sites = tq_sites_table.c
    banned = tq_banned_sites_table.c
    return and_(
        or_(~_exists(fence, sites.tq_id == tq.id),
            _exists(fence, sites.tq_id == tq.id, sites.value == site)),
        ~_exists(fence, banned.tq_id == tq.id, banned.value == site),
    )


def _sites_allow(offered: BindParameter[Any], count: BindParameter[Any], fence: str
                 ) -> ColumnElement[bool]:
    """One of the ``offered`` sites (more than MANY_SITES) is allowed and not banned, as a
    set: the queue names none and bans fewer of them than are offered, or names one of them
    that it does not ban. One term, where :func:`_site_allows` per site would pass SQLite's
    expression depth limit of 1,000 near that many sites."""
    sites = tq_sites_table.c
    banned = tq_banned_sites_table.c
    banned_offered = (select(func.count()).where(banned.tq_id == tq.id, banned.value.in_(offered))
                      .scalar_subquery())
    other_ban = tq_banned_sites_table.alias("other_ban")
    return or_(
        and_(~_exists(fence, sites.tq_id == tq.id),
             banned_offered < count),
        _exists(fence, sites.tq_id == tq.id, sites.value.in_(offered),
                ~select(literal_column("1")).where(other_ban.c.tq_id == sites.tq_id,
                                                   other_ban.c.value == sites.value).exists()),
    )


def _value_allows(table: Table, offered: BindParameter[Any], fence: str
                  ) -> ColumnElement[bool]:
    """The queue lists no value in ``table``, or lists one of ``offered``."""
    return or_(
        ~_exists(fence, table.c.tq_id == tq.id),
        _exists(fence, table.c.tq_id == tq.id, table.c.value.in_(offered)),
    )


#: How each database's draw keeps the checks of value tables per queue (see :func:`_exists`).
_FENCES = {"postgresql": "offset", "mysql": "scalar"}


@dataclass(frozen=True)
class _Statements:
    """A resource shape's statements, built once (SQLAlchemy then also compiles them once)."""

    #: The first batch of matching active queues in draw order, and the batch after a key.
    first_page: Select[int, float, float, str | None]
    next_page: Select[int, float, float, str | None]
    first_try: Select[int, int, int]


@functools.lru_cache(maxsize=256)
def _statements(shape: _Shape, dialect: str) -> _Statements:
    candidates = (select(tq.id, tq.priority, tq.draw_key, tq.expression)
                  .where(tq.active == 1, *_conditions(shape, _FENCES.get(dialect, ""))))
    columns = candidates.selected_columns
    key: BindParameter[float] = bindparam("after_key")
    last_id: BindParameter[int] = bindparam("after_id")
    return _Statements(
        first_page=candidates.order_by(columns.draw_key, columns.id).limit(FIRST_BATCH),
        next_page=candidates.where(or_(columns.draw_key > key,
                                     and_(columns.draw_key == key, columns.id > last_id)))
        .order_by(columns.draw_key, columns.id).limit(CANDIDATE_BATCH),
        first_try=_first_candidate_claim(candidates),
    )


#: Says whether a resource satisfies a ClassAd Requirements expression (given as its text).
ExpressionCheck = Callable[[str], bool]


def matching_queues(session: Session, resource: Resource,
                    expression_check: ExpressionCheck | None = None, *,
                    exclusions: Exclusions = NO_EXCLUSIONS) -> list[QueueCount]:
    """The non-empty queues ``resource`` could serve, with their waiting-job counts."""
    waiting = (select(tqj.tq_id, func.count().label("n")).group_by(tqj.tq_id).subquery())
    rows = session.connection().execute(
        select(tq.id, tq.priority, tq.expression, waiting.c.n)
        .join_from(task_queues_table, waiting, waiting.c.tq_id == tq.id)
        .where(*queue_conditions(resource, with_expressions=expression_check is not None,
                                 exclusions=exclusions))
        .order_by(tq.id),
        condition_parameters(resource, exclusions),
    )
    check = _memo(expression_check)
    return [QueueCount(r.id, r.priority, r.n) for r in rows
            if r.expression is None or check(r.expression)]


def claim_jobs(session: Session, resource: Resource, *, now: datetime, count: int = 1,
               rng: random.Random | None = None,
               expression_check: ExpressionCheck | None = None,
               exclusions: Exclusions = NO_EXCLUSIONS) -> list[Claim]:
    """Claim up to ``count`` jobs for ``resource``: each one is Matched to the resource's pilot
    in the caller's transaction. An empty list means no job the resource can run is waiting.

    Queues whose jobs carry a ClassAd Requirements expression are considered only when
    ``expression_check`` is given (the optimizers package evaluates ClassAds; this one cannot).
    Queues whose job type or owner group ``exclusions`` names are passed over.
    """
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    rng = rng or random.Random()
    conn = session.connection()
    statements = _statements(_shape(resource, expression_check is not None, exclusions),
                             conn.dialect.name)
    params = condition_parameters(resource, exclusions)
    check = _memo(expression_check)
    # The one-statement path takes a job only when the first queue in draw order carries no
    # expression; otherwise it returns nothing and the walk below evaluates expressions.
    fast = conn.dialect.name == "postgresql"
    values = _match_values(resource, now)
    matched = transition_parameters(JobStatus.WAITING, JobStatus.MATCHED,
                                    minor_status=MATCHED_MINOR, source="matcher", now=now,
                                    values=values)
    claims: list[Claim] = []  # moved to Matched already (the one-statement path)
    taken: list[Claim] = []  # still to be moved
    if resource.required_tags and not conn.execute(
            _tags_carried(len(resource.required_tags)), params).scalar():
        return []  # no active queue of the VO carries every required tag: nothing to walk
    while len(claims) + len(taken) < count:
        if fast:
            row = conn.execute(statements.first_try,
                               {**params, **matched, "e": rng.expovariate(1.0)}).one_or_none()
            if row is not None:
                if row.moved != 1:
                    raise ConflictError(
                        f"job {row.job_id} was waiting in task queue {row.tq_id} but is no "
                        "longer Waiting; the claim is abandoned")
                claims.append(Claim(row.job_id, row.tq_id))
                continue
        claim = _claim_one(conn, statements, params, now, rng, check)
        if claim is None:
            break
        taken.append(claim)
    if taken:
        apply_transition(session, [c.job_id for c in taken], JobStatus.WAITING,
                         JobStatus.MATCHED, minor_status=MATCHED_MINOR, source="matcher",
                         now=now, values=values)
    return claims + taken


@functools.lru_cache(maxsize=16)
def _tags_carried(required: int) -> Select[tuple[bool]]:
    """Whether, for each of ``required`` tags, some active queue of the VO carries it.

    The draw walks queues in draw order and checks a queue's required tags as it reaches it:
    cheap when a queue that fits comes early, but a pilot requiring a tag no queue carries
    would walk every active queue of its VO for an empty answer. This probe of the tag index
    answers that case first (a queue that fits must carry every required tag)."""
    tags = tq_tags_table.c
    return select(and_(*(
        select(literal_column("1")).select_from(tq_tags_table.join(
            task_queues_table, tq.id == tags.tq_id))
        .where(tags.value == bindparam(f"r_req_{i}"), tq.vo == bindparam("r_vo"),
               tq.active == 1).exists()
        for i in range(required))))


def _first_candidate_claim(candidates: Select[int, float, float, str | None]
                           ) -> Select[int, int, int]:
    """PostgreSQL, the common case in one statement: draw the first queue, take its best free
    job, advance its clock (by E / priority, E ~ Exp(1) given as ``e``). Returns no row when
    the first queue had no free job or carries a ClassAd expression (or there is no queue);
    :func:`_claim_one` then walks on, evaluating expressions."""
    columns = candidates.selected_columns
    first = candidates.order_by(columns.draw_key, columns.id).limit(1).cte("drawn")
    plain = select(first.c.id).where(first.c.expression.is_(None)).scalar_subquery()
    taken = (
        delete(tq_jobs_table)
        .where(tqj.job_id == select(tqj.job_id)
               .where(tqj.tq_id == plain)
               .order_by(tqj.rank, tqj.job_id).limit(1)
               .with_for_update(skip_locked=True).scalar_subquery())
        .returning(tqj.job_id, tqj.tq_id)
        .cte("taken")
    )
    locked = (select(tq.id).where(tq.id == select(taken.c.tq_id).scalar_subquery())
              .with_for_update(skip_locked=True))
    advanced = (
        update(task_queues_table).where(tq.id == locked.scalar_subquery())
        .ordered_values((tq.draw_clock, tq.draw_key),
                        (tq.draw_key,
                         tq.draw_key + bindparam("e") / select(first.c.priority).scalar_subquery()))
        .returning(tq.id)
        .cte("advanced")
    )
    moved, recorded = status_change_ctes(
        jobs_table.c.id == select(taken.c.job_id).scalar_subquery(), _MATCH_VALUES)
    return select(taken.c.job_id, taken.c.tq_id,
                  select(func.count()).select_from(recorded).scalar_subquery().label("moved"),
                  ).add_cte(advanced, moved)


#: Columns a claim sets besides the status (see :func:`_match_values`).
_MATCH_VALUES = ("ce", "heartbeat_at", "pilot_reference", "site")


def _match_values(resource: Resource, now: datetime) -> dict[str, Any]:
    return {"pilot_reference": resource.pilot_reference or None,
            "site": resource.site_for_job, "ce": resource.ce if resource.site_for_job else None,
            "heartbeat_at": now}


def _memo(check: ExpressionCheck | None) -> ExpressionCheck:
    """``check`` evaluated once per expression text; without one, no expression holds."""
    if check is None:
        return lambda _text: False
    return functools.lru_cache(maxsize=256)(check)


def _claim_one(conn: Connection, statements: _Statements, params: dict[str, Any],
               now: datetime, rng: random.Random, check: ExpressionCheck) -> Claim | None:
    for tq_id, priority, expression in _in_draw_order(conn, statements, params):
        if expression is not None and not check(expression):
            continue
        step = rng.expovariate(max(priority, 1e-12))
        job_id = _take_job(conn, tq_id, step)
        if job_id is None:
            # Empty, or every job in it is being claimed right now.
            _retire_if_empty(conn, tq_id, now)
            continue
        return Claim(job_id, tq_id)
    return None


def _take_job(conn: Connection, tq_id: int, step: float) -> int | None:
    """Remove the queue's best job that no other claimer holds and advance the queue's clock by
    ``step`` (unless another transaction holds the queue's row); return the job's id."""
    dialect = conn.dialect.name
    if dialect == "postgresql":
        return conn.execute(_TAKE_AND_ADVANCE,
                            {"tq_id": tq_id, "step": step}).scalar_one_or_none()
    if dialect == "mysql":
        # MariaDB refuses a locking subquery on the table a DELETE changes: two statements.
        job_id = conn.execute(_NEXT_JOB, {"tq_id": tq_id}).scalar_one_or_none()
        if job_id is not None:
            conn.execute(_DROP_JOB, {"job_id": job_id})
    else:
        job_id = conn.execute(_TAKE_JOB, {"tq_id": tq_id}).scalar_one_or_none()
    if job_id is not None and conn.execute(
            _LOCK_QUEUE, {"tq_id": tq_id}).scalar_one_or_none() is not None:
        conn.execute(_ADVANCE, {"tq_id": tq_id, "step": step})
    return job_id


def _in_draw_order(conn: Connection, statements: _Statements, params: dict[str, Any]
                   ) -> Iterator[tuple[int, float, str | None]]:
    """Matching active queues in draw order, read in batches as long as the caller wants."""
    rows = conn.execute(statements.first_page, params).all()
    batch = FIRST_BATCH
    while True:
        for row in rows:
            yield row.id, row.priority, row.expression
        if len(rows) < batch:
            return
        batch = CANDIDATE_BATCH
        rows = conn.execute(statements.next_page, {
            **params, "after_key": rows[-1].draw_key, "after_id": rows[-1].id}).all()


def _retire_if_empty(conn: Connection, tq_id: int, now: datetime) -> None:
    """Mark a queue inactive if it holds no job, checked while holding its row's lock.

    The lock is what makes this safe against a concurrent inserter (see
    taskqueue.queues.taskqueues): a queue whose row another transaction holds is left active for a
    later claim to look at.
    """
    if conn.execute(_LOCK_QUEUE, {"tq_id": tq_id}).scalar_one_or_none() is None:
        return
    if conn.execute(_ANY_JOB_LEFT, {"tq_id": tq_id}).scalar_one_or_none() is None:
        conn.execute(_DEACTIVATE, {"tq_id": tq_id, "now": now})
