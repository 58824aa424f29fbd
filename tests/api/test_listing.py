"""Job names and groups, job listings with filters and keyset paging, the summary by status,
bulk kill/reschedule/delete, and the pilot listing and records."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import update

from taskqueue.db.models import Job
from tests.api.conftest import TokenMaker
from tests.api.helpers import OTHER_VO, PILOT_REF, SITE, VO, Api, assert_problem
from tests.conftest import Database

CERN_CONDOR = {"site": SITE, "ce": "ce503.cern.ch", "queue": "condor"}


def named(name: str, group: str | None = None) -> str:
    jdl = f'Executable = "/bin/true"; JobName = "{name}";'
    return jdl + (f' JobGroup = "{group}";' if group else "")


def ids_of(answer: dict[str, Any]) -> list[int]:
    return [j["job_id"] for j in answer["jobs"]]


# -- names and groups ------------------------------------------------------------------------

def test_names_and_groups_are_stored_and_shown(client: Api, user_token: str) -> None:
    jdl = 'Executable = "/bin/true"; JobName = "sim-%n"; JobGroup = "mc2026"; Parameters = 3;'
    ids = client.submit_jdl(user_token, jdl)
    job = client.job(user_token, ids[1])
    assert (job["job_name"], job["job_group"]) == ("sim-1", "mc2026")
    listed = client.ok("GET", "/api/v1/jobs", user_token, query={"job_group": "mc2026"})
    assert [(j["job_id"], j["job_name"]) for j in listed["jobs"]] == [
        (ids[0], "sim-0"), (ids[1], "sim-1"), (ids[2], "sim-2")]


def test_json_name_and_custom_group(client: Api, user_token: str) -> None:
    (job_id,) = client.submit_json(user_token, {
        "executable": "/bin/true", "name": "fit",
        "attributes": {"custom_attributes": {"JobGroup": "analysis-7"}}})
    job = client.job(user_token, job_id)
    assert (job["job_name"], job["job_group"]) == ("fit", "analysis-7")


@pytest.mark.parametrize(("jdl", "fragment"), [
    ('Executable = "x"; JobGroup = "' + "g" * 129 + '";', "JobGroup is 129 characters long"),
    ('Executable = "x"; JobName = "' + "n" * 256 + '";', "at most 255"),
    ('Executable = "x"; JobGroup = "a\\nb";', "one line"),
    ('Executable = "x"; JobGroup = {"a", "b"};', "JobGroup must be a non-empty string"),
])
def test_bad_names_and_groups_are_refused(client: Api, user_token: str, jdl: str,
                                          fragment: str) -> None:
    response = client.call("POST", "/api/v1/jobs", user_token, text=jdl)
    assert_problem(response, 422, fragment)
    assert client.ok("GET", "/api/v1/jobs", user_token)["jobs"] == []


# -- listing ---------------------------------------------------------------------------------

def test_name_filter_exact_and_prefix(client: Api, user_token: str) -> None:
    a = client.submit_jdl(user_token, named("reco_1"))[0]
    b = client.submit_jdl(user_token, named("reco_12"))[0]
    c = client.submit_jdl(user_token, named("recoX1"))[0]
    d = client.submit_jdl(user_token, named("50%done"))[0]

    def names(value: str) -> list[int]:
        return ids_of(client.ok("GET", "/api/v1/jobs", user_token, query={"job_name": value}))

    assert names("reco_1") == [a]
    assert names("reco_1*") == [a, b]  # "_" is a character, not a wildcard
    assert names("reco*") == [a, b, c]
    assert names("50%*") == [d]
    assert names("5%*") == []
    assert names("*") == [a, b, c, d]


def test_newest_first_pages_cover_every_job_once(client: Api, user_token: str) -> None:
    ids = client.submit_jdl(user_token, 'Executable = "x"; Parameters = 7;')
    seen: list[int] = []
    after: int | None = None
    while True:
        query: dict[str, str | int] = {"order": "desc", "limit": 3}
        if after is not None:
            query["after"] = after
        page = client.ok("GET", "/api/v1/jobs", user_token, query=query)
        seen += ids_of(page)
        after = page["next_after"]
        if after is None:
            break
    assert seen == sorted(ids, reverse=True)


def test_since_filter(client: Api, db: Database, user_token: str) -> None:
    old, new = client.submit_jdl(user_token, 'Executable = "x"; Parameters = 2;')
    day_ago = datetime.now(UTC) - timedelta(days=1)
    with db.engine.begin() as conn:
        conn.execute(update(Job).where(Job.id == old).values(submitted_at=day_ago))
    since = (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert ids_of(client.ok("GET", "/api/v1/jobs", user_token, query={"since": since})) == [new]
    summary = client.ok("GET", "/api/v1/jobs/summary", user_token, query={"since": since})
    assert summary == {"total": 1, "by_status": {"Waiting": 1}}
    future = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    assert client.ok("GET", "/api/v1/jobs", user_token, query={"since": future})["jobs"] == []


def test_status_names_in_any_letter_case(client: Api, user_token: str) -> None:
    waiting = client.submit_jdl(user_token)[0]
    for status in ("Waiting", "waiting", "WAITING"):
        answer = client.ok("GET", "/api/v1/jobs", user_token, query={"status": status})
        assert [j["job_id"] for j in answer["jobs"]] == [waiting]
    assert client.ok("GET", "/api/v1/jobs", user_token, query={"status": "done"})["jobs"] == []
    assert_problem(client.call("GET", "/api/v1/jobs", user_token, query={"status": "waitin"}),
                   400, "status", "Waiting")


@pytest.mark.parametrize("since", ["yesterday", "2026-13-01", "", "1d"])
def test_a_bad_since_is_400(client: Api, user_token: str, since: str) -> None:
    response = client.call("GET", "/api/v1/jobs", user_token, query={"since": since})
    assert_problem(response, 400, "since", "ISO 8601")


def test_summary_counts_what_the_caller_may_see(client: Api, user_token: str,
                                                other_user_token: str,
                                                operator_token: str) -> None:
    mine = client.submit_jdl(user_token, named("a", "g1") + " Parameters = 3;")
    client.submit_jdl(other_user_token, named("b", "g1"))
    client.ok("POST", f"/api/v1/jobs/{mine[0]}/kill", user_token)
    assert client.ok("GET", "/api/v1/jobs/summary", user_token) == {
        "total": 3, "by_status": {"Killed": 1, "Waiting": 2}}
    assert client.ok("GET", "/api/v1/jobs/summary", operator_token,
                     query={"job_group": "g1"}) == {
        "total": 4, "by_status": {"Killed": 1, "Waiting": 3}}
    assert client.ok("GET", "/api/v1/jobs/summary", operator_token,
                     query={"owner": "bob"})["total"] == 1
    # a user's owner filter cannot widen the view
    assert client.ok("GET", "/api/v1/jobs/summary", user_token,
                     query={"owner": "bob"})["total"] == 3


# -- bulk actions ----------------------------------------------------------------------------

def test_bulk_kill_acts_on_each_job_it_may(client: Api, token: TokenMaker, user_token: str,
                                           other_user_token: str) -> None:
    mine = client.submit_jdl(user_token, 'Executable = "x"; Parameters = 3;')
    theirs = client.submit_jdl(other_user_token)[0]
    belle = token("alice", "user", vo=OTHER_VO, group="belle_user")
    belles = client.submit_jdl(belle)[0]
    client.ok("POST", f"/api/v1/jobs/{mine[2]}/kill", user_token)
    answer = client.ok("POST", "/api/v1/jobs/kill", user_token,
                       json_body={"job_ids": [mine[1], mine[0], mine[2], theirs, belles,
                                              999999, mine[0]], "reason": "wrong input"})
    assert [(j["job_id"], j["status"]) for j in answer["jobs"]] == [
        (mine[0], "Killed"), (mine[1], "Killed")]
    assert answer["jobs"][0]["minor_status"] == "Killed by user:alice: wrong input"
    errors = {e["job_id"]: (e["code"], e["detail"]) for e in answer["errors"]}
    assert errors[mine[2]][0] == 409 and "already Killed" in errors[mine[2]][1]
    assert errors[theirs][0] == 403
    assert errors[belles] == (404, f"job {belles} does not exist")
    assert errors[999999] == (404, "job 999999 does not exist")
    assert client.job(other_user_token, theirs)["status"] == "Waiting"
    assert client.job(belle, belles)["status"] == "Waiting"


def test_bulk_reschedule_and_delete(client: Api, user_token: str, pilot_token: str,
                                    operator_token: str) -> None:
    ids = client.submit_jdl(user_token, 'Executable = "x"; Parameters = 3;')
    matched = client.match(pilot_token, pilot_reference=PILOT_REF)["jobs"][0]["job_id"]
    assert client.report(pilot_token, matched, "Done", exit_code=0).status_code == 200
    answer = client.ok("POST", "/api/v1/jobs/reschedule", operator_token,
                       json_body={"job_ids": ids})
    assert {j["job_id"]: j["status"] for j in answer["jobs"]} == {i: "Waiting" for i in ids}
    assert answer["errors"] == []
    assert client.job(user_token, matched)["reschedule_count"] == 1
    answer = client.ok("POST", "/api/v1/jobs/delete", user_token, json_body={"job_ids": ids})
    assert [j["status"] for j in answer["jobs"]] == ["Deleted"] * 3
    again = client.ok("POST", "/api/v1/jobs/delete", user_token, json_body={"job_ids": ids})
    assert again["jobs"] == [] and [e["code"] for e in again["errors"]] == [409] * 3


@pytest.mark.parametrize(("body", "fragment"), [
    ({"job_ids": []}, "at least 1 item"),
    ({"job_ids": list(range(1, 1002))}, "at most 1000"),
    ({"job_ids": ["1"]}, "body.job_ids[0] must be an integer"),
    ({"job_ids": [0]}, "at least 1"),
    ({"job_ids": [1], "reason": "x" * 256}, "at most 255"),
    ({"ids": [1]}, "body.job_ids is required"),
])
def test_bulk_bodies_are_checked(client: Api, user_token: str, body: Any,
                                 fragment: str) -> None:
    job_id = client.submit_jdl(user_token)[0]
    for action in ("kill", "reschedule", "delete"):
        response = client.call("POST", f"/api/v1/jobs/{action}", user_token, json_body=body)
        assert_problem(response, 422, fragment)
    assert client.job(user_token, job_id)["status"] == "Waiting"


# -- pilots ----------------------------------------------------------------------------------

def test_pilot_listing_and_record(client: Api, user_token: str, own_pilot_token: str,
                                  pilot_token: str, operator_token: str,
                                  other_vo_operator_token: str) -> None:
    for ref in ("pilot-0", PILOT_REF):
        client.ok("PUT", f"/api/v1/pilots/{ref}", pilot_token,
                  json_body={**CERN_CONDOR, "status": "Running"})
    job_id = client.submit_jdl(user_token)[0]
    client.match(own_pilot_token)
    client.report(own_pilot_token, job_id, "Running")
    listed = client.ok("GET", "/api/v1/pilots", operator_token)
    assert [p["reference"] for p in listed["pilots"]] == [PILOT_REF, "pilot-0"]
    page = client.ok("GET", "/api/v1/pilots", operator_token, query={"limit": 1})
    rest = client.ok("GET", "/api/v1/pilots", operator_token,
                     query={"limit": 1, "after": page["next_after"]})
    assert [p["reference"] for p in page["pilots"] + rest["pilots"]] == [PILOT_REF, "pilot-0"]
    assert client.ok("GET", "/api/v1/pilots", operator_token,
                     query={"status": "Done"})["pilots"] == []
    record = client.ok("GET", f"/api/v1/pilots/{PILOT_REF}", operator_token)
    assert record["site"] == SITE and record["status"] == "Running"
    assert record["jobs"] == [{"job_id": job_id, "status": "Running",
                               "minor_status": "Application started"}]
    assert record["last_report"]["job_id"] == job_id
    assert record["last_report"]["status"] == "Running"
    assert client.ok("GET", "/api/v1/pilots/pilot-0", operator_token)["last_report"] is None
    # the pilot itself may read its own record, not another's
    assert client.ok("GET", f"/api/v1/pilots/{PILOT_REF}", own_pilot_token)["jobs"]
    assert_problem(client.call("GET", "/api/v1/pilots/pilot-0", own_pilot_token), 403)
    # another VO sees nothing of them
    assert client.ok("GET", "/api/v1/pilots", other_vo_operator_token)["pilots"] == []
    assert_problem(client.call("GET", f"/api/v1/pilots/{PILOT_REF}",
                               other_vo_operator_token), 404)
    assert_problem(client.call("GET", "/api/v1/pilots/nobody", operator_token), 404, "nobody")
    assert_problem(client.call("GET", "/api/v1/pilots/jobs", operator_token), 404)
    assert_problem(client.call("GET", "/api/v1/pilots", user_token), 403)
    assert VO == "lhcb"
