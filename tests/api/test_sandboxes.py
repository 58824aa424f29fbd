"""The sandbox API: checksum-first upload, dedup, limits and quota, who may download, the
InputSandbox of a submission, a pilot's output upload and the job's output answer."""

from __future__ import annotations

import hashlib
import io
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from pilot.archive import Member, pack, sandbox_id
from taskqueue.core.settings import Settings
from tests.api.conftest import TokenMaker
from tests.api.helpers import PILOT_REF, SITE, Api, assert_problem

ARCHIVE = "application/gzip"
DATA = pack([Member("data.txt", b"hello sandbox\n")])
SID = sandbox_id(DATA)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def start(client: Api, token: str, data: bytes = DATA, **extra: Any) -> dict[str, Any]:
    answer: dict[str, Any] = client.ok("POST", "/api/v1/sandboxes", token, json_body={
        "checksum": hashlib.sha256(data).hexdigest(), "size": len(data), **extra})
    return answer


def upload(client: Api, token: str, data: bytes = DATA, **query: Any) -> str:
    answer = start(client, token, data, **query)
    if not answer["uploaded"]:
        assert answer["upload"]["method"] == "PUT"
        path = answer["upload"]["url"].split("localhost", 1)[-1]
        client.ok("PUT", path, token, status=201, data=data, content_type=ARCHIVE)
    sid: str = answer["sandbox_id"]
    return sid


def download(client: Api, token: str, sid: str, **query: Any) -> Any:
    return client.call("GET", f"/api/v1/sandboxes/{sid}", token, query=query or None)


def test_upload_then_the_checksum_says_it_is_stored(client: Api, user_token: str) -> None:
    first = start(client, user_token)
    assert first["sandbox_id"] == SID and first["uploaded"] is False
    assert first["upload"]["url"].endswith(f"/api/v1/sandboxes/{SID}")
    assert upload(client, user_token) == SID
    again = start(client, user_token)
    assert again == {"sandbox_id": SID, "uploaded": True, "upload": None}
    got = download(client, user_token, SID)
    assert got.status_code == 200 and got.mimetype == ARCHIVE
    assert got.get_data() == DATA


def test_the_same_bytes_from_two_users_are_stored_once(client: Api, user_token: str,
                                                        other_user_token: str,
                                                        api_settings: Settings) -> None:
    upload(client, user_token)
    # Knowing the checksum is not enough: the second user must send the bytes too ...
    assert start(client, other_user_token)["uploaded"] is False
    upload(client, other_user_token)
    # ... which are kept once.
    stored = [p for p in Path(api_settings.sandboxes.directory).rglob("*") if p.is_file()]
    assert len(stored) == 1
    assert download(client, other_user_token, SID).get_data() == DATA


def test_damaged_or_mislabelled_bytes_are_refused(client: Api, user_token: str) -> None:
    response = client.call("PUT", f"/api/v1/sandboxes/{SID}", user_token, data=DATA + b"x",
                           content_type=ARCHIVE)
    assert_problem(response, 422, "sha256", "not the")
    assert download(client, user_token, SID).status_code == 404
    assert_problem(client.call("PUT", "/api/v1/sandboxes/sb:md5:abc", user_token, data=DATA,
                               content_type=ARCHIVE), 404, "sandbox id")
    assert_problem(client.call("POST", "/api/v1/sandboxes", user_token,
                               json_body={"checksum": "Z" * 64, "size": 1}), 422, "checksum")


def test_size_limit_and_quota(make_app: Any, api_settings: Settings, token: TokenMaker
                              ) -> None:
    settings = replace(api_settings, sandboxes=replace(
        api_settings.sandboxes, max_upload_bytes=4096, user_quota_bytes=len(DATA) + 10))
    client = Api(make_app(settings).test_client(), settings, api_settings.auth.secret)
    alice = token("alice", "user")
    big = pack([Member("noise", b"".join(hashlib.sha512(bytes([i, j])).digest()
                                         for i in range(10) for j in range(10)))])
    assert len(big) > 4096
    assert_problem(client.call("POST", "/api/v1/sandboxes", alice, json_body={
        "checksum": hashlib.sha256(big).hexdigest(), "size": len(big)}), 413, "at most 4096")
    assert_problem(client.call("PUT", f"/api/v1/sandboxes/{sandbox_id(big)}", alice,
                               data=big, content_type=ARCHIVE), 413, "at most 4096")
    upload(client, alice)
    other = pack([Member("b.txt", b"another file")])
    response = client.call("PUT", f"/api/v1/sandboxes/{sandbox_id(other)}", alice,
                           data=other, content_type=ARCHIVE)
    assert_problem(response, 403, "quota")
    # The refused bytes were not kept.
    assert not list(Path(settings.sandboxes.directory).rglob(_sha(other)))
    # Another user has a quota of their own.
    upload(client, token("bob", "user"), other)


