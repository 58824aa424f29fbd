"""/api/v1/sitemask, /limits and /shares through the Flask test client, on every database, and
their effect on matching and on task-queue priorities."""

from __future__ import annotations

from typing import Any

from tests.api.conftest import TokenMaker
from tests.api.helpers import OTHER_SITE, PILOT_REF, SITE, Api, assert_problem


def limit(client: Api, token: str, **body: Any) -> dict[str, Any]:
    answer: dict[str, Any] = client.ok("POST", "/api/v1/limits", token, json_body=body)
    return answer


def priorities(client: Api, token: str) -> dict[str, float]:
    queues = client.ok("GET", "/api/v1/taskqueues", token)["task_queues"]
    return {q["owner"]: q["priority"] for q in queues}


# -- the site mask ------------------------------------------------------------------------

def test_ban_and_unban_a_site(client: Api, user_token: str, operator_token: str,
                              site_pilot_token: str) -> None:
    assert client.ok("GET", "/api/v1/sitemask", operator_token) == {"banned": []}
    ban = client.ok("PUT", f"/api/v1/sitemask/{SITE}", operator_token,
                    json_body={"reason": "SE down"})
    assert ban["site"] == SITE and ban["reason"] == "SE down"
    assert ban["banned_by"] == "operator:olga" and ban["banned_at"]
    mask = client.ok("GET", "/api/v1/sitemask", operator_token)
    assert [b["site"] for b in mask["banned"]] == [SITE]
    job_id = client.submit_jdl(user_token)[0]
    assert client.match(site_pilot_token, pilot_reference=PILOT_REF)["no_match"][
        "reason"] == "site_banned"
    assert client.match(site_pilot_token, pilot_reference=PILOT_REF)["jobs"] == []
    assert client.ok("DELETE", f"/api/v1/sitemask/{SITE}", operator_token) == {"banned": []}
    matched = client.match(site_pilot_token, pilot_reference=PILOT_REF)
    assert [p["job_id"] for p in matched["jobs"]] == [job_id]


def test_ban_again_replaces_the_reason(client: Api, operator_token: str) -> None:
    client.ok("PUT", f"/api/v1/sitemask/{SITE}", operator_token, json_body={"reason": "a"})
    client.ok("PUT", f"/api/v1/sitemask/{SITE}", operator_token, json_body={"reason": "b"})
    mask = client.ok("GET", "/api/v1/sitemask", operator_token)["banned"]
    assert [(b["site"], b["reason"]) for b in mask] == [(SITE, "b")]


def test_a_pilot_naming_several_sites_gets_jobs_of_the_unbanned_one(
        client: Api, user_token: str, operator_token: str, pilot_token: str) -> None:
    client.submit_jdl(user_token)
    client.ok("PUT", f"/api/v1/sitemask/{SITE}", operator_token, json_body={})
    answer = client.match(pilot_token, pilot_reference=PILOT_REF, site=[SITE, OTHER_SITE])
    assert len(answer["jobs"]) == 1


def test_unban_a_site_that_is_not_banned_is_404(client: Api, operator_token: str) -> None:
    assert_problem(client.call("DELETE", f"/api/v1/sitemask/{SITE}", operator_token), 404,
                   SITE)


def test_site_masks_are_per_vo(client: Api, user_token: str, operator_token: str,
                               other_vo_operator_token: str, site_pilot_token: str) -> None:
    client.ok("PUT", f"/api/v1/sitemask/{SITE}", other_vo_operator_token, json_body={})
    assert client.ok("GET", "/api/v1/sitemask", operator_token) == {"banned": []}
    client.submit_jdl(user_token)
    assert len(client.match(site_pilot_token, pilot_reference=PILOT_REF)["jobs"]) == 1
    assert_problem(client.call("DELETE", f"/api/v1/sitemask/{SITE}", operator_token), 404)
    assert len(client.ok("GET", "/api/v1/sitemask", other_vo_operator_token)["banned"]) == 1


# -- site limits --------------------------------------------------------------------------

