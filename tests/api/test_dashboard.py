"""The dashboard through the Flask test client on every backend: sign-in and its cookie, every
page, what users and operators may see, CSRF, the operator actions, hostile input."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta
from http.cookies import SimpleCookie
from typing import Any

import jwt
import pytest
from flask.testing import FlaskClient
from sqlalchemy import func, select
from werkzeug.test import TestResponse

from agents.ce.base import CELoad
from agents.context import AgentContext
from agents.maintenance import record_dashboard_activity
from matcher.dashboard import session as cookies
from taskqueue.core.settings import Settings
from taskqueue.db.models import DirectorQueue, Job, JobStatusHistory, Pilot, SiteBan
from taskqueue.pilots.records import (
    lock_director_queue,
    record_ce_failure,
    record_ce_load,
    record_credential_warning,
    record_submission_failure,
)
from tests.api.conftest import SECRET, TokenMaker
from tests.api.helpers import OTHER_SITE, PILOT_REF, SITE, VO, Api
from tests.conftest import Database

PAGES = ("/ui/", "/ui/sites", "/ui/taskqueues", "/ui/jobs", "/ui/pilots")


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, "no CSRF field in the page"
    return found.group(1)


def sign_in(http: FlaskClient, token: str, *, next_url: str = "") -> TestResponse:
    form = http.get("/ui/login")
    assert form.status_code == 200
    data = {"token": token, "csrf": csrf_of(form.get_data(as_text=True))}
    if next_url:
        data["next"] = next_url
    return http.post("/ui/login", data=data)


def page(http: FlaskClient, path: str, status: int = 200) -> str:
    response = http.get(path)
    text = response.get_data(as_text=True)
    assert response.status_code == status, f"{path}: {response.status_code} {text[:2000]}"
    return text


def count_activity(db: Database, settings: Settings, now: datetime | None = None) -> None:
    """A turn of the activity loop (gridpilot agents activity), at ``now``."""
    at = now or datetime.now(UTC)
    record_dashboard_activity(AgentContext(settings, db.factory, clock=lambda: at))


def populate(client: Api, user_token: str, pilot_token: str, operator_token: str
             ) -> dict[str, Any]:
    """A few jobs: two done and one failed at CERN, one running at CNAF, some waiting."""
    ids = client.submit_jdl(user_token, '[ Executable = "/bin/true"; Parameters = 6; ]')
    client.ok("PUT", "/api/v1/pilots/pilot-1", pilot_token,
              json_body={"site": SITE, "ce": "ce503.cern.ch", "queue": "condor",
                         "status": "Running"})
    matched = client.match(pilot_token, count=3, site=SITE, ce="ce503.cern.ch",
                           pilot_reference="pilot-1")["jobs"]
    done = [j["job_id"] for j in matched]
    for job_id in done[:2]:
        assert client.report(pilot_token, job_id, "Done", exit_code=0).status_code == 200
    assert client.report(pilot_token, done[2], "Failed", exit_code=3,
                         minor_status="Payload exited with code 3").status_code == 200
    client.ok("PUT", "/api/v1/pilots/pilot-2", pilot_token,
              json_body={"site": OTHER_SITE, "ce": "ce01-htc.cr.cnaf.infn.it",
                         "queue": "htc_mcore", "status": "Running"})
    running = client.match(pilot_token, site=OTHER_SITE, ce="ce01-htc.cr.cnaf.infn.it",
                           pilot_reference="pilot-2")["jobs"][0]["job_id"]
    assert client.report(pilot_token, running, "Running", reference="pilot-2"
                         ).status_code == 200
    client.ok("PUT", "/api/v1/sitemask/LCG.RAL.uk", operator_token,
              json_body={"reason": "downtime"})
    return {"ids": ids, "done": done[:2], "failed": done[2], "running": running,
            "waiting": [i for i in ids if i not in done and i != running]}


@pytest.fixture()
def grid(client: Api, user_token: str, pilot_token: str, operator_token: str
         ) -> dict[str, Any]:
    return populate(client, user_token, pilot_token, operator_token)


@pytest.fixture()
def operator_http(client: Api, operator_token: str) -> FlaskClient:
    http = client.client
    assert sign_in(http, operator_token).status_code == 302
    return http


def cookie_header(response: TestResponse, name: str) -> str:
    for header in response.headers.getlist("Set-Cookie"):
        if header.startswith(f"{name}="):
            return header
    raise AssertionError(f"no {name} cookie set")


# -- signing in ------------------------------------------------------------------------------

def test_pages_send_the_signed_out_to_the_sign_in_form(client: Api) -> None:
    for path in (*PAGES, "/ui/jobs/1", "/ui/taskqueues/1", "/ui/pilots/p"):
        response = client.client.get(path)
        assert response.status_code == 302, path
        assert response.headers["Location"].startswith("/ui/login?next=")


def test_sign_in_sets_a_strict_short_http_only_cookie(client: Api, operator_token: str
                                                      ) -> None:
    before = time.time()
    response = sign_in(client.client, operator_token, next_url="/ui/sites")
    assert response.status_code == 302
    assert response.headers["Location"] == "/ui/sites"
    header = cookie_header(response, cookies.COOKIE)
    assert "HttpOnly" in header and "SameSite=Strict" in header and "Path=/ui" in header
    assert "Secure" not in header  # plain HTTP here
    morsel = SimpleCookie(header)[cookies.COOKIE]
    expires = datetime.strptime(morsel["expires"], "%a, %d %b %Y %H:%M:%S GMT").replace(
        tzinfo=UTC).timestamp()
    assert before + 3600 - 5 <= expires <= time.time() + 3600 + 1
    page(client.client, "/ui/sites")


def test_the_cookie_is_secure_over_https(client: Api, operator_token: str) -> None:
    http = client.client
    form = http.get("/ui/login", base_url="https://localhost")
    assert "Secure" in cookie_header(form, cookies.LOGIN_COOKIE)
    response = http.post("/ui/login", base_url="https://localhost",
                         data={"token": operator_token,
                               "csrf": csrf_of(form.get_data(as_text=True))})
    assert response.status_code == 302
    assert "Secure" in cookie_header(response, cookies.COOKIE)


def test_the_session_never_outlives_its_token(client: Api, token: TokenMaker) -> None:
    response = sign_in(client.client, token("olga", "operator", group="lhcb_admin",
                                            lifetime=120))
    claims = jwt.decode(SimpleCookie(cookie_header(response, cookies.COOKIE))[
        cookies.COOKIE].value, options={"verify_signature": False})
    assert claims["exp"] <= time.time() + 121


@pytest.mark.parametrize(("which", "status", "fragment"), [
    ("forged", 401, "not valid"), ("expired", 401, "expired"), ("pilot", 403, "pilot token"),
    ("empty", 400, "Paste a token"), ("garbage", 401, "not valid"),
    ("huge", 400, "longer than")])
def test_bad_tokens_do_not_sign_in(client: Api, forged_token: str, expired_token: str,
                                   pilot_token: str, which: str, status: int,
                                   fragment: str) -> None:
    value = {"forged": forged_token, "expired": expired_token, "pilot": pilot_token,
             "empty": "  ", "garbage": "not.a.token", "huge": "x" * 20000}[which]
    response = sign_in(client.client, value)
    assert response.status_code == status
    assert fragment in response.get_data(as_text=True)
    assert not any(h.startswith(f"{cookies.COOKIE}=") for h in
                   response.headers.getlist("Set-Cookie"))


def test_the_sign_in_form_needs_its_own_csrf_value(client: Api, operator_token: str) -> None:
    client.client.get("/ui/login")
    response = client.client.post("/ui/login", data={"token": operator_token,
                                                     "csrf": "guessed"})
    assert response.status_code == 400
    assert "expired" in response.get_data(as_text=True)


def test_after_sign_in_only_dashboard_pages_are_followed(client: Api, operator_token: str
                                                         ) -> None:
    for target in ("//evil.example/ui/", "https://evil.example/", "/api/v1/jobs",
                   "/ui/\\evil"):
        http = client.client
        response = sign_in(http, operator_token, next_url=target)
        assert response.headers["Location"] == "/ui/", target
        http.post("/ui/logout", data={"csrf": csrf_of(page(http, "/ui/jobs"))})


def test_forged_or_foreign_cookies_are_not_sessions(client: Api, operator_token: str) -> None:
    http = client.client
    expired = cookies.encode(cookies.Viewer(cookies.principal_from_header(
        f"Bearer {operator_token}", SECRET), int(time.time()) - 10, "x"), SECRET)
    for value in (operator_token,  # a bearer token is not a session
                  cookies.encode(cookies.Viewer(cookies.principal_from_header(
                      f"Bearer {operator_token}", SECRET), int(time.time()) + 600, "x"),
                      "another-secret-0123456789abcdef"),
                  expired, "garbage"):
        http.set_cookie(cookies.COOKIE, value, path="/ui")
        assert http.get("/ui/jobs").status_code == 302


def test_a_session_cookie_is_not_an_api_token(client: Api, operator_token: str) -> None:
    response = sign_in(client.client, operator_token)
    value = SimpleCookie(cookie_header(response, cookies.COOKIE))[cookies.COOKIE].value
    assert client.call("GET", "/api/v1/jobs", value).status_code == 401


def test_sign_out_ends_the_session(operator_http: FlaskClient) -> None:
    html = page(operator_http, "/ui/jobs")
    kept = operator_http.get_cookie(cookies.COOKIE, path="/ui")
    assert kept is not None
    response = operator_http.post("/ui/logout", data={"csrf": csrf_of(html)})
    assert response.status_code == 302
    assert operator_http.get("/ui/jobs").status_code == 302
    # The signed cookie, kept and sent again, no longer opens a page nor acts.
    operator_http.set_cookie(cookies.COOKIE, kept.value, path="/ui")
    assert operator_http.get("/ui/jobs").status_code == 302
    again = operator_http.post("/ui/logout", data={"csrf": csrf_of(html)})
    assert again.status_code == 401


# -- pages -------------------------------------------------------------------------------------

def test_every_page_shows_the_vo(db: Database, client: Api, grid: dict[str, Any],
                                 operator_http: FlaskClient) -> None:
    count_activity(db, client.settings)
    for path in PAGES:
        html = page(operator_http, path)
        assert "olga" in html and "lhcb" in html
    failed = grid["failed"]
    job_html = page(operator_http, f"/ui/jobs/{failed}")
    assert "Payload exited with code 3" in job_html and "Failed" in job_html
    pilot_html = page(operator_http, "/ui/pilots/pilot-1")
    assert f'href="/ui/jobs/{failed}"' in pilot_html
    assert "never renewed" in pilot_html
    tq = re.search(r'href="/ui/taskqueues/(\d+)"', page(operator_http, "/ui/taskqueues"))
    assert tq
    assert "Next jobs" in page(operator_http, f"/ui/taskqueues/{tq.group(1)}")


def test_the_overview_shows_the_database_counts(db: Database, client: Api,
                                                grid: dict[str, Any],
                                                operator_http: FlaskClient) -> None:
    count_activity(db, client.settings)
    html = page(operator_http, "/ui/")
    with db.factory() as session:
        counts = {s: n for s, n in session.execute(
            select(Job.status, func.count()).group_by(Job.status))}
    for status, n in counts.items():
        assert re.search(rf'data-status="{status}">\s*<span class="label">{status}</span>'
                         rf'<span class="value">{n:,}</span>', html), status
    assert re.search(r'id="failed-hour">1<', html)
    # The failures panel counts the same hour as the counter beside it.
    panel = html.split('id="failures"', 1)[1].split("</table>", 1)[0]
    assert sum(int(n) for n in re.findall(r'<td class="num">(\d+)</td>', panel)) == 1
    assert re.search(r'id="matched-hour">4<', html)
    assert "Payload exited with code 3" in html
    assert "LCG.RAL.uk" in html and "downtime" in html


def test_the_overview_says_why_failures_outnumber_failed_jobs(
        db: Database, client: Api, grid: dict[str, Any], pilot_token: str,
        operator_token: str, operator_http: FlaskClient) -> None:
    """A rescheduled job that fails again is one Failed job and two failures in the last
    hour: the counter says so, rather than disagreeing silently with the Failed tile."""
    job_id = grid["failed"]
    client.ok("POST", "/api/v1/jobs/reschedule", operator_token, json_body={"job_ids": [job_id]})
    client.ok("PUT", "/api/v1/pilots/pilot-3", pilot_token,
              json_body={"site": SITE, "ce": "ce503.cern.ch", "queue": "condor",
                         "status": "Running"})
    while True:  # the rescheduled job waits behind the others of its task queue
        got = [j["job_id"] for j in client.match(pilot_token, site=SITE, ce="ce503.cern.ch",
                                                   pilot_reference="pilot-3")["jobs"]]
        assert got, "the rescheduled job was never matched"
        for other in got:
            assert client.report(pilot_token, other, "Failed" if other == job_id else "Done",
                                 exit_code=3 if other == job_id else 0,
                                 reference="pilot-3").status_code == 200
        if job_id in got:
            break
    count_activity(db, client.settings)
    html = page(operator_http, "/ui/")
    assert re.search(r'data-status="Failed">\s*<span class="label">Failed</span>'
                     r'<span class="value">1</span>', html)
    assert re.search(r'id="failed-hour">2<', html)
    assert "failures in the last hour, of 1 job: a rescheduled job that fails again counts " \
           "once per failure" in html


def test_the_overview_says_when_the_activity_loop_is_not_running(
        client: Api, grid: dict[str, Any], operator_http: FlaskClient) -> None:
    html = page(operator_http, "/ui/")
    assert "the activity loop has not run" in html
    assert "gridpilot agents" in html


def test_the_sites_page_counts_what_runs_and_what_waits(db: Database, client: Api,
                                                        grid: dict[str, Any],
                                                        operator_http: FlaskClient) -> None:
    count_activity(db, client.settings)
    html = page(operator_http, "/ui/sites")
    cnaf = html[html.index('data-queue="LCG.CNAF.it/ce01-htc.cr.cnaf.infn.it/htc_mcore"'):]
    assert re.search(r'data-field="running">1<', cnaf[:600])
    # the waiting jobs are plain one-core jobs any queue may run
    waiting = len(grid["waiting"])
    assert re.search(rf'data-field="waiting-for">{waiting} ', cnaf)
    cern = html[html.index('id="site-LCG.CERN.cern"'):]
    assert re.search(r'data-field="failure-1h"[^>]*>33%<', cern)
    ral = html[html.index('id="site-LCG.RAL.uk"') - 60:html.index('id="site-LCG.RAL.uk"')]
    assert "banned" in ral


def test_the_sites_page_matched_column_adds_up_to_every_match(
        db: Database, client: Api, grid: dict[str, Any], operator_token: str,
        operator_http: FlaskClient) -> None:
    """A job rescheduled before the activity loop counted its match names no site: its match
    is a row of the table (not left out of the column), so the column adds up to the
    overview's 'matched in the last hour'."""
    client.ok("POST", "/api/v1/jobs/reschedule", operator_token,
              json_body={"job_ids": [grid["failed"]]})
    count_activity(db, client.settings)
    overview = page(operator_http, "/ui/")
    matched = re.search(r'id="matched-hour">(\d+)<', overview)
    assert matched
    html = page(operator_http, "/ui/sites")
    cells = [int(n) for n in re.findall(r'data-field="matched-1h">(\d+)<', html)]
    assert sum(cells) == int(matched[1]) == 4, cells
    assert 'id="site-no-site"' in html


