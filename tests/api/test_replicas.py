"""/api/v1/replicas, and JDLs of DIRAC's and gLite's users over the API: the submit answer's
warnings, jobs placed where their data is, DIRAC's %j in what a pilot runs."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sqlalchemy import func, select

from taskqueue.core.settings import Settings
from taskqueue.db.models import FileReplica
from tests.api.helpers import PILOT_REF, SITE, Api, assert_problem
from tests.conftest import Database

REPLICAS = "/api/v1/replicas"


def _add(client: Api, token: str, *pairs: tuple[str, str]) -> dict[str, object]:
    answer: dict[str, object] = client.ok("POST", REPLICAS, token, json_body={
        "replicas": [{"lfn": lfn, "se": se} for lfn, se in pairs]})
    return answer


def test_operators_register_and_everyone_in_the_vo_looks_up(
        client: Api, operator_token: str, user_token: str) -> None:
    answer = _add(client, operator_token, ("LFN:/lhcb/d/f1", "CERN-DST"),
                  ("/lhcb/d/f1", "CNAF-DST"), ("/lhcb/d/f2", "NOWHERE-SE"))
    assert answer["added"] == 3
    assert answer["warnings"] == [
        f"no site of {client.settings.resources.file} lists the storage element NOWHERE-SE "
        "(SE or CloseSE): jobs cannot use its replicas"]
    assert _add(client, operator_token, ("/lhcb/d/f1", "CERN-DST"))["added"] == 0
    found = client.ok("GET", REPLICAS, user_token, query={"lfn": "LFN:/lhcb/d/f1"})
    assert [(r["lfn"], r["se"]) for r in found["replicas"]] == [
        ("/lhcb/d/f1", "CERN-DST"), ("/lhcb/d/f1", "CNAF-DST")]
    at = client.ok("GET", REPLICAS, user_token, query={"se": "NOWHERE-SE"})
    assert [r["lfn"] for r in at["replicas"]] == ["/lhcb/d/f2"]
    gone = client.ok("POST", f"{REPLICAS}/remove", operator_token,
                     json_body={"lfns": ["/lhcb/d/f1"], "se": "CNAF-DST"})
    assert gone["removed"] == 1


def test_users_cannot_change_the_catalogue(client: Api, user_token: str,
                                           pilot_token: str) -> None:
    body = {"replicas": [{"lfn": "/lhcb/f", "se": "CERN-DST"}]}
    assert_problem(client.call("POST", REPLICAS, user_token, json_body=body), 403)
    assert_problem(client.call("POST", REPLICAS, pilot_token, json_body=body), 403)
    assert_problem(client.call("POST", f"{REPLICAS}/remove", user_token,
                               json_body={"lfns": ["/lhcb/f"]}), 403)


def test_another_vo_sees_and_removes_nothing_of_ours(
        client: Api, operator_token: str, other_vo_operator_token: str) -> None:
    _add(client, operator_token, ("/lhcb/f", "CERN-DST"))
    assert client.ok("GET", REPLICAS, other_vo_operator_token)["replicas"] == []
    assert client.ok("POST", f"{REPLICAS}/remove", other_vo_operator_token,
                     json_body={"lfns": ["/lhcb/f"]})["removed"] == 0
    assert len(client.ok("GET", REPLICAS, operator_token)["replicas"]) == 1


def test_bad_entries_are_refused_whole(client: Api, operator_token: str) -> None:
    response = client.call("POST", REPLICAS, operator_token, json_body={"replicas": [
        {"lfn": "/lhcb/ok", "se": "CERN-DST"}, {"lfn": "relative/f", "se": "CERN-DST"}]})
    assert_problem(response, 422, "relative/f", "absolute path")
    assert_problem(client.call("POST", REPLICAS, operator_token, json_body={"replicas": [
        {"lfn": "/lhcb/ok", "se": "CERN DST"}]}), 422, "storage element")
    assert_problem(client.call("POST", REPLICAS, operator_token,
                               json_body={"replicas": []}), 422)
    assert client.ok("GET", REPLICAS, operator_token)["replicas"] == []


def test_a_job_with_input_data_waits_only_where_its_files_are(
        client: Api, operator_token: str, user_token: str, pilot_token: str) -> None:
    # CERN-DST is at LCG.CERN.cern and close to LCG.CNAF.it (conf/resources.toml).
    _add(client, operator_token, ("/lhcb/d/f1", "CERN-DST"))
    answer = client.ok("POST", "/api/v1/jobs", user_token, status=201,
                       text='Executable = "/bin/true"; InputData = {"LFN:/lhcb/d/f1"};')
    (job,) = answer["jobs"]
    assert job["status"] == "Waiting"
    ral = client.match(pilot_token, pilot_reference="p-ral", site="LCG.RAL.uk")
    assert ral["jobs"] == []
    cnaf = client.match(pilot_token, pilot_reference="p-cnaf", site="LCG.CNAF.it")
    assert [j["job_id"] for j in cnaf["jobs"]] == [job["job_id"]]


def test_a_job_whose_files_are_nowhere_fails_naming_them(client: Api, user_token: str) -> None:
    answer = client.ok("POST", "/api/v1/jobs", user_token, status=201,
                       text='Executable = "/bin/true"; InputData = "/lhcb/lost.dst";')
    (job,) = answer["jobs"]
    assert job["status"] == "Failed"
    assert job["minor_status"] == ("InputData: no replica of /lhcb/lost.dst in gridpilot's "
                                   "replica catalogue")


def test_explain_shows_the_data_rule(client: Api, operator_token: str, user_token: str) -> None:
    _add(client, operator_token, ("/lhcb/d/f1", "RAL-DST"))
    (job_id,) = client.submit_jdl(user_token, 'Executable = "/bin/true"; InputData = "/lhcb/d/f1";')
    answer = client.ok("POST", "/api/v1/taskqueues/explain", user_token, json_body={
        "job_id": job_id, "queue": "LCG.CERN.cern/ce503.cern.ch/condor"})
    assert answer["can_run"] is False
    (rule,) = [r for r in answer["rules"] if r["rule"] == "InputData"]
    assert rule["holds"] is False
    assert "LCG.CERN.cern reads from CERN-DST, CERN-RAW" in rule["detail"]
    assert "/lhcb/d/f1 is at RAL-DST" in rule["detail"]


def test_the_submit_answer_warns_where_gridpilot_reads_differently(
        client: Api, user_token: str) -> None:
    answer = client.ok("POST", "/api/v1/jobs", user_token, status=201, text=(
        '# a gLite job\n[ JobType = "Normal"; Executable = /bin/true; RetryCount = 3;\n'
        '  Arguments = "%s"; Parameters = 2; Site = ""; Platform = ""; ]'))
    assert len(answer["job_ids"]) == 2
    warnings = answer["warnings"]
    assert any('"Normal" is gLite\'s kind of job' in w for w in warnings)
    assert any(w.startswith("RetryCount: not used") for w in warnings)
    assert any("no ParameterStep" in w for w in warnings)
    assert not any("not one gridpilot knows" in w for w in warnings)


def test_percent_j_is_the_job_id_in_what_the_pilot_runs(
        client: Api, user_token: str, site_pilot_token: str) -> None:
    (job_id,) = client.submit_jdl(user_token, 'Executable = "/bin/true"; JobName = "run_%j"; '
                                              'StdOutput = "StdOut_%j"; '
                                              'OutputSandbox = {"StdOut_%j"};')
    assert client.job(user_token, job_id)["job_name"] == f"run_{job_id}"
    (payload,) = client.match(site_pilot_token, pilot_reference=PILOT_REF, site=SITE)["jobs"]
    assert payload["stdout"] == f"StdOut_{job_id}"
    assert payload["output_sandbox"] == [f"StdOut_{job_id}"]
    assert payload["job_name"] == f"run_{job_id}"


def test_concurrent_identical_registrations_count_each_replica_once(
        app: Any, api_settings: Settings, operator_token: str, db: Database) -> None:
    """Issue 33 item 10: four identical calls at once answered ``added: 200`` each; the
    replicas a call reports are those it inserted."""
    body = {"replicas": [{"lfn": f"/lhcb/c/f{i}", "se": "CERN-DST"} for i in range(200)]}
    barrier = threading.Barrier(4)

    def register(_: int) -> int:
        client = Api(app.test_client(), api_settings, api_settings.auth.secret)
        barrier.wait()
        answer = client.ok("POST", REPLICAS, operator_token, json_body=body)
        return int(answer["added"])

    with ThreadPoolExecutor(4) as pool:
        added = list(pool.map(register, range(4)))
    assert sum(added) == 200, added
    with db.factory() as session:
        assert session.scalar(select(func.count()).select_from(FileReplica)) == 200