def test_limits_post_get_delete(client: Api, operator_token: str) -> None:
    assert client.ok("GET", "/api/v1/limits", operator_token) == {"limits": []}
    made = limit(client, operator_token, site=SITE, attribute="job_type", value="User",
                 max_running=2)
    assert made["limit_id"] >= 1
    assert (made["site"], made["ce"], made["attribute"], made["value"]) == (
        SITE, "", "job_type", "User")
    assert made["max_running"] == 2 and made["matching_delay"] is None
    assert made["last_matched_at"] is None
    replaced = limit(client, operator_token, site=SITE, attribute="job_type", value="User",
                     max_running=5, matching_delay=30)
    assert replaced["limit_id"] == made["limit_id"]
    assert (replaced["max_running"], replaced["matching_delay"]) == (5, 30)
    other = limit(client, operator_token, site=SITE, ce="ce503.cern.ch",
                  attribute="owner_group", value="lhcb_user", max_running=1)
    listed = client.ok("GET", "/api/v1/limits", operator_token)["limits"]
    assert sorted(x["limit_id"] for x in listed) == sorted([made["limit_id"],
                                                            other["limit_id"]])
    remaining = client.ok("DELETE", f"/api/v1/limits/{made['limit_id']}", operator_token)
    assert [x["limit_id"] for x in remaining["limits"]] == [other["limit_id"]]
    assert_problem(client.call("DELETE", f"/api/v1/limits/{made['limit_id']}",
                               operator_token), 404, str(made["limit_id"]))


def test_a_limit_needs_a_number(client: Api, operator_token: str) -> None:
    response = client.call("POST", "/api/v1/limits", operator_token,
                           json_body={"site": SITE, "attribute": "job_type", "value": "User"})
    assert_problem(response, 422, "max_running")
    response = client.call("POST", "/api/v1/limits", operator_token,
                           json_body={"site": SITE, "attribute": "site", "value": "User",
                                      "max_running": 1})
    assert_problem(response, 422, "body.attribute")


def test_limits_are_per_vo(client: Api, operator_token: str,
                           other_vo_operator_token: str) -> None:
    made = limit(client, operator_token, site=SITE, attribute="job_type", value="User",
                 max_running=1)
    assert client.ok("GET", "/api/v1/limits", other_vo_operator_token) == {"limits": []}
    response = client.call("DELETE", f"/api/v1/limits/{made['limit_id']}",
                           other_vo_operator_token)
    assert response.status_code in (403, 404)
    assert_problem(response, response.status_code)
    assert len(client.ok("GET", "/api/v1/limits", operator_token)["limits"]) == 1


def test_max_running_limit_is_honoured_by_match(client: Api, user_token: str,
                                                operator_token: str, site_pilot_token: str,
                                                pilot_token: str) -> None:
    ids = [client.submit_jdl(user_token)[0] for _ in range(5)]
    limit(client, operator_token, site=SITE, attribute="job_type", value="User",
          max_running=2)
    first = client.match(site_pilot_token, pilot_reference="p-1")["jobs"]
    second = client.match(site_pilot_token, pilot_reference="p-2")["jobs"]
    assert len(first) == len(second) == 1
    third = client.match(site_pilot_token, pilot_reference="p-3")
    assert third["jobs"] == []
    assert third["no_match"]["reason"] == "held_by_limits"
    elsewhere = client.match(pilot_token, pilot_reference="p-4", site=OTHER_SITE)
    assert len(elsewhere["jobs"]) == 1  # the limit is for LCG.CERN.cern only
    ended = first[0]["job_id"]
    assert client.report(site_pilot_token, ended, "Running", reference="p-1").status_code == 200
    still = client.match(site_pilot_token, pilot_reference="p-3")
    assert still["no_match"]["reason"] == "held_by_limits"  # Running still counts
    assert client.report(site_pilot_token, ended, "Done", reference="p-1",
                         exit_code=0).status_code == 200
    freed = client.match(site_pilot_token, pilot_reference="p-3")
    assert len(freed["jobs"]) == 1
    running = client.ok("GET", "/api/v1/jobs", user_token,
                        query={"status": "Matched", "site": SITE})["jobs"]
    assert len(running) == 2
    assert {p["job_id"] for p in first + second + freed["jobs"]} <= set(ids)


def test_max_running_limit_caps_a_multi_job_match(client: Api, user_token: str,
                                                  operator_token: str,
                                                  site_pilot_token: str) -> None:
    for _ in range(4):
        client.submit_jdl(user_token)
    limit(client, operator_token, site=SITE, attribute="owner_group", value="lhcb_user",
          max_running=2)
    answer = client.match(site_pilot_token, count=4, pilot_reference=PILOT_REF)
    assert len(answer["jobs"]) == 2
    assert client.match(site_pilot_token, pilot_reference=PILOT_REF)["no_match"][
        "reason"] == "held_by_limits"


