"""An operator's pilot kill, over HTTP: any pilot the service knows may be killed; from then on
it gets no job and is told to stop; the job it hands back is rescheduled once; a report on a
job that is no longer its own changes nothing; a pilot heard from after its CE said it ended
is marked so and told to stop; its page lists every job it ran."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from flask import Flask

from matcher.runtime import runtime_of
from taskqueue.pilots.pilotlogs import mark_hanging, record_ce_state, record_killed
from tests.api.helpers import SITE, Api, assert_problem
from tests.api.test_dashboard import page, sign_in
from tests.api.test_pilot_logs import CE, QUEUE, director_pilot

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def by_hand(client: Api, pilot_token: str, reference: str) -> None:
    """A pilot started by hand: it registers itself, the director knows nothing of it."""
    client.ok("PUT", f"/api/v1/pilots/{reference}", pilot_token, json_body={
        "site": SITE, "ce": CE, "queue": QUEUE, "status": "Running"})


def match(client: Api, token: str, reference: str) -> dict[str, Any]:
    return client.match(token, pilot_reference=reference, site=SITE)


def beat(client: Api, token: str, reference: str, *job_ids: int) -> dict[str, Any]:
    answer: dict[str, Any] = client.ok("POST", "/api/v1/pilots/heartbeat", token, json_body={
        "pilot_reference": reference, "jobs": [{"job_id": j} for j in job_ids]})
    return answer


def test_a_pilot_started_by_hand_is_killed_and_gets_no_job(
        client: Api, operator_token: str, user_token: str, pilot_token: str) -> None:
    by_hand(client, pilot_token, "hand-1")
    (job_id,) = client.submit_jdl(user_token)
    answer = client.ok("POST", "/api/v1/pilots/hand-1/kill", operator_token, status=202)
    assert answer["kill_requested_by"] == "olga"
    refused = match(client, pilot_token, "hand-1")
    assert refused["jobs"] == []
    assert refused["no_match"]["reason"] == "pilot_killed"
    assert "killed at the request of olga" in refused["no_match"]["detail"]
    assert beat(client, pilot_token, "hand-1")["pilot_command"] == "kill"
    # The job waits for another pilot, which gets it.
    assert client.job(user_token, job_id)["status"] == "Waiting"
    other = match(client, pilot_token, "hand-2")
    assert [j["job_id"] for j in other["jobs"]] == [job_id]
    assert "pilot_command" not in beat(client, pilot_token, "hand-2", job_id)
    assert_problem(client.call("POST", "/api/v1/pilots/nosuch/kill", operator_token), 404)


def test_the_job_of_a_killed_pilot_is_rescheduled_once_and_a_late_report_changes_nothing(
        client: Api, operator_token: str, user_token: str, pilot_token: str) -> None:
    by_hand(client, pilot_token, "hand-3")
    (job_id,) = client.submit_jdl(user_token)
    assert [j["job_id"] for j in match(client, pilot_token, "hand-3")["jobs"]] == [job_id]
    assert client.report(pilot_token, job_id, "Running", "hand-3").status_code == 200
    client.ok("POST", "/api/v1/pilots/hand-3/kill", operator_token, status=202)
    answer = beat(client, pilot_token, "hand-3", job_id)
    # The pilot as a whole must stop; the job is still its own to hand back.
    assert answer == {"commands": [], "pilot_command": "kill"}
    handed = client.report(pilot_token, job_id, "Rescheduled", "hand-3",
                           minor_status="Pilot stopped: killed")
    assert handed.status_code == 200, handed.get_data(as_text=True)
    job = client.job(user_token, job_id)
    assert (job["status"], job["reschedule_count"]) == ("Waiting", 1)
    # The same report again, and a Failed one, are refused and change nothing.
    for status in ("Rescheduled", "Failed", "Running"):
        assert_problem(client.report(pilot_token, job_id, status, "hand-3", exit_code=1,
                                     output_tail="late"), 403, "was not given to pilot")
    after = client.job(user_token, job_id)
    assert after == job
    # No later match gives it the job (or any other).
    assert match(client, pilot_token, "hand-3")["jobs"] == []
    # Its page still lists the job it ran, now waiting elsewhere.
    record = client.ok("GET", "/api/v1/pilots/hand-3", operator_token)
    assert [j["job_id"] for j in record["jobs"]] == [job_id]


def test_a_kill_that_lands_while_a_claim_is_in_flight_hands_the_job_back_uncounted(
        client: Api, operator_token: str, user_token: str, pilot_token: str) -> None:
    by_hand(client, pilot_token, "hand-4")
    (job_id,) = client.submit_jdl(user_token)
    assert [j["job_id"] for j in match(client, pilot_token, "hand-4")["jobs"]] == [job_id]
    # The kill is noted after the claim and before the pilot confirms the job.
    client.ok("POST", "/api/v1/pilots/hand-4/kill", operator_token, status=202)
    confirmed = client.ok("POST", f"/api/v1/pilots/jobs/{job_id}/status", pilot_token,
                          json_body={"pilot_reference": "hand-4", "status": "Running"})
    assert confirmed["status"] == "Waiting"
    job = client.job(user_token, job_id)
    assert (job["status"], job["reschedule_count"], job["pilot_reference"]) == (
        "Waiting", 0, None)
    assert "killed at the request of olga" in " ".join(
        h["minor_status"] for h in job["history"])
    assert beat(client, pilot_token, "hand-4", job_id) == {
        "commands": [{"job_id": job_id, "command": "kill"}], "pilot_command": "kill"}


def test_a_pilot_heard_from_after_its_ce_said_it_ended_is_marked_and_told_to_stop(
        client: Api, app: Flask, operator_token: str, user_token: str,
        pilot_token: str) -> None:
    director_pilot(app, "arc-aaa")
    runtime = runtime_of(app)
    runtime.transaction(partial(record_ce_state, vo="lhcb", reference="arc-aaa",
                                status="Done", reason="the CE says FINISHED", exit_code=0,
                                now=NOW))
    client.submit_jdl(user_token)
    before = client.ok("GET", "/api/v1/pilots/arc-aaa", operator_token)
    assert before["heard_after_end_at"] is None
    refused = match(client, pilot_token, "arc-aaa")
    assert (refused["jobs"], refused["no_match"]["reason"]) == ([], "pilot_killed")
    assert "has ended (Done)" in refused["no_match"]["detail"]
    assert beat(client, pilot_token, "arc-aaa")["pilot_command"] == "kill"
    after = client.ok("GET", "/api/v1/pilots/arc-aaa", operator_token)
    assert after["heard_after_end_at"] is not None
    http = client.client
    assert sign_in(http, operator_token).status_code == 302
    html = page(http, "/ui/pilots/arc-aaa")
    assert 'id="heard-after-end"' in html
    # It may still be killed (it lives on).
    assert 'id="kill"' in html


def test_the_kill_banner_goes_once_the_pilot_ended(
        client: Api, app: Flask, operator_token: str) -> None:
    director_pilot(app, "arc-bbb")
    http = client.client
    assert sign_in(http, operator_token).status_code == 302
    client.ok("POST", "/api/v1/pilots/arc-bbb/kill", operator_token, status=202)
    html = page(http, "/ui/pilots/arc-bbb")
    assert 'id="kill-requested"' in html and 'id="kill"' not in html
    runtime_of(app).transaction(partial(record_ce_state, vo="lhcb", reference="arc-bbb",
                                        status="Aborted", reason="", exit_code=None, now=NOW))
    assert 'id="kill-requested"' not in page(http, "/ui/pilots/arc-bbb")


def test_a_pilot_that_hangs_in_a_ce_state_says_where_and_how_long_and_why_it_was_killed(
        client: Api, app: Flask, operator_token: str) -> None:
    director_pilot(app, "arc-ccc")
    runtime = runtime_of(app)
    runtime.transaction(partial(record_ce_state, vo="lhcb", reference="arc-ccc",
                                status="Submitted", reason="", exit_code=None, now=NOW,
                                ce_state="ACCEPTING"))
    record = client.ok("GET", "/api/v1/pilots/arc-ccc", operator_token)
    assert (record["ce_state"], record["ce_state_since"], record["hung_in"]) == (
        "ACCEPTING", "2026-12-06T12:00:00.000000Z", None)
    http = client.client
    assert sign_in(http, operator_token).status_code == 302
    html = page(http, "/ui/pilots/arc-ccc")
    assert re.search(r'id="ce-state">ACCEPTING for \d+ (d|h|min|s) \(since 2026-12-06 '
                     r'12:00:00\)', html), html
    assert re.search(r"ACCEPTING for \d+ (d|h|min|s)</span>", page(http, "/ui/pilots"))

    later = NOW + timedelta(seconds=960)
    (hung,) = runtime.transaction(partial(mark_hanging, pilots=[("lhcb", "arc-ccc")],
                                          timeouts={"ACCEPTING": 900}, now=later))
    assert (hung.reference, hung.ce_state, hung.seconds) == ("arc-ccc", "ACCEPTING", 960)
    runtime.transaction(partial(record_killed, vo="lhcb", reference="arc-ccc", now=later))
    record = client.ok("GET", "/api/v1/pilots/arc-ccc", operator_token)
    assert (record["status"], record["hung_in"], record["reason"]) == (
        "Aborted", "ACCEPTING", "stuck in ACCEPTING for 960 s: killed")
    html = page(http, "/ui/pilots/arc-ccc")
    assert 'id="hung-in">killed for hanging in ACCEPTING' in html
    assert "stuck in ACCEPTING for 960 s: killed" in html
