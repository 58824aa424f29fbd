"""Jobs per VO and status, and waiting jobs per task queue, kept by the database as they
change, so that the activity loop no longer counts the jobs table (2.7 s a turn at ten million
jobs) nor the task queues' job rows.

Triggers on ``jobs`` add a row to ``job_count_deltas`` for every INSERT of jobs and every
change of a job's status, and triggers on ``task_queue_jobs`` one to ``tq_waiting_deltas`` for
every job put in or taken out of a queue, in the writer's transaction: rows are only added, so
no two writers wait on each other. The activity loop folds them into ``job_status_totals`` and
``tq_waiting`` and deletes them (taskqueue.db.jobcounts). Deleting a job writes no row: a job the
purge removed still counts in its last status, as the dashboard counted it through
``purged_jobs`` before. On MariaDB a foreign key's cascade fires no trigger; the only task
queues ever deleted are empty ones.

- PostgreSQL: statement triggers with transition tables, so that a bulk submission or a bulk
  status change writes one row per (VO, status) or task queue it changed, not one per job.
- MariaDB and SQLite: row triggers (neither has transition tables).

The totals start as the jobs counted now plus those purged so far, and the queues' job rows
counted now. On PostgreSQL the counts and the triggers are made in one transaction that holds
off writes to both tables; on MariaDB, whose DDL commits at once, run this revision with the
service stopped, as every MariaDB migration.

Revision ID: 0028
Revises: 0027
Create Date: 2026-11-29 00:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0028"
down_revision: str | None = "0027"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_POSTGRESQL = (
    """CREATE FUNCTION gridpilot_count_new_jobs() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO job_count_deltas (vo, status, jobs)
    SELECT vo, status, count(*) FROM gridpilot_new_jobs GROUP BY vo, status;
    RETURN NULL;
END $fn$""",
    """CREATE FUNCTION gridpilot_count_changed_jobs() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO job_count_deltas (vo, status, jobs)
    SELECT vo, status, sum(n) FROM (
        SELECT vo, status, 1 AS n FROM gridpilot_new_jobs
        UNION ALL SELECT vo, status, -1 FROM gridpilot_old_jobs) AS changed
    GROUP BY vo, status HAVING sum(n) <> 0;
    RETURN NULL;
END $fn$""",
    """CREATE TRIGGER gridpilot_count_new_jobs AFTER INSERT ON jobs
    REFERENCING NEW TABLE AS gridpilot_new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION gridpilot_count_new_jobs()""",
    """CREATE TRIGGER gridpilot_count_changed_jobs AFTER UPDATE ON jobs
    REFERENCING OLD TABLE AS gridpilot_old_jobs NEW TABLE AS gridpilot_new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION gridpilot_count_changed_jobs()""",
)
_POSTGRESQL_QUEUED = (
    """CREATE FUNCTION gridpilot_count_queued_jobs() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO tq_waiting_deltas (tq_id, jobs)
    SELECT tq_id, count(*) FROM gridpilot_queued GROUP BY tq_id;
    RETURN NULL;
END $fn$""",
    """CREATE FUNCTION gridpilot_count_unqueued_jobs() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO tq_waiting_deltas (tq_id, jobs)
    SELECT tq_id, -count(*) FROM gridpilot_unqueued GROUP BY tq_id;
    RETURN NULL;
END $fn$""",
    """CREATE FUNCTION gridpilot_count_requeued_jobs() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO tq_waiting_deltas (tq_id, jobs)
    SELECT tq_id, sum(n) FROM (
        SELECT tq_id, 1 AS n FROM gridpilot_queued
        UNION ALL SELECT tq_id, -1 FROM gridpilot_unqueued) AS moved
    GROUP BY tq_id HAVING sum(n) <> 0;
    RETURN NULL;
