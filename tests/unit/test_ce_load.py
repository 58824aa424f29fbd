"""A CE's own load (issue 34 item 9): read from an ARC-CE's GLUE2 document as A-REX 6.17 gives
it, the queue's share found by name or mapping queue, and the room it leaves the director."""

from __future__ import annotations

from agents.ce.arcrest import _load
from agents.ce.base import CELoad, CELoads
from agents.director import ce_room

#: A-REX 6.17's ComputingService and ComputingShare (tools/arc-localhost), as its REST
#: interface's JSON gives them: every count a string.
SERVICE = {"Name": "localhost", "TotalJobs": "2", "RunningJobs": "0", "WaitingJobs": "0",
           "StagingJobs": "0", "PreLRMSWaitingJobs": "0"}
SHARE = {"Name": "fork", "MappingQueue": "fork", "MaxRunningJobs": "1",
         "MaxWaitingJobs": "1", "TotalJobs": "2", "RunningJobs": "0", "WaitingJobs": "0",
         "PreLRMSWaitingJobs": "2", "FreeSlots": "2"}


def test_a_share_counts_what_waits_before_and_in_the_batch_system() -> None:
    load = _load("fork", SHARE)
    assert load == CELoad("fork", running=0, waiting=2, total=2, free_slots=2, max_running=1,
                          max_total=None, aliases=("fork",))
    assert _load("x", {"Name": "x"}) is None  # no RunningJobs: no load


def test_the_queue_is_found_by_name_or_batch_queue_else_the_only_one() -> None:
    whole = _load("", SERVICE)
    assert whole is not None
    share = CELoad("grid_atlas", running=5, waiting=1, total=6, aliases=("grid",))
    loads = CELoads((whole, share))
    assert loads.of("grid_atlas") == share and loads.of("grid") == share
    assert loads.of("other") is None
    assert loads.of(None) == share  # its only queue
    two = CELoads((whole, share, CELoad("short", running=0, waiting=0, total=0)))
    assert two.of(None) == whole  # which one is not known: the CE as a whole


def test_the_room_a_ce_leaves() -> None:
    assert ce_room(CELoad("q", running=9, waiting=1, total=10), 5)[0] == 4
    room, why = ce_room(CELoad("q", running=0, waiting=7, total=7, free_slots=0), 5)
    assert room == -2 and "7 job(s) wait in its queue, MaxWaitingPilots is 5" in why
    assert "0 free slot(s)" in why
    room, why = ce_room(CELoad("q", running=38, waiting=1, total=39, max_total=40), 5)
    assert room == 1 and "its MaxTotalJobs is 40" in why
