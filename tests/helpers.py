"""Small builders shared by the database tests."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session

from optimizers.description import JobDescriptionError
from taskqueue.core.definitions import JobRequirements
from taskqueue.core.resources import parse_resource
from taskqueue.core.settings import Settings
from taskqueue.core.states import JobStatus
from taskqueue.matching.claim import Claim, ExpressionCheck, claim_jobs
from taskqueue.pilots.pilotmatch import MatchDatabase, match_for_pilot
from taskqueue.queues.jobs import NewJob, add_jobs, apply_transition
from taskqueue.queues.taskqueues import QueueEntry, enqueue_jobs


def requirements(**kw: Any) -> JobRequirements:
    base: dict[str, Any] = {"vo": "lhcb", "owner": "alice", "owner_group": "lhcb_user"}
    base.update(kw)
    for key in ("sites", "banned_sites", "platforms", "tags", "ces"):
        if key in base:
            base[key] = frozenset(base[key])
    return JobRequirements(**base)


def submit(session: Session, settings: Settings, now: datetime, reqs: list[JobRequirements],
           priorities: list[int] | None = None, rng: random.Random | None = None
           ) -> list[int]:
    """Add jobs and put them in their task queues (Received → Checking → Waiting)."""
    prios = priorities or [1] * len(reqs)
    ids = add_jobs(session, [NewJob("[Executable = \"x\"]", r, p)
                             for r, p in zip(reqs, prios, strict=True)], now=now)
    apply_transition(session, ids, JobStatus.RECEIVED, JobStatus.CHECKING,
                     minor_status="checks", source="test", now=now)
    enqueue_jobs(session, [QueueEntry(i, r, p) for i, r, p in zip(ids, reqs, prios, strict=True)],
                 settings, now=now, rng=rng)
    return ids


#: Set by the ``claim_entry`` fixture (tests/conftest.py): claim through the matcher's entry
#: point on this MatchDatabase instead of claim_jobs.
CLAIM_VIA: tuple[str, MatchDatabase] | None = None


def claim(session: Session, now: datetime, count: int = 1, rng: random.Random | None = None,
          expression_check: ExpressionCheck | None = None, **resource: Any) -> list[Claim]:
    """Claim jobs for a resource (vo lhcb, pilot-1 unless given): in ``session`` with
    claim_jobs, or, under the ``claim_entry`` fixture's "match_for_pilot", through
    taskqueue.pilots.pilotmatch in transactions of its own (``session`` must hold no change
    then)."""
    resource.setdefault("vo", "lhcb")
    resource.setdefault("pilot_reference", "pilot-1")
    if CLAIM_VIA is not None and CLAIM_VIA[0] == "match_for_pilot":
        assert not session.new and not session.dirty and not session.deleted
        return match_for_pilot(CLAIM_VIA[1], parse_resource(resource), now=now, count=count,
                               rng=rng, expression_check=expression_check).claims
    return claim_jobs(session, parse_resource(resource), now=now, count=count, rng=rng,
                      expression_check=expression_check)


def refusal(parse: Callable[[str], object], text: str) -> JobDescriptionError:
    """The error ``parse`` raises for ``text``: exactly a JobDescriptionError, nothing else."""
    try:
        parse(text)
    except Exception as exc:
        assert type(exc) is JobDescriptionError, (
            f"{type(exc).__name__} raised instead of JobDescriptionError: {exc}")
        return exc
    pytest.fail("accepted, but should have been refused")


#: The schema revision the migrations end at (tests that name it read it here).
HEAD_REVISION = "0042"


def write_token_file(path: Path, token: str) -> Path:
    """A pilot token file as the site director writes it: mode 0600, removed by the pilot."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(token + "\n")
    return path
