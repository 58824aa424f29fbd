"""Texts that are not Unicode text in JSON bodies: a lone surrogate (``"\\ud800"``, which JSON
can write but UTF-8 cannot encode) is refused as a 400 problem naming where, as NUL is; a
surrogate pair is one character and is taken."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.api.helpers import PILOT_REF, Api, assert_problem


def _send(client: Api, path: str, token: str, body: Any) -> Any:
    # json.dumps writes a lone surrogate as its escape, as a careless client would.
    return client.call("POST", path, token, data=json.dumps(body).encode("ascii"),
                       content_type="application/json")


def _matched_job(client: Api, user_token: str, pilot_token: str) -> int:
    job_id = client.submit_jdl(user_token)[0]
    answer = client.match(pilot_token, pilot_reference=PILOT_REF)
    assert [j["job_id"] for j in answer["jobs"]] == [job_id], answer
    return job_id


@pytest.mark.parametrize("bad", ["\ud800", "x\udfffy", "\udbff"])
def test_a_lone_surrogate_in_a_heartbeat_tail_is_a_400(
        client: Api, user_token: str, pilot_token: str, bad: str) -> None:
    job_id = _matched_job(client, user_token, pilot_token)
    response = _send(client, "/api/v1/pilots/heartbeat", pilot_token, {
        "pilot_reference": PILOT_REF,
        "jobs": [{"job_id": job_id, "cpu_used": 1, "output_tail": bad}]})
    assert_problem(response, 400, "body.jobs[0].output_tail", "lone surrogate")


def test_a_lone_surrogate_in_a_final_report_is_a_400(
        client: Api, user_token: str, pilot_token: str) -> None:
    job_id = _matched_job(client, user_token, pilot_token)
    response = _send(client, f"/api/v1/pilots/jobs/{job_id}/status", pilot_token, {
        "pilot_reference": PILOT_REF, "status": "Done", "exit_code": 0,
        "output_tail": "ok\ud800"})
    assert_problem(response, 400, "body.output_tail", "U+D800")


def test_a_lone_surrogate_in_a_replica_lfn_is_a_400(client: Api,
                                                    operator_token: str) -> None:
    response = _send(client, "/api/v1/replicas", operator_token, {
        "replicas": [{"lfn": "/lhcb/d/\ud800", "se": "CERN-DST"}]})
    assert_problem(response, 400, "body.replicas[0].lfn", "lone surrogate")


def test_a_surrogate_pair_is_one_character_and_taken(
        client: Api, user_token: str, pilot_token: str) -> None:
    job_id = _matched_job(client, user_token, pilot_token)
    client.ok("POST", f"/api/v1/pilots/jobs/{job_id}/status", pilot_token, json_body={
        "pilot_reference": PILOT_REF, "status": "Running"})
    tail = "smile \ud83d\ude00"
    body = json.dumps({"pilot_reference": PILOT_REF,
                       "jobs": [{"job_id": job_id, "output_tail": tail}]})
    assert "\\ud83d\\ude00" in body
    response = client.call("POST", "/api/v1/pilots/heartbeat", pilot_token,
                           data=body.encode("ascii"), content_type="application/json")
    assert response.status_code == 200, response.get_data(as_text=True)
    assert client.ok("GET", f"/api/v1/jobs/{job_id}/output", user_token)[
        "output_tail"] == "smile \U0001f600"
