"""The SQL schema: jobs and their history, task queues, SubmitPools, pilots, and the
operators' site mask, site limits and shares.

Keys, uniqueness and cascades live here, in the schema, so that every database enforces them
whatever the code does. Times are timezone-aware UTC (see :class:`UTCDateTime`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.sql import text
from sqlalchemy.types import TypeEngine

from taskqueue.core.states import NO_QUEUE_MINOR_STATUS

#: The rows of the partial index of unrunnable jobs (migration 0027).
UNRUNNABLE_PREDICATE = f"status = 'Waiting' AND minor_status = '{NO_QUEUE_MINOR_STATUS}'"

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

#: Integer primary keys: 64-bit on the servers, plain INTEGER (rowid) on SQLite.
BigId = BigInteger().with_variant(Integer(), "sqlite")


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp stored as naive UTC and always returned timezone-aware.

    MariaDB and SQLite keep no zone; storing naive UTC everywhere and attaching UTC on the way
    out gives one behaviour on all three databases. Naive datetimes are refused on the way in.
    """

    impl = DateTime(timezone=False)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        # MariaDB's DATETIME keeps whole seconds unless asked for microseconds.
        if dialect.name == "mysql":
            return dialect.type_descriptor(mysql.DATETIME(fsp=6))
        return dialect.type_descriptor(DateTime(timezone=False))

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r} given; gridpilot stores UTC-aware times")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        assert isinstance(value, datetime)
        return value.replace(tzinfo=UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    vo: Mapped[str] = mapped_column(String(64))
    owner: Mapped[str] = mapped_column(String(255))
    owner_group: Mapped[str] = mapped_column(String(128))
    status: Mapped[str] = mapped_column(String(16))
    minor_status: Mapped[str] = mapped_column(String(255), default="")
    #: The job description exactly as it was submitted, its format ("jdl" or "json"), and for
    #: a job of a parametric bulk, which of the bulk's jobs this one is.
    description: Mapped[str] = mapped_column(Text)
    description_format: Mapped[str] = mapped_column(String(8), default="jdl")
    bulk_index: Mapped[int | None] = mapped_column(Integer, default=None)
    job_type: Mapped[str] = mapped_column(String(64), default="User")
    #: User priority, 0 (lowest) to 10.
    user_priority: Mapped[int] = mapped_column(Integer, default=1)
    #: Requested CPU time in normalised seconds, exact (the task queue keeps it bucketed).
    cpu_time: Mapped[int] = mapped_column(BigInteger, default=0)
    processors: Mapped[int] = mapped_column(Integer, default=1)
    #: Requested memory in MB, 0 for no requirement.
    memory: Mapped[int] = mapped_column(Integer, default=0)
    submit_pool: Mapped[str | None] = mapped_column(
        ForeignKey("submit_pools.id", ondelete="SET NULL"), default=None
    )
    site: Mapped[str | None] = mapped_column(String(128), default=None)
    ce: Mapped[str | None] = mapped_column(String(255), default=None)
    pilot_reference: Mapped[str | None] = mapped_column(String(255), default=None)
    submitted_at: Mapped[datetime] = mapped_column(UTCDateTime)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    reschedule_count: Mapped[int] = mapped_column(Integer, default=0)
    #: What the pilot last said: CPU seconds the payload used, its progress (free text), and
    #: at the end its exit code and the tail of its standard output and error.
    cpu_used: Mapped[float | None] = mapped_column(Float, default=None)
    progress: Mapped[str | None] = mapped_column(String(255), default=None)
    exit_code: Mapped[int | None] = mapped_column(Integer, default=None)
    output_tail: Mapped[str | None] = mapped_column(Text, default=None)
    #: The owner's name for the job (JobName) and the label it groups jobs under (JobGroup):
    #: what listings filter by.
    job_name: Mapped[str | None] = mapped_column(String(255), default=None)
    job_group: Mapped[str | None] = mapped_column(String(128), default=None)

    __table_args__ = (
        Index(None, "status", "id"),
        Index(None, "owner", "status"),
        # Listings are keyset pages in id order: each filter they are asked for most has an
        # index that ends in the id, so a page reads its rows in order and stops.
        Index(None, "vo", "owner", "id"),
        # Pattern operators on PostgreSQL: a prefix search (LIKE 'abc%') can use the index
        # whatever the database's collation.
        Index(None, "job_group", "id", postgresql_ops={"job_group": "varchar_pattern_ops"}),
        Index(None, "job_name", "id", postgresql_ops={"job_name": "varchar_pattern_ops"}),
        # "since": the smallest id submitted at or after a time, read from the index alone.
        Index(None, "submitted_at", "id"),
        Index(None, "submit_pool", "status"),
        # Running limits count a site's running jobs.
        Index(None, "site", "status", "ce"),
        # The jobs at a site and of an owner group, a page at a time (the dashboard's and the
        # API's listings): without them a page read all of a site's or group's jobs (2.2 s and
        # 0.6 s at ten million jobs, bench/ten_million.py). Each costs a claim one more index
        # entry (about a hundredth of its server CPU).
        Index(None, "site", "id"),
        Index(None, "owner_group", "id"),
        Index(None, "pilot_reference"),
        # The Waiting jobs no configured queue can run (taskqueue.queues.unrunnable): where the
        # database has partial indexes (PostgreSQL, SQLite), an index of only them. The
        # watchdog no longer reads it (it walks task_queue_jobs a window at a time); a query
        # for that minor status still may.
        Index("ix_jobs_unrunnable", "id", postgresql_where=text(UNRUNNABLE_PREDICATE),
              sqlite_where=text(UNRUNNABLE_PREDICATE),
              info={"dialects": ("postgresql", "sqlite")}),
    )


class JobStatusHistory(Base):
    __tablename__ = "job_status_history"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    #: The job's id. No foreign key (migration 0016): a history row is written only with its
    #: job (stored in the same statement, or locked by the change it records), and removed
    #: with it by the purge (taskqueue.queues.purge); the key's check cost a third of a bulk
    #: submission's database time.
    job_id: Mapped[int] = mapped_column(BigId, index=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    status: Mapped[str] = mapped_column(String(16))
    minor_status: Mapped[str] = mapped_column(String(255), default="")
    #: Who made the change: "submit", "optimizer", "matcher", "pilot", "operator", an agent ...
    source: Mapped[str] = mapped_column(String(64))

    #: The activity loop reads the recent changes into Matched, Done and Failed (and the
    #: dashboard the last hour's failures) without walking the whole history.
    __table_args__ = (Index(None, "status", "at"),)


class SubmitPool(Base):
    __tablename__ = "submit_pools"

    #: sha256 hex digest of the canonical requirements.
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    #: Canonical JSON of the requirements.
    requirements: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    #: Last time a job used this pool (the cleanup grace period counts from here).
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class SubmitPoolQueue(Base):
    __tablename__ = "submit_pool_queues"

    pool_id: Mapped[str] = mapped_column(
        ForeignKey("submit_pools.id", ondelete="CASCADE"), primary_key=True
    )
    site: Mapped[str] = mapped_column(String(128), primary_key=True)
    ce: Mapped[str] = mapped_column(String(255), primary_key=True)
    queue: Mapped[str] = mapped_column(String(128), primary_key=True)
    refreshed_at: Mapped[datetime] = mapped_column(UTCDateTime)

    __table_args__ = (Index(None, "site", "ce", "queue"),)


class TaskQueue(Base):
    __tablename__ = "task_queues"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    #: sha256 hex digest of the canonical definition: one task queue per definition.
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    vo: Mapped[str] = mapped_column(String(64))
    owner_group: Mapped[str] = mapped_column(String(128))
    #: NULL when the owner group shares its jobs.
    owner: Mapped[str | None] = mapped_column(String(255))
    #: The bucket of the jobs' normalised CPU time per core (see taskqueue.core.definitions).
    cpu_time: Mapped[int] = mapped_column(BigInteger)
    processors: Mapped[int] = mapped_column(Integer)
    memory: Mapped[int] = mapped_column(Integer)
    #: The bucket of the GPUs the jobs need, 0 for none.
    gpus: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    job_type: Mapped[str] = mapped_column(String(64))
    submit_pool: Mapped[str | None] = mapped_column(
        ForeignKey("submit_pools.id", ondelete="CASCADE")
    )
    #: The ClassAd Requirements expression all the queue's jobs carry, or NULL. A queue with one
    #: matches only a resource the matcher has evaluated it against (taskqueue.matching.claim).
    expression: Mapped[str | None] = mapped_column(Text)
    #: Fair-share priority: the queue's weight in the matcher's draw (see taskqueue.queues.shares).
    priority: Mapped[float] = mapped_column(Float)
    #: Mean user priority of the jobs put in the queue since it last became active, and how many
    #: they were: kept by the inserters, so that fair share never has to scan the jobs.
    mean_job_priority: Mapped[float] = mapped_column(Float)
    jobs_inserted: Mapped[int] = mapped_column(BigInteger)
    #: 1 while the queue may hold waiting jobs; 0 once a claim found it empty.
    active: Mapped[int] = mapped_column(Integer)
    #: Key of the priority-weighted draw: the next event of an exponential clock of rate
    #: ``priority``; the smallest key among matching queues wins (see taskqueue.matching.claim).
    draw_key: Mapped[float] = mapped_column(Float)
    #: The draw's time the current key was drawn from: the key the queue had when it was last
    #: drawn, or the VO's current time when it was created or came back. The largest among a
    #: VO's active queues is the VO's current time, where new queues' clocks start.
    draw_clock: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    emptied_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    __table_args__ = (
        # With the id, ORDER BY draw_key, id LIMIT n reads the index in order and stops at
        # the first matching queue; without it, every matching queue is read and sorted.
        Index(None, "active", "vo", "draw_key", "id"),
        Index(None, "active", "vo", "draw_clock"),
        Index(None, "owner_group", "owner"),
    )


class _TaskQueueValue:
    """Columns shared by the per-queue value tables (sites, banned sites, platforms, tags)."""

    tq_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("task_queues.id", ondelete="CASCADE"), primary_key=True
    )
    value: Mapped[str] = mapped_column(String(128), primary_key=True)


class TaskQueueSite(_TaskQueueValue, Base):
    __tablename__ = "tq_sites"


class TaskQueueBannedSite(_TaskQueueValue, Base):
    __tablename__ = "tq_banned_sites"


class TaskQueuePlatform(_TaskQueueValue, Base):
    __tablename__ = "tq_platforms"


class TaskQueueCE(_TaskQueueValue, Base):
    """The computing elements a queue's jobs may run on (JDL GridCE); none: any."""

    __tablename__ = "tq_ces"


class TaskQueueTag(_TaskQueueValue, Base):
    __tablename__ = "tq_tags"
    #: Finds the queues carrying a tag a resource requires, without walking all queues.
    __table_args__ = (Index(None, "value", "tq_id"),)


class JobPayloadRow(Base):
    """What a pilot is handed of a job's description (the fields of pilot.protocol.JobPayload
    that come from it, with the job's id in place of ``%j``), as compact JSON written when the
    description is read at submission or optimization: a match answer reads it instead of
    parsing the description again. A narrow table of its own, so the wide ``jobs`` row and its
    indexes do not grow. A job stored without one (before migration 0042) is answered from
    its description. No foreign key, for the reason given at JobStatusHistory.job_id; its row
    leaves with its job (taskqueue.queues.purge)."""

    __tablename__ = "job_payloads"

    job_id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=False)
    payload: Mapped[str] = mapped_column(Text)


