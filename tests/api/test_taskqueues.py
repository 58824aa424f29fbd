"""/api/v1/taskqueues through the Flask test client, on every database: the queue listing with
waiting counts, the queues a resource could be served from, and explain."""

from __future__ import annotations

from typing import Any

from tests.api.helpers import PILOT_REF, SITE, VO, Api, assert_problem

CERN_CONDOR = "LCG.CERN.cern/ce503.cern.ch/condor"
CERN_ARM = "LCG.CERN.cern/ce-arm01.cern.ch/arm64"


def rules(answer: dict[str, Any]) -> dict[str, bool]:
    return {r["rule"]: r["holds"] for r in answer["rules"]}


def test_list_with_waiting_counts(client: Api, user_token: str, other_user_token: str,
                                  operator_token: str) -> None:
    for _ in range(3):
        client.submit_jdl(user_token)
    client.submit_jdl(user_token, 'Executable = "x"; CPUTime = 100; Site = "LCG.RAL.uk";')
    client.submit_jdl(other_user_token)
    answer = client.ok("GET", "/api/v1/taskqueues", operator_token)
    queues = answer["task_queues"]
    assert answer["next_after"] is None
    assert len(queues) == 3
    assert [q["tq_id"] for q in queues] == sorted(q["tq_id"] for q in queues)
    by_shape = {(q["owner"], tuple(q["sites"])): q for q in queues}
    assert by_shape[("alice", ())]["waiting"] == 3
    assert by_shape[("alice", ("LCG.RAL.uk",))]["waiting"] == 1
    assert by_shape[("bob", ())]["waiting"] == 1
    one = by_shape[("alice", ())]
    assert (one["vo"], one["owner_group"], one["job_type"]) == (VO, "lhcb_user", "User")
    assert one["active"] is True and one["priority"] > 0
    assert one["banned_sites"] == [] and one["platforms"] == [] and one["tags"] == []
    assert by_shape[("alice", ("LCG.RAL.uk",))]["cpu_time"] < one["cpu_time"]
    users_view = client.ok("GET", "/api/v1/taskqueues", user_token)["task_queues"]
    assert len(users_view) == 3


def test_list_is_paged(client: Api, user_token: str, operator_token: str) -> None:
    for cpu in (100, 1000, 5000):
        client.submit_jdl(user_token, f'Executable = "x"; CPUTime = {cpu};')
    first = client.ok("GET", "/api/v1/taskqueues", operator_token, query={"limit": 2})
    assert len(first["task_queues"]) == 2
    assert first["next_after"] == first["task_queues"][-1]["tq_id"]
    second = client.ok("GET", "/api/v1/taskqueues", operator_token,
                       query={"limit": 2, "after": first["next_after"]})
    assert len(second["task_queues"]) == 1 and second["next_after"] is None
    assert {q["tq_id"] for q in first["task_queues"]}.isdisjoint(
        q["tq_id"] for q in second["task_queues"])


def test_list_shows_only_the_tokens_vo(client: Api, user_token: str,
                                       other_vo_operator_token: str) -> None:
    client.submit_jdl(user_token)
    answer = client.ok("GET", "/api/v1/taskqueues", other_vo_operator_token)
    assert answer == {"task_queues": [], "next_after": None}


def test_matching_queues_for_a_resource(client: Api, user_token: str, operator_token: str,
                                        pilot_token: str) -> None:
    client.submit_jdl(user_token)
    client.submit_jdl(user_token)
    client.submit_jdl(user_token, 'Executable = "x"; Platform = "aarch64-el9";')
    for token in (operator_token, pilot_token):
        x86 = client.ok("POST", "/api/v1/taskqueues/matching", token,
                        json_body={"resource": {"vo": VO, "site": SITE,
                                                "platform": "x86_64-el9"}})
        assert x86["waiting"] == 2 and len(x86["task_queues"]) == 1
        assert x86["task_queues"][0]["waiting"] == 2 and x86["task_queues"][0]["priority"] > 0
        anything = client.ok("POST", "/api/v1/taskqueues/matching", token,
                             json_body={"resource": {"vo": VO, "site": SITE}})
        assert anything["waiting"] == 3 and len(anything["task_queues"]) == 2
        small = client.ok("POST", "/api/v1/taskqueues/matching", token,
                          json_body={"resource": {"vo": VO, "cpu_time": 10}})
        assert small == {"task_queues": [], "waiting": 0}