END $fn$""",
    """CREATE TRIGGER gridpilot_count_queued_jobs AFTER INSERT ON task_queue_jobs
    REFERENCING NEW TABLE AS gridpilot_queued
    FOR EACH STATEMENT EXECUTE FUNCTION gridpilot_count_queued_jobs()""",
    """CREATE TRIGGER gridpilot_count_unqueued_jobs AFTER DELETE ON task_queue_jobs
    REFERENCING OLD TABLE AS gridpilot_unqueued
    FOR EACH STATEMENT EXECUTE FUNCTION gridpilot_count_unqueued_jobs()""",
    """CREATE TRIGGER gridpilot_count_requeued_jobs AFTER UPDATE ON task_queue_jobs
    REFERENCING OLD TABLE AS gridpilot_unqueued NEW TABLE AS gridpilot_queued
    FOR EACH STATEMENT EXECUTE FUNCTION gridpilot_count_requeued_jobs()""",
)
_MARIADB = (
    """CREATE TRIGGER gridpilot_count_new_jobs AFTER INSERT ON jobs FOR EACH ROW
    INSERT INTO job_count_deltas (vo, status, jobs) VALUES (NEW.vo, NEW.status, 1)""",
    """CREATE TRIGGER gridpilot_count_changed_jobs AFTER UPDATE ON jobs FOR EACH ROW
    IF NEW.status <> OLD.status THEN
        INSERT INTO job_count_deltas (vo, status, jobs)
        VALUES (OLD.vo, OLD.status, -1), (NEW.vo, NEW.status, 1);
    END IF""",
)
_MARIADB_QUEUED = (
    """CREATE TRIGGER gridpilot_count_queued_jobs AFTER INSERT ON task_queue_jobs FOR EACH ROW
    INSERT INTO tq_waiting_deltas (tq_id, jobs) VALUES (NEW.tq_id, 1)""",
    """CREATE TRIGGER gridpilot_count_unqueued_jobs AFTER DELETE ON task_queue_jobs FOR EACH ROW
    INSERT INTO tq_waiting_deltas (tq_id, jobs) VALUES (OLD.tq_id, -1)""",
    """CREATE TRIGGER gridpilot_count_requeued_jobs AFTER UPDATE ON task_queue_jobs FOR EACH ROW
    IF NEW.tq_id <> OLD.tq_id THEN
        INSERT INTO tq_waiting_deltas (tq_id, jobs) VALUES (OLD.tq_id, -1), (NEW.tq_id, 1);
    END IF""",
)
_SQLITE = (
    """CREATE TRIGGER gridpilot_count_new_jobs AFTER INSERT ON jobs FOR EACH ROW
    BEGIN INSERT INTO job_count_deltas (vo, status, jobs) VALUES (NEW.vo, NEW.status, 1); END""",
    """CREATE TRIGGER gridpilot_count_changed_jobs AFTER UPDATE OF status ON jobs FOR EACH ROW
    WHEN NEW.status IS NOT OLD.status
    BEGIN INSERT INTO job_count_deltas (vo, status, jobs)
          VALUES (OLD.vo, OLD.status, -1), (NEW.vo, NEW.status, 1); END""",
)
_SQLITE_QUEUED = (
    """CREATE TRIGGER gridpilot_count_queued_jobs AFTER INSERT ON task_queue_jobs FOR EACH ROW
    BEGIN INSERT INTO tq_waiting_deltas (tq_id, jobs) VALUES (NEW.tq_id, 1); END""",
    """CREATE TRIGGER gridpilot_count_unqueued_jobs AFTER DELETE ON task_queue_jobs FOR EACH ROW
    BEGIN INSERT INTO tq_waiting_deltas (tq_id, jobs) VALUES (OLD.tq_id, -1); END""",
    """CREATE TRIGGER gridpilot_count_requeued_jobs AFTER UPDATE OF tq_id ON task_queue_jobs
    FOR EACH ROW WHEN NEW.tq_id IS NOT OLD.tq_id
    BEGIN INSERT INTO tq_waiting_deltas (tq_id, jobs)
          VALUES (OLD.tq_id, -1), (NEW.tq_id, 1); END""",
)
_TRIGGERS = {"postgresql": _POSTGRESQL + _POSTGRESQL_QUEUED,
             "mysql": _MARIADB + _MARIADB_QUEUED, "mariadb": _MARIADB + _MARIADB_QUEUED,
             "sqlite": _SQLITE + _SQLITE_QUEUED}
#: (trigger, its table) of every trigger above.
_NAMES = (("gridpilot_count_new_jobs", "jobs"), ("gridpilot_count_changed_jobs", "jobs"),
          ("gridpilot_count_queued_jobs", "task_queue_jobs"),
          ("gridpilot_count_unqueued_jobs", "task_queue_jobs"),
          ("gridpilot_count_requeued_jobs", "task_queue_jobs"))


def upgrade() -> None:
    op.create_table(
        "job_count_deltas",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False,
                  autoincrement=True),
        sa.Column("vo", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("jobs", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_count_deltas")),
    )
    op.create_table(
        "job_status_totals",
        sa.Column("vo", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("jobs", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("vo", "status", name=op.f("pk_job_status_totals")),
    )
    op.create_table(
        "tq_waiting_deltas",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False,
                  autoincrement=True),
        sa.Column("tq_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  nullable=False),
        sa.Column("jobs", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tq_waiting_deltas")),
    )
    op.create_table(
        "tq_waiting",
        sa.Column("tq_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  nullable=False, autoincrement=False),
        sa.Column("jobs", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("tq_id", name=op.f("pk_tq_waiting")),
    )
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        op.execute("LOCK TABLE jobs, task_queue_jobs IN SHARE ROW EXCLUSIVE MODE")
    for statement in _TRIGGERS[bind.dialect.name]:
        op.execute(statement)
    op.execute("""INSERT INTO job_status_totals (vo, status, jobs)
        SELECT vo, status, sum(n) FROM (
            SELECT vo, status, count(*) AS n FROM jobs GROUP BY vo, status
            UNION ALL SELECT vo, status, jobs FROM purged_jobs) AS counted
        GROUP BY vo, status""")
    op.execute("""INSERT INTO tq_waiting (tq_id, jobs)
        SELECT tq_id, count(*) FROM task_queue_jobs GROUP BY tq_id""")


def downgrade() -> None:
    postgresql = op.get_bind().dialect.name == "postgresql"
    for name, table in _NAMES:
        op.execute(f"DROP TRIGGER IF EXISTS {name}" + (f" ON {table}" if postgresql else ""))
        if postgresql:
            op.execute(f"DROP FUNCTION IF EXISTS {name}()")
    op.drop_table("tq_waiting")
    op.drop_table("tq_waiting_deltas")
    op.drop_table("job_status_totals")
    op.drop_table("job_count_deltas")