class TaskQueueJob(Base):
    __tablename__ = "task_queue_jobs"

    #: The job's id; no foreign key, for the reason given at JobStatusHistory.job_id (a
    #: queue row is written with its job, or by a change that holds the job locked).
    job_id: Mapped[int] = mapped_column(BigId, primary_key=True)
    tq_id: Mapped[int] = mapped_column(BigId, ForeignKey("task_queues.id", ondelete="CASCADE"))
    #: Minus the job's user priority, so that one ascending index scan on (tq_id, rank, job_id)
    #: yields the best job first: highest priority, then oldest.
    rank: Mapped[int] = mapped_column(Integer)

    __table_args__ = (Index(None, "tq_id", "rank", "job_id"),)


class Pilot(Base):
    __tablename__ = "pilots"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    #: Unique within its VO: one VO's pilots cannot take or shadow another VO's references.
    reference: Mapped[str] = mapped_column(String(255))
    vo: Mapped[str] = mapped_column(String(64))
    site: Mapped[str] = mapped_column(String(128))
    ce: Mapped[str] = mapped_column(String(255))
    queue: Mapped[str] = mapped_column(String(128))
    status: Mapped[str] = mapped_column(String(32))
    submitted_at: Mapped[datetime] = mapped_column(UTCDateTime)
    last_seen_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    #: The PSI/J executor the site director submitted it with, and the batch system's id for
    #: it; both NULL for a pilot started by other means (it registers itself).
    executor: Mapped[str | None] = mapped_column(String(32), default=None)
    native_id: Mapped[str | None] = mapped_column(String(255), default=None)
    #: Why it is in its status (a submission error, "vanished from the batch system" ...).
    reason: Mapped[str] = mapped_column(String(255), default="")
    updated_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    #: The pilot process's exit code, when its CE reported one.
    exit_code: Mapped[int | None] = mapped_column(Integer, default=None)
    #: Its standard output and error once its CE said it ended: NULL while the director
    #: still follows it (a submitted pilot), "stored" (``log_id`` names the archive in the
    #: sandbox store) or "unavailable" (``log_note`` says why).
    log_state: Mapped[str | None] = mapped_column(String(16), default=None)
    log_id: Mapped[str | None] = mapped_column(String(80), default=None)
    log_note: Mapped[str] = mapped_column(String(255), default="")
    #: Who asked for the pilot to be killed through its CE (the director does it at its next
    #: turn).
    kill_requested_by: Mapped[str | None] = mapped_column(String(255), default=None)
    #: When the pilot was first heard from (match, heartbeat) after its record said it
    #: ended (its CE said so, yet the pilot lives on); it is told to stop.
    heard_after_end_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    #: How many times the pilot had its token renewed, the last time, and when the last
    #: token it was given expires.
    token_renewals: Mapped[int] = mapped_column(Integer, default=0)
    token_renewed_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    token_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    #: The CE's own word for the pilot's state as last reported ("ACCEPTING", "QUEUING",
    #: "HELD" for an ARC-CE, PSI/J's "QUEUED" ...; empty until its CE said one), and since
    #: when the CE has said it: how long a pilot hangs in one of its CE's states.
    ce_state: Mapped[str] = mapped_column(String(32), default="")
    ce_state_since: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    #: The CE state the pilot hung in past its timeout ([agents] pilot_stage_timeout ...),
    #: for which the pilots loop killed it ("Submitting": its director never submitted it).
    hung_in: Mapped[str | None] = mapped_column(String(32), default=None)
    #: Whether, when the matcher last answered the pilot "no job", waiting jobs that its
    #: queue's pilots could run were there (True: the pilot's own description misses work
    #: its queue has; False: others had taken it, an overshoot); NULL until such an answer.
    missed_work: Mapped[bool | None] = mapped_column(Boolean, default=None)
    #: How the pilot isolates its payloads, as it said when it registered: the tool and its
    #: version ("bwrap 0.8.0"), "none", or NULL (not said: a pilot older than the field).
    isolation: Mapped[str | None] = mapped_column(String(64), default=None)

    #: updated_at: the pilots that ended lately, per site, for the agents' metrics.
    __table_args__ = (UniqueConstraint("reference", "vo"),
                      Index(None, "site", "ce", "queue", "status"),
                      Index(None, "status", "executor"),
                      Index(None, "log_state", "executor"),
                      Index(None, "updated_at"))


