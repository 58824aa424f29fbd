"""A pilot's match, the way the matcher serves it: one entry point for the service, the
benchmarks and the tools.

On PostgreSQL and MariaDB the common claim is one round trip: the database function
``gridpilot_claim`` (PostgreSQL) or the stored procedure of that name (MariaDB), both in
taskqueue/matching/sql/, draws, takes the job, advances the queue's clock, moves the job to
Matched with its history row and returns the payload columns, in one autocommit statement
(the procedure runs its own transaction), on a bare driver connection. Both follow the rules
of taskqueue.matching.claim one for one, and hand back to that Python path (in a transaction of its
own) what they do not do themselves: a queue whose jobs carry a ClassAd expression (the
optimizers package evaluates those), and a site with limits (taskqueue.matching.limits counts and
locks them). SQLite takes the Python path throughout.

Lists travel as one string each: a PostgreSQL array literal cast to text[], a JSON array on
MariaDB (which has no arrays; the procedure reads it with JSON_TABLE), so that a label may
hold any character.

Why a function: a claim through SQLAlchemy costs 1.5-1.8 ms of client CPU and a few round
trips; the function's call is one statement, and its plans are kept in the server.
"""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple

from sqlalchemy import Engine, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.orm import Session, sessionmaker

from taskqueue.core.errors import ConflictError, DatabaseUnavailableError
from taskqueue.core.resources import Resource
from taskqueue.core.settings import DatabaseSettings
from taskqueue.core.states import JobStatus
from taskqueue.db.database import (
    UNAVAILABLE,
    engine_for,
    is_read_only_server,
    run_in_transaction,
)
from taskqueue.db.groupcommit import GroupCommit
from taskqueue.db.models import Job
from taskqueue.db.statementdeadline import limits_of, statement_deadline
from taskqueue.matching.claim import MATCHED_MINOR, Claim, ExpressionCheck
from taskqueue.matching.limits import (
    NO_MATCH_NO_JOB,
    NO_MATCH_PILOT_KILLED,
    NO_MATCH_SITE_BANNED,
    claim_for_pilot,
)
from taskqueue.pilots.records import FINAL_PILOT_STATES, pilot_stop_reason
from taskqueue.queues.jobs import jobs_for_pilot


class PilotJob(NamedTuple):
    """What a pilot is handed for a job: its identity and its stored description."""

    id: int
    vo: str
    owner: str
    owner_group: str
    job_type: str
    description: str
    description_format: str
    bulk_index: int | None
    #: What the pilot is handed of its description, as stored with the job (JSON; None for a
    #: job stored without it, answered from its description).
    payload: str | None = None


@dataclass(frozen=True)
class MatchAnswer:
    """The jobs matched to the pilot (by id) and the claims (job and task queue, in the order
    made), or none and why (a NO_MATCH_* code and a sentence)."""

    jobs: list[PilotJob]
    claims: list[Claim]
    reason: str | None = None
    detail: str = ""


#: A process's claims grouped per commit: the call's arguments in, its rows out.
ClaimGroups = GroupCommit[tuple[Any, ...], list[tuple[Any, ...]]]


