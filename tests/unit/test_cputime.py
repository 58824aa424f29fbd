"""The budgets on a user's text (a JDL's evaluation, a Requirements expression's) count the
thread's CPU time: a loaded machine's waits must not refuse a plain description or give up an
expression for good."""

from __future__ import annotations

import os
import time

import pytest

from optimizers import classads, jdl
from optimizers.cputime import Stopwatch
from optimizers.description import JobDescriptionError

os.environ.setdefault("CONDOR_CONFIG", "/dev/null")
import classad2


def _spin(seconds: float) -> None:
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        pass


def test_waiting_is_not_spent_working_is() -> None:
    clock = Stopwatch()
    time.sleep(0.12)
    assert clock.over(0.05) is None
    _spin(0.12)
    spent = clock.over(0.05)
    assert spent is not None and 0.1 <= spent < 1.0


def test_a_jdl_evaluation_waiting_for_a_core_is_not_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jdl, "EVALUATION_BUDGET_MS", 50)
    budget = jdl._Budget()
    time.sleep(0.12)
    budget.spend("Arguments", 1)
    _spin(0.12)
    with pytest.raises(JobDescriptionError,
                       match=r"Arguments: evaluating the JDL took \d+ ms of CPU time"):
        budget.spend("Arguments", 1)


def test_an_expression_is_given_up_only_for_its_own_cpu_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A budget no evaluation can stay under gives the expression up: the check is live.
    monkeypatch.setattr(classads, "EVALUATION_BUDGET", -1.0)
    target = classad2.ClassAd({"Site": "A"})
    classads._timed('other.Site == "A"', target)
    assert 'other.Site == "A"' in classads._too_slow
    # Under a budget it keeps, it is evaluated again and again.
    monkeypatch.setattr(classads, "EVALUATION_BUDGET", 0.05)
    assert classads._timed('other.Site == "B" || true', target) is True
    assert 'other.Site == "B" || true' not in classads._too_slow
    classads._too_slow.discard('other.Site == "A"')
