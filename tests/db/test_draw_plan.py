"""The draw's plan: a walk in draw order with a probe per queue, never a pass over every queue.

Planners like to answer a correlated EXISTS for all queues at once: PostgreSQL as a hashed
subplan, MariaDB by turning it into IN and materialising it. Either reads a whole value table
(every site, platform or tag row of every queue) for each claim, although the walk in draw order
stops after a few queues; that is what made a claim cost 65 ms at 100,000 queues. These tests
read the plans the servers choose (no timing), for the shapes a pilot sends.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from sqlalchemy import event

from taskqueue.core.resources import Resource, parse_resource
from taskqueue.core.settings import Settings
from taskqueue.matching.claim import _shape, _statements, claim_jobs, condition_parameters
from tests.conftest import Database
from tests.helpers import requirements, submit

RESOURCES = {
    "site, platform, CE and tags": {"vo": "lhcb", "site": "LCG.CERN.cern", "ce": "ce1.cern.ch",
                                    "platform": "EL9", "cpu_time": 86400, "tags": ["SSD"]},
    "with a required tag": {"vo": "lhcb", "site": "LCG.CERN.cern", "platform": "EL9",
                            "tags": ["GPU", "SSD"], "required_tags": ["GPU"]},
}


def _plan(db: Database, resource: Resource) -> list[str]:
    """The server's EXPLAIN of the first page of the walk, one string per line or row."""
    statement = _statements(_shape(resource, True), db.engine.dialect.name).first_page
    prefix = "EXPLAIN " if db.backend == "postgresql" else "EXPLAIN EXTENDED "

    def explain(conn: Any, cursor: Any, sql: str, parameters: Any, context: Any,
                executemany: bool) -> tuple[str, Any]:
        return prefix + sql, parameters

    with db.engine.connect() as conn:
        event.listen(conn, "before_cursor_execute", explain, retval=True)
        try:
            rows = conn.execute(statement, condition_parameters(resource)).cursor.fetchall()
        finally:
            event.remove(conn, "before_cursor_execute", explain)
    return [" | ".join(str(value) for value in row) for row in rows]


@pytest.mark.parametrize("name", sorted(RESOURCES))
def test_the_checks_of_a_queue_are_probes_of_that_queue(db: Database, settings: Settings,
                                                        now: datetime, name: str) -> None:
    if not db.is_server:
        pytest.skip("SQLite runs correlated subqueries per row")
    with db.factory.begin() as session:  # queues with sites, platforms and tags to look at
        submit(session, settings, now, [
            requirements(sites=[site], platforms=[platform], tags=tags, cpu_time=3600 * hours)
            for site in ("LCG.CERN.cern", "LCG.RAL.uk") for platform in ("EL9", "EL8")
            for tags in ([], ["GPU"], ["SSD"]) for hours in (1, 24)])
    plan = _plan(db, parse_resource(RESOURCES[name]))
    assert plan
    if db.backend == "postgresql":
        assert not [line for line in plan if "hashed SubPlan" in line], plan
        assert not [line for line in plan if "Sort" in line], plan
    else:
        kinds = {line.split(" | ")[1] for line in plan}
        assert kinds <= {"PRIMARY", "DEPENDENT SUBQUERY"}, plan


def _claim_counting(db: Database, now: datetime, resource: dict[str, Any]
                    ) -> tuple[list[Any], list[str]]:
    """Claim for ``resource``; return the claims and the statements the claim ran."""
    ran: list[str] = []

    def count(conn: Any, cursor: Any, sql: str, parameters: Any, context: Any,
              executemany: bool) -> None:
        ran.append(sql)

    with db.factory.begin() as session:
        conn = session.connection()
        event.listen(conn, "before_cursor_execute", count)
        try:
            claims = claim_jobs(session, parse_resource(resource), now=now)
        finally:
            event.remove(conn, "before_cursor_execute", count)
    return claims, ran


def test_a_required_tag_no_queue_carries_answers_without_walking_the_queues(
        db: Database, settings: Settings, now: datetime) -> None:
    """A pilot requiring a tag that no active queue of its VO carries gets its empty answer
    from the tag index alone: the walk in draw order (which would read every queue of the VO
    for nothing) never runs. A queue of another VO carrying the tag does not count."""
    with db.factory.begin() as session:
        submit(session, settings, now, [requirements(tags=tags, cpu_time=3600 * hours)
                                        for tags in ([], ["SSD"]) for hours in (1, 24)]
               + [requirements(vo="atlas", owner_group="atlas_user", tags=["GPU"])])
    claims, ran = _claim_counting(db, now, {"vo": "lhcb", "tags": ["GPU", "SSD"],
                                            "required_tags": ["GPU"]})
    assert claims == []
    # The probe of the tag index, and nothing else: no statement walks in draw order.
    assert len(ran) == 1 and "draw_key" not in ran[0], ran
    claims, ran = _claim_counting(db, now, {"vo": "lhcb", "tags": ["SSD"],
                                            "required_tags": ["SSD"]})
    assert len(claims) == 1  # a carried tag walks on and matches
    assert len(ran) > 1