def test_matching_for_another_vo_is_403(client: Api, operator_token: str,
                                        pilot_token: str) -> None:
    for token in (operator_token, pilot_token):
        response = client.call("POST", "/api/v1/taskqueues/matching", token,
                               json_body={"resource": {"vo": "belle"}})
        assert_problem(response, 403, "lhcb")


def test_explain_with_a_queue_of_the_resources_file(client: Api, user_token: str,
                                                    operator_token: str) -> None:
    job_id = client.submit_jdl(user_token, 'Executable = "x"; Platform = "x86_64-el9";')[0]
    for token in (user_token, operator_token):
        good = client.ok("POST", "/api/v1/taskqueues/explain", token,
                         json_body={"job_id": job_id, "queue": CERN_CONDOR})
        assert good["job_id"] == job_id and good["can_run"] is True
        assert good["rules"] and all(r["holds"] and r["detail"] for r in good["rules"])
        assert {"VO", "site", "CPU time"} <= set(rules(good))
    arm = client.ok("POST", "/api/v1/taskqueues/explain", user_token,
                    json_body={"job_id": job_id, "queue": CERN_ARM})
    assert arm["can_run"] is False
    failing = [r for r in arm["rules"] if not r["holds"]]
    assert [r["rule"] for r in failing] == ["platform"]
    assert "aarch64-el9" in failing[0]["detail"]


def test_explain_with_rfc7_requirements(client: Api, user_token: str) -> None:
    jdl = '[Executable = "x"; Requirements = [MaxRAM = 3000;];]'
    job_id = client.submit_jdl(user_token, jdl)[0]
    cern = client.ok("POST", "/api/v1/taskqueues/explain", user_token,
                     json_body={"job_id": job_id, "queue": CERN_CONDOR})
    assert cern["can_run"] is False
    assert [r["rule"] for r in cern["rules"] if not r["holds"]] == ["requirement MaxRAM"]
    cnaf = client.ok("POST", "/api/v1/taskqueues/explain", user_token,
                     json_body={"job_id": job_id,
                                "queue": "LCG.CNAF.it/ce01-htc.cr.cnaf.infn.it/htc"})
    assert cnaf["can_run"] is True


def test_explain_with_a_resource(client: Api, user_token: str) -> None:
    job_id = client.submit_jdl(user_token, 'Executable = "x"; BannedSites = "LCG.RAL.uk";')[0]
    ok = client.ok("POST", "/api/v1/taskqueues/explain", user_token,
                   json_body={"job_id": job_id, "resource": {"vo": VO, "site": SITE}})
    assert ok["can_run"] is True
    banned = client.ok("POST", "/api/v1/taskqueues/explain", user_token,
                       json_body={"job_id": job_id,
                                  "resource": {"vo": VO, "site": "LCG.RAL.uk"}})
    assert banned["can_run"] is False
    assert rules(banned)["site"] is False


def test_explain_takes_a_queue_or_a_resource_not_both(client: Api, user_token: str) -> None:
    job_id = client.submit_jdl(user_token)[0]
    both = client.call("POST", "/api/v1/taskqueues/explain", user_token,
                       json_body={"job_id": job_id, "queue": CERN_CONDOR,
                                  "resource": {"vo": VO}})
    assert_problem(both, 422, "body.queue", "body.resource")