def test_the_sites_page_names_the_ended_pilots_statuses(
        db: Database, client: Api, pilot_token: str, operator_http: FlaskClient) -> None:
    """"Done 1", "Aborted 1": not "D 1 / A 1", which says nothing to a newcomer."""
    for reference, status in (("pilot-d", "Done"), ("pilot-a", "Aborted")):
        client.ok("PUT", f"/api/v1/pilots/{reference}", pilot_token,
                  json_body={"site": SITE, "ce": "ce503.cern.ch", "queue": "condor",
                             "status": "Running"})
        client.ok("PUT", f"/api/v1/pilots/{reference}", pilot_token,
                  json_body={"site": SITE, "ce": "ce503.cern.ch", "queue": "condor",
                             "status": status})
    count_activity(db, client.settings)
    html = page(operator_http, "/ui/sites")
    row = html[html.index('data-queue="LCG.CERN.cern/ce503.cern.ch/condor"'):]
    row = row[:row.index("</tr>")]
    ended = re.findall(r'<span class="chip[^"]*"[^>]*>([^<]*)</span>', row)
    assert "Done 1" in ended and "Aborted 1" in ended, ended


def test_a_user_sees_only_their_own_jobs(client: Api, grid: dict[str, Any],
                                         other_user_token: str, user_token: str) -> None:
    mine = client.submit_jdl(other_user_token)[0]
    http = client.client
    response = sign_in(http, user_token)
    assert response.headers["Location"] == "/ui/jobs"
    html = page(http, "/ui/jobs")
    assert f'data-job="{grid["ids"][0]}"' in html and f'data-job="{mine}"' not in html
    assert f'data-job="{mine}"' not in page(http, "/ui/jobs?owner=bob")
    assert "another user" in page(http, f"/ui/jobs/{mine}", 403)
    for path in ("/ui/sites", "/ui/taskqueues", "/ui/pilots", "/ui/pilots/pilot-1"):
        assert "operators" in page(http, path, 403)
    assert http.get("/ui/").headers["Location"] == "/ui/jobs"


