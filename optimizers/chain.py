"""The optimizer chain: sanity → requirements → data → scheduling → insertion.

Every job a user submits goes through it between Received and Waiting, inline at submission
and, for jobs that come back (rescheduled) or were stored by another process, in batches by
:func:`optimize_received` (``gridpilot optimize``). All steps run in the caller's transaction,
so a batch is either fully optimized or not at all; a job that fails a step ends Failed, with
the step and a reason a person can act on as its minor status.

- sanity: the description parses and its values are in range (the parser's job; done at
  submission for new jobs, again here for stored ones);
- requirements (RFC 7): the job's ``Requirements`` section becomes a SubmitPool, stored with
  the queues that meet it; the job's sites are intersected with those queues' sites;
- data: a job with input files (InputData, LFN: sandbox entries) keeps only the sites that
  reach a replica of every one (optimizers.datalocation), or fails naming the files;
- scheduling: CPU time, processors, memory, sites, platforms, tags, SubmitPool and ClassAd
  expression become the job's task-queue requirements (the task queue buckets them);
- insertion: the job joins the task queue of its definition and becomes Waiting.
"""

from __future__ import annotations

import functools
import random
import threading
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from optimizers.classads import canonical_expression, never_holds, why_not
from optimizers.datalocation import (
    DatabaseCatalogue,
    DataPlacement,
    ReplicaCatalogue,
    locate_jobs,
)
from optimizers.description import JobDescription, JobDescriptionError, payload_json
from optimizers.gridattributes import vo_mismatch
from optimizers.jdl import parse_jdl
from optimizers.jobjson import parse_json_bulk, parse_json_text
from optimizers.queueresources import resource_for_queue
from optimizers.resources import ResourcesConfig, eligible_queues, no_match_reason, serves_vo
from taskqueue.core.definitions import JobRequirements
from taskqueue.core.errors import InvalidInputError, InvalidRequirementsError
from taskqueue.core.resources import Resource
from taskqueue.core.scopes import granted_scopes, scope_problem
from taskqueue.core.settings import Settings
from taskqueue.core.states import JobStatus
from taskqueue.db.bulk import insert_rows
from taskqueue.db.database import Session
from taskqueue.db.models import tq_jobs_table
from taskqueue.queues.jobs import (
    NewJob,
    Passage,
    add_jobs,
    apply_transition,
    lock_received_jobs,
    name_jobs,
    store_payloads,
)
from taskqueue.queues.submitpools import canonical_text, set_pool_queues, store_submit_pool
from taskqueue.queues.taskqueues import (
    WAITING_MINOR_STATUS,
    QueueEntry,
    enqueue_jobs,
    finish_queues,
    lock_planned,
    plan_queues,
    refill_of,
)

SOURCE = "optimizer"


@dataclass(frozen=True)
class Identity:
    """Who submits: the VO, the owner and the owner's group."""

    vo: str
    owner: str
    owner_group: str


@dataclass(frozen=True)
class ChainContext:
    settings: Settings
    resources: ResourcesConfig
    now: datetime
    rng: random.Random = field(default_factory=random.Random)
    #: Where the replicas of jobs' input files are looked up (the data step).
    catalogue: ReplicaCatalogue = field(default_factory=DatabaseCatalogue)


@dataclass(frozen=True)
class Submission:
    """One job to store: its exact text and format, its place in a bulk, its parsed form."""

    text: str
    format: str
    bulk_index: int | None
    description: JobDescription


@dataclass
class ChainResult:
    waiting: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)
    #: :func:`submit`: the ids of the jobs stored, in the order of the submissions.
    stored: list[int] = field(default_factory=list)


def parse_description(text: str, fmt: str) -> list[JobDescription]:
    """The jobs a description text holds, in the given format ("jdl" or "json")."""
    if fmt == "jdl":
        return parse_jdl(text)
    if fmt == "json":
        return parse_json_text(text)
    raise JobDescriptionError(f"unknown description format {fmt!r}: use jdl or json")


@functools.lru_cache(maxsize=16)
def _parsed(text: str, fmt: str) -> tuple[JobDescription, ...]:
    return tuple(parse_description(text, fmt))


