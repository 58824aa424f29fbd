"""A pilot's log and its kill through its compute element, over HTTP: who may read which log,
what is said while there is none, and who may ask for a kill (on every backend)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import partial

from flask import Flask

from matcher.runtime import runtime_of
from taskqueue.pilots.pilotlogs import pack_log, record_ce_state, record_log
from taskqueue.pilots.records import PilotInfo, record_new_pilots, record_submission, register_pilot
from tests.api.helpers import OTHER_VO, SITE, Api, assert_problem

CE, QUEUE = "ce503.cern.ch", "condor"
NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)


def director_pilot(app: Flask, reference: str, *, vo: str = "lhcb",
                   native_id: str = "1234") -> None:
    """A pilot the site director submitted (its CE took it)."""
    runtime = runtime_of(app)
    runtime.transaction(partial(record_new_pilots, vo=vo, site=SITE, ce=CE, queue=QUEUE,
                                executor="slurm", references=[reference], now=NOW))
    runtime.transaction(partial(record_submission, reference=reference, native_id=native_id,
                                now=NOW))


def end_with_log(app: Flask, reference: str, stdout: bytes, stderr: bytes, *,
                 vo: str = "lhcb", exit_code: int = 0) -> str:
    """The pilot's CE says it ended; its log is stored as the director stores it."""
    runtime = runtime_of(app)
    runtime.transaction(partial(record_ce_state, vo=vo, reference=reference,
                                status="Done" if exit_code == 0 else "Failed",
                                reason="" if exit_code == 0 else "the batch system says FAILED",
                                exit_code=exit_code, now=NOW))
    log_id, packed = pack_log(stdout, stderr)
    runtime.sandbox_store().put(log_id, packed)
    runtime.transaction(partial(record_log, vo=vo, reference=reference, log_id=log_id,
                                size=len(packed), note="", now=NOW))
    return log_id


def test_an_operator_reads_an_ended_pilot_s_log(client: Api, app: Flask,
                                                operator_token: str) -> None:
    director_pilot(app, "slurm-aaa")
    end_with_log(app, "slurm-aaa", b"matched job 7\n", b"\xff not utf-8\nidle: exiting\n")
    log = client.ok("GET", "/api/v1/pilots/slurm-aaa/log", operator_token)
    assert log["reference"] == "slurm-aaa" and log["status"] == "Done"
    assert log["exit_code"] == 0
    assert log["stdout"] == "matched job 7\n"
    # Bytes that are not UTF-8 are shown, not refused.
    assert log["stderr"] == "\ufffd not utf-8\nidle: exiting\n"
    summary = client.ok("GET", "/api/v1/pilots/slurm-aaa", operator_token)
    assert (summary["log"], summary["exit_code"]) == ("stored", 0)


def test_a_user_reads_the_log_of_a_pilot_that_ran_their_job_only(
        client: Api, app: Flask, user_token: str, other_user_token: str,
        site_pilot_token: str) -> None:
    director_pilot(app, "slurm-bbb")
    (job_id,) = client.submit_jdl(user_token)
    client.match(site_pilot_token, pilot_reference="slurm-bbb", site=SITE)
    assert client.job(user_token, job_id)["pilot_reference"] == "slurm-bbb"
    end_with_log(app, "slurm-bbb", b"out", b"err")
    assert client.ok("GET", "/api/v1/pilots/slurm-bbb/log", user_token)["stdout"] == "out"
    # Bob's jobs never ran there: to him the pilot does not exist.
    assert_problem(client.call("GET", "/api/v1/pilots/slurm-bbb/log", other_user_token), 404,
                   "does not exist")


def test_another_vo_never_sees_a_pilot_s_log(client: Api, app: Flask,
                                             other_vo_operator_token: str) -> None:
    director_pilot(app, "slurm-ccc")
    end_with_log(app, "slurm-ccc", b"secret", b"")
    response = client.call("GET", "/api/v1/pilots/slurm-ccc/log", other_vo_operator_token)
    assert_problem(response, 404, "does not exist in VO belle")
    assert b"secret" not in response.get_data()


def test_a_pilot_that_ended_says_its_log_is_on_its_way(
        client: Api, app: Flask, operator_token: str) -> None:
    """A Done pilot whose log the pilots loop has not fetched yet has ended: say so plainly,
    and when the log comes, never "has not ended yet (Done)"."""
    director_pilot(app, "slurm-ended")
    runtime_of(app).transaction(partial(record_ce_state, vo="lhcb", reference="slurm-ended",
                                        status="Done", reason="", exit_code=0, now=NOW))
    response = client.call("GET", "/api/v1/pilots/slurm-ended/log", operator_token)
    assert_problem(response, 409, "pilot slurm-ended ended (Done); its log is not kept yet",
                   "the agents' pilots loop fetches it from its compute element, every 60 s")
    assert "has not ended" not in response.get_data(as_text=True)