def test_parallel_uploads_cannot_overrun_the_quota(make_app: Any, api_settings: Settings,
                                                   token: TokenMaker) -> None:
    archives = [pack([Member("noise", hashlib.sha512(bytes([i])).digest() * 4)])
                for i in range(8)]
    size = max(len(a) for a in archives)
    settings = replace(api_settings, sandboxes=replace(
        api_settings.sandboxes, user_quota_bytes=3 * size + size // 2))
    app = make_app(settings)
    alice = token("alice", "user")
    barrier = threading.Barrier(len(archives))

    def put(data: bytes) -> int:
        client = Api(app.test_client(), settings, api_settings.auth.secret)
        barrier.wait()
        return int(client.call("PUT", f"/api/v1/sandboxes/{sandbox_id(data)}", alice,
                               data=data, content_type=ARCHIVE).status_code)

    with ThreadPoolExecutor(len(archives)) as pool:
        statuses = sorted(pool.map(put, archives))
    assert statuses == [201] * 3 + [403] * 5
    stored = [p for p in Path(settings.sandboxes.directory).rglob("*") if p.is_file()]
    assert len(stored) == 3


def test_who_may_download(client: Api, user_token: str, other_user_token: str,
                          operator_token: str, other_vo_operator_token: str,
                          pilot_token: str) -> None:
    upload(client, user_token)
    assert download(client, user_token, SID).status_code == 200
    assert download(client, operator_token, SID).status_code == 200
    for who in (other_user_token, other_vo_operator_token):
        assert_problem(download(client, who, SID), 404, "does not exist or is not yours")
    # A pilot holding no job that references it sees nothing either.
    assert_problem(download(client, pilot_token, SID, pilot_reference=PILOT_REF), 404)
    assert_problem(download(client, pilot_token, SID), 422, "pilot_reference")


def test_submission_with_a_local_file_names_it(client: Api, user_token: str) -> None:
    response = client.call("POST", "/api/v1/jobs", user_token,
                           text='[Executable = "/bin/cat"; InputSandbox = {"data.txt"};]')
    body = assert_problem(response, 422, "'data.txt'", "not uploaded")
    assert body["file"] == "data.txt"
    assert client.ok("GET", "/api/v1/jobs", user_token)["jobs"] == []


def test_submission_with_another_users_sandbox_is_refused(client: Api, user_token: str,
                                                          other_user_token: str) -> None:
    upload(client, user_token)
    response = client.call("POST", "/api/v1/jobs", other_user_token,
                           text=f'[Executable = "/bin/cat"; InputSandbox = {{"{SID}"}};]')
    assert_problem(response, 422, SID, "is not yours")
    bad = client.call("POST", "/api/v1/jobs", user_token,
                      text='[Executable = "/bin/cat"; InputSandbox = {"sb:sha256:12"};]')
    assert_problem(bad, 422, "not a sandbox id")


def _match_one(client: Api, token: str) -> dict[str, Any]:
    answer = client.match(token, pilot_reference=PILOT_REF, site=SITE)
    assert len(answer["jobs"]) == 1, answer
    job: dict[str, Any] = answer["jobs"][0]
    return job


def test_parametric_jobs_share_the_sandbox_and_the_pilot_reads_it(
        client: Api, user_token: str, pilot_token: str, token: TokenMaker) -> None:
    upload(client, user_token)
    # The LFN: entry is input data (as in DIRAC): its replica at CERN lets the jobs run there.
    client.ok("POST", "/api/v1/replicas", token("olga", "operator", group="lhcb_admin"),
              json_body={"replicas": [{"lfn": "/lhcb/x", "se": "CERN-DST"}]})
    jdl = (f'[Executable = "/bin/cat"; Arguments = "data.txt %s"; Parameters = 3; '
           f'ParameterStart = 0; ParameterStep = 1; InputSandbox = {{"{SID}", "LFN:/lhcb/x"}};]')
    ids = client.submit_jdl(user_token, jdl)
    assert len(ids) == 3
    for job_id in ids:
        out = client.ok("GET", f"/api/v1/jobs/{job_id}/output", user_token)
        assert out["input_sandboxes"] == [SID] and out["output_sandbox"] is None
    job = _match_one(client, pilot_token)
    assert SID in job["input_sandbox"]
    assert download(client, pilot_token, SID, pilot_reference=PILOT_REF).get_data() == DATA
    # Another pilot reference of the VO holds no such job; a pilot of another VO with the
    # same reference sees nothing either.
    assert download(client, pilot_token, SID, pilot_reference="pilot-2").status_code == 404
    belle = token("belle-factory", "pilot", vo="belle", group="belle_pilot")
    assert download(client, belle, SID, pilot_reference=PILOT_REF).status_code == 404
    # Once the job ended, its pilot may not read its sandbox any more.
    client.report(pilot_token, job["job_id"], "Done", exit_code=0)
    assert download(client, pilot_token, SID, pilot_reference=PILOT_REF).status_code == 404


def test_a_pilot_uploads_the_output_for_the_owner(client: Api, user_token: str,
                                                  pilot_token: str, other_user_token: str,
                                                  token: TokenMaker) -> None:
    job_id = client.submit_jdl(user_token, '[Executable = "/bin/true"; '
                                           'OutputSandbox = {"out.txt"};]')[0]
    out = pack([Member("out.txt", b"result\n")])
    # Not before the pilot holds the job, and only with the job named.
    assert_problem(client.call("POST", "/api/v1/sandboxes", pilot_token, json_body={
        "checksum": hashlib.sha256(out).hexdigest(), "size": len(out), "job_id": job_id,
        "pilot_reference": PILOT_REF}), 404, "not a job pilot")
    assert_problem(client.call("POST", "/api/v1/sandboxes", pilot_token, json_body={
        "checksum": hashlib.sha256(out).hexdigest(), "size": len(out)}), 422, "job_id")
    _match_one(client, pilot_token)
    sid = upload(client, pilot_token, out, job_id=job_id, pilot_reference=PILOT_REF)
    client.report(pilot_token, job_id, "Done", exit_code=0, output_sandbox=sid)
    answer = client.ok("GET", f"/api/v1/jobs/{job_id}/output", user_token)
    assert answer["status"] == "Done" and answer["output_sandbox"] == sid
    assert download(client, user_token, sid).get_data() == out
    assert download(client, other_user_token, sid).status_code == 404
    # A site-bound pilot token for another reference cannot upload for this job.
    other = token("x", "pilot", group="lhcb_pilot", site=SITE, pilot="pilot-9")
    assert_problem(client.call("POST", "/api/v1/sandboxes", other, json_body={
        "checksum": "a" * 64, "size": 10, "job_id": job_id}), 404)


def test_usage_per_vo(client: Api, user_token: str, operator_token: str) -> None:
    upload(client, user_token)
    answer = client.ok("GET", "/api/v1/sandboxes/usage", operator_token)
    assert answer == {"vos": [{"vo": "lhcb", "sandboxes": 1, "bytes": len(DATA)}]}
    assert client.call("GET", "/api/v1/sandboxes/usage", user_token).status_code == 403
    metrics = client.call("GET", "/metrics", operator_token).get_data(as_text=True)
    assert f'gridpilot_sandbox_bytes{{vo="lhcb"}} {len(DATA)}' in metrics
    assert 'gridpilot_sandboxes{vo="lhcb"} 1' in metrics


def test_other_bodies_keep_their_limit(make_app: Any, api_settings: Settings,
                                       user_token: str) -> None:
    settings = replace(api_settings, matcher=replace(api_settings.matcher,
                                                     max_body_bytes=1000))
    client = Api(make_app(settings).test_client(), settings, api_settings.auth.secret)
    response = client.call("POST", "/api/v1/jobs", user_token, text="#" * 5000)
    assert_problem(response, 413, "1000 bytes")



def test_object_storage_moves_the_bytes_through_presigned_urls(
        make_app: Any, api_settings: Settings, moto_endpoint: str, token: TokenMaker) -> None:
    import uuid

    import requests

    from taskqueue.files.sandboxstore import S3Store

    settings = replace(api_settings, sandboxes=replace(
        api_settings.sandboxes, backend="s3", endpoint_url=moto_endpoint,
        bucket=f"api-{uuid.uuid4().hex[:12]}"))
    S3Store(settings.sandboxes).ensure_bucket()
    client = Api(make_app(settings).test_client(), settings, api_settings.auth.secret)
    alice, bob = token("alice", "user"), token("bob", "user")
    first = start(client, alice)
    assert first["uploaded"] is False and first["upload"]["url"].startswith(moto_endpoint)
    put = requests.put(first["upload"]["url"], data=DATA, headers=first["upload"]["headers"],
                       timeout=30)
    assert put.status_code == 200, put.text
    assert start(client, alice)["uploaded"] is True
    got = download(client, alice, SID)
    assert got.status_code == 307 and got.headers["Location"].startswith(moto_endpoint)
    assert requests.get(got.headers["Location"], timeout=30).content == DATA
    # Another user with the same bytes proves it to the matcher; the object is not rewritten.
    second = start(client, bob)
    assert second["uploaded"] is False and "/api/v1/sandboxes/" in second["upload"]["url"]
    assert not second["upload"]["url"].startswith(moto_endpoint)
    assert_problem(client.call("PUT", f"/api/v1/sandboxes/{SID}", bob, data=DATA[:-1] + b"!",
                               content_type=ARCHIVE), 422, "sha256")
    assert download(client, bob, SID).status_code == 404
    client.ok("PUT", f"/api/v1/sandboxes/{SID}", bob, status=201, data=DATA,
              content_type=ARCHIVE)
    assert download(client, bob, SID).status_code == 307
    # New bytes never go through the matcher.
    other = pack([Member("new.txt", b"new")])
    assert_problem(client.call("PUT", f"/api/v1/sandboxes/{sandbox_id(other)}", bob, data=other,
                               content_type=ARCHIVE), 409, "object storage")
    assert_problem(download(client, token("carol", "user"), SID), 404)


def test_a_json_bulk_with_a_parametric_object_links_each_job_to_its_own_sandboxes(
        client: Api, user_token: str) -> None:
    # In a JSON list, a parametric object's jobs are numbered within it (0, 1, ...), like the
    # list's own objects: the sandboxes each job takes in must not be looked up by that
    # number, or the first job of the list got the parametric jobs' sandbox instead of its own.
    other = pack([Member("other.txt", b"other\n")])
    plain_sid, param_sid = upload(client, user_token), upload(client, user_token, other)
    ids = client.submit_json(user_token, [
        {"executable": "/bin/cat", "arguments": ["data.txt"], "input_sandbox": [plain_sid]},
        {"executable": "/bin/cat", "arguments": ["%s"], "input_sandbox": [param_sid],
         "attributes": {"custom_attributes": {"Parameters": ["a", "b"]}}},
        {"executable": "/bin/true"},
    ])
    assert len(ids) == 4
    wanted = [[plain_sid], [param_sid], [param_sid], []]
    for job_id, sids in zip(ids, wanted, strict=True):
        out = client.ok("GET", f"/api/v1/jobs/{job_id}/output", user_token)
        assert out["input_sandboxes"] == sids, (job_id, out)


def test_a_chunked_upload_over_the_limit_is_413_not_damaged(make_app: Any,
                                                            api_settings: Settings,
                                                            token: TokenMaker) -> None:
    settings = replace(api_settings, sandboxes=replace(api_settings.sandboxes,
                                                       max_upload_bytes=4096),
                       matcher=replace(api_settings.matcher, max_body_bytes=4096))
    app = make_app(settings)
    alice = token("alice", "user")
    big = pack([Member("noise", b"".join(hashlib.sha512(bytes([i, j])).digest()
                                         for i in range(10) for j in range(10)))])
    assert len(big) > 4096
    # No Content-Length: the body comes in chunks, as a streaming client sends it.
    response = app.test_client().put(
        f"/api/v1/sandboxes/{sandbox_id(big)}", input_stream=io.BytesIO(big),
        headers={"Authorization": f"Bearer {alice}", "Content-Type": ARCHIVE,
                 "Transfer-Encoding": "chunked"},
        environ_overrides={"wsgi.input_terminated": True})
    assert_problem(response, 413, "larger than the 4096 bytes")


def test_a_script_executable_nothing_ships_is_a_warning(client: Api, user_token: str) -> None:
    """The job is stored all the same; the answer says the file will not be there. A name
    without "/" and without a script's ending is a command of the worker node's PATH."""
    answer = client.ok("POST", "/api/v1/jobs", user_token, status=201,
                       text='[ Executable = "run.sh"; ]')
    assert answer["jobs"][0]["status"] == "Waiting"
    (warning,) = answer["warnings"]
    assert warning.startswith('Executable "run.sh" names a file in the job\'s folder')
    spec = client.ok("POST", "/api/v1/jobs", user_token, status=201, json_body={
        "executable": "bin/run", "input_sandbox": ["LFN:/lhcb/user/a/run"]})
    assert any('Executable "bin/run"' in w and "does not download" in w
               for w in spec["warnings"])
    sid = upload(client, user_token)
    for quiet in (f'[ Executable = "run.sh"; InputSandbox = {{"{sid}"}}; ]',
                  '[ Executable = "python3"; ]', '[ Executable = "/bin/run.sh"; ]'):
        assert client.ok("POST", "/api/v1/jobs", user_token, status=201,
                         text=quiet)["warnings"] == [], quiet