def stored_description(text: str, fmt: str, bulk_index: int | None) -> JobDescription:
    """The description of one stored job: its text holds it alone, or it is job
    ``bulk_index`` of the parametric description the text holds. The last few texts read are
    kept parsed, so the jobs of one parametric bulk do not each expand it again. Raises
    JobDescriptionError (or IndexError for an index the text does not have)."""
    jobs = _parsed(text, fmt)
    return jobs[0] if len(jobs) == 1 else jobs[bulk_index or 0]


#: JDL texts of one job each, parsed: the same description is often submitted again and again
#: (a user's jobs differ by their sandbox, a production's by its arguments). Bounded; the
#: oldest entry goes first. Parametric texts are not kept (their jobs can be many).
_ALONE: dict[str, list[JobDescription]] = {}
_ALONE_SIZE = 256
_ALONE_LOCK = threading.Lock()


def _parsed_alone(text: str) -> list[JobDescription]:
    jobs = _ALONE.get(text)
    if jobs is None:
        jobs = parse_jdl(text)
        if len(jobs) == 1 and jobs[0].parameter is None:
            with _ALONE_LOCK:  # a threaded worker's requests share the cache
                if len(_ALONE) >= _ALONE_SIZE:
                    _ALONE.pop(next(iter(_ALONE)), None)
                _ALONE[text] = jobs
    return list(jobs)


def submissions_from_text(text: str, fmt: str) -> list[Submission]:
    """Parse a submitted text into the jobs to store (sanity happens here, before storing).

    Each object of a JSON list is stored with its own text (not the whole list), the job
    keeping its place in the list as ``bulk_index``; the jobs of a parametric description
    share its text, each with its place among them (:func:`stored_description`)."""
    if fmt != "json":
        jobs = _parsed_alone(text) if fmt == "jdl" else parse_description(text, fmt)
        if len(jobs) == 1 and jobs[0].parameter is None:
            return [Submission(text, fmt, None, jobs[0])]
        return [Submission(text, fmt, i, job) for i, job in enumerate(jobs)]
    parts = parse_json_bulk(text)
    if len(parts) == 1:
        own_text, jobs = parts[0]
        if len(jobs) == 1 and jobs[0].parameter is None:
            return [Submission(own_text, fmt, None, jobs[0])]
        return [Submission(own_text, fmt, i, job) for i, job in enumerate(jobs)]
    out: list[Submission] = []
    for own_text, jobs in parts:
        if len(jobs) == 1:
            out.append(Submission(own_text, fmt, len(out), jobs[0]))
        else:  # a parametric object: its jobs by their place in it
            out.extend(Submission(own_text, fmt, i, job) for i, job in enumerate(jobs))
    return out