class PilotRun(Base):
    """A job a pilot started (its first Running report on it): kept when the job is
    rescheduled to another pilot, so that the pilot's page lists every job it ran. Its rows
    leave with their job (taskqueue.queues.purge), found through the index on ``job_id``."""

    __tablename__ = "pilot_runs"

    vo: Mapped[str] = mapped_column(String(64), primary_key=True)
    pilot_reference: Mapped[str] = mapped_column(String(255), primary_key=True)
    job_id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=False,
                                        index=True)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)


class DirectorQueue(Base):
    """The site director's memory of one queue: its submissions that failed in a row, and
    apart from them the polls of its CE that failed in a row (the pilots loop), each kind with
    its last error and until when the queue is skipped for it; and when an operator last
    asked to retry it now. Its row is also the lock that keeps two directors from submitting
    to one queue at once."""

    __tablename__ = "director_queues"

    site: Mapped[str] = mapped_column(String(128), primary_key=True)
    ce: Mapped[str] = mapped_column(String(255), primary_key=True)
    queue: Mapped[str] = mapped_column(String(128), primary_key=True)
    #: Submissions failed in a row; a successful submission sets it to 0.
    failures: Mapped[int] = mapped_column(Integer, default=0)
    skip_until: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    last_error: Mapped[str] = mapped_column(String(255), default="")
    last_cycle_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    #: Polls of the queue's CE failed in a row; a successful poll sets it to 0 and ends
    #: ``poll_skip_until``.
    poll_failures: Mapped[int] = mapped_column(Integer, default=0)
    poll_skip_until: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    poll_error: Mapped[str] = mapped_column(String(255), default="")
    #: When an operator last asked for the queue to be tried again now, and who.
    retry_requested_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    retry_requested_by: Mapped[str] = mapped_column(String(255), default="")
    #: Pilots in a row that ended before they reached the matcher when its submissions were
    #: stopped for it (0: not stopped), why, and when; an operator's retry or a pilot of the
    #: queue reaching the matcher lifts the stop.
    failed_starts: Mapped[int] = mapped_column(Integer, default=0)
    starts_error: Mapped[str] = mapped_column(String(255), default="")
    starts_stopped_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    #: Pilots decided for the queue whose submission never reached its CE (it was down,
    #: refused the credentials ...), in all: they leave no pilot record.
    unsent_pilots: Mapped[int] = mapped_column(Integer, default=0)
    #: What the queue's CE last said of its jobs (all its users'; an ARC-CE's GLUE2 share),
    #: when it was read, and why the last read failed ("" when it did not).
    ce_running: Mapped[int | None] = mapped_column(Integer, default=None)
    ce_waiting: Mapped[int | None] = mapped_column(Integer, default=None)
    ce_total: Mapped[int | None] = mapped_column(Integer, default=None)
    ce_free_slots: Mapped[int | None] = mapped_column(Integer, default=None)
    ce_max_total: Mapped[int | None] = mapped_column(Integer, default=None)
    ce_read_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    ce_error: Mapped[str] = mapped_column(String(255), default="")
    #: Since when the CE has said, at every read, that it holds waiting jobs and runs none.
    ce_idle_since: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    #: Why the credential the queue's CE is reached with will soon stop working (a token
    #: near its end that its file has not replaced), as the director last saw; "" when not.
    credential_warning: Mapped[str] = mapped_column(String(255), default="")