def test_no_log_yet_none_at_all_and_one_removed_say_why(
        client: Api, app: Flask, operator_token: str, pilot_token: str) -> None:
    director_pilot(app, "slurm-ddd")
    assert_problem(client.call("GET", "/api/v1/pilots/slurm-ddd/log", operator_token), 409,
                   "has not ended yet", "once its compute element says it ended")
    # A pilot started by another factory registers itself: the director keeps no log of it.
    client.ok("PUT", "/api/v1/pilots/factory-1", pilot_token, json_body={
        "site": SITE, "ce": CE, "queue": QUEUE, "status": "Running"})
    assert_problem(client.call("GET", "/api/v1/pilots/factory-1/log", operator_token), 404,
                   "was not submitted by the site director")
    # A pilot whose CE lost it.
    runtime = runtime_of(app)
    runtime.transaction(partial(record_log, vo="lhcb", reference="slurm-ddd", log_id=None,
                                size=0, note="the CE does not know it", now=NOW))
    assert_problem(client.call("GET", "/api/v1/pilots/slurm-ddd/log", operator_token), 404,
                   "has no log: the CE does not know it")
    # A log whose bytes the sandbox cleanup removed.
    director_pilot(app, "slurm-eee", native_id="5678")
    log_id = end_with_log(app, "slurm-eee", b"gone soon", b"")
    runtime.sandbox_store().delete(log_id)
    assert_problem(client.call("GET", "/api/v1/pilots/slurm-eee/log", operator_token), 404,
                   "removed after the retention period")
    # Pilots cannot read logs, and an unknown reference is 404.
    assert_problem(client.call("GET", "/api/v1/pilots/slurm-eee/log", pilot_token), 403)
    assert_problem(client.call("GET", "/api/v1/pilots/nosuch/log", operator_token), 404)


def test_an_operator_asks_for_a_kill_that_the_director_passes_on(
        client: Api, app: Flask, operator_token: str, user_token: str,
        pilot_token: str, other_vo_operator_token: str) -> None:
    director_pilot(app, "slurm-fff")
    answer = client.ok("POST", "/api/v1/pilots/slurm-fff/kill", operator_token, status=202)
    assert answer["kill_requested_by"] == "olga"
    assert answer["status"] == "Submitted"  # the director does it at its next turn
    # Asked twice: the first request stands.
    again = client.ok("POST", "/api/v1/pilots/slurm-fff/kill",
                      client_token_of(client, "oscar"), status=202)
    assert again["kill_requested_by"] == "olga"
    # Users and pilots may not; another VO's operator does not see it.
    assert_problem(client.call("POST", "/api/v1/pilots/slurm-fff/kill", user_token), 403)
    assert_problem(client.call("POST", "/api/v1/pilots/slurm-fff/kill", pilot_token), 403)
    assert_problem(client.call("POST", "/api/v1/pilots/slurm-fff/kill",
                               other_vo_operator_token), 404, f"in VO {OTHER_VO}")


def test_a_kill_of_an_ended_or_hand_started_pilot_is_accepted(
        client: Api, app: Flask, operator_token: str, pilot_token: str) -> None:
    # An ended pilot may live on (its CE ignored a cancel); a pilot started by hand is told
    # to stop by the matcher, having no CE record to kill it through.
    director_pilot(app, "slurm-ggg")
    end_with_log(app, "slurm-ggg", b"", b"")
    answer = client.ok("POST", "/api/v1/pilots/slurm-ggg/kill", operator_token, status=202)
    assert (answer["status"], answer["kill_requested_by"]) == ("Done", "olga")
    client.ok("PUT", "/api/v1/pilots/factory-2", pilot_token, json_body={
        "site": SITE, "ce": CE, "queue": QUEUE, "status": "Running"})
    answer = client.ok("POST", "/api/v1/pilots/factory-2/kill", operator_token, status=202)
    assert answer["kill_requested_by"] == "olga"
    assert_problem(client.call("POST", "/api/v1/pilots/match/kill", operator_token), 404)
    assert_problem(client.call("POST", "/api/v1/pilots/nosuch/kill", operator_token), 404)



def client_token_of(client: Api, operator: str) -> str:
    from matcher.auth import issue_token

    return issue_token(client.secret, subject=operator, role="operator", vo="lhcb",
                       group="lhcb_admin", lifetime=600)


def test_a_pilot_registered_by_itself_keeps_its_record_when_its_ce_reports(
        client: Api, app: Flask, operator_token: str) -> None:
    """The CE's word never moves a pilot back: Done said by the pilot stays Done when a late
    poll says Running; the exit code is noted when the CE gives it."""
    director_pilot(app, "slurm-hhh")
    runtime = runtime_of(app)
    runtime.transaction(lambda s: register_pilot(
        s, "lhcb", PilotInfo("slurm-hhh", SITE, CE, QUEUE, "Done"), now=NOW))
    assert not runtime.transaction(partial(
        record_ce_state, vo="lhcb", reference="slurm-hhh", status="Running", reason="",
        exit_code=None, now=NOW + timedelta(seconds=5)))
    assert not runtime.transaction(partial(
        record_ce_state, vo="lhcb", reference="slurm-hhh", status="Failed", reason="x",
        exit_code=4, now=NOW + timedelta(seconds=9)))
    summary = client.ok("GET", "/api/v1/pilots/slurm-hhh", operator_token)
    assert (summary["status"], summary["exit_code"], summary["reason"]) == ("Done", 4, "")