def submit(session: Session, submissions: Sequence[Submission], identity: Identity,
           ctx: ChainContext) -> ChainResult:
    """Store new jobs and run the chain on them at once.

    The chain's steps need no job id, so they run first, in memory; each job is then stored
    directly in its outcome (Waiting, or Failed with the reason), its history (Received,
    Checking, the outcome) written in the same pass: a bulk costs a few statements whatever
    its size, not a status change per step. The queues of the waiting jobs are locked and
    their statistics updated before the jobs are stored, so that the jobs' queue rows go in
    with them; on PostgreSQL, when they all go to one active queue, the one statement that
    stores them does that too (a single job: that statement and COMMIT)."""
    granted = granted_scopes(ctx.settings.tokens, identity.vo, identity.owner)
    for s in submissions:
        why = (vo_mismatch(s.description.extra, identity.vo)
               or scope_problem(s.description.token_scopes, granted))
        if why:
            where = f"job {s.bulk_index}: " if s.bulk_index is not None else ""
            raise InvalidInputError(where + why)
    work = [(i, identity, s.description) for i, s in enumerate(submissions)]
    decided = _decide(session, work, ctx)
    checking = Passage(JobStatus.CHECKING, "Job sanity", SOURCE)
    waiting = [checking, Passage(JobStatus.WAITING, WAITING_MINOR_STATUS, SOURCE)]
    outcomes: list[list[Passage]] = []
    queued: list[tuple[int, JobRequirements, int]] = []  # (place, requirements, priority)
    new: list[NewJob] = []
    basic: dict[tuple[int, int, int, str, str | None], JobRequirements] = {}
    for i, s in enumerate(submissions):
        outcome = decided[i]
        desc = s.description
        pool = None
        if isinstance(outcome, str):
            outcomes.append([checking, Passage(JobStatus.FAILED, outcome[:255], SOURCE)])
        else:
            outcomes.append(waiting)
            queued.append((i, outcome, desc.priority))
            pool = outcome.submit_pool  # a job's pool is its queue's pool
        # What the jobs table records of a job (the chain's pool for a waiting one): one
        # object per distinct set of values, not one per job.
        key = (desc.cpu_time, desc.processors, desc.memory, desc.job_type, pool)
        requirements = basic.get(key)
        if requirements is None:
            requirements = basic[key] = _basic_requirements(identity, desc, pool)
        new.append(NewJob(s.text, requirements, desc.priority, s.format, s.bulk_index,
                          desc.job_name, desc.job_group))
    digests, batch = plan_queues([(r, p) for _, r, p in queued], ctx.settings)
    refill = refill_of(batch) if session.get_bind().dialect.name == "postgresql" else None
    plan = None
    if queued and refill is None:
        plan = lock_planned(session, digests, batch, now=ctx.now, rng=ctx.rng)
    queue_ids = plan.queue_ids if plan is not None else [0] * len(queued)
    places: list[tuple[int, int] | None] = [None] * len(submissions)
    for (i, _, priority), tq_id in zip(queued, queue_ids, strict=True):
        places[i] = (tq_id, -priority)
    # PostgreSQL, one queue: the statement that stores the jobs folds them into it too.
    ids = add_jobs(session, new, now=ctx.now, outcomes=outcomes, queues=places,
                   refill=refill)
    if refill is not None and refill.tq_id is None:
        # The queue is to be created or reactivated: locked now, the jobs' rows after.
        plan = lock_planned(session, digests, batch, now=ctx.now, rng=ctx.rng)
        insert_rows(session.connection(), tq_jobs_table, [
            {"job_id": ids[i], "tq_id": tq_id, "rank": -priority}
            for (i, _, priority), tq_id in zip(queued, plan.queue_ids, strict=True)])
    if plan is not None:
        finish_queues(session, ctx.settings, plan)
    store_payloads(session, [(job_id, payload_json(s.description, job_id))
                             for job_id, s in zip(ids, submissions, strict=True)], new=True)
    name_jobs(session, [(job_id, s.description.for_job(job_id).job_name or "")
                        for job_id, s in zip(ids, submissions, strict=True)
                        if s.description.job_name and "%j" in s.description.job_name])
    result = ChainResult(stored=list(ids))
    for i, job_id in enumerate(ids):
        outcome = decided[i]
        if isinstance(outcome, str):
            result.failed[job_id] = outcome
        else:
            result.waiting.append(job_id)
    return result


def _decide(session: Session, jobs: Sequence[tuple[int, Identity, JobDescription]],
            ctx: ChainContext) -> dict[int, JobRequirements | str]:
    """The chain's verdict on each job (by the key given with it): the requirements it waits
    with, or why it failed."""
    pools = _requirements_step(session, jobs, ctx)
    data = locate_jobs(session, ctx.catalogue, ctx.resources,
                       ((identity.vo, desc.input_data) for _, identity, desc in jobs))
    out: dict[int, JobRequirements | str] = {}
    # The jobs of a bulk mostly share their scheduling fields: each distinct set is decided
    # once (the arguments, names and environment that make the jobs differ play no part).
    seen: dict[tuple[Any, ...], JobRequirements | str] = {}
    for key, identity, desc in jobs:
        outcome = pools.get(key)
        if desc.input_data and not isinstance(outcome, str):
            outcome = _data_step(desc, outcome, data[(identity.vo, desc.input_data)])
        if isinstance(outcome, str):
            out[key] = outcome
            continue
        fields = (identity, outcome, desc.requirements_expression, desc.cpu_time,
                  desc.processors, desc.memory, desc.job_type, desc.sites, desc.banned_sites,
                  desc.platforms, desc.tags, desc.ces, desc.gpus)
        decided = seen.get(fields)
        if decided is None:
            try:
                decided = _scheduling_step(identity, desc, outcome)
            except JobDescriptionError as exc:
                decided = f"Scheduling: {exc.message}"
            seen[fields] = decided
        out[key] = decided
    return out