class AgentRun(Base):
    """When each periodic agent loop last ran: several agent processes share the work, and a
    loop that ran recently somewhere is not run again before its interval."""

    __tablename__ = "agent_runs"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    #: The running turn's last heartbeat: a turn not renewed within the lease is free.
    renewed_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    holder: Mapped[str] = mapped_column(String(255), default="")
    summary: Mapped[str] = mapped_column(String(255), default="")


class SiteBan(Base):
    """A site of a VO's site mask that is banned: its pilots get no job."""

    __tablename__ = "site_bans"

    vo: Mapped[str] = mapped_column(String(64), primary_key=True)
    site: Mapped[str] = mapped_column(String(128), primary_key=True)
    reason: Mapped[str] = mapped_column(String(255))
    banned_by: Mapped[str] = mapped_column(String(255))
    banned_at: Mapped[datetime] = mapped_column(UTCDateTime)


class SiteLimit(Base):
    """A limit on the jobs with one attribute value at a site (or one CE of it): at most
    ``max_running`` of them running at once, and/or at least ``matching_delay`` seconds between
    two matches of them. Every matcher process reads and locks these rows when it matches."""

    __tablename__ = "site_limits"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    vo: Mapped[str] = mapped_column(String(64))
    site: Mapped[str] = mapped_column(String(128))
    #: "" for every CE of the site.
    ce: Mapped[str] = mapped_column(String(255))
    #: The job attribute limited: "job_type" or "owner_group" (see taskqueue.matching.limits).
    attribute: Mapped[str] = mapped_column(String(32))
    value: Mapped[str] = mapped_column(String(128))
    max_running: Mapped[int | None] = mapped_column(Integer)
    matching_delay: Mapped[int | None] = mapped_column(Integer)
    last_matched_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)

    __table_args__ = (UniqueConstraint("vo", "site", "ce", "attribute", "value"),)


