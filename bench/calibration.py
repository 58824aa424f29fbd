"""The machine's own yardsticks, measured on the benchmark's database in the same run.

Two loops on one connection in autocommit, each for a few seconds:

- ``SELECT 1``: a round trip that does nothing (the rate no call can beat);
- a single-row ``UPDATE … RETURNING`` (MariaDB, which has no UPDATE … RETURNING: the UPDATE
  alone) of a table of its own, each its own durable commit: the floor of any durable claim.

For each: calls per second, p50/p99 latency, the client's CPU per call (this process's CPU
time inside the loop) and, where it can be read from /proc on this host, the server's CPU per
call (PostgreSQL: the connection's backend process; MariaDB: the connection's own thread,
found through performance_schema when it is on, else the busiest server thread in the loop).
The claim benchmarks divide their own figures by these (``ratios``): absolute numbers differ
from machine to machine, ratios much less.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from kit import stat_cpu
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

TABLE = "gp_bench_calibration"


def _mariadb_threads() -> list[str]:
    """/proc paths of every thread of the MariaDB server processes on this host."""
    paths = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            comm = Path(f"/proc/{entry.name}/comm").read_text().strip()
            if comm in ("mariadbd", "mysqld"):
                paths += [f"/proc/{entry.name}/task/{tid}/stat"
                          for tid in os.listdir(f"/proc/{entry.name}/task")]
        except OSError:
            continue
    return paths


def _mariadb_thread(cursor: Any) -> list[str]:
    """/proc path of the mariadbd thread serving this connection when performance_schema
    names it; otherwise every mariadbd thread (the busiest in the loop is the connection's,
    most likely: an estimate on a server others use)."""
    try:
        cursor.execute("SELECT THREAD_OS_ID FROM performance_schema.threads "
                       "WHERE PROCESSLIST_ID = CONNECTION_ID()")
        row = cursor.fetchone()
    except Exception:  # performance_schema off or not readable
        row = None
    if row and row[0] is not None:
        tid = int(row[0])
        for path in _mariadb_threads():
            if path.endswith(f"/task/{tid}/stat"):
                return [path]
    return _mariadb_threads()


def _server_stat(backend: str, cursor: Any) -> list[str]:
    """/proc stat files among which the busiest in a loop is the connection's server side."""
    if backend == "postgresql":
        cursor.execute("SELECT pg_backend_pid()")
        path = f"/proc/{int(cursor.fetchone()[0])}/stat"
        return [path] if os.path.exists(path) else []
    if backend == "mariadb":
        return _mariadb_thread(cursor)
    return []


def _cpu_of(paths: list[str]) -> dict[str, float]:
    return {p: c for p in paths if (c := stat_cpu(p)) is not None}


def _loop(cursor: Any, statement: str, seconds: float, stat: list[str]) -> dict[str, Any]:
    latencies: list[float] = []
    server0 = _cpu_of(stat)
    cpu0 = time.process_time()
    start = time.perf_counter()
    deadline = start + seconds
    now = start
    while now < deadline:
        cursor.execute(statement)
        cursor.fetchall()
        after = time.perf_counter()
        latencies.append(after - now)
        now = after
    window = now - start
    client = time.process_time() - cpu0
    server1 = _cpu_of(stat)
    n = len(latencies)
    latencies.sort()
    deltas = [c - server0[p] for p, c in server1.items() if p in server0]
    server = max(deltas) if deltas else None
    return {
        "calls": n, "per_s": round(n / window, 1),
        "p50_ms": round(latencies[n // 2] * 1000, 3),
        "p99_ms": round(latencies[min(n - 1, int(n * 0.99))] * 1000, 3),
        "client_cpu_ms": round(client * 1000 / n, 4),
        "server_cpu_ms": round(server * 1000 / n, 4) if server is not None else None,
    }


def calibrate(url: str, backend: str, *, seconds: float = 3.0) -> dict[str, Any]:
    """The two calibration loops on ``url`` (a server database; SQLite runs them too)."""
    engine = create_engine(make_url(url), isolation_level="AUTOCOMMIT")
    try:
        raw = engine.raw_connection()
        try:
            cursor = raw.cursor()
            if backend == "sqlite":
                raw.driver_connection.isolation_level = None  # type: ignore[union-attr]
            cursor.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} (id INTEGER PRIMARY KEY, "
                           "n BIGINT NOT NULL)")
            cursor.execute(f"DELETE FROM {TABLE}")
            cursor.execute(f"INSERT INTO {TABLE} (id, n) VALUES (1, 0)")
            stat = _server_stat(backend, cursor)
            update = f"UPDATE {TABLE} SET n = n + 1 WHERE id = 1"
            if backend != "mariadb":
                update += " RETURNING n"
            select_one = _loop(cursor, "SELECT 1", seconds, stat)
            updates = _loop(cursor, update, seconds, stat)
            cursor.execute(f"DROP TABLE {TABLE}")
        finally:
            raw.close()
    finally:
        engine.dispose()
    return {"measure": "calibration", "backend": backend, "seconds": seconds,
            "select_1": select_one, "update_commit": updates,
            "update_statement": update, "server_cpu_readable": bool(stat),
            "server_cpu_scope": ("backend process" if backend == "postgresql" else
                                 "connection's thread" if len(stat) == 1 else
                                 "busiest server thread (estimate)" if stat else None)}


def ratios(record: dict[str, Any], calibration: dict[str, Any]) -> dict[str, float | None]:
    """A measurement's figures as multiples of the calibration's (the floor: the UPDATE)."""
    floor, select_one = calibration["update_commit"], calibration["select_1"]

    def div(a: float | None, b: float | None) -> float | None:
        return round(a / b, 2) if a is not None and b else None

    return {
        "claims_per_s_x_floor": div(record.get("claims_per_s"), floor["per_s"]),
        "jobs_per_s_x_floor": div(record.get("jobs_per_s"), floor["per_s"]),
        "claims_per_s_x_select_1": div(record.get("claims_per_s"), select_one["per_s"]),
        "p99_x_floor_p99": div(record.get("p99_ms"), floor["p99_ms"]),
        "server_cpu_x_floor": div(record.get("server_cpu_ms_per_claim"),
                                  floor["server_cpu_ms"]),
        "client_cpu_x_floor": div(record.get("client_cpu_ms_per_claim"),
                                  floor["client_cpu_ms"]),
    }
