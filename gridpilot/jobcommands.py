"""The job commands of the ``gridpilot`` CLI: submit, jobs, job, explain, optimize."""

from __future__ import annotations

import getpass
import json
import random
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gridpilot.reports import history_table, jobs_table
from optimizers.chain import (
    ChainContext,
    Identity,
    Submission,
    optimize_received,
    parse_description,
    submissions_from_text,
    submit,
)
from optimizers.classads import expression_check
from optimizers.description import JobDescription, JobDescriptionError
from optimizers.queueresources import resource_for_queue
from optimizers.resources import ResourcesConfig, explain_requirements, load_resources
from taskqueue.database import make_engine, make_session_factory, run_in_transaction
from taskqueue.definitions import JobRequirements, TaskQueueDefinition
from taskqueue.errors import InvalidInputError, NotFoundError
from taskqueue.explain import RuleResult, explain_match
from taskqueue.models import (
    Job,
    SubmitPool,
    TaskQueue,
    TaskQueueBannedSite,
    TaskQueueJob,
    TaskQueuePlatform,
    TaskQueueSite,
    TaskQueueTag,
)
from taskqueue.resources import Resource, parse_resource
from taskqueue.settings import Settings
from taskqueue.submitpools import get_submit_pools_for_queue, submit_pool_id


def _factory(settings: Settings) -> sessionmaker[Session]:
    return make_session_factory(make_engine(settings.database.url))


def _context(settings: Settings) -> ChainContext:
    return ChainContext(settings, load_resources(Path(settings.resources.file)),
                        datetime.now(UTC), random.Random())


def submit_files(settings: Settings, files: tuple[Path, ...], as_json: bool,
                 identity: Identity) -> list[int]:
    """Parse every file first (nothing is stored if one is bad), then store and optimize."""
    fmt = "json" if as_json else "jdl"
    submissions: list[Submission] = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidInputError(f"{path}: cannot read it: {exc}") from exc
        try:
            submissions.extend(submissions_from_text(text, fmt))
        except JobDescriptionError as exc:
            raise InvalidInputError(f"{path}: {exc.message}") from exc
    ctx = _context(settings)
    result = run_in_transaction(_factory(settings),
                                lambda s: submit(s, submissions, identity, ctx))
    for job_id, reason in sorted(result.failed.items()):
        click.echo(f"job {job_id} failed: {reason}", err=True)
    return sorted(result.waiting + list(result.failed))


def identity_from(settings: Settings, vo: str | None, group: str | None,
                  owner: str | None) -> Identity:
    return Identity(vo or settings.submit.vo, owner or settings.submit.owner or getpass.getuser(),
                    group or settings.submit.owner_group)


def optimize(settings: Settings, batch: int) -> tuple[int, int]:
    ctx = _context(settings)
    result = run_in_transaction(_factory(settings),
                                lambda s: optimize_received(s, ctx, limit=batch))
    return len(result.waiting), len(result.failed)


def list_jobs(settings: Settings, status: str | None, owner: str | None, site: str | None,
              limit: int) -> str:
    with _factory(settings)() as session:
        return jobs_table(session, status=status, owner=owner, site=site, limit=limit)


def show_job(settings: Settings, job_id: int) -> str:
    with _factory(settings)() as session:
        job = session.get(Job, job_id)
        if job is None:
            raise NotFoundError(f"job {job_id} does not exist")
        lines = [
            f"job {job.id}: {job.status} ({job.minor_status})",
            f"  owner {job.owner} / {job.owner_group} / VO {job.vo}, type {job.job_type}, "
            f"priority {job.user_priority}",
            f"  needs {job.cpu_time} s CPU, {job.processors} processor(s), "
            f"{job.memory or 'any'} MB" + (f", SubmitPool {job.submit_pool}"
                                            if job.submit_pool else ""),
            f"  submitted {job.submitted_at:%Y-%m-%d %H:%M:%S} UTC"
            + (f", site {job.site}, pilot {job.pilot_reference}" if job.site or
               job.pilot_reference else ""),
            f"  description ({job.description_format}"
            + (f", job {job.bulk_index} of a parametric bulk" if job.bulk_index is not None
               else "") + "):",
        ]
        lines += ["    " + line for line in job.description.splitlines()]
        lines += ["  history:", history_table(session, job_id)]
        return "\n".join(lines)