def test_an_operator_sees_only_their_vo(client: Api, grid: dict[str, Any],
                                        other_vo_operator_token: str) -> None:
    http = client.client
    sign_in(http, other_vo_operator_token)
    assert "does not exist" in page(http, f"/ui/jobs/{grid['failed']}", 404)
    assert 'data-job=' not in page(http, "/ui/jobs")
    page(http, "/ui/pilots/pilot-1", 404)
    assert "LCG.RAL.uk" not in page(http, "/ui/")


def test_job_lists_page_newest_first_without_gaps(client: Api, grid: dict[str, Any],
                                                  operator_http: FlaskClient) -> None:
    seen: list[int] = []
    url = "/ui/jobs?owner=alice"
    while url:
        html = page(operator_http, url.replace("&amp;", "&"))
        seen += [int(i) for i in re.findall(r'data-job="(\d+)"', html)]
        found = re.search(r'href="([^"]+)" id="next"', html)
        url = found.group(1) if found else ""
    assert seen == sorted(grid["ids"], reverse=True)
    for status in ("Done", "done", "DONE"):  # status names in any letter case
        assert re.findall(r'data-job="(\d+)"', page(operator_http, f"/ui/jobs?status={status}")
                          ) == [str(i) for i in sorted(grid["done"], reverse=True)]
    jump = operator_http.get(f"/ui/jobs?id={grid['failed']}")
    assert jump.headers["Location"] == f"/ui/jobs/{grid['failed']}"


