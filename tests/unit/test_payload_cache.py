"""The match answer's payloads are read from the jobs' stored descriptions through a
per-process cache: the same text and place give the same payload, another place or text its
own, a text that cannot be read is refused every time, and the cache stays within its size."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from matcher.pilots import DESCRIPTIONS, Descriptions, payload
from matcher.problems import Problem
from optimizers.description import JobDescriptionError

PARAMETRIC = '[ Executable = "run.sh"; Arguments = "%s"; Parameters = {"a", "b", "c"}; ]'


@dataclass
class Row:
    """The columns of a job that the match answer reads (taskqueue.queues.jobs.jobs_for_pilot)."""

    id: int
    description: str
    bulk_index: int | None
    description_format: str = "jdl"
    vo: str = "lhcb"
    owner: str = "alice"
    owner_group: str = "lhcb_user"
    job_type: str = "User"
    payload: str | None = None


def test_the_same_text_and_place_give_the_same_payload() -> None:
    first = payload(Row(1, PARAMETRIC, 1))
    again = payload(Row(2, PARAMETRIC, 1))
    assert first.arguments == again.arguments == ["b"]
    assert (first.job_id, again.job_id) == (1, 2)
    assert {**first.to_dict(), "job_id": 0} == {**again.to_dict(), "job_id": 0}
    assert DESCRIPTIONS.get(PARAMETRIC, "jdl", 1) is DESCRIPTIONS.get(PARAMETRIC, "jdl", 1)


def test_each_place_in_a_parametric_text_has_its_own_payload() -> None:
    assert [payload(Row(i, PARAMETRIC, i)).arguments for i in range(3)] == [["a"], ["b"],
                                                                            ["c"]]


def test_a_payload_changed_by_its_reader_does_not_change_the_next() -> None:
    text = '[ Executable = "run.sh"; Arguments = "x y"; Environment = {"A=1"}; ]'
    first = payload(Row(1, text, None))
    first.arguments.append("z")
    first.environment["B"] = "2"
    again = payload(Row(2, text, None))
    assert again.arguments == ["x", "y"]
    assert again.environment == {"A": "1"}


def test_an_unreadable_text_is_refused_each_time() -> None:
    broken = '[ Executable = "run.sh"; Arguments = '
    for job_id in (1, 2):
        with pytest.raises(Problem) as refused:
            payload(Row(job_id, broken, None))
        assert refused.value.status == 500
        assert f"job {job_id}'s stored description cannot be read" in refused.value.detail


def test_a_place_the_text_does_not_have_is_not_kept() -> None:
    cache = Descriptions()
    with pytest.raises(IndexError):
        cache.get(PARAMETRIC, "jdl", 7)
    assert len(cache) == 0


def test_the_cache_keeps_at_most_its_size() -> None:
    cache = Descriptions(size=2)
    texts = [f'[ Executable = "run{i}.sh"; ]' for i in range(4)]
    for text in texts:
        assert cache.get(text, "jdl", None).executable == text.split('"')[1]
    assert len(cache) == 2
    with pytest.raises(JobDescriptionError):
        cache.get("[ Executable = 1; ]", "jdl", None)
    assert len(cache) == 2