def test_explain_without_a_queue_checks_every_configured_queue(client: Api,
                                                               user_token: str) -> None:
    job_id = client.submit_jdl(user_token, 'Executable = "x"; Platform = "aarch64-el9";')[0]
    answer = client.ok("POST", "/api/v1/taskqueues/explain", user_token,
                       json_body={"job_id": job_id})
    assert answer["job_id"] == job_id and answer["rules"] == []
    verdicts = {q["queue"]: q for q in answer["queues"]}
    assert CERN_CONDOR in verdicts and CERN_ARM in verdicts
    assert verdicts[CERN_ARM]["can_run"] is True and verdicts[CERN_ARM]["failed"] == []
    condor = verdicts[CERN_CONDOR]
    assert condor["can_run"] is False
    assert [r["rule"] for r in condor["failed"]] == ["platform"]
    assert answer["can_run"] is True
    # A day of CPU (the default) on no queue of a site whose queues give less.
    short = client.submit_jdl(user_token, 'Executable = "x"; Site = "DIRAC.Demo.local";')[0]
    nowhere = client.ok("POST", "/api/v1/taskqueues/explain", user_token,
                        json_body={"job_id": short})
    assert nowhere["can_run"] is False
    demo = [q for q in nowhere["queues"] if q["queue"].startswith("DIRAC.Demo.local/")]
    assert demo and all("CPU time" in {r["rule"] for r in q["failed"]} for q in demo)


def test_explain_with_a_malformed_or_unknown_queue(client: Api, user_token: str) -> None:
    job_id = client.submit_jdl(user_token)[0]
    malformed = client.call("POST", "/api/v1/taskqueues/explain", user_token,
                            json_body={"job_id": job_id, "queue": "LCG.CERN.cern/condor"})
    assert_problem(malformed, 422, "SITE/CE/QUEUE")
    unknown = client.call("POST", "/api/v1/taskqueues/explain", user_token,
                          json_body={"job_id": job_id, "queue": "NO.SUCH.site/ce/q"})
    assert_problem(unknown, 404, "NO.SUCH.site")


def test_explain_of_an_unknown_job_is_404(client: Api, user_token: str) -> None:
    response = client.call("POST", "/api/v1/taskqueues/explain", user_token,
                           json_body={"job_id": 987654, "queue": CERN_CONDOR})
    assert_problem(response, 404, "987654")


def test_expressions_that_can_never_match_are_refused(client: Api, user_token: str) -> None:
    """Not a boolean over the resource's attributes, too many terms: 422; an expression no
    configured queue satisfies: the job fails at once, saying which part fails where."""
    assert_problem(client.call("POST", "/api/v1/jobs", user_token,
                               text='[Executable = "x"; Requirements = foo;]'),
                   422, "Requirements refers to foo", "other.foo")
    many = "||".join(["other.A==1"] * 600)
    assert_problem(client.call("POST", "/api/v1/jobs", user_token, json_body={
        "executable": "x", "attributes": {"custom_attributes": {"Requirements": many}}}),
        422, "599 && and || operators")
    answer = client.ok("POST", "/api/v1/jobs", user_token, status=201, text=(
        '[Executable = "x"; Requirements = other.MaxRAM >= 1000000 && other.CPUTime > 1;]'))
    (job,) = answer["jobs"]
    assert job["status"] == "Failed"
    assert "no configured queue satisfies the expression" in job["minor_status"]
    assert "other.MaxRAM >= 1000000 is false (other.MaxRAM = " in job["minor_status"]
    # one the configuration cannot decide (an attribute only the pilot gives) waits
    waits = client.ok("POST", "/api/v1/jobs", user_token, status=201, text=(
        '[Executable = "x"; Requirements = other.CPUModel == "EPYC";]'))
    assert waits["jobs"][0]["status"] == "Waiting"


def test_explain_names_the_failing_part_of_an_expression(client: Api, user_token: str) -> None:
    jdl = ('[Executable = "x"; Requirements = other.NumberOfProcessors >= 1 && '
           'other.MaxRAM >= 4000;]')
    job_id = client.submit_jdl(user_token, jdl)[0]
    cern = client.ok("POST", "/api/v1/taskqueues/explain", user_token,
                     json_body={"job_id": job_id, "queue": CERN_CONDOR})
    assert cern["can_run"] is False
    (failing,) = [r for r in cern["rules"] if not r["holds"]]
    assert failing["rule"] == "Requirements expression"
    assert failing["detail"] == "other.MaxRAM >= 4000 is false (other.MaxRAM = 2048)"