@dataclass(frozen=True)
class MatchDatabase:
    """Where a match runs: sessions for the Python path, and on a database with a claim
    function an engine in autocommit for it (None: the Python path only).

    On PostgreSQL, the claims that threads of the process make at the same time are grouped
    (``groups``, made here): one statement and one commit for a group (see
    :func:`_run_group`). Made per process, like its engines."""

    sessions: sessionmaker[Session]
    autocommit: Engine | None = None
    groups: ClaimGroups | None = field(
        init=False, default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        engine = self.autocommit
        if engine is not None and engine.dialect.name == "postgresql":
            groups: ClaimGroups = GroupCommit(lambda group: _run_group(engine, group),
                                              most=MOST_PER_GROUP, lanes=GROUP_LANES)
            object.__setattr__(self, "groups", groups)


#: Databases whose schema has the claim function (SQLAlchemy's dialect names; MariaDB is
#: "mysql" through a mysql:// URL, "mariadb" through a mariadb:// one).
SERVER_CLAIMS = frozenset({"postgresql", "mysql", "mariadb"})


def open_match_database(settings: DatabaseSettings, sessions: sessionmaker[Session], *,
                        liveness: Callable[[], bool] | None = None) -> MatchDatabase:
    """The MatchDatabase of a process: its sessions, and where the database has a claim
    function, an engine in autocommit for it (the ``[database]`` timeouts and the
    ``liveness`` check of taskqueue.db.database.make_engine hold there too)."""
    autocommit = None
    if make_url(settings.url).get_backend_name() in SERVER_CLAIMS:
        autocommit = engine_for(settings, autocommit=True, liveness=liveness)
    return MatchDatabase(sessions, autocommit)


#: The calls, with their parameters in the order of :func:`_parameters`.
_FUNCTION_CALL = ("gridpilot_claim("
                  "%s, %s, %s::text[], %s, %s, %s, %s, %s::text[], %s::text[], %s::text[], "
                  "%s::text[], %s::text[], %s, %s::text[], %s, %s, %s::timestamp, %s, %s, "
                  "%s::float8[])")
#: The payload columns of the claim function, in its order.
_COLUMNS = ("kind", "job_id", "tq_id", "vo", "owner", "owner_group", "job_type",
            "description", "description_format", "bulk_index")
#: The job's stored payload (taskqueue.queues.jobs.store_payloads) beside each row the claim
#: function hands back, read in its statement (so its transaction) by the job's key.
_PAYLOAD = "(SELECT p.payload FROM job_payloads p WHERE p.job_id = c.job_id)"
_CALL = (f"SELECT {', '.join('c.' + name for name in _COLUMNS)}, {_PAYLOAD} "
         f"FROM {_FUNCTION_CALL} AS c")
#: MariaDB's procedure hands back its rows alone: the payloads of the jobs it claimed are
#: read after it, in one statement.
_PAYLOADS_MYSQL = "SELECT job_id, payload FROM job_payloads WHERE job_id IN ({})"
#: PostgreSQL's codes for a lost race, worth running the claim again.
_RETRY_STATES = frozenset({"40001", "40P01"})
#: The claim function's code for a job that left Waiting under it (see the function).
_CONFLICT_STATE = "GP409"
_CALL_MYSQL = "CALL gridpilot_claim(" + ", ".join(["%s"] * 20) + ")"
#: MariaDB's codes for a lost race: lock wait timeout, deadlock.
_RETRY_ERRORS = frozenset({1205, 1213})
#: The error of the procedure's SIGNAL for a job that left Waiting under it (SQLSTATE 45000).
_CONFLICT_ERROR = 1644
#: Calls made for a claim that keeps losing races before it gives up.
_ATTEMPTS = 5
#: The most claims in one group (one transaction) on PostgreSQL. A group holds the rows of
#: the queues it drew from until it commits, and a claim of another process that draws such
#: a queue meanwhile takes its job without advancing the queue's clock (it does not wait):
#: small groups keep that window short, and 8 already spread a commit over 8 claims.
MOST_PER_GROUP = 8
#: Groups of one process running at once, each on a connection of its own: one runs in the
#: database while the next forms (see taskqueue.db.groupcommit).
GROUP_LANES = 2


def match_for_pilot(db: MatchDatabase, resource: Resource, *, now: datetime, count: int = 1,
                    rng: random.Random | None = None,
                    expression_check: ExpressionCheck | None = None) -> MatchAnswer:
    """Claim up to ``count`` jobs for the pilot ``resource`` describes, each Matched to it,
    honouring every matching rule, the site mask and the site limits; committed on return.
    A pilot that must stop as a whole (taskqueue.pilots.records.pilot_stop_reason) gets none, with
    the reason NO_MATCH_PILOT_KILLED.

    A claim whose database went away under it (a failover: the connection lost while the
    claim function ran or committed, or after it committed and before the rest of the claim)
    may have stored some of its matches. Its outcome is read back, not guessed: every claim
    marks its jobs Matched to the pilot with ``heartbeat_at`` set to ``now``, the request's
    own time, so the jobs this very claim stored are found by (pilot, Matched, ``now``) and
    handed to the pilot as if the answer had arrived (:func:`claimed_at`). When nothing was
    stored, or the read fails too, the caller gets :class:`DatabaseUnavailableError` (503):
    a job the read could not find stays Matched, unconfirmed, and goes back to its queue after
    ``[agents] matched_lease``; no job is handed to two pilots either way."""
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    try:
        return _match_for_pilot(db, resource, now=now, count=count, rng=rng,
                                expression_check=expression_check)
    except DatabaseUnavailableError:
        if not resource.pilot_reference:
            raise
        try:
            stored = claimed_at(db, resource.vo, resource.pilot_reference, now)
        except DatabaseUnavailableError:
            stored = []
        if not stored:
            raise
        return MatchAnswer(stored, [])


#: The jobs one claim stored (see claimed_at), with what a pilot is handed for each.
_CLAIMED_AT = ("SELECT id, vo, owner, owner_group, job_type, description, description_format, "
               "bulk_index, (SELECT p.payload FROM job_payloads p WHERE p.job_id = jobs.id) "
               "FROM jobs WHERE pilot_reference = %s AND vo = %s AND status = "
               "'Matched' AND heartbeat_at = %s ORDER BY id")


def claimed_at(db: MatchDatabase, vo: str, reference: str, now: datetime) -> list[PilotJob]:
    """The jobs the claim made at ``now`` for the pilot ``reference`` holds, still Matched
    (unconfirmed): what its answer would have carried. Read on the claim function's
    connection where there is one (the sessions' engine may be the one that failed)."""
    engine = db.autocommit
    at = now.astimezone(UTC).replace(tzinfo=None)
    if engine is not None and engine.dialect.name in SERVER_CLAIMS:
        return [PilotJob(*row) for row in _call(engine, (reference, vo, at), _CLAIMED_AT)]

    def work(session: Session) -> list[PilotJob]:
        ids = session.scalars(select(Job.id).where(
            Job.pilot_reference == reference, Job.vo == vo,
            Job.status == JobStatus.MATCHED.value, Job.heartbeat_at == now)).all()
        return [PilotJob(*row) for row in jobs_for_pilot(session, ids)]

    return run_in_transaction(db.sessions, work)


def _match_for_pilot(db: MatchDatabase, resource: Resource, *, now: datetime, count: int,
                     rng: random.Random | None,
                     expression_check: ExpressionCheck | None) -> MatchAnswer:
    rng = rng or random.Random()
    if resource.pilot_reference:
        # A pilot that must stop (killed, or ended by its record) claims nothing. A kill that
        # lands after this look, while the claim is in flight, is caught when the pilot
        # confirms the job (taskqueue.pilots.pilotreports.report_status hands it back uncounted).
        stop = _pilot_stop(db, resource.vo, resource.pilot_reference, now=now)
        if stop is not None:
            return MatchAnswer([], [], NO_MATCH_PILOT_KILLED, stop)
    jobs: list[PilotJob] = []
    claims: list[Claim] = []
    engine = db.autocommit
    if engine is not None and engine.dialect.name in SERVER_CLAIMS:
        kind, detail, jobs, claims = _claim_on_server(
            engine, db.groups, resource, now=now, count=count, rng=rng,
            with_expressions=expression_check is not None)
        if kind == "banned":
            return MatchAnswer([], [], NO_MATCH_SITE_BANNED,
                               f"site {detail} is banned for VO {resource.vo}")
        jobs.sort(key=lambda job: job.id)
        if kind is None:  # the function did it all
            if jobs:
                return MatchAnswer(jobs, claims)
            return MatchAnswer([], [], NO_MATCH_NO_JOB, "no waiting job matches this resource")
        if len(jobs) == count:
            return MatchAnswer(jobs, claims)

    def work(session: Session) -> tuple[list[PilotJob], list[Claim], str | None, str]:
        outcome = claim_for_pilot(session, resource, now=now, count=count - len(jobs),
                                  rng=rng, expression_check=expression_check)
        rows = jobs_for_pilot(session, [c.job_id for c in outcome.claims])
        return ([PilotJob(*row) for row in rows], outcome.claims, outcome.reason,
                outcome.detail)

    more, more_claims, reason, detail = run_in_transaction(db.sessions, work)
    jobs = sorted(jobs + more, key=lambda job: job.id)
    if jobs:
        return MatchAnswer(jobs, claims + more_claims)
    return MatchAnswer([], [], reason, detail)


#: The pilot's record as the match path looks it up (the unique (reference, vo) index).
_PILOT_LOOKUP = "SELECT kill_requested_by, status FROM pilots WHERE reference = %s AND vo = %s"


def _pilot_stop(db: MatchDatabase, vo: str, reference: str, *, now: datetime) -> str | None:
    """Why the pilot must stop (taskqueue.pilots.records.pilot_stop_reason), or None. On a database
    with a claim function the record is read on the driver connection of the claim (one
    statement, no session); only a pilot that must stop goes on to the session, which notes
    a pilot heard from after its end."""
    engine = db.autocommit
    if engine is not None and engine.dialect.name in SERVER_CLAIMS:
        rows = _call(engine, (reference, vo), _PILOT_LOOKUP)
        if not rows or (rows[0][0] is None and rows[0][1] not in FINAL_PILOT_STATES):
            return None
    return run_in_transaction(db.sessions, lambda session: pilot_stop_reason(
        session, vo, reference, now=now))


def _claim_on_server(engine: Engine, groups: ClaimGroups | None, resource: Resource, *,
                     now: datetime, count: int, rng: random.Random, with_expressions: bool
                     ) -> tuple[str | None, str, list[PilotJob], list[Claim]]:
    """Call the claim function: what it handed back (its last row's kind when that is not a
    job: 'expression', 'limits' or 'banned', with the banned sites), the jobs it claimed and
    their claims."""
    postgresql = engine.dialect.name == "postgresql"
    params = _parameters(resource, now=now, count=count, rng=rng,
                         with_expressions=with_expressions, postgresql=postgresql)
    rows = _call(engine, params) if groups is None else groups.call(params)
    jobs = [PilotJob(row[1], *row[3:]) for row in rows if row[0] == "job"]
    claims = [Claim(row[1], row[2]) for row in rows if row[0] == "job"]
    if jobs and not postgresql:
        stored = dict(_call(engine, [job.id for job in jobs],
                            _PAYLOADS_MYSQL.format(", ".join(["%s"] * len(jobs)))))
        jobs = [job._replace(payload=stored.get(job.id)) for job in jobs]
    last = rows[-1] if rows and rows[-1][0] != "job" else None
    if last is None:
        return None, "", jobs, claims
    return str(last[0]), str(last[7] or ""), jobs, claims


def _parameters(resource: Resource, *, now: datetime, count: int, rng: random.Random,
                with_expressions: bool, postgresql: bool = True) -> tuple[Any, ...]:
    """The call's arguments, in the order of the function's (and the procedure's) inputs."""
    encode = _array_literal if postgresql else _json_array

    def listed(values: frozenset[str] | None) -> str | None:
        return None if values is None else encode(values)

    variates = [rng.expovariate(1.0) for _ in range(count)]

    return (
        resource.vo, resource.owner, listed(resource.owner_group), resource.cpu_time,
        resource.processors, resource.memory, resource.gpus, listed(resource.job_type),
        listed(resource.submit_pools), listed(resource.site), listed(resource.platform),
        listed(resource.tags), resource.ce, listed(resource.required_tags or None),
        with_expressions, resource.pilot_reference or None,
        now.astimezone(UTC).replace(tzinfo=None), MATCHED_MINOR, "matcher",
        ("{" + ",".join(map(repr, variates)) + "}") if postgresql else json.dumps(variates),
    )


def _array_literal(values: frozenset[str]) -> str:
    """``values`` as a PostgreSQL array literal (cast to text[] by the call): sent as one
    string, which costs the client far less than adapting a list item by item."""
    quoted = (value.replace("\\", "\\\\").replace('"', '\\"') for value in sorted(values))
    return "{" + ",".join(f'"{value}"' for value in quoted) + "}"


def _json_array(values: frozenset[str]) -> str:
    """``values`` as a JSON array of strings, for the MariaDB procedure's JSON_TABLE: JSON's
    escaping keeps commas, quotes, brackets and backslashes inside a label."""
    return json.dumps(sorted(values), ensure_ascii=False)


def _run_group(engine: Engine, group: Sequence[tuple[Any, ...]]
               ) -> list[list[tuple[Any, ...]] | BaseException]:
    """The claims of a group on PostgreSQL, each with its own arguments: one statement, so
    one transaction and one commit, that calls the claim function once per claim, in order
    (a UNION ALL runs its parts one after the other, and each call sees what the calls before
    it did: a job is claimed once, a queue's clock advanced by each claim from it). Its rows
    come back tagged with the claim's place and their own order.

    If the group fails (a job that left Waiting under one claim, races lost again and again,
    any error but a lost connection), nothing of it was committed, and each claim runs again
    alone, so that one claim's failure is its own. A lost connection is every claim's."""
    if len(group) == 1:
        return [_outcome(engine, group[0])]
    statement = _group_statement(len(group))
    try:
        rows = _call(engine, [value for params in group for value in params], statement)
    except DatabaseUnavailableError:
        return [DatabaseUnavailableError(UNAVAILABLE) for _ in group]
    except Exception:  # the group's transaction rolled back whole: one claim at a time
        return [_outcome(engine, params) for params in group]
    answers: list[list[tuple[Any, ...]]] = [[] for _ in group]
    for row in sorted(rows, key=lambda row: (row[0], row[1])):
        answers[row[0]].append(row[2:])
    return list(answers)


def _outcome(engine: Engine, params: tuple[Any, ...]) -> list[tuple[Any, ...]] | BaseException:
    try:
        return _call(engine, params)
    except Exception as exc:  # the claim's own failure, raised to its caller
        return exc


@functools.cache
def _group_statement(size: int) -> str:
    """The statement of a group of ``size`` claims (the driver keeps it prepared per size)."""
    columns = ", ".join(f"c.{name}" for name in _COLUMNS) + ", " + _PAYLOAD
    named = ", ".join(_COLUMNS)
    return " UNION ALL ".join(
        f"SELECT {i} AS i, c.n, {columns} "
        f"FROM {_FUNCTION_CALL} WITH ORDINALITY AS c({named}, n)" for i in range(size))


def _call(engine: Engine, params: Sequence[Any], statement: str | None = None
          ) -> list[tuple[Any, ...]]:
    """Call the claim function or procedure on a pooled driver connection (autocommit; the
    procedure commits or rolls back its own transaction), again if it lost a race; a database
    that cannot be reached is :class:`DatabaseUnavailableError`, a job that left Waiting
    under the claim :class:`ConflictError`.

    MariaDB answers a CALL with the procedure's result set and then a status of its own:
    every result set is read before the connection goes back to the pool, which does not
    reset it, so that the next call on it does not find an unread answer."""
    postgresql = engine.dialect.name == "postgresql"
    statement = statement or (_CALL if postgresql else _CALL_MYSQL)
    driver = engine.dialect.loaded_dbapi  # psycopg or PyMySQL, whichever the URL names
    for attempt in range(1, _ATTEMPTS + 1):
        try:
            connection = engine.raw_connection()
        except (OperationalError, PoolTimeoutError, driver.OperationalError) as exc:
            # A new connection's failure comes from the pool unwrapped: the driver's own.
            raise DatabaseUnavailableError(UNAVAILABLE) from exc
        try:
            with statement_deadline(connection.dbapi_connection, limits_of(engine)):
                cursor = connection.cursor()
                cursor.execute(statement, params)
                rows = [tuple(row) for row in cursor.fetchall()]
                while cursor.nextset():
                    pass
                cursor.close()
            return rows
        except driver.Error as exc:
            race, conflict = (_pg_verdict if postgresql else _mysql_verdict)(exc)
            if conflict:
                raise ConflictError(conflict) from exc
            if race and attempt < _ATTEMPTS:
                continue
            if race:
                raise ConflictError(f"the claim lost {_ATTEMPTS} races in a row with other "
                                    "processes; try again") from exc
            # Anything else may leave an answer half read: the connection is not reused.
            connection.invalidate(exc)
            if isinstance(exc, driver.OperationalError) or is_read_only_server(exc):
                # A read-only server (a standby: the primary failed over) changed nothing.
                raise DatabaseUnavailableError(UNAVAILABLE) from exc
            raise
        finally:
            connection.close()
    raise AssertionError("unreachable")


def _pg_verdict(exc: Exception) -> tuple[bool, str]:
    """Whether a psycopg error is a lost race, and the message of a job no longer Waiting."""
    state = getattr(exc, "sqlstate", None)
    diag = getattr(exc, "diag", None)
    message = getattr(diag, "message_primary", None) or ""
    return state in _RETRY_STATES, message if state == _CONFLICT_STATE else ""


def _mysql_verdict(exc: Exception) -> tuple[bool, str]:
    """The same for a PyMySQL error (its code and message are its arguments)."""
    code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
    message = str(exc.args[1]) if code == _CONFLICT_ERROR and len(exc.args) > 1 else ""
    return code in _RETRY_ERRORS, message
