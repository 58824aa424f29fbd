"""The pilot kill as a careless or hostile hand uses it, over HTTP on every database the
session runs on: a reference of odd characters (300 characters, non-ASCII, "%2F", spaces, a
NUL) in the kill, the pilot's record and a match is a clear 404 or 422, never a 500; a pilot of
such a name that registered itself is killed and then gets no job; a pilot token bound to one
pilot cannot kill, nor match as another pilot once killed."""

from __future__ import annotations

from urllib.parse import quote

import pytest

from tests.api.helpers import SITE, Api, assert_problem
from tests.api.test_pilot_kill import beat, by_hand, match

ODD = ["p" * 300, "p" * 255 + "é", "pilote-é-ß-日本-💥", "a%2Fb", "with space", "..",
       "trailing ", "x" * 5000]


@pytest.mark.parametrize("reference", ODD)
def test_an_odd_reference_is_a_clear_not_found(client: Api, operator_token: str,
                                               pilot_token: str, reference: str) -> None:
    path = quote(reference, safe="")
    for method, url in (("POST", f"/api/v1/pilots/{path}/kill"),
                        ("GET", f"/api/v1/pilots/{path}"),
                        ("GET", f"/api/v1/pilots/{path}/log")):
        response = client.call(method, url, operator_token)
        assert response.status_code in (404, 422), (method, response.get_data(as_text=True))
        assert_problem(response, response.status_code)
    answer = client.call("POST", "/api/v1/pilots/match", pilot_token, json_body={
        "resource": {"vo": "lhcb", "site": SITE, "pilot_reference": reference}})
    assert answer.status_code in (200, 422), answer.get_data(as_text=True)


def test_a_nul_in_a_reference_is_refused(client: Api, operator_token: str,
                                         pilot_token: str) -> None:
    for method, url in (("POST", "/api/v1/pilots/a%00b/kill"),
                        ("GET", "/api/v1/pilots/a%00b")):
        response = client.call(method, url, operator_token)
        assert response.status_code in (404, 422), response.get_data(as_text=True)
    assert_problem(client.call("POST", "/api/v1/pilots/match", pilot_token, json_body={
        "resource": {"vo": "lhcb", "site": SITE, "pilot_reference": "a\x00b"}}), 422, "NUL")


@pytest.mark.parametrize("reference", ["pilote-é-ß-日本-💥", "p" * 255, "with space"])
def test_a_pilot_of_an_odd_name_is_killed_and_gets_no_job(
        client: Api, operator_token: str, user_token: str, pilot_token: str,
        reference: str) -> None:
    by_hand(client, pilot_token, reference)
    (job_id,) = client.submit_jdl(user_token)
    path = quote(reference, safe="")
    killed = client.ok("POST", f"/api/v1/pilots/{path}/kill", operator_token, status=202)
    assert killed["reference"] == reference
    refused = match(client, pilot_token, reference)
    assert (refused["jobs"], refused["no_match"]["reason"]) == ([], "pilot_killed")
    assert beat(client, pilot_token, reference)["pilot_command"] == "kill"
    assert client.job(user_token, job_id)["status"] == "Waiting"
    assert client.ok("GET", f"/api/v1/pilots/{path}", operator_token)["jobs"] == []


def test_a_token_of_one_pilot_neither_kills_nor_escapes_its_kill(
        client: Api, operator_token: str, user_token: str, own_pilot_token: str,
        site_pilot_token: str) -> None:
    """own_pilot_token speaks for pilot-1 at LCG.CERN.cern only."""
    by_hand(client, own_pilot_token, "pilot-1")
    assert_problem(client.call("POST", "/api/v1/pilots/pilot-1/kill", own_pilot_token), 403)
    assert_problem(client.call("POST", "/api/v1/pilots/pilot-1/kill", site_pilot_token), 403)
    client.ok("POST", "/api/v1/pilots/pilot-1/kill", operator_token, status=202)
    client.submit_jdl(user_token)
    # Another reference or site in its match request is refused or overridden: still killed.
    assert_problem(client.call("POST", "/api/v1/pilots/match", own_pilot_token, json_body={
        "resource": {"vo": "lhcb", "site": SITE, "pilot_reference": "pilot-2"}}), 403)
    assert_problem(client.call("POST", "/api/v1/pilots/match", own_pilot_token, json_body={
        "resource": {"vo": "lhcb", "site": "LCG.Other.org"}}), 403)
    refused = client.match(own_pilot_token, site=SITE)
    assert (refused["jobs"], refused["no_match"]["reason"]) == ([], "pilot_killed")
    # Nor may it beat for another pilot to learn or dodge a command.
    assert_problem(client.call("POST", "/api/v1/pilots/heartbeat", own_pilot_token,
                               json_body={"pilot_reference": "pilot-2", "jobs": []}), 403)


@pytest.mark.parametrize("reference", ["pilote-é-ß-日本-💥", "💥" * 255])
def test_a_pilot_of_an_odd_name_runs_a_job_and_its_page_lists_it(
        client: Api, operator_token: str, user_token: str, pilot_token: str,
        reference: str) -> None:
    """pilot_runs keeps the reference as given, four-byte characters too."""
    by_hand(client, pilot_token, reference)
    (job_id,) = client.submit_jdl(user_token)
    assert [j["job_id"] for j in match(client, pilot_token, reference)["jobs"]] == [job_id]
    assert client.report(pilot_token, job_id, "Running", reference).status_code == 200
    client.ok("POST", f"/api/v1/pilots/{quote(reference, safe='')}/kill", operator_token,
              status=202)
    handed = client.report(pilot_token, job_id, "Rescheduled", reference,
                           minor_status="Pilot stopped: killed")
    assert handed.status_code == 200, handed.get_data(as_text=True)
    record = client.ok("GET", f"/api/v1/pilots/{quote(reference, safe='')}", operator_token)
    assert [j["job_id"] for j in record["jobs"]] == [job_id]
    assert record["reference"] == reference
