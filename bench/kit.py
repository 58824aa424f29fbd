"""What every benchmark needs: progress and JSON-line output, a fresh database, argument types,
and the CPU time of processes read from /proc.

The benchmarks run as scripts (``.venv/bin/python bench/NAME.py``), so this folder comes first
on ``sys.path``: they import this module as ``kit`` and one another by their file names, none
of which is the name of a package of the project. The machine's yardsticks (a durable
single-row commit, a round trip) are in ``calibration.py``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import secrets
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

CLK_TCK = os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------- output


def log(message: str) -> None:
    """A progress line on stderr, with the time."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def emit(record: dict[str, Any]) -> None:
    """One measurement as one JSON line on stdout."""
    print(json.dumps(record), flush=True)


def int_list(value: str) -> list[int]:
    """An argparse type: a comma list of positive integers ("1,4,16")."""
    try:
        values = [int(v) for v in value.split(",") if v.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers: {exc}") from exc
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError("expected positive integers")
    return values


def percentile_ms(sorted_values: Sequence[float], p: float) -> float | None:
    """The ``p`` quantile (0 < p < 1) of sorted seconds, in milliseconds."""
    if not sorted_values:
        return None
    if len(sorted_values) == 1:
        return round(sorted_values[0] * 1000, 3)
    cuts = statistics.quantiles(sorted_values, n=1000, method="inclusive")
    return round(cuts[round(p * 1000) - 1] * 1000, 3)


def rate(n: float, seconds: float) -> float | None:
    """Events per second, to one decimal (None for no time)."""
    return round(n / seconds, 1) if seconds > 0 else None


def url_option(parser: argparse.ArgumentParser, default: str | None) -> None:
    """The ``--url`` option of a benchmark that measures on a :func:`fresh_database`."""
    where = "%(default)s" if default else "an SQLite file in a temporary folder"
    parser.add_argument("--url", default=default, help=(
        "SQLAlchemy URL: on a server, the benchmark creates a fresh database there and drops "
        f"it at the end; an sqlite URL, a fresh file beside it (default: {where})"))


def postgres_default() -> str:
    """The PostgreSQL server a server-only benchmark uses when given none."""
    return os.environ.get("GRIDPILOT_TEST_POSTGRES_URL",
                          "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def load_file(alias: str, path: Path) -> ModuleType:
    """The Python file at ``path`` (a migration, say) as a module named ``alias``, once per
    process; registered before it runs, as dataclasses look their module up by name."""
    loaded = sys.modules.get(alias)
    if loaded is not None:
        return loaded
    spec = importlib.util.spec_from_file_location(alias, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[alias] = module
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- processes


def end_on_signals(*signals: signal.Signals) -> None:
    """Make these signals (SIGTERM by default) end the benchmark as Ctrl-C does, so that its
    finally blocks stop what it started and drop the databases it made."""
    def interrupt(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in signals or (signal.SIGTERM,):
        signal.signal(sig, interrupt)


def start_together(processes: Sequence[Any], barrier: Any, *, timeout: float, what: str) -> None:
    """Start worker ``processes`` and wait at ``barrier`` (a multiprocessing Barrier of one more
    party) until each is ready to measure; if they are not ready in ``timeout`` seconds, stop
    them and end the benchmark saying ``what`` did not start."""
    for p in processes:
        p.start()
    try:
        barrier.wait(timeout=timeout)
    except Exception as exc:
        for p in processes:
            p.terminate()
        raise SystemExit(f"{what} did not start: {exc!r}") from exc


# --------------------------------------------------------------------------- databases


def process_cpu(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of the process ``pid`` (a database backend), from /proc;
    a clear exit when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        raise SystemExit(f"the database backend {pid} is gone") from None
    fields = raw[raw.rindex(")") + 2:].split()
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def backend_of(url: str) -> str:
    """``sqlite``, ``postgresql`` or ``mariadb``."""
    name = make_url(url).get_backend_name()
    return "mariadb" if name == "mysql" else name


@dataclass
class BenchDatabase:
    """A database made for one benchmark run: its URL, its backend and a name for the log."""

    url: str
    backend: str
    label: str


@contextmanager
def fresh_database(base_url: str, *, prefix: str = "gp_bench", keep: bool = False,
                   tmpdir: Path | None = None, upgrade: bool = True) -> Iterator[BenchDatabase]:
    """A new, empty database ``<prefix>_<random>`` on the server of ``base_url`` (which only
    serves to create and drop it), or a new SQLite file (beside the one ``base_url`` names, or
    in ``tmpdir``, or in a temporary folder); with the alembic schema unless ``upgrade`` is
    false; dropped or removed after, unless ``keep``."""
    parsed = make_url(base_url)
    backend = backend_of(base_url)
    name = f"{prefix}_{secrets.token_hex(4)}"
    files: list[Path] = []
    made: Path | None = None
    if backend == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            given = Path(parsed.database)
            path = given.with_name(f"{given.stem}_{name}{given.suffix or '.db'}")
        else:
            if tmpdir is None:
                tmpdir = made = Path(tempfile.mkdtemp(prefix=f"{prefix}_"))
            path = tmpdir / f"{name}.db"
        url = parsed.set(database=str(path)).render_as_string(hide_password=False)
        db = BenchDatabase(url, backend, str(path))
        files = [path, *(Path(f"{path}{end}") for end in ("-wal", "-shm", "-journal"))]
    elif backend in ("postgresql", "mariadb"):
        admin_statement(base_url, f"CREATE DATABASE {name}")
        url = parsed.set(database=name).render_as_string(hide_password=False)
        db = BenchDatabase(url, backend, name)
        log(f"created database {name}")
    else:
        raise SystemExit(f"unsupported backend {backend!r}")
    try:
        if upgrade:
            upgrade_schema(db.url)
        yield db
    finally:
        if keep:
            log(f"--keep: leaving {db.label} in place")
        elif backend == "sqlite":
            for f in files:
                f.unlink(missing_ok=True)
            if made is not None:
                shutil.rmtree(made, ignore_errors=True)
            log(f"removed {db.label}")
        else:
            force = " WITH (FORCE)" if backend == "postgresql" else ""
            admin_statement(base_url, f"DROP DATABASE IF EXISTS {name}{force}")
            log(f"dropped database {name}")


def upgrade_schema(url: str) -> None:
    """Build the alembic schema of the database at ``url``, or bring it up to date."""
    from gridpilot import schema
    from taskqueue.db.database import make_engine

    engine = make_engine(url, statement_timeout=0)
    try:
        schema.upgrade(engine)
    finally:
        engine.dispose()


def admin_statement(base_url: str, statement: str) -> None:
    """Run one statement outside a transaction (CREATE/DROP DATABASE) on the server of
    ``base_url``."""
    admin = create_engine(base_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(statement))
    finally:
        admin.dispose()


# --------------------------------------------------------------------------- CPU from /proc


def _stat_fields(path: str) -> list[str] | None:
    """The fields after the command name of a /proc ``stat`` file; None when it is gone."""
    try:
        raw = Path(path).read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2:].split()


def stat_cpu(path: str) -> float | None:
    """CPU seconds (user + system) in the /proc ``stat`` file at ``path`` (a process's, or a
    thread's under ``task/``)."""
    fields = _stat_fields(path)
    return None if fields is None else (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_stat(pid: int, tid: int | None = None) -> tuple[int, float, float] | None:
    """(parent pid, own CPU seconds, reaped children's CPU seconds) of a process, or of one of
    its threads; None when it is gone (or not on this host)."""
    fields = _stat_fields(f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat")
    if fields is None:
        return None
    utime, stime, cutime, cstime = (int(v) for v in fields[11:15])
    return int(fields[1]), (utime + stime) / CLK_TCK, (cutime + cstime) / CLK_TCK


def proc_cpu(pid: int, tid: int | None = None) -> float | None:
    """CPU seconds (user + system) of a process or one of its threads."""
    stat = proc_stat(pid, tid)
    return None if stat is None else stat[1]


def process_comm(pid: int) -> str:
    """A process's command name ("" when it is gone)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def children_of(root: int) -> list[int]:
    """The live children of a process."""
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            stat = proc_stat(int(entry.name))
            if stat is not None and stat[0] == root:
                pids.append(int(entry.name))
    return sorted(pids)


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds of ``root``, its live children, and the children it has reaped (gunicorn's
    arbiter and its workers, recycled ones included)."""
    own = proc_stat(root)
    if own is None:
        return 0.0
    total = own[1] + own[2]
    for child in children_of(root):
        stat = proc_stat(child)
        if stat is not None:
            total += stat[1]
    return total


def machine_cpu_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, all cores."""
    first = Path("/proc/stat").read_text().splitlines()[0].split()
    user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in first[1:9])
    busy = user + nice + system + irq + softirq + steal
    return busy / CLK_TCK, (busy + idle + iowait) / CLK_TCK


def store_missing_payloads(url: str, vo: str | None = None, *,
                           batch: int = 10_000) -> int:
    """Store the payload of every job (of ``vo``, None: of all) that has none: a bulk load
    writes jobs only, a submission stores their payloads too (migration 0042); returns how
    many were stored."""
    from sqlalchemy import select

    from optimizers.chain import stored_description
    from optimizers.description import JobDescription, payload_json
    from taskqueue.db.database import make_engine, make_session_factory
    from taskqueue.db.models import job_payloads_table, jobs_table
    from taskqueue.queues.jobs import store_payloads

    j, jp = jobs_table.c, job_payloads_table.c
    read: dict[tuple[str, str, int | None], JobDescription] = {}
    stored, after = 0, 0
    engine = make_engine(url)
    try:
        while True:
            with make_session_factory(engine).begin() as session:
                rows = session.execute(
                    select(j.id, j.description, j.description_format, j.bulk_index)
                    .outerjoin(job_payloads_table, jp.job_id == j.id)
                    .where(jp.job_id.is_(None), j.id > after,
                           *([] if vo is None else [j.vo == vo])).order_by(j.id)
                    .limit(batch)).all()
                if not rows:
                    return stored
                payloads = []
                for r in rows:
                    key = (r.description, r.description_format, r.bulk_index)
                    if key not in read:
                        read[key] = stored_description(*key)
                    payloads.append((r.id, payload_json(read[key], r.id)))
                store_payloads(session, payloads, new=True)
                stored += len(rows)
                after = rows[-1].id
    finally:
        engine.dispose()
