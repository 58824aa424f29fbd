"""PostgreSQL: the change of a job's status is counted by a row trigger that only a changed
status (or VO) calls, no longer by a statement trigger that every UPDATE of jobs fires.

0028's ``AFTER UPDATE ON jobs`` statement trigger built and scanned its two transition tables
for every UPDATE of jobs, a heartbeat's too. ``AFTER UPDATE OF status, vo ... FOR EACH ROW
WHEN (...)`` is not even considered for an UPDATE that sets neither column (a heartbeat), and
its ``WHEN`` is evaluated without calling PL/pgSQL, so a row whose status stays writes nothing;
a row whose status changes writes two delta rows, as on MariaDB and SQLite. Measured with
bench/count_triggers.py (backend CPU, interleaved, ten rounds): a claim 3% less (median; -2 to
7%; no UPDATE trigger at all would save 6%: the cost is the INSERT of delta rows, not the
transition tables), a heartbeat 8 to 17% less, a bulk kill of 1,000 jobs 12 to 19% more (10 to
15 us a job: 2,000 delta rows instead of 2). Claims and heartbeats are what a grid does all
day; bulk changes are an operator's occasional act.

The INSERT of jobs keeps its statement trigger (a bulk submission writes one row per VO and
status), and the trigger and its function keep their names (0028's downgrade drops them).
MariaDB's and SQLite's triggers are row triggers already (SQLite's ``AFTER UPDATE OF status``
with ``WHEN``; MariaDB's ``IF`` writes nothing for an unchanged status): nothing changes there.

Revision ID: 0041
Revises: 0040
Create Date: 2026-12-07 02:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0041"
down_revision: str | None = "0040"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ROW = (
    "DROP TRIGGER gridpilot_count_changed_jobs ON jobs",
    "DROP FUNCTION gridpilot_count_changed_jobs()",
    """CREATE FUNCTION gridpilot_count_changed_jobs() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO job_count_deltas (vo, status, jobs)
    VALUES (OLD.vo, OLD.status, -1), (NEW.vo, NEW.status, 1);
    RETURN NULL;
END $fn$""",
    """CREATE TRIGGER gridpilot_count_changed_jobs AFTER UPDATE OF status, vo ON jobs
    FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.vo IS DISTINCT FROM NEW.vo)
    EXECUTE FUNCTION gridpilot_count_changed_jobs()""",
)
#: 0028's statement trigger.
_STATEMENT = (
    "DROP TRIGGER gridpilot_count_changed_jobs ON jobs",
    "DROP FUNCTION gridpilot_count_changed_jobs()",
    """CREATE FUNCTION gridpilot_count_changed_jobs() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO job_count_deltas (vo, status, jobs)
    SELECT vo, status, sum(n) FROM (
        SELECT vo, status, 1 AS n FROM gridpilot_new_jobs
        UNION ALL SELECT vo, status, -1 FROM gridpilot_old_jobs) AS changed
    GROUP BY vo, status HAVING sum(n) <> 0;
    RETURN NULL;
END $fn$""",
    """CREATE TRIGGER gridpilot_count_changed_jobs AFTER UPDATE ON jobs
    REFERENCING OLD TABLE AS gridpilot_old_jobs NEW TABLE AS gridpilot_new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION gridpilot_count_changed_jobs()""",
)


def _replace(statements: Sequence[str]) -> None:
    """PostgreSQL only: the trigger is swapped in one transaction (DDL is transactional
    there), so no status change falls between the two triggers."""
    if op.get_bind().dialect.name != "postgresql":
        return
    for statement in statements:
        op.execute(statement)


def upgrade() -> None:
    _replace(_ROW)


def downgrade() -> None:
    _replace(_STATEMENT)