def test_kill_and_log_need_a_token(client: Api, app: Flask) -> None:
    director_pilot(app, "slurm-iii")
    assert_problem(client.call("GET", "/api/v1/pilots/slurm-iii/log"), 401)
    assert_problem(client.call("POST", "/api/v1/pilots/slurm-iii/kill"), 401)


def _record(job: int | None, message: str) -> str:
    """One record as the pilot writes it (pilot.logformat)."""
    mark = f" [job {job}]" if job is not None else ""
    return f"2026-11-28 12:00:00,000 INFO pilot{mark}: {message}".replace("\n", "\n    ")


def test_a_user_reads_only_the_lines_of_a_shared_pilot_s_log_about_their_own_jobs(
        client: Api, app: Flask, user_token: str, other_user_token: str,
        operator_token: str, site_pilot_token: str) -> None:
    """Issue 33 item 10: a user whose one job ran on a multi-payload pilot read the whole
    log, which named other users' jobs and executables."""
    director_pilot(app, "slurm-ggg")
    (mine,) = client.submit_jdl(user_token, 'Executable = "/bin/alice-step";')
    (theirs,) = client.submit_jdl(other_user_token, 'Executable = "/home/bob/secret-model";')
    for _ in range(2):
        client.match(site_pilot_token, pilot_reference="slurm-ggg", site=SITE)
    stderr = "\n".join([
        _record(None, "pilot slurm-ggg: 8 cores, 16000 MB, matcher https://m.example"),
        _record(mine, f"job {mine} started on 1 core(s): /bin/alice-step"),
        _record(theirs, f"job {theirs} started on 1 core(s): /home/bob/secret-model"),
        _record(theirs, f"job {theirs}: Input sandbox: refused\n"
                        f"2026-11-28 12:00:01,000 INFO pilot [job {mine}]: forged by bob"),
        _record(None, f"heartbeat refused (422: job {theirs}: output_tail ...); sending it "
                      "without output tails"),
        _record(mine, f"job {mine} ended with exit code 0"),
        _record(None, "retiring: no job for 600 s"),
    ]) + "\n"
    end_with_log(app, "slurm-ggg", b"pilot finished (no job for 600 s): 2 payloads\n",
                 stderr.encode())
    alice = client.ok("GET", "/api/v1/pilots/slurm-ggg/log", user_token)
    assert alice["stderr"] == "\n".join([
        _record(None, "pilot slurm-ggg: 8 cores, 16000 MB, matcher https://m.example"),
        _record(mine, f"job {mine} started on 1 core(s): /bin/alice-step"),
        _record(mine, f"job {mine} ended with exit code 0"),
        _record(None, "retiring: no job for 600 s"),
    ]) + "\n"
    assert alice["stdout"] == "pilot finished (no job for 600 s): 2 payloads\n"
    assert alice["hidden_lines"] == 4
    bob = client.ok("GET", "/api/v1/pilots/slurm-ggg/log", other_user_token)
    assert "alice-step" not in bob["stderr"] and "secret-model" in bob["stderr"]
    operator = client.ok("GET", "/api/v1/pilots/slurm-ggg/log", operator_token)
    assert operator["stderr"] == stderr and operator["hidden_lines"] == 0


def test_an_older_pilot_s_unmarked_log_shows_a_user_what_names_no_other_job(
        client: Api, app: Flask, user_token: str, other_user_token: str,
        site_pilot_token: str) -> None:
    director_pilot(app, "slurm-hhh")
    (mine,) = client.submit_jdl(user_token)
    (theirs,) = client.submit_jdl(other_user_token)
    for _ in range(2):
        client.match(site_pilot_token, pilot_reference="slurm-hhh", site=SITE)
    lines = [_record(None, text) for text in (
        "pilot slurm-hhh: 8 cores",
        f"job {mine} started on 1 core(s): /bin/echo",
        f"job {theirs} started on 1 core(s): /home/bob/secret-model",
        "output file name '../../x' leaves the job folder; output.log is used instead",
        f"output /w/job_{theirs}/std.out grew beyond 100 bytes; cut to its end",
        f"report on job {mine} not delivered yet: 503",
        "ending 2 leftover process(es)",
    )]
    end_with_log(app, "slurm-hhh", b"", ("\n".join(lines) + "\n").encode())
    alice = client.ok("GET", "/api/v1/pilots/slurm-hhh/log", user_token)
    assert alice["stderr"] == "\n".join(lines[i] for i in (0, 1, 5, 6)) + "\n"
    assert alice["hidden_lines"] == 3
