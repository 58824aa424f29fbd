"""Dashboard benchmark: the time of each /ui/ page over a large grid.

A fresh database (``gp_bench_*`` on the server ``--url`` names, dropped at the end unless
``--keep``) is migrated and filled in bulk by SQL (generate_series on PostgreSQL, the SEQUENCE
engine's ``seq_1_to_N`` on MariaDB): ``--jobs`` jobs over seven days in every status (30 %
waiting in ``--queues`` task queues, running and ended ones at the sites of
conf/resources.toml), their status history (Received, Checking, Waiting, then Matched, Running
and the end), ``--pilots`` pilot records, a banned site and site limits. The activity loop runs
once (its time is printed too) and the planner statistics are refreshed.

Then each page is fetched ``--repeat`` times through the Flask test client (in this process:
the whole request, sign-in cookie, SQL, rendering; no network) with an operator's session, and
one JSON line per page gives its median, best and worst time in ms and whether the median is
within ``--target-ms``. With ``--explain``, each page's three slowest statements are printed
(stderr) with their plans (EXPLAIN ANALYZE on PostgreSQL, ANALYZE on MariaDB). Run from the
repository root::

    .venv/bin/python bench/dashboard.py --url postgresql+psycopg://postgres@127.0.0.1:5432/test
    .venv/bin/python bench/dashboard.py --url mysql+pymysql://root@127.0.0.1:3306/test --explain

The machine's other load is printed first (load average and the CPU time other processes used
during the run), since page times on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kit import emit, fresh_database, log, machine_cpu_seconds, postgres_default, url_option
from sqlalchemy import Engine, event, text

from matcher.app import create_app
from matcher.auth import issue_token
from matcher.dashboard import session as cookies
from matcher.runtime import runtime_of
from optimizers.resources import load_resources
from taskqueue.core.settings import Settings
from taskqueue.db.database import make_engine, make_session_factory
from taskqueue.pilots.activity import record_activity

_HERE = Path(__file__).resolve().parent

ROOT = _HERE.parent
SECRET = "dashboard-benchmark-secret-0123456789"
GROUPS = ("lhcb_user", "lhcb_prod", "lhcb_mc", "lhcb_calib", "lhcb_data", "lhcb_lumi",
          "lhcb_ana1", "lhcb_ana2", "lhcb_ana3", "lhcb_test")
SEGMENTS = (360, 1800, 3600, 21600, 43200, 86400, 172800, 259200, 345600, 518400, 691200,
            864000, 1080000)
WEEK = 7 * 86400

class Sql:
    """The few expressions that differ between PostgreSQL and MariaDB."""

    def __init__(self, dialect: str) -> None:
        self.pg = dialect == "postgresql"

    def numbers(self, n: int) -> str:
        return (f"generate_series(1, {n}) AS g(n)" if self.pg
                else f"(SELECT seq AS n FROM seq_1_to_{n}) AS g")

    def ago(self, seconds: str) -> str:
        """Now minus an integer expression of seconds, as naive UTC."""
        if self.pg:
            return f"(timezone('UTC', now()) - ({seconds}) * interval '1 second')"
        return f"(UTC_TIMESTAMP(6) - INTERVAL ({seconds}) SECOND)"

    def plus(self, column: str, seconds: int) -> str:
        if self.pg:
            return f"({column} + interval '{seconds} seconds')"
        return f"({column} + INTERVAL {seconds} SECOND)"

    def pick(self, values: Sequence[Any], index: str) -> str:
        """The ``index``-th of ``values`` (an SQL CASE)."""
        whens = " ".join(f"WHEN {i} THEN {_quote(v)}" for i, v in enumerate(values))
        return f"(CASE {index} {whens} END)"

    def text(self, *parts: str) -> str:
        return " || ".join(parts) if self.pg else f"CONCAT({', '.join(parts)})"

    def digits(self, expr: str) -> str:
        return f"CAST({expr} AS TEXT)" if self.pg else f"CAST({expr} AS CHAR)"

    def md5(self, expr: str) -> str:
        return f"md5({self.digits(expr)})"

    def named(self, prefix: str, expr: str) -> str:
        """``prefix`` followed by the digits of ``expr``."""
        return self.text(_quote(prefix), self.digits(expr))


def _quote(value: Any) -> str:
    return str(value) if isinstance(value, int) else "'" + str(value).replace("'", "''") + "'"


#: Each job's status by ``n % 100``: 30 % waiting, 6 % matched or running, 64 % ended.
STATUS = " ".join(f"WHEN n % 100 < {upper} THEN '{status}'" for upper, status in (
    (30, "Waiting"), (31, "Matched"), (35, "Running"), (36, "Stalled"), (85, "Done"),
    (93, "Failed"), (96, "Killed"), (100, "Done")))


def populate(engine: Engine, *, jobs: int, queues: int, pilots: int) -> dict[str, Any]:
    config = load_resources(ROOT / "conf" / "resources.toml")
    places = [(q.site, q.ce, q.name) for q in config.queues()]
    sql = Sql(engine.dialect.name)
    spacing = WEEK / jobs  # job n was submitted (jobs - n) * spacing seconds ago
    status = f"(CASE {STATUS} END)"
    place = f"(n % {len(places)})"
    sites, ces, names = (sql.pick([p[i] for p in places], place) for i in range(3))
    started = time.perf_counter()
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO task_queues (id, digest, vo, owner_group, owner, cpu_time, processors, "
            "memory, job_type, submit_pool, expression, priority, mean_job_priority, "
            "jobs_inserted, active, draw_key, created_at, emptied_at) "
            f"SELECT n, {sql.md5('n')}, CASE WHEN (n - 1) % 20 = 0 THEN 'belle' ELSE 'lhcb' END, "
            f"{sql.pick(GROUPS, '((n - 1) % 10)')}, "
            f"CASE WHEN (n - 1) % 10 = 1 THEN NULL ELSE {sql.named('user', '(n - 1) % 200')} "
            "END, "
            f"{sql.pick(SEGMENTS, '(n % 13)')}, {sql.pick((1, 1, 2, 8), '(n % 4)')}, "
            f"{sql.pick((0, 2048, 4096), '(n % 3)')}, "
            f"CASE WHEN n % 3 = 0 THEN 'MCSimulation' ELSE 'User' END, NULL, NULL, 1.0, 1.0, "
            f"100, 1, n * 0.001, {sql.ago('3600')}, NULL FROM {sql.numbers(queues)}"))
        conn.execute(text(
            f"INSERT INTO tq_sites (tq_id, value) SELECT n, {sites} "
            f"FROM {sql.numbers(queues)} WHERE n % 5 = 0"))
        conn.execute(text(
            f"INSERT INTO tq_tags (tq_id, value) SELECT n, 'MultiProcessor' "
            f"FROM {sql.numbers(queues)} WHERE n % 4 = 3"))
        log(f"{queues:,} task queues")
        conn.execute(text(
            "INSERT INTO jobs (id, vo, owner, owner_group, status, minor_status, description, "
            "description_format, bulk_index, job_type, user_priority, cpu_time, processors, "
            "memory, submit_pool, site, ce, pilot_reference, submitted_at, started_at, ended_at, "
            "heartbeat_at, reschedule_count, cpu_used, progress, exit_code, output_tail, "
            "job_name, job_group) "
            f"SELECT n, CASE WHEN n % 20 = 0 THEN 'belle' ELSE 'lhcb' END, "
            f"{sql.named('user', 'n % 200')}, "
            f"{sql.pick(GROUPS, '(n % 10)')}, {status}, "
            f"CASE WHEN {status} = 'Failed' THEN "
            f"{sql.named('Payload exited with code ', 'n % 7 + 1')} ELSE '' END, "
            "'[ Executable = \"/bin/sh\"; Arguments = \"-c true\"; ]', 'jdl', NULL, "
            "CASE WHEN n % 3 = 0 THEN 'MCSimulation' ELSE 'User' END, n % 5, 3600, 1, 0, NULL, "
            f"CASE WHEN n % 100 < 30 THEN NULL ELSE {sites} END, "
            f"CASE WHEN n % 100 < 30 THEN NULL ELSE {ces} END, "
            f"CASE WHEN n % 100 < 30 THEN NULL ELSE {sql.named('pilot-', f'n % {pilots} + 1')} "
            "END, "
            f"{sql.ago(f'({jobs} - n) * {spacing:.6f} + 700')}, NULL, NULL, NULL, 0, NULL, NULL, "
            f"NULL, NULL, {sql.named('task-', 'n % 1000')}, "
            f"{sql.named('campaign-', 'FLOOR(n / 5000)')} "
            f"FROM {sql.numbers(jobs)}"))
        log(f"{jobs:,} jobs ({time.perf_counter() - started:.0f} s)")
        conn.execute(text(
            "INSERT INTO task_queue_jobs (job_id, tq_id, rank) "
            f"SELECT id, 1 + id % {queues}, -user_priority FROM jobs WHERE status = 'Waiting'"))
        for name, offset, where in (
                ("Received", 0, "1 = 1"), ("Checking", 1, "1 = 1"), ("Waiting", 2, "1 = 1"),
                ("Matched", 60, "site IS NOT NULL"), ("Running", 70, "site IS NOT NULL"),
                ("Done", 650, "status = 'Done'"), ("Failed", 650, "status = 'Failed'"),
                ("Killed", 650, "status = 'Killed'")):
            minor = "minor_status" if name == "Failed" else "''"
            conn.execute(text(
                "INSERT INTO job_status_history (job_id, at, status, minor_status, source) "
                f"SELECT id, {sql.plus('submitted_at', offset)}, '{name}', {minor}, 'bench' "
                f"FROM jobs WHERE {where}"))
        log(f"history ({time.perf_counter() - started:.0f} s)")
        pilot_status = (f"CASE WHEN n > {pilots} - {pilots // 30} THEN 'Running' "
                        f"WHEN n > {pilots} - {pilots // 20} THEN 'Waiting' "
                        "WHEN n % 10 = 0 THEN 'Failed' ELSE 'Done' END")
        conn.execute(text(
            "INSERT INTO pilots (id, reference, vo, site, ce, queue, status, submitted_at, "
            "last_seen_at, executor, native_id, reason, updated_at) "
            f"SELECT n, {sql.named('pilot-', 'n')}, 'lhcb', {sites}, {ces}, {names}, "
            f"{pilot_status}, "
            f"{sql.ago(f'({pilots} - n) * {WEEK / pilots:.6f} + 900')}, "
            f"{sql.ago(f'({pilots} - n) * {WEEK / pilots:.6f}')}, 'slurm', "
            f"{sql.digits('n')}, '', {sql.ago(f'({pilots} - n) * {WEEK / pilots:.6f}')} "
            f"FROM {sql.numbers(pilots)}"))
        now = datetime.now(UTC)
        conn.execute(text(
            "INSERT INTO site_bans (vo, site, reason, banned_by, banned_at) VALUES "
            "('lhcb', 'LCG.RAL.uk', 'CE in downtime', 'operator:bench', :now)"),
            {"now": now.replace(tzinfo=None)})
        for i, (site, value) in enumerate((("LCG.CERN.cern", "User"),
                                           ("LCG.CNAF.it", "MCSimulation"))):
            conn.execute(text(
                "INSERT INTO site_limits (id, vo, site, ce, attribute, value, max_running, "
                "matching_delay, last_matched_at, updated_at) VALUES "
                f"({i + 1}, 'lhcb', '{site}', '', 'job_type', '{value}', 5000, NULL, NULL, :now)"),
                {"now": now.replace(tzinfo=None)})
        if sql.pg:  # the explicit ids above leave the sequences behind
            for table in ("jobs", "task_queues", "pilots", "site_limits"):
                conn.execute(text(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                                  f"(SELECT max(id) FROM {table}))"))
    counts = {}
    with engine.connect() as conn:
        for table in ("jobs", "job_status_history", "task_queues", "task_queue_jobs",
                      "pilots"):
            counts[table] = conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()
    return {"seconds": round(time.perf_counter() - started, 1), **counts,
            "places": len(places)}


def analyse(engine: Engine) -> None:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(text("VACUUM ANALYZE"))
        else:
            for table in ("jobs", "job_status_history", "task_queues", "task_queue_jobs",
                          "pilots", "tq_sites", "tq_tags", "site_activity", "job_counts"):
                conn.execute(text(f"ANALYZE TABLE {table}"))


def other_cpu() -> float:
    """CPU seconds all processes but this one have used (from /proc/stat)."""
    return machine_cpu_seconds()[0] - sum(os.times()[:2])


def pages(first_tq: int, job_id: int, failed_job: int, pilot: str) -> list[tuple[str, str]]:
    return [
        ("overview", "/ui/"), ("overview 7 days", "/ui/?range=7d"), ("sites", "/ui/sites"),
        ("task queues", "/ui/taskqueues"), ("task queues, page 50",
                                           f"/ui/taskqueues?after={first_tq + 2500}"),
        ("task queues of a group", "/ui/taskqueues?owner_group=lhcb_mc"),
        ("task queue", f"/ui/taskqueues/{first_tq + 7}"),
        ("jobs", "/ui/jobs"), ("jobs, deep page", f"/ui/jobs?before={job_id // 2}"),
        ("jobs Failed", "/ui/jobs?status=Failed"), ("jobs of an owner", "/ui/jobs?owner=user42"),
        ("jobs of an owner, Running", "/ui/jobs?owner=user42&status=Running"),
        ("jobs of a group", "/ui/jobs?owner_group=lhcb_calib"),
        ("jobs at a site", "/ui/jobs?site=LCG.CNAF.it"),
        ("jobs of a type, Killed", "/ui/jobs?job_type=User&status=Killed"),
        ("jobs by name prefix", "/ui/jobs?job_name=task-99*"),
        ("jobs of a job group", "/ui/jobs?job_group=campaign-100"),
        ("job", f"/ui/jobs/{failed_job}"),
        ("job explained", f"/ui/jobs/{failed_job}?explain=LCG.CERN.cern/ce503.cern.ch/condor"),
        ("pilots", "/ui/pilots"), ("pilots of a queue",
                                   "/ui/pilots?site=LCG.CNAF.it&status=Running"),
        ("pilot", f"/ui/pilots/{pilot}"),
    ]


class Statements:
    """The statements one request ran, with their times."""

    def __init__(self, engine: Engine) -> None:
        self.seen: list[tuple[float, str, Any]] = []
        event.listen(engine, "before_cursor_execute", self._before)
        event.listen(engine, "after_cursor_execute", self._after)

    def _before(self, conn: Any, cursor: Any, statement: str, params: Any, context: Any,
                many: bool) -> None:
        conn.info["bench_t0"] = time.perf_counter()

    def _after(self, conn: Any, cursor: Any, statement: str, params: Any, context: Any,
               many: bool) -> None:
        self.seen.append((time.perf_counter() - conn.info.pop("bench_t0"), statement, params))


def explain(engine: Engine, statement: str, params: Any) -> str:
    prefix = ("EXPLAIN (ANALYZE, BUFFERS) " if engine.dialect.name == "postgresql"
              else "ANALYZE ")
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        cursor.execute(prefix + statement, params)
        rows = cursor.fetchall()
        raw.rollback()
    finally:
        raw.close()
    return "\n".join("  " + " | ".join(str(c) for c in row) for row in rows)


def operator_client(url: str, vo: str) -> tuple[Any, Any]:
    """A Flask test client of the matcher app on ``url`` signed in to /ui as an operator of
    ``vo``, and the app's runtime (dispose it at the end)."""
    settings = Settings()
    settings = replace(settings, database=replace(settings.database, url=url),
                       auth=replace(settings.auth, secret=SECRET),
                       resources=replace(settings.resources,
                                         file=str(ROOT / "conf" / "resources.toml")))
    app = create_app(settings)
    client = app.test_client()
    token = issue_token(SECRET, subject="olga", role="operator", vo=vo, group=f"{vo}_admin",
                        lifetime=3600)
    viewer = cookies.sign_in(token, SECRET, lifetime=3600)
    client.set_cookie(cookies.COOKIE, cookies.encode(viewer, SECRET), path="/ui")
    return client, runtime_of(app)