class GroupShare(Base):
    """An owner group's fair share set by one of its VO's operators; it overrides the
    settings file."""

    __tablename__ = "group_shares"

    vo: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner_group: Mapped[str] = mapped_column(String(128), primary_key=True)
    share: Mapped[float] = mapped_column(Float)
    updated_by: Mapped[str] = mapped_column(String(255))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class SiteActivity(Base):
    """Jobs matched, done and failed at one site in one period (a minute, an hour or a day),
    derived from the job status history by the activity loop (taskqueue.pilots.activity); what the
    dashboard's charts and failure rates read, the same for every matcher process."""

    __tablename__ = "site_activity"

    #: Seconds the row covers: 60, 3600 or 86400.
    period: Mapped[int] = mapped_column(Integer, primary_key=True)
    start: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    vo: Mapped[str] = mapped_column(String(64), primary_key=True)
    #: "" for jobs that no longer name a site (rescheduled before the loop saw them).
    site: Mapped[str] = mapped_column(String(128), primary_key=True)
    matched: Mapped[int] = mapped_column(Integer)
    done: Mapped[int] = mapped_column(Integer)
    failed: Mapped[int] = mapped_column(Integer)


class JobCount(Base):
    """A snapshot of a VO's jobs per status, and of its waiting jobs per owner group, taken by
    the activity loop; one snapshot a minute is kept for a while, one an hour and one a day
    for longer (``period`` says which tier a row belongs to)."""

    __tablename__ = "job_counts"

    period: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    vo: Mapped[str] = mapped_column(String(64), primary_key=True)
    #: "status" (jobs in each status) or "owner_group" (waiting jobs of each group).
    dimension: Mapped[str] = mapped_column(String(16), primary_key=True)
    value: Mapped[str] = mapped_column(String(128), primary_key=True)
    jobs: Mapped[int] = mapped_column(BigInteger)


