"""The job commands of the ``gridpilot`` CLI: submit, jobs, job, explain, optimize."""

from __future__ import annotations

import getpass
import json
import random
from datetime import UTC, datetime
from pathlib import Path

import click
from sqlalchemy.orm import Session, sessionmaker

from client.show import queue_verdicts
from gridpilot.reports import history_table, jobs_table
from optimizers.chain import (
    ChainContext,
    Identity,
    Submission,
    optimize_received,
    submissions_from_text,
    submit,
)
from optimizers.datalocation import catalogue_for
from optimizers.description import JobDescriptionError, description_warnings
from optimizers.jobexplain import explain_every_queue, explain_job
from optimizers.resources import load_resources
from taskqueue.core.buckets import memory_text
from taskqueue.core.errors import InvalidInputError, NotFoundError
from taskqueue.core.resources import Resource, parse_resource
from taskqueue.core.settings import Settings
from taskqueue.db.database import engine_for, make_session_factory, run_in_transaction
from taskqueue.db.models import (
    Job,
)


def _factory(settings: Settings) -> sessionmaker[Session]:
    return make_session_factory(engine_for(settings.database))


def _context(settings: Settings) -> ChainContext:
    return ChainContext(settings, load_resources(Path(settings.resources.file)),
                        datetime.now(UTC), random.Random(), catalogue_for(settings.catalogue))


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
            found = submissions_from_text(text, fmt)
        except JobDescriptionError as exc:
            raise InvalidInputError(f"{path}: {exc.message}") from exc
        for warning in description_warnings(s.description for s in found):
            click.echo(f"{path}: warning: {warning}", err=True)
        submissions.extend(found)
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
            f"{memory_text(job.memory)}" + (f", SubmitPool {job.submit_pool}"
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
    description (with neither, every configured queue and the rules that fail there); returns
    whether the job can run there (somewhere), and the text."""
    resources = load_resources(Path(settings.resources.file))
    resource = _resource_from_file(resource_file) if resource_file is not None else None
    with _factory(settings)() as session:
        job = session.get(Job, job_id)
        if job is None:
            raise NotFoundError(f"job {job_id} does not exist")
        catalogue = catalogue_for(settings.catalogue)
        if queue is None and resource is None:
            verdicts = explain_every_queue(session, settings, resources, job,
                                           catalogue=catalogue)
            text = queue_verdicts([
                {"queue": v.queue, "can_run": v.can_run,
                 "failed": [{"rule": r.rule, "detail": r.detail} for r in v.failed]}
                for v in verdicts])
            return (any(v.can_run for v in verdicts),
                    f"job {job.id} ({job.status}) against every configured queue:\n{text}")
        result = explain_job(session, settings, resources, job, queue=queue, resource=resource,
                             catalogue=catalogue)
        lines = [f"job {job.id} ({job.status}) against "
                 + (f"queue {queue}" if queue else f"resource {resource_file}") + ":"]
        lines += [f"  [{'ok' if r.holds else 'NO'}] {r.rule}: {r.detail}" for r in result.rules]
        lines.append("=> it can run there" if result.can_run else "=> it cannot run there")
        return result.can_run, "\n".join(lines)


def _resource_from_file(path: Path) -> Resource:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInputError(f"{path}: cannot read it: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise InvalidInputError(f"{path}: not valid JSON: {exc.msg} at line {exc.lineno}") \
            from exc
    return parse_resource(data)