def test_a_limit_on_one_ce(client: Api, user_token: str, operator_token: str,
                           site_pilot_token: str) -> None:
    for _ in range(3):
        client.submit_jdl(user_token)
    limit(client, operator_token, site=SITE, ce="ce503.cern.ch", attribute="job_type",
          value="User", max_running=1)
    assert len(client.match(site_pilot_token, pilot_reference="a",
                            ce="ce503.cern.ch")["jobs"]) == 1
    held = client.match(site_pilot_token, pilot_reference="b", ce="ce503.cern.ch")
    assert held["no_match"]["reason"] == "held_by_limits"
    other_ce = client.match(site_pilot_token, pilot_reference="c", ce="ce-arm01.cern.ch")
    assert len(other_ce["jobs"]) == 1


def test_a_limit_on_another_job_type_holds_nothing(client: Api, user_token: str,
                                                   operator_token: str,
                                                   site_pilot_token: str) -> None:
    client.submit_jdl(user_token)
    limit(client, operator_token, site=SITE, attribute="job_type", value="MCSimulation",
          max_running=0)
    assert len(client.match(site_pilot_token, pilot_reference=PILOT_REF)["jobs"]) == 1


def test_matching_delay_is_honoured_by_match(client: Api, user_token: str,
                                             operator_token: str,
                                             site_pilot_token: str) -> None:
    for _ in range(3):
        client.submit_jdl(user_token)
    made = limit(client, operator_token, site=SITE, attribute="job_type", value="User",
                 matching_delay=3600)
    assert len(client.match(site_pilot_token, pilot_reference="a")["jobs"]) == 1
    listed = client.ok("GET", "/api/v1/limits", operator_token)["limits"]
    assert listed[0]["limit_id"] == made["limit_id"]
    assert listed[0]["last_matched_at"] is not None
    held = client.match(site_pilot_token, pilot_reference="b")
    assert held["jobs"] == [] and held["no_match"]["reason"] == "held_by_limits"
    client.ok("DELETE", f"/api/v1/limits/{made['limit_id']}", operator_token)
    assert len(client.match(site_pilot_token, pilot_reference="b")["jobs"]) == 1


# -- shares -------------------------------------------------------------------------------

def test_shares_get_put_delete(client: Api, user_token: str, operator_token: str) -> None:
    client.submit_jdl(user_token)
    start = client.ok("GET", "/api/v1/shares", operator_token)
    assert start == {"default_share": 1.0, "shares": []}
    before = priorities(client, operator_token)["alice"]
    answer = client.ok("PUT", "/api/v1/shares/lhcb_user", operator_token,
                       json_body={"share": 4})
    assert answer["shares"] == [{"owner_group": "lhcb_user", "share": 4.0,
                                 "source": "operator"}]
    after = priorities(client, operator_token)["alice"]
    assert after == 4 * before
    assert client.ok("GET", "/api/v1/shares", operator_token) == answer
    reset = client.ok("DELETE", "/api/v1/shares/lhcb_user", operator_token)
    assert reset == start
    assert priorities(client, operator_token)["alice"] == before
    assert_problem(client.call("DELETE", "/api/v1/shares/lhcb_user", operator_token), 404,
                   "lhcb_user")


def test_share_changes_the_draw_between_groups(client: Api, token: TokenMaker,
                                               operator_token: str) -> None:
    client.submit_jdl(token("alice", "user"))
    client.submit_jdl(token("carol", "user", group="lhcb_prod"))
    client.ok("PUT", "/api/v1/shares/lhcb_prod", operator_token, json_body={"share": 9})
    prio = priorities(client, operator_token)
    assert prio["carol"] == 9 * prio["alice"]


def test_share_must_be_positive(client: Api, operator_token: str) -> None:
    for bad in (0, -1, "much"):
        response = client.call("PUT", "/api/v1/shares/lhcb_user", operator_token,
                               json_body={"share": bad})
        assert_problem(response, 422, "body.share")
    assert client.ok("GET", "/api/v1/shares", operator_token)["shares"] == []