class JobCountDelta(Base):
    """A change of the number of jobs in a status of a VO, written by the database itself
    (triggers on ``jobs``, migration 0028) with every INSERT of jobs and every change of a
    job's status, in the writer's transaction. Rows are only ever added, so no two writers
    wait on each other; the activity loop folds them into :class:`JobStatusTotal` and deletes
    them (taskqueue.db.jobcounts). Deleting a job writes none: a purged job still counts in its
    last status."""

    __tablename__ = "job_count_deltas"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    vo: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))
    jobs: Mapped[int] = mapped_column(BigInteger)


class JobStatusTotal(Base):
    """Jobs per VO and status, as of the last fold of :class:`JobCountDelta` (jobs the purge
    removed still count in their last status): the dashboard's counts without a scan of
    ``jobs``."""

    __tablename__ = "job_status_totals"

    vo: Mapped[str] = mapped_column(String(64), primary_key=True)
    status: Mapped[str] = mapped_column(String(16), primary_key=True)
    jobs: Mapped[int] = mapped_column(BigInteger)


class TaskQueueWaitingDelta(Base):
    """A change of the number of jobs waiting in a task queue, written by the database itself
    (triggers on ``task_queue_jobs``, migration 0028) as jobs go in and out of queues; folded
    into :class:`TaskQueueWaiting` by the activity loop like :class:`JobCountDelta`. On
    MariaDB a foreign key's cascade fires no trigger: only empty task queues are deleted."""

    __tablename__ = "tq_waiting_deltas"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    tq_id: Mapped[int] = mapped_column(BigId)
    jobs: Mapped[int] = mapped_column(BigInteger)


