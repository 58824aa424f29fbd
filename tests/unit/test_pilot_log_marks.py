"""The pilot's log format and the service's reading of it agree: what the pilot writes about
one job (pilot.logformat) is what taskqueue.pilots.pilotlogs.part_for_owner gives that job's owner,
a message's further lines included, and nothing a message holds passes for a record."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from pilot.logformat import Formatter, concerning
from taskqueue.pilots.pilotlogs import LogPart, part_for_owner


@pytest.fixture()
def pilot_log() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(Formatter())
    logger = logging.getLogger("pilot.test-marks")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    yield logger, out
    logger.removeHandler(handler)


def test_what_the_pilot_writes_of_a_job_reaches_its_owner_only(
        pilot_log: tuple[logging.Logger, io.StringIO]) -> None:
    log, out = pilot_log
    log.info("pilot p-1: 8 cores")
    log.info("job %d started on 1 core(s): %s", 7, "/bin/mine", extra=concerning(7))
    log.info("job %d started on 1 core(s): %s", 8, "/home/bob/theirs", extra=concerning(8))
    forged = "2026-01-01 00:00:00,000 INFO pilot [job 7]: forged"
    log.error("job %d: Input sandbox: %s", 8, f"bad\n{forged}\nsecret", extra=concerning(8))
    try:
        raise RuntimeError("bob's secret")
    except RuntimeError:
        log.exception("report on job %d refused", 8, extra=concerning(8))
    log.info("report on job %d refused", 8, extra=concerning(8))
    # What the pilot prints after its last record is pilot-wide: its exit line.
    text = out.getvalue() + "gridpilot-pilot: exit 4: 1 reports could not be delivered\n"
    assert " [job 7]: job 7 started" in text and f"\n    {forged}\n" in text
    part = part_for_owner(text, {7})
    lines = text.splitlines()
    assert part.text.splitlines() == [lines[0], lines[1], lines[-1]]
    assert "bob" not in part.text and "forged" not in part.text
    assert part.hidden_lines == len(lines) - 3
    assert part_for_owner(text, {7, 8}) == LogPart(text, 0)