@pytest.mark.parametrize("query", ["before=abc", "before=-1", "status=Bogus", "id=1e9",
                                   "owner=" + "x" * 300, "site=a%00b", "range=forever"])
def test_hostile_queries_get_a_clear_400_page(operator_http: FlaskClient, query: str) -> None:
    path = "/ui/?" + query if query.startswith("range") else "/ui/jobs?" + query
    html = page(operator_http, path, 400)
    assert "Bad request" in html and "Traceback" not in html


def test_unknown_objects_get_a_404_page(operator_http: FlaskClient) -> None:
    assert "does not exist" in page(operator_http, "/ui/jobs/999999", 404)
    assert "does not exist" in page(operator_http, f"/ui/jobs/{2**70}", 404)
    assert "does not exist" in page(operator_http, "/ui/taskqueues/999999", 404)
    page(operator_http, "/ui/pilots/nobody", 404)


def test_pages_forbid_scripts_from_elsewhere(operator_http: FlaskClient) -> None:
    response = operator_http.get("/ui/jobs")
    assert "script-src 'self'" in response.headers["Content-Security-Policy"]
    assert response.headers["X-Frame-Options"] == "DENY"
    assert response.headers["Cache-Control"] == "no-store"
    css = operator_http.get("/ui/static/dashboard.css")
    assert css.status_code == 200 and css.mimetype == "text/css"
    assert b"--accent" in css.get_data()
    css.close()


@pytest.mark.parametrize("path", ["/ui/no-such-page", "/ui/jobs/x/y", "/ui/static/none.css",
                                  "/ui"])
def test_answers_under_ui_that_no_page_makes_carry_the_headers(
        operator_http: FlaskClient, path: str) -> None:
    """Issue 33 item 10: the 404 answers of paths under /ui/ that no view serves had no
    Content-Security-Policy."""
    response = operator_http.get(path)
    assert response.status_code in (308, 404), response.status_code
    assert "default-src 'none'" in response.headers.get("Content-Security-Policy", "")
    assert response.headers["X-Frame-Options"] == "DENY"
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    response.close()


def test_names_are_escaped(client: Api, token: TokenMaker, operator_http: FlaskClient) -> None:
    evil = '<script>alert(1)</script>'
    client.ok("PUT", "/api/v1/sitemask/LCG.CNAF.it", token("olga", "operator",
                                                           group="lhcb_admin"),
              json_body={"reason": evil})
    html = page(operator_http, "/ui/sites")
    assert evil not in html and "&lt;script&gt;" in html


# -- actions -----------------------------------------------------------------------------------

