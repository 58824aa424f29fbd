"""``gridpilot queues list`` (and the demo) show each task queue's share of its VO's draws,
not raw priorities whose scale means nothing to a reader."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select, update

from gridpilot.reports import draw_share, queue_table
from taskqueue.core.settings import Settings
from taskqueue.db.models import TaskQueue
from tests.conftest import Database
from tests.helpers import requirements, submit


def test_draw_share() -> None:
    assert (draw_share(1.0, 4.0), draw_share(5e-7, 4.0), draw_share(0.0, 4.0),
            draw_share(1.0, 0.0)) == ("25.00", "<0.01", "0.00", "-")


def test_the_table_shows_each_queues_share_of_draws(db: Database, settings: Settings,
                                                   now: datetime) -> None:
    with db.factory.begin() as s:
        submit(s, settings, now, [requirements(owner="alice", cpu_time=100)] * 3
               + [requirements(owner="alice", cpu_time=90000)]
               + [requirements(owner="bob", cpu_time=100)])
        queues = sorted(s.scalars(select(TaskQueue.id)))
        for tq_id, priority in zip(queues, (3.0, 1.0, 5e-7), strict=True):
            s.execute(update(TaskQueue).where(TaskQueue.id == tq_id).values(priority=priority))
    with db.factory() as s:
        text = queue_table(s, 10)
    lines = text.splitlines()
    assert lines[0].split()[-3:] == ["draws", "%", "conditions"]
    shares = {int(line.split()[0]): line.split()[-1] for line in lines[1:-1]}  # no conditions
    assert shares == {queues[0]: "75.00", queues[1]: "25.00", queues[2]: "<0.01"}
    assert "draws %: the share of matches" in lines[-1]
