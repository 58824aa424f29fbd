"""/api/v1/jobs through the Flask test client, on every database: submission in each form,
inspection, listing, kill, reschedule, delete and output."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from flask import Flask

from taskqueue.core.settings import Settings
from tests.api.conftest import SECRET
from tests.api.helpers import GROUP, HELLO_JDL, PILOT_REF, SITE, VO, Api, assert_problem

DATA = Path(__file__).resolve().parents[1] / "data"


def statuses(history: list[dict[str, object]]) -> list[object]:
    return [h["status"] for h in history]


def test_submit_jdl_text(client: Api, user_token: str) -> None:
    answer = client.ok("POST", "/api/v1/jobs", user_token, status=201, text=HELLO_JDL)
    assert len(answer["job_ids"]) == 1
    job_id = answer["job_ids"][0]
    assert answer["jobs"] == [{"job_id": job_id, "status": "Waiting",
                               "minor_status": answer["jobs"][0]["minor_status"]}]
    job = client.job(user_token, job_id)
    assert (job["vo"], job["owner"], job["owner_group"]) == (VO, "alice", GROUP)
    assert job["status"] == "Waiting"
    assert job["job_type"] == "User"
    assert job["bulk_index"] is None
    assert job["reschedule_count"] == 0
    assert job["site"] is None and job["pilot_reference"] is None
    assert statuses(job["history"]) == ["Received", "Checking", "Waiting"]
    assert all(h["at"] and h["at"].endswith("Z") for h in job["history"])


def test_unknown_attributes_are_warnings_naming_the_closest_known(client: Api,
                                                                  user_token: str) -> None:
    clean = client.ok("POST", "/api/v1/jobs", user_token, status=201, text=HELLO_JDL)
    assert clean["warnings"] == []
    answer = client.ok("POST", "/api/v1/jobs", user_token, status=201,
                       text='[ Executable = "/bin/true"; NumberOfProcesors = 4; '
                            'Parameters = 3; DebugLevel = "high"; ]')
    assert len(answer["job_ids"]) == 3
    assert len(answer["warnings"]) == 2  # once per attribute, not per job
    typo = next(w for w in answer["warnings"] if "NumberOfProcesors" in w)
    assert "did you mean NumberOfProcessors?" in typo
    other = next(w for w in answer["warnings"] if "DebugLevel" in w)
    assert "did you mean" not in other and "kept and passed to the job" in other
    # The misspelt attribute asked for no processors; the jobs were stored all the same.
    assert client.job(user_token, answer["job_ids"][0])["processors"] == 1
    spec = client.ok("POST", "/api/v1/jobs", user_token, status=201, json_body={
        "executable": "/bin/true", "attributes": {"custom_attributes": {"MaxRAMM": 10}}})
    assert any("did you mean MaxRAM?" in w for w in spec["warnings"])


def test_submit_jdl_with_charset_parameter(client: Api, user_token: str) -> None:
    ids = client.submit_jdl(user_token, 'Executable = "/bin/true"; CPUTime = 3600;')
    assert client.job(user_token, ids[0])["status"] == "Waiting"
    answer = client.ok("POST", "/api/v1/jobs", user_token, status=201, text=HELLO_JDL,
                       content_type="text/plain; charset=utf-8")
    assert len(answer["job_ids"]) == 1


def test_submit_json_object(client: Api, user_token: str, pilot_token: str) -> None:
    ids = client.submit_json(user_token, {"executable": "/bin/echo", "arguments": ["hi", "x"]})
    assert len(ids) == 1
    assert client.job(user_token, ids[0])["status"] == "Waiting"
    matched = client.match(pilot_token, pilot_reference=PILOT_REF)
    payload = matched["jobs"][0]
    assert payload["job_id"] == ids[0]
    assert payload["executable"] == "/bin/echo"
    assert payload["arguments"] == ["hi", "x"]
    assert payload["description_format"] == "json"


def test_submit_json_list_is_a_bulk(client: Api, user_token: str) -> None:
    answer = client.ok("POST", "/api/v1/jobs", user_token, status=201,
                       json_body=[{"executable": "a.sh"}, {"executable": "b.sh"},
                                  {"executable": "c.sh"}])
    ids = answer["job_ids"]
    assert len(ids) == 3 and ids == sorted(ids)
    assert [j["status"] for j in answer["jobs"]] == ["Waiting"] * 3
    assert [client.job(user_token, i)["bulk_index"] for i in ids] == [0, 1, 2]


def test_submit_parametric_jdl(client: Api, user_token: str, pilot_token: str) -> None:
    text = (DATA / "jdl" / "valid-parametric-list.jdl").read_text()
    # Over the raw API local files must be uploaded first (tests/api/test_sandboxes.py).
    text = text.replace('InputSandbox = {"%s", "process.sh"};', "")
    ids = client.submit_jdl(user_token, text)
    assert len(ids) == 3
    assert [client.job(user_token, i)["bulk_index"] for i in ids] == [0, 1, 2]
    matched = client.match(pilot_token, count=3, pilot_reference=PILOT_REF)
    by_id = {p["job_id"]: p for p in matched["jobs"]}
    assert set(by_id) == set(ids)
    assert [by_id[i]["arguments"] for i in ids] == [
        ["--input", "run1.dat", "--index", "0"], ["--input", "run2.dat", "--index", "1"],
        ["--input", "42", "--index", "2"]]
    assert by_id[ids[1]]["job_name"] == "scan_1"


def test_submit_parametric_json(client: Api, user_token: str) -> None:
    body = json.loads((DATA / "json" / "valid-parametric-list.json").read_text())
    refused = client.call("POST", "/api/v1/jobs", user_token, json_body=body)
    assert_problem(refused, 422, "'run1.dat' (job 0 of the bulk)", "not uploaded")
    del body["input_sandbox"]
    answer = client.ok("POST", "/api/v1/jobs", user_token, status=201, json_body=body)
    assert len(answer["job_ids"]) == 3


def test_submit_invalid_jdl_is_422_and_stores_nothing(client: Api, user_token: str) -> None:
    response = client.call("POST", "/api/v1/jobs", user_token,
                           text='Executable = "x"; CPUTime = -5;')
    assert_problem(response, 422)
    assert client.ok("GET", "/api/v1/jobs", user_token)["jobs"] == []


def test_a_jdl_whose_attributes_double_each_other_is_422_naming_one(client: Api,
                                                                    user_token: str) -> None:
    # 1 KB: each attribute the strcat of the one before with itself. Read by evaluating
    # every reference anew, this took minutes; each attribute is evaluated once now, and the
    # first that builds more than the bound of a value is named.
    lines = ['Executable = "/bin/true";', 'X0 = "a";']
    lines += [f"X{i} = strcat(X{i - 1}, X{i - 1});" for i in range(1, 61)]
    response = client.call("POST", "/api/v1/jobs", user_token, text="\n".join(lines))
    assert_problem(response, 422, "X17 builds a value of 131072 characters")
    assert client.ok("GET", "/api/v1/jobs", user_token)["jobs"] == []


def test_submit_bulk_with_one_bad_job_stores_nothing(client: Api, user_token: str) -> None:
    response = client.call("POST", "/api/v1/jobs", user_token,
                           json_body=[{"executable": "a"}, {"arguments": ["no executable"]}])
    assert_problem(response, 422, "executable")
    assert client.ok("GET", "/api/v1/jobs", user_token)["jobs"] == []


def test_unmeetable_requirements_fail_with_a_reason(client: Api, user_token: str) -> None:
    answer = client.ok("POST", "/api/v1/jobs", user_token, status=201,
                       text='[Executable = "x"; Requirements = [MaxRAM = 99999999;];]')
    assert answer["jobs"][0]["status"] == "Failed"
    assert "MaxRAM" in answer["jobs"][0]["minor_status"]
    job = client.job(user_token, answer["job_ids"][0])
    assert job["status"] == "Failed" and job["ended_at"] is not None


def test_list_pagination(client: Api, user_token: str) -> None:
    ids = [client.submit_jdl(user_token)[0] for _ in range(5)]
    seen: list[int] = []
    after = 0
    pages = 0
    while True:
        page = client.ok("GET", "/api/v1/jobs", user_token, query={"limit": 2, "after": after})
        seen += [j["job_id"] for j in page["jobs"]]
        pages += 1
        assert len(page["jobs"]) <= 2
        if page["next_after"] is None:
            break
        assert page["next_after"] == page["jobs"][-1]["job_id"]
        after = page["next_after"]
        assert pages < 10
    assert seen == ids
    assert pages == 3
    first = client.ok("GET", "/api/v1/jobs", user_token, query={"limit": 2})
    assert [j["job_id"] for j in first["jobs"]] == ids[:2]
    assert first["next_after"] == ids[1]
    everything = client.ok("GET", "/api/v1/jobs", user_token)
    assert [j["job_id"] for j in everything["jobs"]] == ids
    assert everything["next_after"] is None


def test_list_page_size_is_capped(make_app: Callable[[Settings], Flask],
                                  api_settings: Settings, user_token: str) -> None:
    settings = replace(api_settings, matcher=replace(api_settings.matcher, page_size=2,
                                                     max_page_size=3))
    api = Api(make_app(settings).test_client(), settings, SECRET)
    for _ in range(5):
        api.submit_jdl(user_token)
    assert len(api.ok("GET", "/api/v1/jobs", user_token)["jobs"]) == 2
    big = api.ok("GET", "/api/v1/jobs", user_token, query={"limit": 1000})
    assert len(big["jobs"]) == 3
    assert big["next_after"] == big["jobs"][-1]["job_id"]


def test_list_filters(client: Api, user_token: str, other_user_token: str,
                      operator_token: str, site_pilot_token: str) -> None:
    mine = [client.submit_jdl(user_token)[0] for _ in range(3)]
    scripted = client.submit_jdl(user_token, 'Executable = "x"; JobType = "MCSimulation";')
    bobs = client.submit_jdl(other_user_token)
    client.ok("POST", f"/api/v1/jobs/{mine[2]}/kill", user_token, json_body={})
    matched = client.match(site_pilot_token, pilot_reference=PILOT_REF, owner="alice",
                           job_type=["User"])["jobs"][0]["job_id"]
    assert matched == mine[0]

    def listed(token: str, **query: str) -> list[int]:
        page = client.ok("GET", "/api/v1/jobs", token, query=query)
        return [j["job_id"] for j in page["jobs"]]

    assert listed(user_token) == [*mine, *scripted]
    assert listed(other_user_token) == bobs
    assert listed(operator_token) == sorted([*mine, *scripted, *bobs])
    assert listed(operator_token, owner="bob") == bobs
    assert listed(user_token, owner="bob") == [*mine, *scripted]  # a user sees only their own
    assert listed(user_token, status="Killed") == [mine[2]]
    assert listed(user_token, status="Waiting") == [mine[1], *scripted]
    assert listed(user_token, status="Matched", site=SITE) == [mine[0]]
    assert listed(operator_token, site="LCG.RAL.uk") == []
    assert listed(user_token, job_type="MCSimulation") == scripted
    assert listed(operator_token, owner_group=GROUP) == sorted([*mine, *scripted, *bobs])
    assert listed(operator_token, owner_group="other") == []
    summary = client.ok("GET", "/api/v1/jobs", user_token, query={"status": "Killed"})["jobs"]
    assert summary[0]["status"] == "Killed" and summary[0]["ended_at"] is not None


def test_kill_waiting_job(client: Api, user_token: str, operator_token: str) -> None:
    job_id = client.submit_jdl(user_token)[0]
    queues = client.ok("GET", "/api/v1/taskqueues", operator_token)["task_queues"]
    assert [q["waiting"] for q in queues] == [1]
    answer = client.ok("POST", f"/api/v1/jobs/{job_id}/kill", user_token,
                       json_body={"reason": "wrong input"})
    assert answer["job_id"] == job_id and answer["status"] == "Killed"
    assert "wrong input" in answer["minor_status"]
    job = client.job(user_token, job_id)
    assert job["status"] == "Killed" and job["ended_at"] is not None
    assert statuses(job["history"])[-1] == "Killed"
    queues = client.ok("GET", "/api/v1/taskqueues", operator_token)["task_queues"]
    assert sum(q["waiting"] for q in queues) == 0


def test_operator_kills_a_users_job(client: Api, user_token: str, operator_token: str) -> None:
    job_id = client.submit_jdl(user_token)[0]
    answer = client.ok("POST", f"/api/v1/jobs/{job_id}/kill", operator_token, json_body={})
    assert answer["status"] == "Killed"
    assert "operator:olga" in answer["minor_status"]


def test_kill_and_reschedule_need_no_body(client: Api, user_token: str) -> None:
    """A plain ``curl -X POST .../kill`` works: the reason is optional, and so is the body."""
    job_id = client.submit_jdl(user_token)[0]
    assert client.ok("POST", f"/api/v1/jobs/{job_id}/kill", user_token)["status"] == "Killed"
    again = client.ok("POST", f"/api/v1/jobs/{job_id}/reschedule", user_token)
    assert again["status"] == "Waiting"
    assert client.job(user_token, job_id)["reschedule_count"] == 1


def test_killing_an_ended_job_is_409(client: Api, user_token: str, pilot_token: str) -> None:
    job_id = client.submit_jdl(user_token)[0]
    client.match(pilot_token, pilot_reference=PILOT_REF)
    assert client.report(pilot_token, job_id, "Done", exit_code=0).status_code == 200
    assert_problem(client.call("POST", f"/api/v1/jobs/{job_id}/kill", user_token,
                               json_body={}), 409, "Done")
    assert client.job(user_token, job_id)["status"] == "Done"


def test_reschedule_waiting_job(client: Api, user_token: str) -> None:
    job_id = client.submit_jdl(user_token)[0]
    answer = client.ok("POST", f"/api/v1/jobs/{job_id}/reschedule", user_token,
                       json_body={"reason": "try again"})
    assert answer == {"job_id": job_id, "status": "Waiting",
                      "minor_status": answer["minor_status"]}
    job = client.job(user_token, job_id)
    assert job["status"] == "Waiting"
    assert job["reschedule_count"] == 1
    assert statuses(job["history"]) == ["Received", "Checking", "Waiting", "Rescheduled",
                                        "Received", "Checking", "Waiting"]
    assert job["history"][3]["minor_status"] == "try again"


def test_reschedule_ended_job_runs_again(client: Api, user_token: str,
                                         site_pilot_token: str) -> None:
    job_id = client.submit_jdl(user_token)[0]
    client.match(site_pilot_token, pilot_reference=PILOT_REF)
    assert client.report(site_pilot_token, job_id, "Failed", exit_code=2,
                         output_tail="boom").status_code == 200
    answer = client.ok("POST", f"/api/v1/jobs/{job_id}/reschedule", user_token, json_body={})
    assert answer["status"] == "Waiting"
    job = client.job(user_token, job_id)
    assert job["reschedule_count"] == 1
    assert job["site"] is None and job["pilot_reference"] is None
    assert job["exit_code"] is None and job["ended_at"] is None
    again = client.match(site_pilot_token, pilot_reference="pilot-2")
    assert [j["job_id"] for j in again["jobs"]] == [job_id]


def test_reschedule_refused_after_the_maximum(make_app: Callable[[Settings], Flask],
                                              api_settings: Settings,
                                              user_token: str) -> None:
    settings = replace(api_settings,
                       taskqueue=replace(api_settings.taskqueue, max_reschedules=2))
    api = Api(make_app(settings).test_client(), settings, SECRET)
    job_id = api.submit_jdl(user_token)[0]
    for expected in (1, 2):
        api.ok("POST", f"/api/v1/jobs/{job_id}/reschedule", user_token, json_body={})
        assert api.job(user_token, job_id)["reschedule_count"] == expected
    refused = api.call("POST", f"/api/v1/jobs/{job_id}/reschedule", user_token, json_body={})
    assert_problem(refused, 409, "maximum")
    job = api.job(user_token, job_id)
    assert job["status"] == "Waiting" and job["reschedule_count"] == 2


def test_delete_job(client: Api, user_token: str, operator_token: str) -> None:
    job_id = client.submit_jdl(user_token)[0]
    answer = client.ok("DELETE", f"/api/v1/jobs/{job_id}", user_token)
    assert answer["job_id"] == job_id and answer["status"] == "Deleted"
    assert client.job(user_token, job_id)["status"] == "Deleted"
    queues = client.ok("GET", "/api/v1/taskqueues", operator_token)["task_queues"]
    assert sum(q["waiting"] for q in queues) == 0
    assert_problem(client.call("DELETE", f"/api/v1/jobs/{job_id}", user_token), 409,
                   "Deleted")


def test_delete_running_job_kills_it_first(client: Api, user_token: str,
                                           pilot_token: str) -> None:
    job_id = client.submit_jdl(user_token)[0]
    client.match(pilot_token, pilot_reference=PILOT_REF)
    assert client.report(pilot_token, job_id, "Running").status_code == 200
    assert client.ok("DELETE", f"/api/v1/jobs/{job_id}", user_token)["status"] == "Deleted"
    assert statuses(client.job(user_token, job_id)["history"])[-2:] == ["Killed", "Deleted"]
    beat = client.ok("POST", "/api/v1/pilots/heartbeat", pilot_token,
                     json_body={"pilot_reference": PILOT_REF, "jobs": [{"job_id": job_id}]})
    assert beat["commands"] == [{"job_id": job_id, "command": "kill"}]


def test_output(client: Api, user_token: str, pilot_token: str) -> None:
    job_id = client.submit_jdl(user_token)[0]
    before = client.ok("GET", f"/api/v1/jobs/{job_id}/output", user_token)
    assert before == {"job_id": job_id, "status": "Waiting", "exit_code": None,
                      "output_tail": None, "output_sandbox": None, "input_sandboxes": []}
    client.match(pilot_token, pilot_reference=PILOT_REF)
    client.report(pilot_token, job_id, "Running")
    client.report(pilot_token, job_id, "Done", exit_code=0, output_tail="hello\nworld\n")
    after = client.ok("GET", f"/api/v1/jobs/{job_id}/output", user_token)
    assert after == {"job_id": job_id, "status": "Done", "exit_code": 0,
                     "output_tail": "hello\nworld\n", "output_sandbox": None,
                     "input_sandboxes": []}


# -- the job's own VO ---------------------------------------------------------------------------

def test_a_jdl_naming_another_vo_is_refused_and_nothing_is_stored(client: Api,
                                                                  user_token: str) -> None:
    before = client.ok("GET", "/api/v1/jobs", user_token)["jobs"]
    jdl = '[ Executable = "/bin/true"; VirtualOrganisation = "belle"; ]'
    problem = assert_problem(client.call("POST", "/api/v1/jobs", user_token, text=jdl), 422,
                             "VirtualOrganisation", "belle", "lhcb")
    assert "Traceback" not in problem["detail"]
    assert client.ok("GET", "/api/v1/jobs", user_token)["jobs"] == before


def test_a_jdl_naming_its_own_vo_is_taken(client: Api, user_token: str) -> None:
    [job_id] = client.submit_jdl(
        user_token, '[ Executable = "/bin/true"; VirtualOrganization = "lhcb"; ]')
    assert client.job(user_token, job_id)["status"] == "Waiting"


def test_a_bulk_with_one_job_of_another_vo_is_refused_whole(client: Api,
                                                            user_token: str) -> None:
    body = [{"executable": "/bin/true"},
            {"executable": "/bin/true",
             "attributes": {"custom_attributes": {"VirtualOrganisation": ["lhcb", "belle"]}}}]
    assert_problem(client.call("POST", "/api/v1/jobs", user_token, json_body=body), 422,
                   "job 1: VirtualOrganisation", "['lhcb', 'belle']")
    assert client.ok("GET", "/api/v1/jobs", user_token)["jobs"] == []