def explain(settings: Settings, job_id: int, queue: str | None, resource_file: Path | None
            ) -> tuple[bool, str]:
    """Each matching rule for the job against a queue of the resources file or a resource
    description; returns whether all hold, and the text."""
    resources = load_resources(Path(settings.resources.file))
    with _factory(settings)() as session:
        job = session.get(Job, job_id)
        if job is None:
            raise NotFoundError(f"job {job_id} does not exist")
        definition, desc = _definition_of(session, job, settings)
        lines: list[str] = []
        rfc7: list[tuple[str, bool, str]] = []
        if queue is not None:
            resource, where = _queue_resource(session, resources, job.vo, queue)
            if desc.requirements:
                site, ce, name = where
                rfc7 = explain_requirements(resources, desc.requirements, site, ce, name,
                                            vo=job.vo)
        else:
            assert resource_file is not None
            resource = _resource_from_file(resource_file)
        results = explain_match(definition, resource, expression_check(resource))
        if desc.requirements and queue is not None:
            results = [r for r in results if r.rule != "SubmitPool"]
        lines.append(f"job {job.id} ({job.status}) against "
                     + (f"queue {queue}" if queue else f"resource {resource_file}") + ":")
        for r in results:
            lines.append(_line(r))
        for name, holds, detail in rfc7:
            lines.append(_line(RuleResult(f"requirement {name}", holds, detail)))
        ok = all(r.holds for r in results) and all(h for _, h, _ in rfc7)
        lines.append("=> it can run there" if ok else "=> it cannot run there")
        return ok, "\n".join(lines)


def _line(r: RuleResult) -> str:
    return f"  [{'ok' if r.holds else 'NO'}] {r.rule}: {r.detail}"


def _definition_of(session: Session, job: Job, settings: Settings
                   ) -> tuple[TaskQueueDefinition, JobDescription]:
    try:
        jobs = parse_description(job.description, job.description_format)
    except JobDescriptionError as exc:
        raise InvalidInputError(f"job {job.id}'s description cannot be read: {exc}") from exc
    desc = jobs[job.bulk_index or 0]
    waiting = session.execute(
        select(TaskQueue).join(TaskQueueJob, TaskQueueJob.tq_id == TaskQueue.id)
        .where(TaskQueueJob.job_id == job.id)).scalar_one_or_none()
    if waiting is not None:
        return _stored_definition(session, waiting), desc
    pool = (submit_pool_id(desc.requirements) if desc.requirements else None)
    if pool is not None and session.get(SubmitPool, pool) is None:
        pool = None
    req = JobRequirements(
        vo=job.vo, owner=job.owner, owner_group=job.owner_group, cpu_time=desc.cpu_time,
        processors=desc.processors, memory=desc.memory, job_type=desc.job_type,
        submit_pool=pool, expression=desc.requirements_expression, sites=desc.sites,
        banned_sites=desc.banned_sites, platforms=desc.platforms, tags=desc.tags)
    return TaskQueueDefinition.for_job(req, settings), desc


def _stored_definition(session: Session, tq: TaskQueue) -> TaskQueueDefinition:
    def values(table: Any) -> frozenset[str]:
        return frozenset(session.scalars(select(table.value).where(table.tq_id == tq.id)))

    return TaskQueueDefinition(
        vo=tq.vo, owner_group=tq.owner_group, owner=tq.owner, cpu_time=tq.cpu_time,
        processors=tq.processors, memory=tq.memory, job_type=tq.job_type,
        submit_pool=tq.submit_pool, expression=tq.expression,
        sites=values(TaskQueueSite), banned_sites=values(TaskQueueBannedSite),
        platforms=values(TaskQueuePlatform), tags=values(TaskQueueTag))


def _queue_resource(session: Session, resources: ResourcesConfig, vo: str, path: str
                    ) -> tuple[Resource, tuple[str, str, str]]:
    parts = path.split("/")
    if len(parts) != 3 or not all(parts):
        raise InvalidInputError(f"--queue must be SITE/CE/QUEUE, got {path!r}")
    site, ce, name = parts
    pools = get_submit_pools_for_queue(session, site, ce, name)
    return resource_for_queue(resources, site, ce, name, vo, submit_pools=pools), (site, ce,
                                                                                    name)


def _resource_from_file(path: Path) -> Resource:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInputError(f"{path}: cannot read it: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise InvalidInputError(f"{path}: not valid JSON: {exc.msg} at line {exc.lineno}") \
            from exc
    return parse_resource(data)