def test_explain_says_what_the_site_mask_does_as_the_matcher_does(
        client: Api, user_token: str, operator_token: str, pilot_token: str) -> None:
    job_id = client.submit_jdl(user_token, 'Executable = "x"; CPUTime = 600;')[0]
    one_site = {"job_id": job_id, "resource": {"vo": VO, "site": SITE}}
    two_sites = {"job_id": job_id, "resource": {"vo": VO, "site": [SITE, "LCG.CNAF.it"]}}
    assert "site mask" not in rules(client.ok("POST", "/api/v1/taskqueues/explain",
                                              user_token, json_body=one_site))
    client.ok("PUT", f"/api/v1/sitemask/{SITE}", operator_token,
              json_body={"reason": "downtime until Monday"})
    banned = client.ok("POST", "/api/v1/taskqueues/explain", user_token, json_body=one_site)
    assert banned["can_run"] is False
    (mask,) = [r for r in banned["rules"] if r["rule"] == "site mask"]
    assert mask["holds"] is False
    assert SITE in mask["detail"] and "downtime until Monday" in mask["detail"]
    # The matcher agrees: a pilot of the banned site gets nothing, one that also serves
    # another site gets the job.
    assert client.match(pilot_token, site=SITE, pilot_reference=PILOT_REF)["jobs"] == []
    either = client.ok("POST", "/api/v1/taskqueues/explain", user_token, json_body=two_sites)
    assert either["can_run"] is True and rules(either)["site mask"] is True
    assert "matched for LCG.CNAF.it" in next(
        r["detail"] for r in either["rules"] if r["rule"] == "site mask")
    client.ok("DELETE", f"/api/v1/sitemask/{SITE}", operator_token)
    lifted = client.ok("POST", "/api/v1/taskqueues/explain", user_token, json_body=one_site)
    assert lifted["can_run"] is True and "site mask" not in rules(lifted)
    assert [j["job_id"] for j in client.match(pilot_token, site=SITE,
                                              pilot_reference=PILOT_REF)["jobs"]] == [job_id]


def test_a_gpu_job_is_listed_and_explained_with_its_gpus(client: Api, user_token: str,
                                                         operator_token: str,
                                                         pilot_token: str) -> None:
    job_id = client.submit_jdl(user_token, 'Executable = "x"; NumberOfGPUs = 2;')[0]
    (queue,) = client.ok("GET", "/api/v1/taskqueues", operator_token)["task_queues"]
    assert queue["gpus"] == 2
    none = client.ok("POST", "/api/v1/taskqueues/explain", user_token,
                     json_body={"job_id": job_id, "resource": {"vo": VO, "site": SITE}})
    assert none["can_run"] is False
    (failing,) = [r for r in none["rules"] if not r["holds"]]
    assert (failing["rule"], failing["detail"]) == (
        "GPUs", "job needs 2 GPUs (bucket); resource offers 0")
    two = client.ok("POST", "/api/v1/taskqueues/explain", user_token,
                    json_body={"job_id": job_id,
                               "resource": {"vo": VO, "site": SITE, "gpus": 2}})
    assert two["can_run"] is True and rules(two)["GPUs"] is True
    # Matched, out of its queue: explain reads the GPUs from its description.
    assert client.match(pilot_token, site=SITE, pilot_reference=PILOT_REF)["jobs"] == []
    (matched,) = client.match(pilot_token, site=SITE, pilot_reference=PILOT_REF,
                              gpus=2)["jobs"]
    assert (matched["job_id"], matched["gpus"]) == (job_id, 2)
    later = client.ok("POST", "/api/v1/taskqueues/explain", user_token,
                      json_body={"job_id": job_id, "resource": {"vo": VO, "site": SITE}})
    assert later["can_run"] is False and rules(later)["GPUs"] is False
