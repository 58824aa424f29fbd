"""/api/v1/director/queues: the director's record of a VO's queues, and an operator's retry,
through the Flask test client on every database."""

from __future__ import annotations

from datetime import UTC, datetime
from functools import partial

from flask import Flask

from matcher.runtime import runtime_of
from taskqueue.pilots.records import record_ce_failure, record_submission_failure
from tests.api.helpers import SITE, Api, assert_problem

CE, QUEUE = "ce503.cern.ch", "condor"
#: A queue of a site that serves lhcb only.
RAL = ("LCG.RAL.uk", "arc-ce01.gridpp.rl.ac.uk", "grid")


def _fail(app: Flask, site: str, ce: str, queue: str, reason: str) -> None:
    runtime = runtime_of(app)
    now = datetime.now(UTC)
    runtime.transaction(partial(record_submission_failure, site=site, ce=ce, queue=queue,
                                references=[], reason=reason, now=now, base_backoff=300))
    runtime.transaction(partial(record_ce_failure, queues=[(site, ce, queue)],
                                reason="poll: connection refused", now=now,
                                base_backoff=300))


def test_a_failing_queue_is_listed_and_a_retry_ends_its_back_off(
        client: Api, app: Flask, operator_token: str) -> None:
    assert client.ok("GET", "/api/v1/director/queues", operator_token) == {"queues": []}
    _fail(app, SITE, CE, QUEUE, "A-REX said 503")
    [state] = client.ok("GET", "/api/v1/director/queues", operator_token)["queues"]
    assert (state["site"], state["ce"], state["queue"]) == (SITE, CE, QUEUE)
    assert state["failures"] == 1 and state["last_error"] == "A-REX said 503"
    assert state["poll_failures"] == 1 and state["poll_error"] == "poll: connection refused"
    assert state["skip_until"] and state["poll_skip_until"]
    after = client.ok("POST", f"/api/v1/director/queues/{SITE}/{CE}/{QUEUE}/retry",
                      operator_token)
    assert after["failures"] == 0 and after["poll_failures"] == 0
    assert after["poll_skip_until"] is None
    assert after["retry_requested_by"] == "operator:olga" and after["retry_requested_at"]
    [listed] = client.ok("GET", "/api/v1/director/queues", operator_token)["queues"]
    assert listed == after


def test_a_queue_never_served_is_404(client: Api, operator_token: str) -> None:
    assert_problem(client.call("POST", f"/api/v1/director/queues/{SITE}/{CE}/{QUEUE}/retry",
                               operator_token), 404, "never served")


def test_a_queue_that_is_not_configured_is_404(client: Api, operator_token: str) -> None:
    assert_problem(client.call("POST", f"/api/v1/director/queues/{SITE}/{CE}/nosuch/retry",
                               operator_token), 404, "nosuch", "resources configuration")


def test_another_vos_queues_are_neither_listed_nor_retried(
        client: Api, app: Flask, operator_token: str, other_vo_operator_token: str) -> None:
    _fail(app, *RAL, "down")
    assert [q["site"] for q in client.ok("GET", "/api/v1/director/queues",
                                         operator_token)["queues"]] == [RAL[0]]
    assert client.ok("GET", "/api/v1/director/queues", other_vo_operator_token) == {
        "queues": []}
    assert_problem(client.call("POST", "/api/v1/director/queues/{}/{}/{}/retry".format(*RAL),
                               other_vo_operator_token), 404, "belle")
    [state] = client.ok("GET", "/api/v1/director/queues", operator_token)["queues"]
    assert state["failures"] == 1 and state["retry_requested_by"] == ""


def test_users_and_pilots_may_not_retry(client: Api, app: Flask, user_token: str,
                                        pilot_token: str, operator_token: str) -> None:
    _fail(app, SITE, CE, QUEUE, "down")
    for token in (user_token, pilot_token):
        assert_problem(client.call("POST", f"/api/v1/director/queues/{SITE}/{CE}/{QUEUE}/retry",
                                   token), 403)
    [state] = client.ok("GET", "/api/v1/director/queues", operator_token)["queues"]
    assert state["failures"] == 1
