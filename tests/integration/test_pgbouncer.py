"""What works against PostgreSQL itself works through PgBouncer in transaction pooling mode
(the topology's, in front of the test server) with [database] transaction_pooler: the
driver's statements, prepared again and again from many threads; the claim function, alone
and grouped per commit; the Python claim path with its row locks (site limits); the agents'
turns (SELECT ... FOR UPDATE) and SKIP LOCKED. Without the setting PgBouncer refuses the
connection outright. gridpilot keeps nothing on a server connection between transactions
(no advisory lock, LISTEN, session SET or named prepared statement of its own)."""

from __future__ import annotations

import random
import re
import threading
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path

import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.exc import OperationalError

from taskqueue.agentruns import start_run
from taskqueue.core.resources import parse_resource
from taskqueue.core.settings import Settings
from taskqueue.db.database import (
    Session,
    make_engine,
    make_session_factory,
    run_in_transaction,
)
from taskqueue.db.models import Job
from taskqueue.matching.limits import LimitSpec, set_limit
from taskqueue.pilots.pilotmatch import MatchDatabase, match_for_pilot
from tests.helpers import requirements, submit
from tests.integration.conftest import ROOT, Topology

VO = "pgbtest"


@pytest.fixture()
def pooled(topology: Topology) -> Iterator[Engine]:
    """An engine through PgBouncer, as the matchers open theirs."""
    engine = make_engine(topology.state["database_url"], pool_size=4, transaction_pooler=True)
    yield engine
    engine.dispose()


@pytest.fixture()
def direct(topology: Topology) -> Iterator[Engine]:
    engine = make_engine(topology.state["direct_url"], pool_size=2)
    yield engine
    engine.dispose()


def test_without_the_setting_pgbouncer_refuses_the_connection(topology: Topology) -> None:
    engine = make_engine(topology.state["database_url"], pool_size=1)
    try:
        with pytest.raises(OperationalError, match="unsupported startup parameter"), \
                engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    finally:
        engine.dispose()


def test_statements_repeated_from_many_threads(pooled: Engine) -> None:
    """psycopg prepares a statement on the server after a few runs; through PgBouncer the
    next transaction may run on another server connection, where it does not exist. The
    setting keeps psycopg from preparing: hundreds of runs of the same statements from eight
    threads, over the pool's connections and PgBouncer's, all succeed."""
    factory = make_session_factory(pooled)
    errors: list[str] = []

    def work(n: int) -> None:
        for i in range(60):
            try:
                with factory.begin() as session:
                    session.execute(select(Job.id).where(Job.vo == VO, Job.id > i)
                                    .limit(1)).all()
                    session.execute(text("SELECT count(*) FROM agent_runs WHERE name = :n"),
                                    {"n": f"x{n}"}).one()
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert errors == []
    with pooled.connect() as conn:
        assert conn.connection.dbapi_connection.prepare_threshold is None  # type: ignore[union-attr]


def _fill(engine: Engine, n: int, site: str, job_type: str) -> set[int]:
    factory = make_session_factory(engine)
    reqs = [requirements(vo=VO, owner=f"u{i % 3}", owner_group="pgb_user", sites=[site],
                         job_type=job_type, cpu_time=3600) for i in range(n)]
    return set(run_in_transaction(factory, partial(_submit, reqs=reqs)))


def _submit(session: Session, *, reqs: list[object]) -> list[int]:
    return submit(session, Settings(), datetime.now(UTC), reqs,  # type: ignore[arg-type]
                  rng=random.Random(1))


