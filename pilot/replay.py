"""``gridpilot-pilot --replay FILE``: deliver the reports a pilot could not deliver before it
exited (exit code 4, kept in ``WORKDIR/undelivered-reports.json``).

Each report is sent as the pilot would have sent it, in order, retrying a matcher that cannot
be reached until ``--report-timeout``; one the matcher refuses (4xx) is sent again plainer
(pilot.output.plainer_report, down to its exit code), and dropped with the reason when even
that is refused (the job was already reported, or is not this pilot's). What could not be
delivered is written back to FILE (so it can be replayed again, exit 4); once nothing is left,
FILE is removed (exit 0).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pilot.client import Backoff, MatcherClient, RefusedError, TransientError
from pilot.output import REPORT_REFUSALS, plainer_report

log = logging.getLogger("pilot.replay")

EXIT_OK = 0
EXIT_UNSENT = 4


class ReplayError(Exception):
    """FILE cannot be replayed: says why."""


def load_reports(path: Path, reference: str | None) -> list[dict[str, Any]]:
    """The reports kept in ``path``, each with its pilot reference (``reference`` for those
    written without one). Raises ReplayError naming what is wrong and where."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ReplayError(f"{path} cannot be read: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise ReplayError(f"{path} is not JSON: {exc}") from exc
    if not isinstance(data, list):
        raise ReplayError(f"{path} holds no list of reports")
    reports = []
    for i, item in enumerate(data):
        where = f"{path} report {i + 1}"
        if not isinstance(item, dict):
            raise ReplayError(f"{where} is not an object")
        job_id = item.get("job_id")
        if not isinstance(job_id, int) or isinstance(job_id, bool) or job_id < 1:
            raise ReplayError(f"{where}: job_id must be a positive integer, got {job_id!r}")
        if not isinstance(item.get("status"), str):
            raise ReplayError(f"{where}: status is missing")
        item = dict(item)
        if not item.get("pilot_reference"):
            if not reference:
                raise ReplayError(f"{where} names no pilot_reference: give --reference")
            item["pilot_reference"] = reference
        reports.append(item)
    return reports


def replay(client: MatcherClient, path: Path, reports: list[dict[str, Any]], *,
           timeout: float, clock: Callable[[], float] = time.monotonic,
           backoff: Backoff | None = None) -> tuple[int, str]:
    """Send ``reports``; returns the exit code and a line saying what happened."""
    backoff = backoff or Backoff()
    deadline = clock() + timeout
    left = list(reports)
    delivered = refused = refusals = 0
    while left:
        report = left[0]
        body = {k: v for k, v in report.items() if k != "job_id"}
        try:
            client.report(int(report["job_id"]), body)
            delivered += 1
        except RefusedError as exc:
            if refusals < REPORT_REFUSALS:
                refusals += 1
                left[0] = {"job_id": report["job_id"],
                           **plainer_report(body, refusals, exc.status)}
                log.warning("report on job %s refused (%s); sending a plainer one",
                            report["job_id"], exc)
                continue
            log.error("report on job %s refused: %s", report["job_id"], exc)
            refused += 1
        except TransientError as exc:
            if clock() >= deadline:
                log.error("report on job %s not delivered: %s", report["job_id"], exc)
                break
            time.sleep(min(backoff.next_delay(), max(0.0, deadline - clock())))
            continue
        left.pop(0)
        refusals = 0
        backoff.reset()
    line = (f"{delivered} reports delivered, {refused} refused by the matcher, {len(left)} "
            f"undelivered")
    if left:
        _write(path, left)
        return EXIT_UNSENT, f"{line}; kept in {path}"
    path.unlink(missing_ok=True)
    return EXIT_OK, line


def _write(path: Path, reports: list[dict[str, Any]]) -> None:
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(reports, f)
    os.replace(temp, path)
