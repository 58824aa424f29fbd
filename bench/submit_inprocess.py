"""Submission cost in process: the matcher app called through Flask's test client, no HTTP.

What ``bench/submit.py`` measures over HTTP, without the server, the client and the network:
for one backend (a fresh database as in ``bench/submit.py``, dropped at the end) it sends
``--requests`` submissions of one kind (``single``: one small JDL; ``bulk``: a JSON list of
``--bulk`` jobs; ``parametric``: a JDL with ``Parameters = --parametric``) one after another,
and prints one JSON line: wall time and client CPU per request, jobs/s, and the statements
(COMMIT included) each request sent to the database, counted with a SQLAlchemy event; with
``--statements`` the first request's statements are listed too. Run from the repository root::

    .venv/bin/python bench/submit_inprocess.py --backend postgresql --kind single
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kit import fresh_database
from sqlalchemy import event
from submit import SECRET, SINGLE_JDL, base_url_for

from gridpilot.server import worker_app
from matcher.auth import issue_token
from matcher.runtime import runtime_of
from taskqueue.core.settings import load_settings

_HERE = Path(__file__).resolve().parent

ROOT = _HERE.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="sqlite",
                        choices=("sqlite", "postgresql", "mariadb"))
    parser.add_argument("--postgres-url", default=os.environ.get("GRIDPILOT_TEST_POSTGRES_URL"))
    parser.add_argument("--mariadb-url", default=os.environ.get("GRIDPILOT_TEST_MARIADB_URL"))
    parser.add_argument("--database-prefix", default="gp_bench_submit")
    parser.add_argument("--kind", default="single", choices=("single", "bulk", "parametric"))
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--bulk", type=int, default=1000)
    parser.add_argument("--parametric", type=int, default=10000)
    parser.add_argument("--statements", action="store_true",
                        help="list the statements of one request")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="profile the timed requests (CPU time, cProfile) and print the "
                             "N functions with the most cumulative time to stderr")
    args = parser.parse_args()
    if args.kind == "single":
        body, media, jobs = SINGLE_JDL, "text/plain", 1
    elif args.kind == "bulk":
        body = json.dumps([{"executable": "/bin/true", "arguments": [str(i)]}
                           for i in range(args.bulk)], separators=(",", ":"))
        media, jobs = "application/json", args.bulk
    else:
        body = (f'Executable = "/bin/echo"; Arguments = "%n"; '
                f"Parameters = {args.parametric};")
        media, jobs = "text/plain", args.parametric
    token = issue_token(SECRET, subject="bench", role="user", vo="lhcb", group="lhcb_user",
                        lifetime=3600)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": media}
    urls = {"postgresql": args.postgres_url, "mariadb": args.mariadb_url}
    with tempfile.TemporaryDirectory(prefix="gp-bench-submit-") as tmp, \
            fresh_database(base_url_for(args.backend, urls), prefix=args.database_prefix,
                           tmpdir=Path(tmp)) as db:
        settings = load_settings(None, {
            "GRIDPILOT_DATABASE_URL": db.url, "GRIDPILOT_AUTH_SECRET": SECRET,
            "GRIDPILOT_RESOURCES_FILE": str(ROOT / "conf" / "resources.toml"),
            "GRIDPILOT_MATCHER_METRICS_DIR": str(Path(tmp) / "metrics")})
        app = worker_app(settings)  # as each worker of gridpilot serve builds it
        client = app.test_client()

        def one() -> None:
            answer = client.post("/api/v1/jobs", data=body, headers=headers)
            if answer.status_code != 201:
                raise SystemExit(f"submission refused: {answer.get_data(as_text=True)}")

        one()  # warm up: connections, compiled statements, caches
        engine = runtime_of(app).session_factory().kw["bind"]
        sent: list[str] = []

        def count(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
            sent.append(" ".join(statement.split()[:4]))

        event.listen(engine, "before_cursor_execute", count)
        event.listen(engine, "commit", lambda conn: sent.append("COMMIT"))
        one()
        first = list(sent)
        sent.clear()
        profiler = cProfile.Profile(time.process_time) if args.profile else None
        wall, cpu = time.perf_counter(), time.process_time()
        if profiler is not None:
            profiler.enable()
        for _ in range(args.requests):
            one()
        if profiler is not None:
            profiler.disable()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        if profiler is not None:
            pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(
                args.profile)
    record: dict[str, Any] = {
        "bench": "submit_inprocess", "backend": args.backend, "kind": args.kind,
        "jobs_per_request": jobs, "requests": args.requests,
        "ms_per_request": round(wall / args.requests * 1000, 2),
        "client_cpu_ms_per_request": round(cpu / args.requests * 1000, 2),
        "jobs_per_s": round(jobs * args.requests / wall, 1),
        "statements_per_request": round(len(sent) / args.requests, 1),
        "load_average": os.getloadavg()[0]}
    if args.statements:
        record["statements"] = first
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
