"""/api/v1/pilots through the Flask test client, on every database: match, heartbeats, status
reports, SubmitPools and the pilot registry."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from flask import Flask

from taskqueue.core.settings import Settings
from taskqueue.db.models import job_payloads_table, jobs_table
from taskqueue.queues.stalled import lock_jobs_of_dead_pilots
from tests.api.conftest import SECRET, TokenMaker
from tests.api.helpers import OTHER_SITE, OTHER_VO, PILOT_REF, SITE, VO, Api, assert_problem
from tests.conftest import Database

CERN_CONDOR = {"site": SITE, "ce": "ce503.cern.ch", "queue": "condor"}
CNAF_HTC = {"site": OTHER_SITE, "ce": "ce01-htc.cr.cnaf.infn.it", "queue": "htc"}


def history(client: Api, token: str, job_id: int) -> list[str]:
    return [h["status"] for h in client.job(token, job_id)["history"]]


def test_match_one_job(client: Api, user_token: str, site_pilot_token: str) -> None:
    job_id = client.submit_jdl(user_token, 'Executable = "/bin/echo"; Arguments = "a b";')[0]
    answer = client.match(site_pilot_token, pilot_reference=PILOT_REF, ce="ce503.cern.ch")
    assert answer["no_match"] is None
    assert len(answer["jobs"]) == 1
    payload = answer["jobs"][0]
    assert payload["job_id"] == job_id
    assert (payload["vo"], payload["owner"], payload["owner_group"]) == (VO, "alice",
                                                                         "lhcb_user")
    assert payload["executable"] == "/bin/echo" and payload["arguments"] == ["a", "b"]
    assert payload["job_type"] == "User"
    assert payload["description_format"] == "jdl"
    assert "/bin/echo" in payload["description"]
    job = client.job(user_token, job_id)
    assert job["status"] == "Matched"
    assert job["pilot_reference"] == PILOT_REF
    assert job["site"] == SITE  # from the token's site claim
    again = client.match(site_pilot_token, pilot_reference=PILOT_REF)
    assert again["jobs"] == []
    assert again["no_match"]["reason"] == "no_matching_job"


def test_match_several_jobs_with_count(client: Api, user_token: str, pilot_token: str) -> None:
    ids = [client.submit_jdl(user_token)[0] for _ in range(5)]
    answer = client.match(pilot_token, count=3, pilot_reference=PILOT_REF, site=SITE)
    got = [p["job_id"] for p in answer["jobs"]]
    assert len(got) == 3 and len(set(got)) == 3 and set(got) <= set(ids)
    rest = client.match(pilot_token, count=10, pilot_reference="pilot-2", site=SITE)
    assert sorted(p["job_id"] for p in rest["jobs"]) == sorted(set(ids) - set(got))
    for job_id in got:
        assert client.job(user_token, job_id)["pilot_reference"] == PILOT_REF


def test_count_above_the_maximum_is_422(make_app: Callable[[Settings], Flask],
                                        api_settings: Settings, pilot_token: str) -> None:
    settings = replace(api_settings, matcher=replace(api_settings.matcher,
                                                     max_jobs_per_match=4))
    api = Api(make_app(settings).test_client(), settings, SECRET)
    response = api.call("POST", "/api/v1/pilots/match", pilot_token,
                        json_body={"resource": {"vo": VO, "pilot_reference": "p"}, "count": 5})
    assert_problem(response, 422, "body.count", "4")
    response = api.call("POST", "/api/v1/pilots/match", pilot_token,
                        json_body={"resource": {"vo": VO, "pilot_reference": "p"}, "count": 0})
    assert_problem(response, 422, "body.count")


def test_a_vo_that_requires_isolation_gets_its_jobs_run_by_isolated_pilots_only(
        make_app: Callable[[Settings], Flask], api_settings: Settings, user_token: str,
        pilot_token: str) -> None:
    settings = replace(api_settings, matcher=replace(api_settings.matcher,
                                                     isolation_required_vos=(VO,)))
    api = Api(make_app(settings).test_client(), settings, SECRET)
    (job_id,) = api.submit_jdl(user_token)
    bare = api.match(pilot_token, pilot_reference="bare", site=SITE, tags=["GPU"])
    assert bare["jobs"] == [] and bare["no_match"]["reason"] == "no_matching_job"
    assert "go only to pilots that run payloads isolated" in bare["no_match"]["detail"]
    assert api.job(user_token, job_id)["status"] == "Waiting"
    isolated = api.match(pilot_token, pilot_reference="boxed", site=SITE,
                         tags=["isolated", "bwrap"])
    assert [j["job_id"] for j in isolated["jobs"]] == [job_id]


def test_no_matching_job(client: Api, user_token: str, pilot_token: str) -> None:
    empty = client.match(pilot_token, pilot_reference=PILOT_REF)
    assert empty == {"jobs": [], "no_match": {"reason": "no_matching_job",
                                              "detail": empty["no_match"]["detail"]}}
    assert empty["no_match"]["detail"]
    client.submit_jdl(user_token, 'Executable = "x"; Site = "LCG.RAL.uk";')
    elsewhere = client.match(pilot_token, pilot_reference=PILOT_REF, site=SITE)
    assert elsewhere["no_match"]["reason"] == "no_matching_job"
    there = client.match(pilot_token, pilot_reference=PILOT_REF, site="LCG.RAL.uk")
    assert len(there["jobs"]) == 1


def test_no_match_site_banned(client: Api, user_token: str, operator_token: str,
                              site_pilot_token: str) -> None:
    job_id = client.submit_jdl(user_token)[0]
    client.ok("PUT", f"/api/v1/sitemask/{SITE}", operator_token, json_body={"reason": "down"})
    answer = client.match(site_pilot_token, pilot_reference=PILOT_REF)
    assert answer["jobs"] == []
    assert answer["no_match"]["reason"] == "site_banned"
    assert SITE in answer["no_match"]["detail"]
    assert client.job(user_token, job_id)["status"] == "Waiting"


def test_match_needs_a_pilot_reference(client: Api, pilot_token: str) -> None:
    response = client.call("POST", "/api/v1/pilots/match", pilot_token,
                           json_body={"resource": {"vo": VO}})
    assert_problem(response, 422, "pilot_reference")


@pytest.mark.parametrize(("resource", "message"), [
    ({"tags": ["GPU", "a\x00b"]}, "tags[1] contains a NUL character"),
    ({"site": "A\x00"}, "site contains a NUL character"),
    ({"owner_group": ["x\x1b[31m"]}, "'owner_group' item 0 must not hold control characters"),
    ({"ce": "ce\n1"}, "'ce' must not hold control characters")])
def test_control_characters_in_a_resource_are_422_and_nothing_is_matched(
        client: Api, user_token: str, pilot_token: str, resource: dict[str, Any],
        message: str) -> None:
    job_id = client.submit_jdl(user_token)[0]
    response = client.call("POST", "/api/v1/pilots/match", pilot_token, json_body={
        "resource": {"vo": VO, "pilot_reference": PILOT_REF, **resource}})
    assert_problem(response, 422, message)
    assert client.job(user_token, job_id)["status"] == "Waiting"


def test_pilot_claim_supplies_the_reference(client: Api, user_token: str,
                                            own_pilot_token: str) -> None:
    job_id = client.submit_jdl(user_token)[0]
    answer = client.match(own_pilot_token)
    assert [p["job_id"] for p in answer["jobs"]] == [job_id]
    assert client.job(user_token, job_id)["pilot_reference"] == PILOT_REF


def test_heartbeat(client: Api, user_token: str, pilot_token: str) -> None:
    job_id = client.submit_jdl(user_token)[0]
    client.match(pilot_token, pilot_reference=PILOT_REF)
    answer = client.ok("POST", "/api/v1/pilots/heartbeat", pilot_token, json_body={
        "pilot_reference": PILOT_REF,
        "jobs": [{"job_id": job_id, "cpu_used": 12.5, "progress": "event 10/100"}]})
    assert answer == {"commands": []}
    job = client.job(user_token, job_id)
    assert job["heartbeat_at"] is not None
    assert job["cpu_used"] == 12.5 and job["progress"] == "event 10/100"
    assert client.ok("POST", "/api/v1/pilots/heartbeat", pilot_token,
                     json_body={"pilot_reference": PILOT_REF}) == {"commands": []}


def test_heartbeat_kills_a_killed_job(client: Api, user_token: str, pilot_token: str) -> None:
    kept, killed = client.submit_jdl(user_token)[0], client.submit_jdl(user_token)[0]
    matched = client.match(pilot_token, count=2, pilot_reference=PILOT_REF)
    assert sorted(p["job_id"] for p in matched["jobs"]) == [kept, killed]
    client.report(pilot_token, killed, "Running")
    client.ok("POST", f"/api/v1/jobs/{killed}/kill", user_token, json_body={})
    answer = client.ok("POST", "/api/v1/pilots/heartbeat", pilot_token, json_body={
        "pilot_reference": PILOT_REF, "jobs": [{"job_id": kept}, {"job_id": killed}]})
    assert answer["commands"] == [{"job_id": killed, "command": "kill"}]


def test_heartbeat_for_a_job_not_given_to_the_pilot(client: Api, user_token: str,
                                                    pilot_token: str) -> None:
    job_id = client.submit_jdl(user_token)[0]
    client.match(pilot_token, pilot_reference=PILOT_REF)
    answer = client.ok("POST", "/api/v1/pilots/heartbeat", pilot_token, json_body={
        "pilot_reference": "someone-else", "jobs": [{"job_id": job_id}]})
    assert answer["commands"] == [{"job_id": job_id, "command": "kill"}]
    assert client.job(user_token, job_id)["status"] == "Matched"


def test_status_reports_running_then_done(client: Api, user_token: str,
                                          pilot_token: str) -> None:
    job_id = client.submit_jdl(user_token)[0]
    client.match(pilot_token, pilot_reference=PILOT_REF, site=SITE)
    running = client.report(pilot_token, job_id, "Running")
    assert running.status_code == 200
    assert running.get_json() == {"job_id": job_id, "status": "Running"}
    job = client.job(user_token, job_id)
    assert job["status"] == "Running" and job["started_at"] is not None
    done = client.report(pilot_token, job_id, "Done", exit_code=0, output_tail="all good\n",
                         cpu_used=42.0)
    assert done.get_json() == {"job_id": job_id, "status": "Done"}
    job = client.job(user_token, job_id)
    assert job["status"] == "Done" and job["exit_code"] == 0 and job["cpu_used"] == 42.0
    assert job["ended_at"] is not None
    assert history(client, user_token, job_id)[-3:] == ["Matched", "Running", "Done"]
    output = client.ok("GET", f"/api/v1/jobs/{job_id}/output", user_token)
    assert output["output_tail"] == "all good\n" and output["exit_code"] == 0


def test_status_report_failed(client: Api, user_token: str, pilot_token: str) -> None:
    job_id = client.submit_jdl(user_token)[0]
    client.match(pilot_token, pilot_reference=PILOT_REF)
    answer = client.report(pilot_token, job_id, "Failed", exit_code=3, output_tail="Error\n")
    assert answer.get_json() == {"job_id": job_id, "status": "Failed"}
    job = client.job(user_token, job_id)
    assert job["status"] == "Failed" and job["exit_code"] == 3
    assert "3" in job["minor_status"]
    assert client.ok("GET", f"/api/v1/jobs/{job_id}/output",
                     user_token)["output_tail"] == "Error\n"


def test_long_output_keeps_the_tail(client: Api, user_token: str, pilot_token: str) -> None:
    job_id = client.submit_jdl(user_token)[0]
    client.match(pilot_token, pilot_reference=PILOT_REF)
    text = "".join(f"line {i}\n" for i in range(5000))
    client.report(pilot_token, job_id, "Done", exit_code=0, output_tail=text)
    tail = client.ok("GET", f"/api/v1/jobs/{job_id}/output", user_token)["output_tail"]
    assert text.endswith(tail) and len(tail) < len(text)
    assert tail.endswith("line 4999\n")


def test_repeated_done_report_is_idempotent(client: Api, user_token: str,
                                            pilot_token: str) -> None:
    job_id = client.submit_jdl(user_token)[0]
    client.match(pilot_token, pilot_reference=PILOT_REF)
    first = client.report(pilot_token, job_id, "Done", exit_code=0, output_tail="x")
    second = client.report(pilot_token, job_id, "Done", exit_code=0, output_tail="x")
    assert first.status_code == second.status_code == 200
    assert first.get_json() == second.get_json() == {"job_id": job_id, "status": "Done"}
    assert history(client, user_token, job_id).count("Done") == 1
    assert client.job(user_token, job_id)["exit_code"] == 0


def test_rescheduled_report_puts_the_job_back(client: Api, user_token: str,
                                              pilot_token: str) -> None:
    job_id = client.submit_jdl(user_token)[0]
    client.match(pilot_token, pilot_reference=PILOT_REF, site=SITE)
    client.report(pilot_token, job_id, "Running")
    answer = client.report(pilot_token, job_id, "Rescheduled", minor_status="out of time")
    assert answer.status_code == 200
    assert answer.get_json() == {"job_id": job_id, "status": "Waiting"}
    job = client.job(user_token, job_id)
    assert job["status"] == "Waiting" and job["reschedule_count"] == 1
    assert job["pilot_reference"] is None and job["site"] is None
    assert "Rescheduled" in history(client, user_token, job_id)
    beat = client.ok("POST", "/api/v1/pilots/heartbeat", pilot_token,
                     json_body={"pilot_reference": PILOT_REF, "jobs": [{"job_id": job_id}]})
    assert beat["commands"] == [{"job_id": job_id, "command": "kill"}]
    again = client.match(pilot_token, pilot_reference="pilot-2")
    assert [p["job_id"] for p in again["jobs"]] == [job_id]


def test_rescheduled_report_past_the_maximum_fails_the_job(
        make_app: Callable[[Settings], Flask], api_settings: Settings, user_token: str,
        pilot_token: str) -> None:
    settings = replace(api_settings,
                       taskqueue=replace(api_settings.taskqueue, max_reschedules=1))
    api = Api(make_app(settings).test_client(), settings, SECRET)
    job_id = api.submit_jdl(user_token)[0]
    api.match(pilot_token, pilot_reference=PILOT_REF)
    assert api.report(pilot_token, job_id, "Rescheduled").get_json()["status"] == "Waiting"
    api.match(pilot_token, pilot_reference=PILOT_REF)
    last = api.report(pilot_token, job_id, "Rescheduled")
    assert last.status_code == 200 and last.get_json()["status"] == "Failed"
    assert api.job(user_token, job_id)["status"] == "Failed"


def test_report_on_another_pilots_job_is_403(client: Api, user_token: str,
                                             pilot_token: str) -> None:
    job_id = client.submit_jdl(user_token)[0]
    client.match(pilot_token, pilot_reference=PILOT_REF)
    response = client.report(pilot_token, job_id, "Done", reference="pilot-2", exit_code=0)
    assert_problem(response, 403, "pilot-2")
    assert client.job(user_token, job_id)["status"] == "Matched"


def test_report_on_a_waiting_job_is_403(client: Api, user_token: str,
                                        pilot_token: str) -> None:
    job_id = client.submit_jdl(user_token)[0]
    assert_problem(client.report(pilot_token, job_id, "Running"), 403)
    assert client.job(user_token, job_id)["status"] == "Waiting"


def test_report_on_an_unknown_job_is_404(client: Api, pilot_token: str) -> None:
    assert_problem(client.report(pilot_token, 424242, "Running"), 404, "424242")


def test_report_on_a_killed_job_keeps_it_killed(client: Api, user_token: str,
                                                pilot_token: str) -> None:
    job_id = client.submit_jdl(user_token)[0]
    client.match(pilot_token, pilot_reference=PILOT_REF)
    client.ok("POST", f"/api/v1/jobs/{job_id}/kill", user_token, json_body={})
    answer = client.report(pilot_token, job_id, "Done", exit_code=0, output_tail="late")
    assert answer.status_code == 200 and answer.get_json()["status"] == "Killed"
    assert client.job(user_token, job_id)["status"] == "Killed"


def test_submitpools_for_a_queue(client: Api, user_token: str, pilot_token: str,
                                 operator_token: str) -> None:
    jdl = '[Executable = "x"; Requirements = [MaxRAM = 3000; Platform = "x86_64-el9";];]'
    job_id = client.submit_jdl(user_token, jdl)[0]
    job = client.job(user_token, job_id)
    assert job["status"] == "Waiting", job["minor_status"]
    pool = job["submit_pool"]
    assert isinstance(pool, str) and len(pool) == 64
    for token in (pilot_token, operator_token):
        cnaf = client.ok("GET", "/api/v1/pilots/submitpools", token, query=CNAF_HTC)
        assert cnaf == {**CNAF_HTC, "submit_pools": [pool]}
        cern = client.ok("GET", "/api/v1/pilots/submitpools", token, query=CERN_CONDOR)
        assert cern["submit_pools"] == []  # 2048 MB there


def test_submitpools_needs_site_ce_and_queue(client: Api, pilot_token: str) -> None:
    response = client.call("GET", "/api/v1/pilots/submitpools", pilot_token,
                           query={"site": SITE, "ce": "ce503.cern.ch"})
    assert_problem(response, 400, "queue")


def test_register_and_update_a_pilot(client: Api, pilot_token: str) -> None:
    registered = client.ok("PUT", "/api/v1/pilots/pilot-7", pilot_token,
                           json_body={**CERN_CONDOR, "status": "Submitted"})
    assert {k: registered[k] for k in ("reference", "vo", "site", "ce", "queue", "status")} == {
        "reference": "pilot-7", "vo": VO, **CERN_CONDOR, "status": "Submitted"}
    assert registered["submitted_at"] and registered["last_seen_at"]
    updated = client.ok("PUT", "/api/v1/pilots/pilot-7", pilot_token,
                        json_body={**CERN_CONDOR, "status": "Running"})
    assert updated["status"] == "Running"
    assert updated["submitted_at"] == registered["submitted_at"]
    assert updated["last_seen_at"] is not None


def test_a_pilot_says_how_it_isolates_its_payloads(client: Api, pilot_token: str,
                                                  operator_token: str) -> None:
    client.ok("PUT", "/api/v1/pilots/pilot-8", pilot_token,
              json_body={**CERN_CONDOR, "status": "Running", "isolation": "bwrap 0.8.0"})
    record = client.ok("GET", "/api/v1/pilots/pilot-8", operator_token)
    assert record["isolation"] == "bwrap 0.8.0"
    # A registration that does not say it (the pilot's last one, an older pilot) keeps it.
    client.ok("PUT", "/api/v1/pilots/pilot-8", pilot_token,
              json_body={**CERN_CONDOR, "status": "Done"})
    assert client.ok("GET", "/api/v1/pilots/pilot-8", operator_token)["isolation"] == (
        "bwrap 0.8.0")
    client.ok("PUT", "/api/v1/pilots/pilot-9", pilot_token,
              json_body={**CERN_CONDOR, "status": "Running"})
    assert client.ok("GET", "/api/v1/pilots/pilot-9", operator_token)["isolation"] is None
    response = client.call("PUT", "/api/v1/pilots/pilot-9", pilot_token,
                           json_body={**CERN_CONDOR, "status": "Running",
                                      "isolation": "x" * 65})
    assert_problem(response, 422, "body.isolation")


def test_pilot_registration_is_validated(client: Api, pilot_token: str) -> None:
    response = client.call("PUT", "/api/v1/pilots/pilot-7", pilot_token,
                           json_body={**CERN_CONDOR, "status": "Happy"})
    assert_problem(response, 422, "body.status")
    response = client.call("PUT", "/api/v1/pilots/pilot-7", pilot_token,
                           json_body={"site": SITE, "status": "Running"})
    assert_problem(response, 422, "body.ce")


def test_another_vos_pilot_cannot_disturb_a_pilot_of_the_same_reference(
        client: Api, db: Database, token: TokenMaker, user_token: str, pilot_token: str,
        operator_token: str) -> None:
    """Pilot references are unique per VO: a belle pilot token naming lhcb's pilot-cern-1
    registers belle's own pilot-cern-1; it cannot end lhcb's pilot (whose job the watchdog
    would then reschedule), report on lhcb's job, or keep lhcb's pilot from registering."""
    job_id = client.submit_jdl(user_token)[0]
    assert [j["job_id"] for j in client.match(pilot_token, pilot_reference="pilot-cern-1")[
        "jobs"]] == [job_id]
    belle = token("belle-factory", "pilot", vo=OTHER_VO, group="belle_pilot")
    theirs = client.ok("PUT", "/api/v1/pilots/pilot-cern-1", belle,
                       json_body={**CERN_CONDOR, "status": "Done"})
    assert (theirs["vo"], theirs["status"]) == (OTHER_VO, "Done")
    with db.factory.begin() as s:
        assert lock_jobs_of_dead_pilots(s, limit=10) == []
    assert_problem(client.report(belle, job_id, "Failed", reference="pilot-cern-1",
                                 exit_code=1), 404, str(job_id))
    assert client.ok("POST", "/api/v1/pilots/heartbeat", belle, json_body={
        "pilot_reference": "pilot-cern-1", "jobs": [{"job_id": job_id}]})["commands"] == [
        {"job_id": job_id, "command": "kill"}]  # for belle's pilot: not its job
    ours = client.ok("PUT", "/api/v1/pilots/pilot-cern-1", pilot_token,
                     json_body={**CERN_CONDOR, "status": "Running"})
    assert (ours["vo"], ours["status"]) == (VO, "Running")
    seen = client.ok("GET", "/api/v1/pilots/pilot-cern-1", operator_token)
    assert (seen["vo"], seen["status"]) == (VO, "Running")
    assert [j["job_id"] for j in seen["jobs"]] == [job_id]
    client.report(pilot_token, job_id, "Running", reference="pilot-cern-1")
    assert client.job(user_token, job_id)["status"] == "Running"


def test_a_blank_pilot_reference_is_refused(client: Api, user_token: str,
                                            pilot_token: str) -> None:
    """A job matched to a blank reference could never be reported on."""
    job_id = client.submit_jdl(user_token)[0]
    for blank in ("", "   ", "\t"):
        response = client.call("POST", "/api/v1/pilots/match", pilot_token,
                               json_body={"resource": {"vo": VO, "pilot_reference": blank}})
        assert_problem(response, 422, "pilot_reference")
    assert client.job(user_token, job_id)["status"] == "Waiting"
    padded = client.match(pilot_token, pilot_reference=" pilot-9 ")
    assert [j["job_id"] for j in padded["jobs"]] == [job_id]
    client.report(pilot_token, job_id, "Running", reference="pilot-9")
    assert client.job(user_token, job_id)["status"] == "Running"


def test_the_match_answer_is_built_from_the_payload_stored_at_submission(
        client: Api, db: Database, user_token: str, pilot_token: str) -> None:
    """The answer does not read the description again: with its text made unreadable after
    submission, the job is still handed out, its fields those stored at submission."""
    [job_id] = client.submit_jdl(user_token, 'Executable = "run.sh"; Arguments = "%j x";')
    with db.factory.begin() as s:
        s.execute(jobs_table.update().where(jobs_table.c.id == job_id).values(
            description="[ unreadable"))
    answer = client.match(pilot_token, pilot_reference=PILOT_REF, site=SITE)
    [job] = answer["jobs"]
    assert (job["job_id"], job["executable"], job["arguments"], job["description"]) == (
        job_id, "run.sh", [str(job_id), "x"], "[ unreadable")


def test_a_matched_job_whose_stored_text_no_longer_reads_is_failed_not_drawn_again(
        client: Api, db: Database, user_token: str, pilot_token: str) -> None:
    """A description an earlier reader accepted (here: text the reader now refuses) of a job
    stored without its payload (before job_payloads) cannot be handed to a pilot: the job
    fails at its match with the reason, instead of a 500 at every draw and the job going back
    to its queue after each matched lease."""
    broken, fine = (client.submit_jdl(user_token, f'Executable = "/bin/{x}";')[0]
                    for x in ("false", "true"))
    with db.factory.begin() as s:
        s.execute(jobs_table.update().where(jobs_table.c.id == broken).values(
            description='[ Executable = "/bin/false"; Arguments = '))
        s.execute(job_payloads_table.delete().where(job_payloads_table.c.job_id == broken))
    answer = client.match(pilot_token, count=2, pilot_reference=PILOT_REF, site=SITE)
    assert [p["job_id"] for p in answer["jobs"]] == [fine]
    job = client.job(user_token, broken)
    assert job["status"] == "Failed"
    assert job["minor_status"].startswith("Stored description cannot be read: "), job
    # Alone, it is answered as no job, and the pilot may ask again.
    lone = client.submit_jdl(user_token, 'Executable = "/bin/false";')[0]
    with db.factory.begin() as s:
        s.execute(jobs_table.update().where(jobs_table.c.id == lone).values(
            description="["))
        s.execute(job_payloads_table.delete().where(job_payloads_table.c.job_id == lone))
    again = client.match(pilot_token, pilot_reference=PILOT_REF, site=SITE)
    assert again["jobs"] == [] and again["no_match"]["reason"] == "no_matching_job"
    assert "could not be read" in again["no_match"]["detail"]
    assert client.job(user_token, lone)["status"] == "Failed"
