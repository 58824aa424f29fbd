"""What is MariaDB's own in the claim procedure gridpilot_claim (migration 0015).

MariaDB has no arrays, so the pilot's lists travel as JSON text: a label holding commas,
quotes, backslashes, brackets, JSON-looking text or non-ASCII characters must neither break the
call nor match another label. The procedure runs its own transaction, which must be rolled
back whole when it fails. A CALL answers with several result sets, which must all be read for
the pooled connection (returned without a reset) to serve the next call.

The matching rules themselves, through taskqueue.pilots.pilotmatch.match_for_pilot, are tested on
every backend elsewhere. These tests are parametrised over the MariaDB backend alone, so that
they are not collected for SQLite or PostgreSQL; without a MariaDB server the module is
skipped with that reason (conftest makes a missing server an error when servers are required).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from sqlalchemy import select, text

from taskqueue.core.errors import ConflictError, DatabaseUnavailableError
from taskqueue.core.resources import parse_resource
from taskqueue.core.settings import Settings
from taskqueue.db.database import make_engine
from taskqueue.db.models import jobs_table, task_queues_table, tq_jobs_table
from taskqueue.matching.limits import ban_site
from taskqueue.pilots.pilotmatch import MatchDatabase, match_for_pilot
from tests.conftest import BACKENDS, Database
from tests.helpers import requirements, submit

if "mariadb" not in BACKENDS:
    pytest.skip("the MariaDB claim procedure needs a MariaDB server: "
                "GRIDPILOT_TEST_MARIADB_URL is not set", allow_module_level=True)

pytestmark = pytest.mark.parametrize("database", ["mariadb"], indirect=True)

#: Labels that a list encoding could break: separators, quotes, escapes, brackets, JSON text,
#: non-ASCII, and prefixes/parts of one another.
HOSTILE = ["a,b", "a", "b", '"q"', "it's", "back\\slash", "back\\\\two", "[x]", '["a"]',
           '{"k": [1, "a"]}', "null", "ünï©ødé", "数据", "smile 😀", "%_*", "a;b|c"]


@pytest.fixture()
def match_db(db: Database) -> Iterator[MatchDatabase]:
    """The matcher's databases: sessions, and an autocommit engine of one pooled connection
    (so that consecutive calls share it)."""
    engine = make_engine(db.url, pool_size=1, autocommit=True)
    try:
        yield MatchDatabase(db.factory, engine)
    finally:
        engine.dispose()


def _match(match_db: MatchDatabase, now: datetime, count: int = 1, **resource: Any) -> list[int]:
    answer = match_for_pilot(match_db, parse_resource({"vo": "lhcb", **resource}), now=now,
                             count=count)
    return [job.id for job in answer.jobs]


def test_hostile_labels_match_themselves_only(db: Database, match_db: MatchDatabase,
                                              settings: Settings, now: datetime) -> None:
    with db.factory.begin() as s:
        ids = submit(s, settings, now, [requirements(sites=[label], platforms=[label],
                                                     tags=[label], ces=[label])
                                        for label in HOSTILE])
    by_label = dict(zip(HOSTILE, ids, strict=True))
    for label in HOSTILE:
        got = _match(match_db, now, count=3, site=label, platform=label, tags=[label],
                     required_tags=[label], ce=label, pilot_reference=f"p-{label}")
        assert got == [by_label[label]], label
    with db.factory() as s:
        rows = s.execute(select(jobs_table.c.id, jobs_table.c.site, jobs_table.c.ce,
                                jobs_table.c.pilot_reference, jobs_table.c.status)).all()
    assert {row.id: (row.site, row.ce, row.pilot_reference, row.status) for row in rows} == {
        by_label[label]: (label, label, f"p-{label}", "Matched") for label in HOSTILE}


def test_a_label_list_offers_each_label_and_nothing_else(
        db: Database, match_db: MatchDatabase, settings: Settings, now: datetime) -> None:
    """Several labels in one list: each is offered as itself (a pilot offering "a,b" and
    "[x]" serves neither "a" nor "b" nor "x"), and a tag the list lacks keeps a queue out."""
    offered = ["a,b", "[x]", '"q"', "ünï©ødé"]
    with db.factory.begin() as s:
        wanted = submit(s, settings, now, [requirements(tags=[label], job_type=label)
                                           for label in offered])
        submit(s, settings, now, [requirements(tags=[label], job_type=label)
                                  for label in ("a", "b", "x", "q", '"q",', "a,b,c")])
        submit(s, settings, now, [requirements(tags=["a,b", "missing"], job_type="a,b")])
    got = _match(match_db, now, count=20, tags=offered, job_type=offered)
    assert sorted(got) == sorted(wanted)


def test_banned_sites_are_reported_by_their_names(db: Database, match_db: MatchDatabase,
                                                  settings: Settings, now: datetime) -> None:
    sites = ["CERN, \"main\"", "x\\y"]
    with db.factory.begin() as s:
        submit(s, settings, now, [requirements()])
        for site in sites:
            ban_site(s, "lhcb", site, reason="test", by="admin", now=now)
    answer = match_for_pilot(match_db, parse_resource({"vo": "lhcb", "site": sites}), now=now)
    assert answer.jobs == []
    assert answer.detail == f"site {', '.join(sorted(sites))} is banned for VO lhcb"


def test_a_failed_claim_rolls_back_whole(db: Database, match_db: MatchDatabase,
                                         settings: Settings, now: datetime) -> None:
    """A job still in its queue but no longer Waiting stops the claim with a conflict naming
    it; the job's queue entry, the queue's clock and the history are as before."""
    with db.factory.begin() as s:
        (job_id,) = submit(s, settings, now, [requirements()])
        s.execute(jobs_table.update().where(jobs_table.c.id == job_id)
                  .values(status="Killed"))
    before = _state(db, job_id)
    with pytest.raises(ConflictError, match=f"job {job_id} was waiting in task queue"):
        _match(match_db, now)
    assert _state(db, job_id) == before
    assert before[0] == [job_id]


def _state(db: Database, job_id: int) -> tuple[Any, ...]:
    with db.factory() as s:
        entries = list(s.scalars(select(tq_jobs_table.c.job_id)))
        clocks = s.execute(select(task_queues_table.c.draw_key, task_queues_table.c.draw_clock,
                                  task_queues_table.c.active)).all()
        history = s.execute(text("SELECT status FROM job_status_history WHERE job_id = :j "
                                 "ORDER BY id"), {"j": job_id}).scalars().all()
        status = s.scalar(select(jobs_table.c.status).where(jobs_table.c.id == job_id))
    return entries, clocks, history, status


def test_the_pooled_connection_serves_the_next_call(db: Database, match_db: MatchDatabase,
                                                    settings: Settings, now: datetime) -> None:
    """Claims, a conflict and an empty answer in turn on the one pooled connection: each
    call finds it clean (every result set read, no transaction left open)."""
    assert match_db.autocommit is not None
    with match_db.autocommit.connect() as conn:
        first = conn.execute(text("SELECT CONNECTION_ID()")).scalar_one()
    with db.factory.begin() as s:
        ids = submit(s, settings, now, [requirements() for _ in range(3)])
    assert _match(match_db, now) == ids[:1]
    assert _match(match_db, now, count=5) == ids[1:]
    assert _match(match_db, now) == []
    with db.factory.begin() as s:
        (late,) = submit(s, settings, now, [requirements()])
        s.execute(jobs_table.update().where(jobs_table.c.id == late).values(status="Killed"))
    with pytest.raises(ConflictError):
        _match(match_db, now)
    with match_db.autocommit.connect() as conn:
        assert conn.execute(text("SELECT CONNECTION_ID()")).scalar_one() == first
        assert conn.execute(text("SELECT @@in_transaction")).scalar_one() == 0


def test_a_hung_database_is_unavailable_not_a_hang(db: Database, settings: Settings,
                                                   now: datetime) -> None:
    """A table held by another session: the call stops at the statement timeout, claims
    nothing, and the pool's next connection serves the next call."""
    with db.factory.begin() as s:
        (job,) = submit(s, settings, now, [requirements()])
    quick = make_engine(db.url, pool_size=1, autocommit=True, statement_timeout=1.0)
    matches = MatchDatabase(db.factory, quick)
    blocker = db.engine.connect()
    try:
        blocker.exec_driver_sql("LOCK TABLES task_queue_jobs WRITE")
        with pytest.raises(DatabaseUnavailableError):
            _match(matches, now)
    finally:
        blocker.exec_driver_sql("UNLOCK TABLES")
        blocker.close()
    before = _state(db, job)
    assert before[0] == [job] and before[3] == "Waiting" and "Matched" not in before[2]
    assert _match(matches, now) == [job]
    quick.dispose()


def test_a_dropped_connection_is_replaced(db: Database, settings: Settings,
                                          now: datetime) -> None:
    with db.factory.begin() as s:
        ids = submit(s, settings, now, [requirements()] * 2)
    engine = make_engine(db.url, pool_size=1, autocommit=True)
    matches = MatchDatabase(db.factory, engine)
    assert _match(matches, now) == ids[:1]
    with engine.connect() as conn:
        connection_id = conn.execute(text("SELECT CONNECTION_ID()")).scalar_one()
    with db.engine.begin() as conn:
        conn.exec_driver_sql(f"KILL {int(connection_id)}")
    with pytest.raises(DatabaseUnavailableError):
        _match(matches, now)
    assert _match(matches, now) == ids[1:]  # a new connection, nothing lost
    engine.dispose()