def run(args: argparse.Namespace) -> int:
    load0 = os.getloadavg()
    emit({"measure": "machine", "cpus": os.cpu_count(), "loadavg_before": load0})
    with fresh_database(args.url, keep=args.keep) as db:
        url = db.url
        engine = make_engine(url)
        emit({"measure": "populate", "backend": engine.dialect.name,
              **populate(engine, jobs=args.jobs, queues=args.queues, pilots=args.pilots)})
        factory = make_session_factory(engine)
        started = time.perf_counter()
        with factory.begin() as session:
            summary = record_activity(session, now=datetime.now(UTC))
        emit({"measure": "activity_turn", "ms": round(1000 * (time.perf_counter() - started)),
              "summary": summary.line()})
        analyse(engine)
        client, runtime = operator_client(url, "lhcb")
        with engine.connect() as conn:
            first_tq = conn.execute(text("SELECT min(id) FROM task_queues")).scalar_one()
            last_job = conn.execute(text("SELECT max(id) FROM jobs")).scalar_one()
            failed = conn.execute(text(
                "SELECT max(id) FROM jobs WHERE status = 'Failed' AND vo = 'lhcb'")).scalar_one()
        watch = Statements(runtime.session_factory().kw["bind"])
        cpu0, t0 = other_cpu(), time.perf_counter()
        results = []
        for name, path in pages(first_tq, last_job, failed, f"pilot-{args.pilots - 1}"):
            times = []
            for i in range(args.repeat + 1):
                watch.seen.clear()
                started = time.perf_counter()
                response = client.get(path)
                elapsed = 1000 * (time.perf_counter() - started)
                body = response.get_data()
                if response.status_code != 200:
                    raise SystemExit(f"{path}: {response.status_code} {body[:500]!r}")
                if i:  # the first fetch warms caches and is not counted
                    times.append(elapsed)
            statements = sorted(watch.seen, key=lambda s: -s[0])
            median = statistics.median(times)
            record = {"measure": "page", "page": name, "path": path,
                      "median_ms": round(median, 1), "best_ms": round(min(times), 1),
                      "worst_ms": round(max(times), 1), "statements": len(statements),
                      "slowest_statement_ms": round(1000 * statements[0][0], 1),
                      "bytes": len(body), "target_ms": args.target_ms,
                      "met": median <= args.target_ms}
            emit(record)
            results.append(record)
            if args.explain:
                log(f"--- {name} {path}: {median:.1f} ms, {len(statements)} statements")
                for seconds, statement, params in statements[:3]:
                    log(f"{1000 * seconds:.1f} ms: {' '.join(statement.split())[:400]}")
                    log(explain(engine, statement, params))
        wall = time.perf_counter() - t0
        emit({"measure": "machine", "loadavg_after": os.getloadavg(),
              "other_processes_cores": round((other_cpu() - cpu0) / wall, 2)})
        runtime.dispose()
        engine.dispose()
    log(f"{'page':<28} {'median ms':>10} {'worst ms':>9}")
    for r in results:
        log(f"{r['page']:<28} {r['median_ms']:>10} {r['worst_ms']:>9}"
            f"{'' if r['met'] else '  over target'}")
    return 0 if all(r["met"] for r in results) else 1


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    url_option(parser, postgres_default())
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--queues", type=int, default=10_000)
    parser.add_argument("--pilots", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5, help="timed fetches per page")
    parser.add_argument("--target-ms", type=float, default=300.0)
    parser.add_argument("--explain", action="store_true",
                        help="print each page's slowest statements with their plans")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
