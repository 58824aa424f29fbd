"""The pilot's book of its payloads' tokens (pilot.payloadtoken.PayloadTokens): a late token
does not hold a payload's start, a matcher that gives no tokens is asked once, an ended
payload's token file goes."""

from __future__ import annotations

from pathlib import Path

from pilot.client import RefusedError, TransientError
from pilot.payloadtoken import PayloadTokens
from taskqueue.tokens import issue_token

SECRET = "a-test-secret-of-enough-length-0123456789"


def make_token(lifetime: int, now: float) -> str:
    return issue_token(SECRET, subject="alice", role="user", vo="lhcb", group="lhcb_user",
                       lifetime=lifetime, now=now)


class Matcher:
    """Answers each ask with the next of ``answers``: a token, or an error to raise."""

    def __init__(self, *answers: str | Exception) -> None:
        self.answers = list(answers)
        self.asked: list[int] = []

    def __call__(self, job_id: int) -> str:
        self.asked.append(job_id)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_late_token_does_not_hold_the_payload_and_comes_later(tmp_path: Path) -> None:
    clock = Clock()
    token = make_token(lifetime=3600, now=clock.now)
    matcher = Matcher(TransientError("GET ...: no complete answer within 15 s"), token)
    tokens = PayloadTokens(matcher, wall=clock)
    path = tokens.first(7, tmp_path)
    assert path == tmp_path / ".bearer_token"
    assert not path.exists()  # the payload starts; its $BEARER_TOKEN_FILE is not there yet
    tokens.renew({7})
    assert matcher.asked == [7]  # not again at once: after a back-off
    clock.now += 600
    tokens.renew({7})
    assert matcher.asked == [7, 7]
    assert path.read_text().strip() == token
    assert path.stat().st_mode & 0o777 == 0o600


def test_a_matcher_without_payload_tokens_is_asked_once(tmp_path: Path) -> None:
    matcher = Matcher(RefusedError(404, "this service gives payloads no tokens"))
    tokens = PayloadTokens(matcher)
    assert tokens.first(7, tmp_path / "a") is None
    assert tokens.first(8, tmp_path / "b") is None
    assert matcher.asked == [7]
    assert "no tokens" in tokens.off


def test_a_refusal_for_one_job_stops_its_renewals_only(tmp_path: Path) -> None:
    clock = Clock()
    good = make_token(lifetime=100, now=clock.now)
    matcher = Matcher(good, RefusedError(409, "job 7 is Done: its payload gets no token"),
                      make_token(lifetime=100, now=clock.now + 90),
                      make_token(lifetime=100, now=clock.now + 590))
    tokens = PayloadTokens(matcher, wall=clock)
    (tmp_path / "7").mkdir()
    (tmp_path / "8").mkdir()
    assert tokens.first(7, tmp_path / "7") is not None
    clock.now += 90  # due
    tokens.renew({7})
    assert not tokens.off
    assert tokens.first(8, tmp_path / "8") == tmp_path / "8" / ".bearer_token"
    clock.now += 500
    tokens.renew({7, 8})
    assert matcher.asked == [7, 7, 8, 8]  # 7 refused: never asked for again


def test_an_ended_payload_loses_its_token_file(tmp_path: Path) -> None:
    clock = Clock()
    tokens = PayloadTokens(Matcher(make_token(lifetime=100, now=clock.now)), wall=clock)
    path = tokens.first(7, tmp_path)
    assert path is not None and path.exists()
    tokens.finished(7)
    assert not path.exists()
    clock.now += 500
    tokens.renew(set())  # nothing left to renew, nothing asked


def test_a_token_from_the_match_answer_is_written_without_asking(tmp_path: Path) -> None:
    clock = Clock()
    given = make_token(lifetime=100, now=clock.now)
    renewed = make_token(lifetime=100, now=clock.now + 90)
    matcher = Matcher(renewed)
    tokens = PayloadTokens(matcher, wall=clock)
    path = tokens.first(7, tmp_path, given=given)
    assert path == tmp_path / ".bearer_token"
    assert path.read_text().strip() == given
    assert path.stat().st_mode & 0o777 == 0o600
    tokens.renew({7})
    assert matcher.asked == []
    clock.now += 90  # its renewal, through the endpoint as before
    tokens.renew({7})
    assert matcher.asked == [7]
    assert path.read_text().strip() == renewed


def test_a_token_in_the_answer_is_used_even_after_a_matcher_said_none(tmp_path: Path) -> None:
    """A matcher that gives payloads tokens again (its settings changed) and says so by the
    tokens of its answers."""
    clock = Clock()
    matcher = Matcher(RefusedError(404, "this service gives payloads no tokens"))
    tokens = PayloadTokens(matcher, wall=clock)
    assert tokens.first(7, tmp_path / "a") is None
    (tmp_path / "b").mkdir()
    given = make_token(lifetime=100, now=clock.now)
    path = tokens.first(8, tmp_path / "b", given=given)
    assert path is not None and path.read_text().strip() == given
    assert matcher.asked == [7] and not tokens.off