class TaskQueueWaiting(Base):
    """Jobs waiting in each task queue, as of the last fold of :class:`TaskQueueWaitingDelta`
    (queues with none have no row): the dashboard's waiting counts without a scan of
    ``task_queue_jobs``."""

    __tablename__ = "tq_waiting"

    tq_id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=False)
    jobs: Mapped[int] = mapped_column(BigInteger)


class PurgedJobs(Base):
    """Jobs the purge loop removed, per VO and final status (taskqueue.queues.purge)."""

    __tablename__ = "purged_jobs"

    vo: Mapped[str] = mapped_column(String(64), primary_key=True)
    status: Mapped[str] = mapped_column(String(16), primary_key=True)
    jobs: Mapped[int] = mapped_column(BigInteger)


class QueueStatus(Base):
    """What each queue (site, CE, queue) is doing for a VO, as the activity loop last saw it:
    jobs running through its pilots, waiting jobs its pilots could run, its pilots by status
    and when one last spoke. The dashboard's sites and pilots pages read these few rows
    instead of counting the jobs and pilots tables on every view."""

    __tablename__ = "queue_status"

    vo: Mapped[str] = mapped_column(String(64), primary_key=True)
    site: Mapped[str] = mapped_column(String(128), primary_key=True)
    ce: Mapped[str] = mapped_column(String(255), primary_key=True)
    queue: Mapped[str] = mapped_column(String(128), primary_key=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    #: 1 when the resources file lists the queue for the VO.
    configured: Mapped[int] = mapped_column(Integer)
    running: Mapped[int] = mapped_column(Integer)
    #: Waiting jobs its pilots could run, and the task queues they are in (NULL when the
    #: queue is not configured: its pilots' description is not known).
    waiting_for: Mapped[int | None] = mapped_column(Integer)
    task_queues: Mapped[int | None] = mapped_column(Integer)
    #: JSON: {"alive": {status: n}, "ended": {status: n in the last 24 h}}.
    pilots: Mapped[str] = mapped_column(Text)
    last_pilot_seen: Mapped[datetime | None] = mapped_column(UTCDateTime)


# Core table handles, for the hot paths (claims, bulk inserts) that skip the ORM layer.
jobs_table = cast(Table, Job.__table__)
pilots_table = cast(Table, Pilot.__table__)
history_table = cast(Table, JobStatusHistory.__table__)
task_queues_table = cast(Table, TaskQueue.__table__)
tq_jobs_table = cast(Table, TaskQueueJob.__table__)
job_payloads_table = cast(Table, JobPayloadRow.__table__)
tq_sites_table = cast(Table, TaskQueueSite.__table__)
tq_banned_sites_table = cast(Table, TaskQueueBannedSite.__table__)
tq_platforms_table = cast(Table, TaskQueuePlatform.__table__)
tq_tags_table = cast(Table, TaskQueueTag.__table__)
tq_ces_table = cast(Table, TaskQueueCE.__table__)
submit_pool_queues_table = cast(Table, SubmitPoolQueue.__table__)
site_activity_table = cast(Table, SiteActivity.__table__)
job_counts_table = cast(Table, JobCount.__table__)
queue_status_table = cast(Table, QueueStatus.__table__)
purged_jobs_table = cast(Table, PurgedJobs.__table__)
pilot_runs_table = cast(Table, PilotRun.__table__)
job_count_deltas_table = cast(Table, JobCountDelta.__table__)
job_status_totals_table = cast(Table, JobStatusTotal.__table__)
tq_waiting_deltas_table = cast(Table, TaskQueueWaitingDelta.__table__)
tq_waiting_table = cast(Table, TaskQueueWaiting.__table__)


class Sandbox(Base):
    """A sandbox: a tar.gz of a job's files, named by the sha256 of its bytes and stored once
    whoever uploads it (the bytes live in the sandbox store, taskqueue.files.sandboxstore)."""

    __tablename__ = "sandboxes"

    #: ``sb:sha256:`` and the hex digest of the archive.
    id: Mapped[str] = mapped_column(String(80), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class SandboxOwner(Base):
    """Who owns a sandbox: each user who uploaded it (or whose job's pilot did)."""

    __tablename__ = "sandbox_owners"

    sandbox_id: Mapped[str] = mapped_column(
        ForeignKey("sandboxes.id", ondelete="CASCADE"), primary_key=True)
    vo: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner: Mapped[str] = mapped_column(String(255), primary_key=True)
    owner_group: Mapped[str] = mapped_column(String(128))
    #: 1 when a pilot uploaded it as a job's output (it does not count against the quota).
    output: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)

    __table_args__ = (Index(None, "vo", "owner"),)


class SandboxQuotaLock(Base):
    """One row per uploader, locked while their quota is checked and their upload recorded:
    parallel uploads of one owner are checked one after the other."""

    __tablename__ = "sandbox_quota_locks"

    vo: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner: Mapped[str] = mapped_column(String(255), primary_key=True)


class DashboardSignOut(Base):
    """A dashboard session signed out before its cookie expires: the cookie, signed and valid
    till then, no longer opens a page. Kept until the session would have ended."""

    __tablename__ = "dashboard_sign_outs"

    #: sha256 (hex) of the session's random value.
    session_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)