def test_claims_alone_grouped_and_limited_are_exactly_once(
        topology: Topology, pooled: Engine, direct: Engine) -> None:
    """Eight threads share one process's MatchDatabase through PgBouncer: the claim function
    (grouped per commit) takes every free job once, and at the limited site the Python path
    (site limits: rows locked FOR UPDATE) holds the limit."""
    free = _fill(direct, 400, "LCG.PGB.free", "User")
    limited = _fill(direct, 50, "LCG.PGB.limited", "MCSimulation")
    now = datetime.now(UTC)
    run_in_transaction(make_session_factory(direct), lambda s: set_limit(
        s, VO, LimitSpec("LCG.PGB.limited", "job_type", "MCSimulation", max_running=7),
        now=now))
    autocommit = make_engine(topology.state["database_url"], pool_size=4, autocommit=True,
                             transaction_pooler=True)
    db = MatchDatabase(make_session_factory(pooled), autocommit)
    got: list[int] = []
    errors: list[str] = []

    def pilot(n: int, site: str) -> None:
        rng = random.Random(n)
        empty = 0
        while empty < 3:
            try:
                answer = match_for_pilot(db, parse_resource({
                    "vo": VO, "site": site, "pilot_reference": f"pgb-{n}",
                    "cpu_time": 10**6}), now=datetime.now(UTC), count=rng.choice((1, 2)),
                    rng=rng)
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                return
            got.extend(job.id for job in answer.jobs)
            empty = 0 if answer.jobs else empty + 1

    try:
        threads = [threading.Thread(target=pilot, args=(n, "LCG.PGB.free"))
                   for n in range(6)]
        threads += [threading.Thread(target=pilot, args=(n, "LCG.PGB.limited"))
                    for n in range(6, 8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
    finally:
        autocommit.dispose()
    assert errors == []
    assert [job for job, n in Counter(got).items() if n > 1] == []
    assert free <= set(got)
    assert len(set(got) & limited) == 7
    assert db.groups is not None and db.groups.calls >= len(free) // 2
    assert db.groups.groups < db.groups.calls  # some claims shared a commit


def test_agent_turns_and_skip_locked(pooled: Engine) -> None:
    """Row locks live as long as their transaction, which PgBouncer keeps on one server
    connection: of two processes taking a loop's turn at once one gets it; a row a
    transaction holds FOR UPDATE is skipped by another's SKIP LOCKED."""
    factory = make_session_factory(pooled)
    now = datetime.now(UTC)
    name = f"pgb-loop-{random.randrange(10**9)}"
    barrier = threading.Barrier(2)
    won: list[bool] = []

    def take(holder: str) -> None:
        with factory.begin() as session:
            barrier.wait(timeout=30)
            won.append(start_run(session, name, holder=holder, now=now, interval=60,
                                 lease=90, force=True))

    threads = [threading.Thread(target=take, args=(f"host{i}:1",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(won) == [False, True]
    assert not run_in_transaction(factory, partial(start_run, name=name, holder="host9:1",
                                                   now=now + timedelta(seconds=1),
                                                   interval=60, lease=90, force=True))

    job = _fill(pooled, 2, "LCG.PGB.locks", "User")
    first, second = sorted(job)
    held = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with factory.begin() as session:
            session.execute(select(Job.id).where(Job.id == first).with_for_update()).one()
            held.set()
            release.wait(timeout=60)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(timeout=60)
        with factory.begin() as session:
            seen = session.scalars(select(Job.id).where(Job.id.in_([first, second]))
                                   .with_for_update(skip_locked=True)).all()
        assert seen == [second]
    finally:
        release.set()
        holder.join(timeout=60)


def test_nothing_is_kept_on_a_server_connection_between_transactions() -> None:
    """What PgBouncer's transaction mode cannot carry from one transaction to the next is
    used nowhere: session advisory locks, LISTEN/NOTIFY, session-wide SET, temporary tables,
    statements prepared by name."""
    # SQL as the code writes it: in capitals.
    forbidden = re.compile(r"pg_(try_)?advisory_lock|\bLISTEN\b|\bNOTIFY\b|"
                           r"SET SESSION|CREATE TEMP|\bPREPARE\s+\w+\s+(AS|FROM)")
    found = []
    for package in ("taskqueue", "agents", "matcher", "optimizers", "migrations"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if forbidden.search(line) and "max_statement_time" not in line:
                    found.append(f"{Path(path).relative_to(ROOT)}:{number}: {line.strip()}")
    # MariaDB's own session setting (no PgBouncer there) is the one allowed above.
    assert found == []