def test_explain_preselects_a_queue_that_could_run_the_job_or_none(
        client: Api, user_token: str, operator_http: FlaskClient) -> None:
    """Not the first configured queue (CERN's) for a job restricted to CNAF: one of CNAF's,
    and for a job no queue can run, none (a prompt instead)."""
    (at_cnaf,) = client.submit_jdl(user_token, f'[ Executable = "/bin/true"; '
                                               f'Site = "{OTHER_SITE}"; ]')
    html = page(operator_http, f"/ui/jobs/{at_cnaf}")
    selected = re.findall(r"<option [^>]*selected[^>]*>([^<]*)</option>", html)
    assert len(selected) == 1 and selected[0].startswith(f"{OTHER_SITE}/"), selected
    (nowhere,) = client.submit_jdl(user_token, '[ Executable = "/bin/true"; '
                                               'Requirements = [ SoftwareTag = "nope-v0" ]; ]')
    html = page(operator_http, f"/ui/jobs/{nowhere}")
    selected = re.findall(r"<option [^>]*selected[^>]*>([^<]*)</option>", html)
    assert selected == ["choose a queue (none can run it)"], selected


def test_kill_asks_first_and_needs_the_csrf_value(db: Database, client: Api,
                                                  grid: dict[str, Any],
                                                  operator_http: FlaskClient) -> None:
    job_id = grid["running"]
    confirm = page(operator_http, f"/ui/jobs/{job_id}/kill")
    assert "Kill job" in confirm and 'id="confirm"' in confirm
    with db.factory() as session:
        assert session.get(Job, job_id).status == "Running"  # type: ignore[union-attr]
    for data in ({}, {"csrf": "wrong"}):
        assert operator_http.post(f"/ui/jobs/{job_id}/kill", data=data).status_code == 403
    other_site = operator_http.post(f"/ui/jobs/{job_id}/kill",
                                    data={"csrf": csrf_of(confirm)},
                                    headers={"Origin": "https://evil.example"})
    assert other_site.status_code == 403
    with db.factory() as session:
        assert session.get(Job, job_id).status == "Running"  # type: ignore[union-attr]
    response = operator_http.post(f"/ui/jobs/{job_id}/kill",
                                  data={"csrf": csrf_of(confirm), "reason": "looping"})
    assert response.status_code == 302
    html = page(operator_http, response.headers["Location"])
    assert 'id="done"' in html and "Killed" in html
    with db.factory() as session:
        history = session.scalars(select(JobStatusHistory).where(
            JobStatusHistory.job_id == job_id).order_by(JobStatusHistory.id)).all()
    assert history[-1].status == "Killed"
    assert history[-1].minor_status == "Killed by operator:olga: looping"
    # again: the job is final now; a clear page, nothing changes
    again = operator_http.post(f"/ui/jobs/{job_id}/kill", data={"csrf": csrf_of(confirm)})
    assert again.status_code == 409 and "already Killed" in again.get_data(as_text=True)


def test_reschedule_sends_the_job_back_to_its_queue(db: Database, client: Api,
                                                    grid: dict[str, Any],
                                                    operator_http: FlaskClient) -> None:
    job_id = grid["failed"]
    csrf = csrf_of(page(operator_http, f"/ui/jobs/{job_id}/reschedule"))
    response = operator_http.post(f"/ui/jobs/{job_id}/reschedule", data={"csrf": csrf})
    assert response.status_code == 302
    with db.factory() as session:
        job = session.get(Job, job_id)
        assert job is not None and job.status == "Waiting" and job.reschedule_count == 1


def test_a_user_acts_on_their_own_jobs_only(client: Api, grid: dict[str, Any],
                                            other_user_token: str, user_token: str) -> None:
    theirs = client.submit_jdl(other_user_token)[0]
    http = client.client
    sign_in(http, user_token)
    csrf = csrf_of(page(http, "/ui/jobs"))
    assert http.post(f"/ui/jobs/{theirs}/kill", data={"csrf": csrf}).status_code == 403
    assert http.post(f"/ui/sites/{SITE}/ban", data={"csrf": csrf}).status_code == 403
    mine = grid["waiting"][0]
    assert http.post(f"/ui/jobs/{mine}/kill", data={"csrf": csrf}).status_code == 302


def test_ban_and_unban_a_site(db: Database, client: Api, operator_http: FlaskClient,
                              pilot_token: str, user_token: str) -> None:
    client.submit_jdl(user_token)
    confirm = page(operator_http, f"/ui/sites/{SITE}/ban")
    assert f"Ban {SITE}?" in confirm
    response = operator_http.post(f"/ui/sites/{SITE}/ban",
                                  data={"csrf": csrf_of(confirm), "reason": "broken CVMFS"})
    assert response.status_code == 302 and response.headers["Location"] == "/ui/sites"
    with db.factory() as session:
        ban = session.get(SiteBan, (VO, SITE))
        assert ban is not None and ban.reason == "broken CVMFS"
        assert ban.banned_by == "operator:olga"
    answer = client.match(pilot_token, site=SITE, pilot_reference="p-9")
    assert answer["no_match"]["reason"] == "site_banned"
    response = operator_http.post(f"/ui/sites/{SITE}/unban",
                                  data={"csrf": csrf_of(confirm)})
    assert response.status_code == 302
    with db.factory() as session:
        assert session.get(SiteBan, (VO, SITE)) is None
    missing = operator_http.post("/ui/sites/LCG.Nowhere/unban", data={"csrf": csrf_of(confirm)})
    assert missing.status_code == 404