def optimize_received(session: Session, ctx: ChainContext, *, limit: int = 1000,
                      job_ids: Sequence[int] | None = None) -> ChainResult:
    """Run the chain on up to ``limit`` stored Received jobs, or on those of ``job_ids`` that
    are Received (several optimizers may run at once: each takes the jobs no other one
    holds)."""
    rows = lock_received_jobs(session, limit, job_ids)
    work: list[tuple[int, Identity, JobDescription]] = []
    broken: dict[int, str] = {}
    for row in rows:
        try:
            desc = stored_description(row.description, row.description_format,
                                      row.bulk_index)
            work.append((row.id, Identity(row.vo, row.owner, row.owner_group), desc))
        except JobDescriptionError as exc:
            broken[row.id] = f"Job sanity: {exc.message}"
        except IndexError:
            broken[row.id] = (f"Job sanity: the description does not hold job {row.bulk_index} "
                              "of its bulk")
    # A job stored without its payload (before job_payloads) gets it now; one rescheduled
    # keeps its own.
    store_payloads(session, [(job_id, payload_json(desc, job_id)) for job_id, _, desc in work])
    result = run_chain(session, work, ctx) if work else ChainResult()
    if broken:
        _fail(session, broken, JobStatus.RECEIVED, ctx.now)
        result.failed.update(broken)
    return result


def run_chain(session: Session, jobs: Sequence[tuple[int, Identity, JobDescription]],
              ctx: ChainContext) -> ChainResult:
    """Received → Checking → (requirements, scheduling) → Waiting, or Failed with a reason."""
    result = ChainResult()
    if not jobs:
        return result
    apply_transition(session, [j for j, _, _ in jobs], JobStatus.RECEIVED, JobStatus.CHECKING,
                     minor_status="Job sanity", source=SOURCE, now=ctx.now)
    decided = _decide(session, jobs, ctx)
    entries: list[QueueEntry] = []
    for job_id, _identity, desc in jobs:
        outcome = decided[job_id]
        if isinstance(outcome, str):
            result.failed[job_id] = outcome
        else:
            entries.append(QueueEntry(job_id, outcome, desc.priority))
    if result.failed:
        _fail(session, result.failed, JobStatus.CHECKING, ctx.now)
    if entries:
        enqueue_jobs(session, entries, ctx.settings, now=ctx.now, rng=ctx.rng,
                     from_status=JobStatus.CHECKING, source=SOURCE)
        result.waiting = [e.job_id for e in entries]
    return result


@dataclass(frozen=True)
class _Placement:
    """What the requirements step decided for a job."""

    submit_pool: str | None
    sites: frozenset[str] | None  # None: the job's own site list stands


def _requirements_step(session: Session, jobs: Sequence[tuple[int, Identity, JobDescription]],
                       ctx: ChainContext) -> dict[int, _Placement | str]:
    """SubmitPools for the jobs with RFC 7 requirements; a reason for those no queue can run."""
    out: dict[int, _Placement | str] = {}
    by_requirements: dict[tuple[str, str], list[tuple[int, JobDescription]]] = defaultdict(list)
    described: dict[str, list[tuple[str, Resource]]] = {}
    for job_id, identity, desc in jobs:
        if desc.requirements:
            by_requirements[(identity.vo, canonical_text(desc.requirements))].append(
                (job_id, desc))
        elif desc.requirements_expression:
            if identity.vo not in described:
                described[identity.vo] = _configured_resources(ctx.resources, identity.vo)
            reason = _unsatisfiable(desc.requirements_expression, described[identity.vo])
            out[job_id] = _Placement(None, None) if reason is None else reason
        else:
            out[job_id] = _Placement(None, None)
    for (vo, _text), members in sorted(by_requirements.items()):
        requirements: Mapping[str, Any] = members[0][1].requirements or {}
        try:
            queues = eligible_queues(ctx.resources, requirements, vo=vo)
            reason = None if queues else (
                no_match_reason(ctx.resources, requirements, vo=vo)
                or "no queue meets all of them")
        except InvalidRequirementsError as exc:
            queues, reason = [], exc.message
        if reason is not None:
            for job_id, _ in members:
                out[job_id] = f"Requirements: {reason}"
            continue
        pool_id = store_submit_pool(session, requirements, now=ctx.now)
        set_pool_queues(session, pool_id, queues, now=ctx.now, replace=False)
        eligible_sites = frozenset(site for site, _ce, _queue in queues)
        for job_id, desc in members:
            sites = (desc.sites & eligible_sites if desc.sites else eligible_sites)
            sites -= desc.banned_sites
            if not sites:
                out[job_id] = ("Requirements: none of the sites the job may run at has a queue "
                               f"that meets its requirements (queues meeting them are at "
                               f"{', '.join(sorted(eligible_sites))})")
            else:
                out[job_id] = _Placement(pool_id, sites)
    return out


