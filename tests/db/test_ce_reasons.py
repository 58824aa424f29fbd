"""What a CE says about a pilot is made storable before it is stored: a NUL (PostgreSQL
refuses it in text) or another control character in a CE's failure reason is that CE's
oddity, not a failed transaction for every CE's pilots."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select

from taskqueue.db.models import Pilot
from taskqueue.pilots.pilotlogs import record_ce_state, record_log
from taskqueue.pilots.records import PilotInfo, record_ce_failure, register_pilot, storable
from tests.conftest import Database


def test_storable_drops_control_characters_and_keeps_the_rest() -> None:
    assert storable("lrms\x00 said\x1b[31m no\ttab\n") == "lrms said[31m no\ttab\n"
    assert storable("\udcff broken") == "? broken"
    assert storable("é" * 300) == "é" * 126 + " … " + "é" * 126


def test_a_long_reason_is_shortened_in_the_middle_and_keeps_its_cause() -> None:
    """Issue 34 item 7: the end of a CE's error (urllib3's "Caused by …") is its point."""
    reason = ("arc:https://ce.example.org:443/arex: no answer (HTTPSConnectionPool(host="
              "'ce.example.org', port=443): Max retries exceeded with url: /arex/rest "
              + "x" * 200 + " Failed to establish a new connection: Connection refused')")
    kept = storable(reason)
    assert len(kept) == 255 and " … " in kept
    assert kept.startswith("arc:https://ce.example.org:443/arex: no answer")
    assert kept.endswith("Connection refused')")


def test_a_reason_with_a_nul_is_stored_without_it(db: Database, now: datetime) -> None:
    with db.factory.begin() as s:
        register_pilot(s, "lhcb", PilotInfo("p-nul", "LCG.Alpha.org", "ce1", "q", "Running"),
                       now=now)
    with db.factory.begin() as s:
        assert record_ce_state(s, "lhcb", "p-nul", status="Failed",
                               reason="Job failed\x00 in LRMS\x01", exit_code=None, now=now)
        record_log(s, "lhcb", "p-nul", log_id=None, size=0, note="gone\x00", now=now,
                   reason="exit\x00 1")
        record_ce_failure(s, [("LCG.Alpha.org", "ce1", "q")], reason="ce1: bad\x00 answer",
                          now=now, base_backoff=60)
    with db.factory() as s:
        pilot = s.scalars(select(Pilot).where(Pilot.vo == "lhcb",
                                              Pilot.reference == "p-nul")).one()
        assert (pilot.reason, pilot.log_note) == ("exit 1", "gone")
