"""What tokens through a pilot's life cost the service: a pilot's own renewal (``POST
/api/v1/pilots/<ref>/token``) and a payload's token (``POST /api/v1/pilots/jobs/<id>/token``,
ES256), through the Flask application in this process on a fresh database, with the same run's
calibration (one durable single-row UPDATE on that database).

    .venv/bin/python bench/token_renewal.py [--url URL] [--pilots 200] [--seconds 5]

Prints one JSON line per kind of request: milliseconds per request (p50, p99), this process's
CPU per request, the ratio of the median to the calibration's, and what it comes to per pilot
per hour at the default lifetimes (a pilot renews once per 0.5-0.7 of its token's lifetime;
a payload's token is fetched at its start and renewed as often).
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from calibration import calibrate
from kit import emit, fresh_database, log, postgres_default, url_option

from matcher.app import create_app
from matcher.runtime import runtime_of
from taskqueue.core.settings import load_settings
from taskqueue.pilots.records import record_new_pilots, record_submission
from taskqueue.tokens import issue_token

ROOT = Path(__file__).resolve().parent.parent
SECRET = secrets.token_urlsafe(32)
SITE, CE, QUEUE = "LCG.CERN.cern", "ce503.cern.ch", "condor"
#: A pilot renews once per this share of its token's life (pilot.renewal, the mean).
RENEW_SHARE = 0.6


def timed(call: Callable[[int], Any], n: int, seconds: float) -> list[float]:
    took: list[float] = []
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end or i < 20:
        t0 = time.perf_counter()
        call(i % n)
        took.append(time.perf_counter() - t0)
        i += 1
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    url_option(parser, postgres_default())
    parser.add_argument("--pilots", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    with fresh_database(args.url) as db:
        settings = load_settings(None, {"GRIDPILOT_DATABASE_URL": db.url,
                                    "GRIDPILOT_AUTH_SECRET": SECRET,
                                    "GRIDPILOT_RESOURCES_FILE":
                                        str(ROOT / "conf" / "resources.toml")})
        app = create_app(settings)
        runtime = runtime_of(app)
        http = app.test_client()
        now = datetime.now(UTC)
        refs = [f"bench-{i}" for i in range(args.pilots)]
        runtime.transaction(partial(record_new_pilots, vo="lhcb", site=SITE, ce=CE, queue=QUEUE,
                                    executor="local", references=refs, now=now))
        for ref in refs:
            runtime.transaction(partial(record_submission, reference=ref, native_id=ref,
                                        now=now))
        tokens = [issue_token(SECRET, subject="director", role="pilot", vo="lhcb",
                              group="lhcb_pilot", lifetime=settings.agents.pilot_token_lifetime,
                              site=SITE, pilot=ref) for ref in refs]
        user = issue_token(SECRET, subject="alice", role="user", vo="lhcb", group="lhcb_user",
                           lifetime=3600)
        jobs: list[int] = []
        for ref, token in zip(refs, tokens, strict=True):
            answer = http.post("/api/v1/jobs", data=b'[ Executable = "/bin/true"; ]',
                               headers={"Authorization": f"Bearer {user}",
                                        "Content-Type": "text/plain"})
            job_id = answer.get_json()["job_ids"][0]
            matched = http.post("/api/v1/pilots/match", json={"resource": {
                "vo": "lhcb", "site": SITE, "ce": CE, "queue": QUEUE, "pilot_reference": ref}},
                headers={"Authorization": f"Bearer {token}"}).get_json()
            assert [j["job_id"] for j in matched["jobs"]] == [job_id], matched
            jobs.append(job_id)
        calibration = calibrate(db.url, db.backend)
        floor_ms = calibration["update_commit"]["p50_ms"]

        def renew(i: int) -> None:
            r = http.post(f"/api/v1/pilots/{refs[i]}/token",
                          headers={"Authorization": f"Bearer {tokens[i]}"})
            assert r.status_code == 200, r.get_data(as_text=True)

        def payload(i: int) -> None:
            r = http.post(f"/api/v1/pilots/jobs/{jobs[i]}/token",
                          json={"pilot_reference": refs[i]},
                          headers={"Authorization": f"Bearer {tokens[i]}"})
            assert r.status_code == 200, r.get_data(as_text=True)

        lifetimes = {"pilot": settings.agents.pilot_token_lifetime,
                     "payload": settings.tokens.payload_lifetime}
        for kind, call in (("pilot", renew), ("payload", payload)):
            cpu0 = time.process_time()
            took = sorted(timed(call, args.pilots, args.seconds))
            cpu = (time.process_time() - cpu0) / len(took)
            p50 = statistics.median(took) * 1000
            per_hour = 3600 / (lifetimes[kind] * RENEW_SHARE)
            emit({"bench": "token_renewal", "backend": db.backend, "kind": kind,
                  "requests": len(took), "p50_ms": round(p50, 3),
                  "p99_ms": round(took[int(len(took) * 0.99) - 1] * 1000, 3),
                  "cpu_ms": round(cpu * 1000, 3),
                  "calibration_update_p50_ms": round(floor_ms, 3),
                  "p50_over_calibration": round(p50 / floor_ms, 2),
                  "lifetime_s": lifetimes[kind], "renewals_per_hour": round(per_hour, 3),
                  "service_ms_per_hour": round(per_hour * p50, 3)})
        log("done")


if __name__ == "__main__":
    main()