def _data_step(desc: JobDescription, placement: _Placement | None,
               data: DataPlacement) -> _Placement | str:
    """The job's sites narrowed to those that reach its input files (optimizers.datalocation),
    or why it cannot run anywhere."""
    if data.reason is not None:
        return f"InputData: {data.reason}"
    placement = placement or _Placement(None, None)
    chosen = placement.sites if placement.sites is not None else desc.sites
    sites = (chosen & data.sites if chosen else data.sites) - desc.banned_sites
    if not sites:
        return ("InputData: the sites that reach its input files ("
                f"{', '.join(sorted(data.sites))}) are not among the sites it may run at")
    return _Placement(placement.submit_pool, sites)


def _configured_resources(config: ResourcesConfig, vo: str) -> list[tuple[str, Resource]]:
    """Each configured queue that serves ``vo``, named SITE/CE/QUEUE, with the resource its
    pilots present."""
    serves = serves_vo(vo)
    return [(f"{q.site}/{q.ce}/{q.name}", resource_for_queue(config, q.site, q.ce, q.name, vo))
            for q in config.queues() if serves(q)]


def _unsatisfiable(expression: str, queues: list[tuple[str, Resource]]) -> str | None:
    """Why no configured queue can satisfy a Requirements expression, or None if one might.

    Only a definite false counts: an attribute the configuration does not give (undefined)
    may come from the pilot itself, so such a queue might still match."""
    if not queues or not all(never_holds(expression, resource) for _, resource in queues):
        return None
    name, resource = queues[0]
    return (f"Requirements: no configured queue satisfies the expression (at {name}: "
            f"{why_not(expression, resource)})")[:1000]


def _scheduling_step(identity: Identity, desc: JobDescription,
                     placement: _Placement | None) -> JobRequirements:
    placement = placement or _Placement(None, None)
    expression = (canonical_expression(desc.requirements_expression)
                  if desc.requirements_expression else None)
    return JobRequirements(
        vo=identity.vo, owner=identity.owner, owner_group=identity.owner_group,
        cpu_time=desc.cpu_time, processors=desc.processors, memory=desc.memory,
        gpus=desc.gpus,
        job_type=desc.job_type, submit_pool=placement.submit_pool, expression=expression,
        sites=placement.sites if placement.sites is not None else desc.sites,
        banned_sites=desc.banned_sites, platforms=desc.platforms, tags=desc.tags,
        ces=desc.ces,
    )


def _basic_requirements(identity: Identity, desc: JobDescription,
                        submit_pool: str | None = None) -> JobRequirements:
    """What the jobs table records of a job before the chain has run (and the SubmitPool the
    chain gave it)."""
    return JobRequirements(vo=identity.vo, owner=identity.owner,
                           owner_group=identity.owner_group, cpu_time=desc.cpu_time,
                           processors=desc.processors, memory=desc.memory,
                           job_type=desc.job_type, submit_pool=submit_pool)


def _fail(session: Session, reasons: Mapping[int, str], current: JobStatus,
          now: datetime) -> None:
    by_reason: dict[str, list[int]] = defaultdict(list)
    for job_id, reason in reasons.items():
        by_reason[reason].append(job_id)
    for reason, ids in by_reason.items():
        apply_transition(session, ids, current, JobStatus.FAILED, minor_status=reason[:255],
                         source=SOURCE, now=now, values={"ended_at": now})