def test_the_overview_charts_the_counters(db: Database, client: Api, grid: dict[str, Any],
                                          operator_http: FlaskClient) -> None:
    now = datetime.now(UTC)
    count_activity(db, client.settings, now - timedelta(minutes=2))
    count_activity(db, client.settings, now)
    html = page(operator_http, "/ui/?range=6h")
    totals = [int(t) for t in re.findall(r'data-total="(\d+)"', html)]
    # status lines (Waiting, Matched, Running, Stalled) and matched, done, failed
    assert len(totals) == 7
    assert totals[4:] == [4, 2, 1]
    assert 'data-total="4"' in page(operator_http, "/ui/?range=30d")  # the hour rows


def test_the_sites_page_says_when_its_counts_are_missing(client: Api, grid: dict[str, Any],
                                                         operator_http: FlaskClient) -> None:
    html = page(operator_http, "/ui/sites")
    assert "No queue counts yet" in html and "gridpilot agents activity" in html
    assert "LCG.RAL.uk" in html  # the ban is live, not counted


def test_jobs_are_found_by_name_and_job_group(client: Api, user_token: str,
                                              operator_http: FlaskClient) -> None:
    ids = client.submit_jdl(user_token, '[ Executable = "/bin/true"; JobName = "calib-%n"; '
                                        'JobGroup = "run-2026"; Parameters = 3; ]')
    other = client.submit_jdl(user_token, '[ Executable = "/bin/true"; JobName = "reco-1"; ]')
    found = re.findall(r'data-job="(\d+)"', page(operator_http, "/ui/jobs?job_name=calib-*"))
    assert found == [str(i) for i in sorted(ids, reverse=True)]
    assert re.findall(r'data-job="(\d+)"', page(operator_http, "/ui/jobs?job_name=calib-1")
                      ) == [str(ids[1])]
    grouped = page(operator_http, "/ui/jobs?job_group=run-2026")
    assert f'data-job="{other[0]}"' not in grouped and "calib-0" in grouped
    # a "%" or "_" in a prefix is a character, not a pattern
    assert 'data-job=' not in page(operator_http, "/ui/jobs?job_name=cal%25*")


def test_memory_reads_the_same_on_the_job_and_queue_pages(client: Api, user_token: str,
                                                          operator_http: FlaskClient) -> None:
    anything, big = (client.submit_jdl(user_token, jdl)[0] for jdl in (
        '[ Executable = "/bin/true"; ]', '[ Executable = "/bin/true"; MaxRAM = 3000; ]'))
    assert "1 core(s), any memory</td>" in page(operator_http, f"/ui/jobs/{anything}")
    assert re.search(r"1 core\(s\), [\d,]+ MB</td>", page(operator_http, f"/ui/jobs/{big}"))
    queues = page(operator_http, "/ui/taskqueues")
    assert "any memory" in queues and " 0 MB" not in queues


def test_a_running_jobs_page_shows_the_tail_its_heartbeat_sent(
        client: Api, user_token: str, pilot_token: str, operator_http: FlaskClient) -> None:
    job_id = client.submit_jdl(user_token, '[ Executable = "/bin/true"; ]')[0]
    assert [j["job_id"] for j in client.match(pilot_token, pilot_reference=PILOT_REF,
                                              site=SITE)["jobs"]] == [job_id]
    assert client.report(pilot_token, job_id, "Running").status_code == 200
    client.ok("POST", "/api/v1/pilots/heartbeat", pilot_token, json_body={
        "pilot_reference": PILOT_REF, "jobs": [{"job_id": job_id, "output_tail": "step 7\n"}]})
    html = page(operator_http, f"/ui/jobs/{job_id}")
    assert '<pre class="code" id="output">step 7\n</pre>' in html
    assert re.search(r'id="peek">\(while it runs: as of its pilot.s heartbeat at [\d-]+ '
                     r'[\d:]+ UTC\)', html)


def test_the_sites_page_says_what_failed_and_retries_a_queue_now(
        db: Database, client: Api, grid: dict[str, Any], operator_http: FlaskClient) -> None:
    """Issue 34 item 2: failed submissions and failed polls of the CE apart, each with its
    next try; the Retry button ends both back-offs."""
    count_activity(db, client.settings)
    key = ("LCG.CNAF.it", "ce01-htc.cr.cnaf.infn.it", "htc_mcore")
    now = datetime.now(UTC)
    with db.factory.begin() as session:
        record_submission_failure(session, *key, [], reason="token expired", now=now,
                                  base_backoff=600)
        record_ce_failure(session, [key], reason="connection refused", now=now,
                          base_backoff=600)
    html = page(operator_http, "/ui/sites")
    row = html[html.index(f'data-queue="{"/".join(key)}"'):]
    row = row[:row.index("</tr>")]
    submissions = re.search(r'data-failing="submissions">([^<]*)<', row)
    polls = re.search(r'data-failing="polls">([^<]*)<', row)
    assert submissions and "1 failed in a row, last: token expired; next try at" in \
        submissions.group(1)
    assert polls and "connection refused" in polls.group(1) and "next try at" in polls.group(1)
    assert "Retry now" in row

    for bad, code in (("LCG.CNAF.it/htc_mcore", 422), ("LCG.Nowhere/ce/q", 404)):
        answer = operator_http.post("/ui/sites/retry", data={"csrf": csrf_of(html),
                                                             "queue": bad})
        assert answer.status_code == code, bad
    assert operator_http.post("/ui/sites/retry", data={"queue": "/".join(key)}
                              ).status_code == 403  # no csrf value
    response = operator_http.post("/ui/sites/retry", data={"csrf": csrf_of(html),
                                                           "queue": "/".join(key)})
    assert response.status_code == 302 and response.headers["Location"] == "/ui/sites"
    with db.factory() as session:
        state = session.get(DirectorQueue, key)
        assert state is not None
        assert (state.failures, state.poll_failures, state.poll_skip_until) == (0, 0, None)
        assert state.skip_until is not None and state.skip_until <= datetime.now(UTC)
        assert state.retry_requested_by == "operator:olga"
    html = page(operator_http, "/ui/sites")
    row = html[html.index(f'data-queue="{"/".join(key)}"'):]
    row = row[:row.index("</tr>")]
    assert "data-failing" not in row and "retried by operator:olga" in row


