"""optimizers.queuework.QueueWork: the work waiting for a queue, found once per ttl."""

from __future__ import annotations

from optimizers.queuework import QueueWork


def test_an_answer_serves_for_its_ttl_then_is_found_again() -> None:
    now = [100.0]
    work = QueueWork(ttl=15.0, clock=lambda: now[0])
    found = [True]
    key = ("lhcb", "S", "CE", "Q")
    assert work.get(key, lambda: found[0]) is True
    found[0] = False
    now[0] += 14.9
    assert work.get(key, lambda: found[0]) is True
    assert work.lookups == 1
    now[0] += 0.2
    assert work.get(key, lambda: found[0]) is False
    assert work.lookups == 2
    assert work.get(("belle", "S", "CE", "Q"), lambda: True) is True
    assert work.lookups == 3


def test_it_never_grows_past_its_size() -> None:
    work = QueueWork(size=3)
    for i in range(10):
        work.get(("lhcb", "S", "CE", str(i)), lambda: True)
    assert len(work._found) <= 3
