"""Explain's site mask against a resource naming a thousand sites, the configured ones banned
with the longest reason the site mask takes: a clear answer, the matcher agreeing; a
thousand and one sites are refused with where."""

from __future__ import annotations

from tests.api.helpers import PILOT_REF, VO, Api, assert_problem

REASON = "é" + "r" * 253 + "💥"  # 255 characters, not all ASCII
BANNED = ["LCG.CERN.cern", "LCG.CNAF.it", "LCG.RAL.uk"]  # configured sites
SITES = BANNED + [f"LCG.Site{i:04d}.org" for i in range(1000 - len(BANNED))]


def test_explain_with_a_thousand_sites_and_long_ban_reasons(
        client: Api, user_token: str, operator_token: str, pilot_token: str) -> None:
    (job_id,) = client.submit_jdl(user_token, 'Executable = "x"; CPUTime = 600;')
    for site in BANNED:
        client.ok("PUT", f"/api/v1/sitemask/{site}", operator_token, json_body={"reason": REASON})
    assert_problem(client.call("PUT", "/api/v1/sitemask/LCG.CERN.cern", operator_token,
                               json_body={"reason": REASON + "x"}), 422)
    only_banned = client.ok("POST", "/api/v1/taskqueues/explain", user_token, json_body={
        "job_id": job_id, "resource": {"vo": VO, "site": BANNED}})
    assert only_banned["can_run"] is False
    (mask,) = [r for r in only_banned["rules"] if r["rule"] == "site mask"]
    assert mask["holds"] is False
    assert all(f"{site} is banned" in mask["detail"] for site in BANNED)
    assert REASON in mask["detail"]
    assert client.match(pilot_token, site=BANNED, pilot_reference=PILOT_REF)["jobs"] == []
    many = client.ok("POST", "/api/v1/taskqueues/explain", user_token, json_body={
        "job_id": job_id, "resource": {"vo": VO, "site": SITES}})
    (mask,) = [r for r in many["rules"] if r["rule"] == "site mask"]
    assert mask["holds"] is True and SITES[-1] in mask["detail"]
    assert mask["detail"].count(REASON) == len(BANNED)
    assert many["can_run"] is True
    assert_problem(client.call("POST", "/api/v1/taskqueues/explain", user_token, json_body={
        "job_id": job_id, "resource": {"vo": VO, "site": [*SITES, "LCG.One.more"]}}), 422,
        "site")


def test_a_pilot_naming_a_thousand_sites_is_matched(client: Api, user_token: str,
                                                    pilot_token: str) -> None:
    """The schema takes up to 1,000 sites. One OR term per site passed SQLite's expression
    depth of 1,000 near that many sites (the match was answered 503); above MANY_SITES the
    claim's site condition is one set term (taskqueue.matching.claim._sites_allow)."""
    (job_id,) = client.submit_jdl(user_token, 'Executable = "x"; CPUTime = 600;')
    assert [j["job_id"] for j in client.match(
        pilot_token, site=SITES, pilot_reference=PILOT_REF)["jobs"]] == [job_id]