def test_the_pilot_page_shows_its_token_renewals(client: Api, grid: dict[str, Any],
                                                 pilot_token: str,
                                                 operator_http: FlaskClient) -> None:
    for _ in range(2):
        client.ok("POST", "/api/v1/pilots/pilot-1/token", pilot_token)
    html = page(operator_http, "/ui/pilots/pilot-1")
    assert re.search(r'id="token">renewed 2 time\(s\), last [^;]+; expires \d{4}-', html), html


def test_the_sites_page_says_which_pilots_hung_in_a_ce_state_and_were_killed(
        db: Database, client: Api, grid: dict[str, Any], operator_http: FlaskClient) -> None:
    """Issue 34 item 4: a queue whose pilots hung in a CE state past its timeout says so,
    per state, for the last hour; another VO's pilots are not counted."""
    count_activity(db, client.settings)
    key = ("LCG.CNAF.it", "ce01-htc.cr.cnaf.infn.it", "htc_mcore")
    now = datetime.now(UTC)
    with db.factory.begin() as session:
        for i, (vo, hung_in, ago) in enumerate((
                (VO, "ACCEPTING", 60), (VO, "ACCEPTING", 120), (VO, "HELD", 600),
                (VO, "ACCEPTING", 7200), ("belle", "ACCEPTING", 60))):
            session.add(Pilot(reference=f"hung-{i}", vo=vo, site=key[0], ce=key[1],
                              queue=key[2], status="Aborted", submitted_at=now,
                              updated_at=now - timedelta(seconds=ago), hung_in=hung_in,
                              reason=f"stuck in {hung_in} for 960 s: killed"))
    html = page(operator_http, "/ui/sites")
    row = html[html.index(f'data-queue="{"/".join(key)}"'):]
    row = row[:row.index("</tr>")]
    assert dict(re.findall(r'data-stuck="(\w+)">(\d+) pilot', row)) == {
        "ACCEPTING": "2", "HELD": "1"}
    assert "for hanging in ACCEPTING past its timeout" in row


def test_the_sites_page_says_a_queue_stopped_for_failed_starts(
        db: Database, client: Api, grid: dict[str, Any], operator_http: FlaskClient) -> None:
    """Issue 34 items 3 and 6: a queue stopped because its pilots die at start counts as
    failing, says why and can be retried; its pilots that never reached the CE are
    counted."""
    count_activity(db, client.settings)
    key = ("LCG.CNAF.it", "ce01-htc.cr.cnaf.infn.it", "htc_mcore")
    html = page(operator_http, "/ui/sites")
    assert "0 with a failing director queue" in html
    now = datetime.now(UTC)
    with db.factory.begin() as session:
        record_submission_failure(session, *key, [], reason="token expired", now=now,
                                  base_backoff=0)
        state = session.get(DirectorQueue, key)
        assert state is not None
        state.failures, state.unsent_pilots = 0, 7
        state.failed_starts, state.starts_stopped_at = 3, now
        state.starts_error = "the last 3 pilots ended before they reached the matcher (last, " \
                             "arc-1: exit code 3)"
    html = page(operator_http, "/ui/sites")
    assert "1 with a failing director queue" in html
    row = html[html.index(f'data-queue="{"/".join(key)}"'):]
    row = row[:row.index("</tr>")]
    starts = re.search(r'data-failing="starts">([^<]*)<', row)
    assert starts and "the last 3 pilots ended before they reached the matcher" in \
        starts.group(1) and "exit code 3" in starts.group(1)
    assert re.search(r'data-field="unsent"[^>]*>7 pilot\(s\) never reached its CE<', row), row
    assert "Retry now" in row
    response = operator_http.post("/ui/sites/retry", data={"csrf": csrf_of(html),
                                                           "queue": "/".join(key)})
    assert response.status_code == 302
    row = page(operator_http, "/ui/sites")
    assert "0 with a failing director queue" in row


