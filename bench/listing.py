"""Job listings over millions of jobs: the plan and the time of each listing the API and the
client make (taskqueue.queues.jobs.find_jobs and count_jobs_by_status), on PostgreSQL.

    .venv/bin/python bench/listing.py --url postgresql+psycopg://postgres@127.0.0.1:5432/test

Makes its own database, fills it with --jobs jobs of 1,000 owners (most of them Done, as on a
live service) in one INSERT ... SELECT, then runs each listing's statement under EXPLAIN
(ANALYZE, BUFFERS) and prints one JSON line per listing: its time, the rows read and the
plan's first lines (which index it used).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from kit import fresh_database
from sqlalchemy import event, text
from sqlalchemy.orm import Session

from taskqueue.db.database import make_engine
from taskqueue.queues.jobs import JobFilter, count_jobs_by_status, find_jobs

_HERE = Path(__file__).resolve().parent

FILL = """
INSERT INTO jobs (vo, owner, owner_group, status, minor_status, description,
                  description_format, job_type, user_priority, cpu_time, processors, memory,
                  site, submitted_at, reschedule_count, job_name, job_group)
SELECT 'lhcb', 'user' || (i % 1000), 'lhcb_user',
       CASE WHEN i % 100 = 0 THEN 'Running' WHEN i % 50 = 0 THEN 'Waiting'
            WHEN i % 33 = 0 THEN 'Failed' ELSE 'Done' END,
       '', '[Executable = "x"]', 'jdl', 'User', 1, 3600, 1, 0,
       CASE WHEN i % 3 = 0 THEN 'LCG.CERN.cern' ELSE 'LCG.RAL.uk' END,
       :start + i * interval '1 second', 0, 'job-' || i, 'grp-' || (i / 5000)
FROM generate_series(1, :n) AS i
"""


def listings(n: int, start: datetime) -> dict[str, Callable[[Session], Any]]:
    vo = "lhcb"
    recent = start + timedelta(seconds=n - 3600)
    return {
        "user, newest first": lambda s: find_jobs(s, JobFilter(vo, owner="user7"),
                                                  before=2**63 - 1, limit=100),
        "user, Running": lambda s: find_jobs(s, JobFilter(vo, owner="user7", status="Running"),
                                             before=2**63 - 1, limit=100),
        "user, second page": lambda s: find_jobs(s, JobFilter(vo, owner="user7"),
                                                 before=n // 2, limit=100),
        "user, since an hour": lambda s: find_jobs(s, JobFilter(vo, owner="user7",
                                                                since=recent),
                                                   before=2**63 - 1, limit=100),
        "group": lambda s: find_jobs(s, JobFilter(vo, job_group="grp-42"), limit=100),
        "name prefix": lambda s: find_jobs(s, JobFilter(vo, job_name="job-12345*"), limit=100),
        "site, Running": lambda s: find_jobs(s, JobFilter(vo, site="LCG.CERN.cern",
                                                          status="Running"), limit=100),
        "VO, Waiting": lambda s: find_jobs(s, JobFilter(vo, status="Waiting"), limit=100),
        "summary, user": lambda s: count_jobs_by_status(s, JobFilter(vo, owner="user7")),
        "summary, group": lambda s: count_jobs_by_status(s, JobFilter(vo, job_group="grp-42")),
        "summary, user since an hour": lambda s: count_jobs_by_status(
            s, JobFilter(vo, owner="user7", since=recent)),
        "summary, VO": lambda s: count_jobs_by_status(s, JobFilter(vo)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="a PostgreSQL server's SQLAlchemy URL")
    parser.add_argument("--jobs", type=int, default=1_000_000)
    args = parser.parse_args()
    with fresh_database(args.url, prefix="gp_bench_listing") as db:
        engine = make_engine(db.url)
        start = datetime(2026, 1, 1, tzinfo=UTC)
        t0 = time.perf_counter()
        with engine.begin() as conn:
            conn.execute(text(FILL), {"n": args.jobs, "start": start.replace(tzinfo=None)})
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE jobs"))
        print(json.dumps({"fill": args.jobs, "seconds": round(time.perf_counter() - t0, 1)}))
        captured: list[tuple[str, Any]] = []

        def capture(conn: Any, cursor: Any, statement: str, params: Any, context: Any,
                    executemany: bool) -> None:
            captured.append((statement, params))

        for label, listing in listings(args.jobs, start).items():
            with Session(engine) as session:
                event.listen(engine, "before_cursor_execute", capture)
                try:
                    found = listing(session)
                finally:
                    event.remove(engine, "before_cursor_execute", capture)
                statement, params = captured[-1]
                plan = [row[0] for row in session.connection().exec_driver_sql(
                    "EXPLAIN (ANALYZE, BUFFERS) " + statement, params)]
            took = next((line for line in plan if line.startswith("Execution Time")), "")
            print(json.dumps({"listing": label, "rows": len(found),
                              "execution": took.removeprefix("Execution Time: "),
                              "plan": [line.strip() for line in plan[:4]]}))
        engine.dispose()


if __name__ == "__main__":
    main()