class SigningKey(Base):
    """A key the service signs payloads' tokens with (ES256): its public half is published
    (JWKS) while tokens it signed may still be valid; its private half is kept encrypted with
    a key derived from the service's signing secret. Only the newest key not retired signs."""

    __tablename__ = "signing_keys"

    kid: Mapped[str] = mapped_column(String(64), primary_key=True)
    algorithm: Mapped[str] = mapped_column(String(16))
    #: The public key as a JWK (JSON text).
    public_jwk: Mapped[str] = mapped_column(Text)
    #: The private key, PKCS#8 PEM encrypted (Fernet) with a key derived from the secret.
    private_key: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    #: When it stopped signing (NULL while it signs), and when it is no longer published.
    retired_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    drop_after: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)


class JobSandbox(Base):
    """A job's reference to a sandbox: its input ("input") or what it brought back
    ("output"). A referenced sandbox cannot be deleted (no cascade from sandboxes)."""

    __tablename__ = "job_sandboxes"

    job_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    sandbox_id: Mapped[str] = mapped_column(ForeignKey("sandboxes.id"), primary_key=True)
    kind: Mapped[str] = mapped_column(String(8), primary_key=True)

    __table_args__ = (Index(None, "sandbox_id", "job_id"),)


class FileReplica(Base):
    """gridpilot's replica catalogue: a file of a VO (its LFN) has a replica at a storage
    element. Jobs with InputData run only at sites that reach a replica of each of their
    files (conf/resources.toml maps storage elements to sites)."""

    __tablename__ = "file_replicas"

    vo: Mapped[str] = mapped_column(String(64), primary_key=True)
    #: sha256 (hex) of the LFN: a key of fixed width whatever the LFN's length.
    lfn_key: Mapped[str] = mapped_column(String(64), primary_key=True)
    se: Mapped[str] = mapped_column(String(64), primary_key=True)
    lfn: Mapped[str] = mapped_column(String(1024))
    registered_at: Mapped[datetime] = mapped_column(UTCDateTime)

    __table_args__ = (Index(None, "vo", "se"),)


file_replicas_table = cast(Table, FileReplica.__table__)
