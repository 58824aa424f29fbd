"""Pilots that found nothing are judged by the work that was there when they asked (issue 34
item 5), on every backend, through the matcher's API: 10 pilots for 10 jobs and 10 more that
find nothing because the first took every job (an overshoot) do not flag their queue; pilots
whose own description misses the work their queue has still do."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from flask import Flask
from sqlalchemy import select

from matcher.runtime import runtime_of
from optimizers.queueresources import queue_resource_data
from taskqueue.db.models import Pilot
from taskqueue.pilots.records import (
    idle_pilot_streak,
    record_new_pilots,
    record_submission,
    set_pilot_status,
)
from tests.api.conftest import TokenMaker
from tests.api.helpers import VO, Api
from tests.conftest import Database

DEMO = ("DIRAC.Demo.local", "localhost", "local")
JOBS = 10


def _director_pilots(db: Database, n: int, now: datetime) -> list[str]:
    """``n`` pilots of the demo queue as the site director records them, taken by its CE."""
    refs = [f"local-{i:04d}" for i in range(n)]
    with db.factory.begin() as s:
        record_new_pilots(s, VO, *DEMO, "local", refs, now=now)
        for ref in refs:
            record_submission(s, ref, f"native-{ref}", now=now)
    return refs


def _ask(client: Api, app: Flask, token: TokenMaker, ref: str, **changes: Any
         ) -> dict[str, Any]:
    """The pilot registers (it reached the matcher) and asks for a job with the description
    its queue gives it, changed by ``changes``."""
    pilot = token(ref, "pilot", group="lhcb_pilot", site=DEMO[0], pilot=ref)
    client.ok("PUT", f"/api/v1/pilots/{ref}", pilot,
              json_body={"site": DEMO[0], "ce": DEMO[1], "queue": DEMO[2],
                         "status": "Running"})
    resource = queue_resource_data(runtime_of(app).resources(), *DEMO, VO,
                                   pilot_reference=ref)
    return client.match(pilot, **{**resource, **changes})


def _end(db: Database, refs: list[str], now: datetime) -> None:
    """The pilots end, one after the other, in the order given."""
    for i, ref in enumerate(refs):
        with db.factory.begin() as s:
            assert set_pilot_status(s, reference=ref, status="Done",
                                    now=now + timedelta(seconds=i + 1))


def _missed(db: Database) -> dict[str, bool | None]:
    with db.factory() as s:
        return {p.reference: p.missed_work for p in s.scalars(select(Pilot))}


def test_an_overshoot_does_not_flag_the_queue(client: Api, app: Flask, token: TokenMaker,
                                              user_token: str, db: Database,
                                              now: datetime) -> None:
    client.submit_jdl(user_token, f'Executable = "/bin/hostname"; CPUTime = 300; '
                      f'Site = "{DEMO[0]}"; Parameters = {JOBS};')
    refs = _director_pilots(db, 2 * JOBS, now)
    workers, extra = refs[:JOBS], refs[JOBS:]
    for ref in workers:
        assert len(_ask(client, app, token, ref)["jobs"]) == 1
    for ref in extra:
        answer = _ask(client, app, token, ref)
        assert answer["jobs"] == [] and answer["no_match"]["reason"] == "no_matching_job", answer
    # The workers end first; the last pilots of the queue to end found nothing.
    _end(db, workers + extra, now)
    missed = _missed(db)
    assert [missed[r] for r in extra] == [False] * JOBS
    assert [missed[r] for r in workers] == [None] * JOBS
    with db.factory() as s:
        assert idle_pilot_streak(s, *DEMO, length=JOBS) == 0


def test_pilots_whose_description_misses_the_work_flag_the_queue(
        client: Api, app: Flask, token: TokenMaker, user_token: str, db: Database,
        now: datetime) -> None:
    client.submit_jdl(user_token, f'Executable = "/bin/hostname"; CPUTime = 300; '
                      f'Site = "{DEMO[0]}"; Parameters = {JOBS};')
    refs = _director_pilots(db, JOBS, now)
    for ref in refs:
        # The node gives the pilot far less time than its queue says: no job fits.
        answer = _ask(client, app, token, ref, cpu_time=10)
        assert answer["jobs"] == [], answer
    _end(db, refs, now)
    assert set(_missed(db).values()) == {True}
    with db.factory() as s:
        assert idle_pilot_streak(s, *DEMO, length=JOBS) == JOBS