def test_the_sites_page_shows_what_the_ce_says_and_a_ce_that_starts_nothing(
        db: Database, client: Api, grid: dict[str, Any], operator_http: FlaskClient) -> None:
    """Issue 34 item 9: the CE's own running and waiting counts, when they were read, why a
    later read failed, and a CE that has held waiting jobs and run none for long."""
    count_activity(db, client.settings)
    key = ("LCG.CNAF.it", "ce01-htc.cr.cnaf.infn.it", "htc_mcore")
    now = datetime.now(UTC)
    first = now - timedelta(minutes=25)
    with db.factory.begin() as session:
        state = lock_director_queue(session, *key, now=first)
        record_ce_load(state, CELoad("htc_mcore", running=0, waiting=7, total=7,
                                     free_slots=0, max_total=40), error="", read_at=first)
    html = page(operator_http, "/ui/sites")
    row = html[html.index(f'data-queue="{"/".join(key)}"'):]
    row = row[:row.index("</tr>")]
    load = re.search(r'data-field="ce-load"[^>]*>([^<]*)<', row)
    assert load and "its CE: 0 running, 7 waiting, 0 free slot(s), 7 of at most 40" in \
        load.group(1), row
    idle = re.search(r'data-field="ce-idle">([^<]*)<', row)
    assert idle and "run none since" in idle.group(1) and "(25 min)" in idle.group(1)
    assert "data-field=\"ce-error\"" not in row

    with db.factory.begin() as session:
        state = lock_director_queue(session, *key, now=now)
        record_ce_load(state, None, error="its state could not be read: connection refused",
                       read_at=now)
    with db.factory.begin() as session:
        state = lock_director_queue(session, *key, now=now)
        # A later read finds it running: it is no longer flagged.
        record_ce_load(state, CELoad("htc_mcore", running=3, waiting=4, total=7),
                       error="", read_at=now)
    html = page(operator_http, "/ui/sites")
    row = html[html.index(f'data-queue="{"/".join(key)}"'):]
    row = row[:row.index("</tr>")]
    load = re.search(r'data-field="ce-load"[^>]*>([^<]*)<', row)
    assert load and "its CE: 3 running, 4 waiting" in load.group(1)
    assert "ce-idle" not in row and "ce-error" not in row


def test_a_failed_read_of_the_ce_is_shown_and_keeps_the_counts(
        db: Database, client: Api, grid: dict[str, Any], operator_http: FlaskClient) -> None:
    count_activity(db, client.settings)
    key = ("LCG.CNAF.it", "ce01-htc.cr.cnaf.infn.it", "htc_mcore")
    now = datetime.now(UTC)
    with db.factory.begin() as session:
        state = lock_director_queue(session, *key, now=now)
        record_ce_load(state, CELoad("htc_mcore", running=2, waiting=1, total=3), error="",
                       read_at=now - timedelta(minutes=6))
        record_ce_load(state, None, error="its state could not be read: connection refused",
                       read_at=now)
    html = page(operator_http, "/ui/sites")
    row = html[html.index(f'data-queue="{"/".join(key)}"'):]
    row = row[:row.index("</tr>")]
    assert re.search(r'data-field="ce-load"[^>]*>its CE: 2 running, 1 waiting', row), row
    error = re.search(r'data-field="ce-error">([^<]*)<', row)
    assert error and "connection refused" in error.group(1)



def test_a_ce_credential_near_its_end_is_shown_beside_its_queue_until_replaced(
        db: Database, client: Api, grid: dict[str, Any], operator_http: FlaskClient) -> None:
    count_activity(db, client.settings)
    key = ("LCG.CNAF.it", "ce01-htc.cr.cnaf.infn.it", "htc_mcore")
    warning = ("the token in /etc/gridpilot/ce.token is near its end: it expires at "
               "2026-12-06 19:00:00 UTC, 200 s of its 3600 s left, and its file has not been "
               "replaced by a newer one")
    with db.factory.begin() as session:
        record_credential_warning(lock_director_queue(session, *key, now=datetime.now(UTC)),
                                  warning)
    html = page(operator_http, "/ui/sites")
    row = html[html.index(f'data-queue="{"/".join(key)}"'):]
    row = row[:row.index("</tr>")]
    shown = re.search(r'data-field="credential-warning">([^<]*)<', row)
    assert shown and "is near its end" in shown.group(1) and "200 s of its 3600 s" in \
        shown.group(1), row
    with db.factory.begin() as session:
        record_credential_warning(lock_director_queue(session, *key, now=datetime.now(UTC)),
                                  "")
    html = page(operator_http, "/ui/sites")
    row = html[html.index(f'data-queue="{"/".join(key)}"'):]
    assert "credential-warning" not in row[:row.index("</tr>")]

def test_the_pilot_page_shows_how_it_isolates_its_payloads(
        client: Api, pilot_token: str, operator_http: FlaskClient) -> None:
    site = {"site": SITE, "ce": "ce503.cern.ch", "queue": "condor"}
    for reference, isolation in (("pilot-b", "bwrap 0.8.0"), ("pilot-n", "none")):
        client.ok("PUT", f"/api/v1/pilots/{reference}", pilot_token,
                  json_body={**site, "status": "Running", "isolation": isolation})
    client.ok("PUT", "/api/v1/pilots/pilot-o", pilot_token,
              json_body={**site, "status": "Running"})
    assert 'id="isolation">bwrap 0.8.0<' in page(operator_http, "/ui/pilots/pilot-b")
    assert re.search(r'id="isolation"><span class="bad-text">none: its payloads run bare',
                     page(operator_http, "/ui/pilots/pilot-n"))
    assert 'id="isolation">not said<' in page(operator_http, "/ui/pilots/pilot-o")


def test_a_gpu_queue_page_shows_its_gpus(client: Api, user_token: str, operator_token: str,
                                         operator_http: FlaskClient) -> None:
    client.submit_jdl(user_token, 'Executable = "x"; NumberOfGPUs = 4;')
    client.submit_jdl(user_token, 'Executable = "x";')
    queues = client.ok("GET", "/api/v1/taskqueues", operator_token)["task_queues"]
    by_gpus = {q["gpus"]: q["tq_id"] for q in queues}
    assert "<th>GPUs</th><td>4 (bucket)</td>" in page(operator_http,
                                                      f"/ui/taskqueues/{by_gpus[4]}")
    assert "<th>GPUs</th>" not in page(operator_http, f"/ui/taskqueues/{by_gpus[0]}")
