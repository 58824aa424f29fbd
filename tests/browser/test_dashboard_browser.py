"""The dashboard in a real browser: headless Chromium (Debian's chromium and chromedriver,
driven by selenium) against a real matcher (``gridpilot serve`` on loopback) over a database
filled through the HTTP API and counted by the real ``gridpilot agents activity --once``.

Every page is opened, its key numbers are compared with the database's, an operator kills a
job through the confirmation page, and each page is saved as a screenshot at a laptop's width
(1440 x 900) in ``work/artifacts/dashboard/<backend>/`` (or ``$GRIDPILOT_TEST_ARTIFACTS``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from sqlalchemy import func, select

from gridpilot.devserver import matcher_server
from matcher.auth import issue_token
from taskqueue.db.models import Job, Pilot, TaskQueueJob
from taskqueue.matching.limits import RUNNING_STATES
from tests.conftest import Database

ROOT = Path(__file__).resolve().parents[2]
SECRET = "browser-tests-signing-secret-0123456789"
RESOURCES = ROOT / "conf" / "resources.toml"
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
WIDTH, HEIGHT = 1440, 900

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.support import expected_conditions  # noqa: E402
from selenium.webdriver.support.wait import WebDriverWait  # noqa: E402

#: Queues of conf/resources.toml the fake pilots below say they run on.
CERN = ("LCG.CERN.cern", "ce503.cern.ch", "condor")
CNAF = ("LCG.CNAF.it", "ce01-htc.cr.cnaf.infn.it", "htc_mcore")
RAL = ("LCG.RAL.uk", "arc-ce01.gridpp.rl.ac.uk", "grid")


def _browser_present() -> bool:
    return Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()


@pytest.fixture()
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    if not _browser_present():
        message = ("Debian's chromium and chromium-driver are not installed "
                   "(apt-get install -y chromium chromium-driver; .ci/run does it)")
        if os.environ.get("GRIDPILOT_TEST_REQUIRE_SERVERS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    options = Options()
    options.binary_location = CHROMIUM
    # As root, without a display, and with no internet: nothing may phone home.
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic",
                 "--disable-default-apps", "--hide-scrollbars",
                 f"--window-size={WIDTH},{HEIGHT}", f"--user-data-dir={tmp_path / 'chrome'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture()
def artifacts(database: Database) -> Path:
    base = Path(os.environ.get("GRIDPILOT_TEST_ARTIFACTS") or ROOT / "work" / "artifacts")
    folder = base / "dashboard" / database.backend
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


@pytest.fixture()
def matcher(db: Database, tmp_path: Path) -> Iterator[str]:
    with matcher_server(db.url, SECRET, RESOURCES, tmp_path, workers=2) as base:
        yield base


def _token(subject: str, role: str, group: str, **extra: Any) -> str:
    return issue_token(SECRET, subject=subject, role=role, vo="lhcb", group=group,
                       lifetime=3600, **extra)


def populate(base: str) -> dict[str, Any]:
    """Users submit; pilots at three queues match, run and end jobs; an operator bans a site
    and sets a limit: all through the HTTP API."""
    http = requests.Session()

    def call(method: str, path: str, token: str, **kwargs: Any) -> Any:
        headers = {"Authorization": f"Bearer {token}", **kwargs.pop("headers", {})}
        response = http.request(method, f"{base}{path}", timeout=60, headers=headers,
                                **kwargs)
        assert response.status_code < 300, f"{method} {path}: {response.text}"
        return response.json()

    alice = _token("alice", "user", "lhcb_user")
    prod = _token("lhcbprod", "user", "lhcb_prod")
    operator = _token("olga", "operator", "lhcb_admin")
    pilot = _token("factory", "pilot", "lhcb_pilot")
    submit = "/api/v1/jobs"
    jdl = '[ Executable = "/bin/sh"; Arguments = "-c true"; Parameters = 40; CPUTime = 3600 ]'
    text = {"Content-Type": "text/plain"}
    call("POST", submit, alice, data=jdl, headers=text)
    mc = ('[ Executable = "/bin/sh"; JobType = "MCSimulation"; NumberOfProcessors = 8; '
          'Tags = {"MultiProcessor"}; Parameters = 25; CPUTime = 80000 ]')
    call("POST", submit, prod, data=mc, headers=text)
    ended: dict[str, int] = {"Done": 0, "Failed": 0}
    for n, (site, ce, queue) in enumerate((CERN, CNAF, RAL, CERN)):
        reference = f"pilot-{n}"
        call("PUT", f"/api/v1/pilots/{reference}", pilot,
             json={"site": site, "ce": ce, "queue": queue, "status": "Running"})
        resource = {"vo": "lhcb", "site": site, "ce": ce, "pilot_reference": reference,
                    "cpu_time": 400000, "processors": 8 if queue == "htc_mcore" else 1,
                    "tags": ["MultiProcessor"] if queue == "htc_mcore" else []}
        jobs = call("POST", "/api/v1/pilots/match", pilot,
                    json={"resource": resource, "count": 6})["jobs"]
        for i, job in enumerate(jobs):
            status = ("Running" if i < 2 else "Failed" if i == 5 else "Done")
            body: dict[str, Any] = {"pilot_reference": reference, "status": status}
            if status != "Running":
                body["exit_code"] = 0 if status == "Done" else 2
                ended[status] += 1
            if status == "Failed":
                body["minor_status"] = "Payload exited with code 2"
            call("POST", f"/api/v1/pilots/jobs/{job['job_id']}/status", pilot, json=body)
    call("PUT", "/api/v1/sitemask/LCG.RAL.uk", operator, json={"reason": "CE in downtime"})
    call("POST", "/api/v1/limits", operator,
         json={"site": "LCG.CERN.cern", "attribute": "job_type", "value": "User",
               "max_running": 10})
    return {"operator": operator, "alice": alice, **ended}


def count_activity(db: Database, tmp_path: Path) -> None:
    """The real ``gridpilot agents activity --once``."""
    env = {**os.environ, "GRIDPILOT_DATABASE_URL": db.url, "GRIDPILOT_AUTH_SECRET": SECRET,
           "GRIDPILOT_RESOURCES_FILE": str(RESOURCES)}
    out = subprocess.run([sys.executable, "-m", "gridpilot", "agents", "activity", "--once"],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "activity:" in out.stdout and "counts in the snapshot" in out.stdout


def sign_in(driver: WebDriver, base: str, token: str, folder: Path | None = None) -> None:
    driver.get(f"{base}/ui/")
    assert "/ui/login" in driver.current_url
    if folder is not None:
        shot(driver, folder, "login")
    driver.find_element(By.ID, "token").send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    WebDriverWait(driver, 60).until(lambda d: "/ui/login" not in d.current_url)


def number(text: str) -> int:
    return int(re.sub(r"[^\d]", "", text) or "0")


def shot(driver: WebDriver, folder: Path, name: str) -> None:
    """What a person sees first (a 1440 x 900 viewport), and the whole page beside it."""
    viewport = {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False}
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", viewport)
    assert driver.save_screenshot(str(folder / f"{name}.png"))
    full = driver.execute_script("return document.documentElement.scrollHeight")
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {**viewport, "height": max(HEIGHT, int(full))})
    assert driver.save_screenshot(str(folder / f"{name}-full.png"))
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", viewport)


def test_every_page_in_a_browser(db: Database, matcher: str, browser: WebDriver,
                                 artifacts: Path, tmp_path: Path) -> None:
    grid = populate(matcher)
    count_activity(db, tmp_path)
    with db.factory() as session:
        by_status = {s: n for s, n in session.execute(
            select(Job.status, func.count()).group_by(Job.status))}
        waiting = session.scalar(select(func.count()).select_from(TaskQueueJob))
        running_cnaf = session.scalar(
            select(func.count()).select_from(Job).join(
                Pilot, Pilot.reference == Job.pilot_reference)
            .where(Job.status.in_(RUNNING_STATES), Pilot.site == CNAF[0],
                   Pilot.queue == CNAF[2]))
        cern_user = session.scalar(select(func.count()).select_from(Job).where(
            Job.status.in_(RUNNING_STATES), Job.site == CERN[0], Job.job_type == "User"))
        newest = session.scalar(select(func.max(Job.id)))
        victim = session.scalar(select(func.min(TaskQueueJob.job_id)))

    sign_in(browser, matcher, grid["operator"], artifacts)
    assert browser.current_url.endswith("/ui/")
    shot(browser, artifacts, "overview")
    tiles = {t.get_attribute("data-status"): number(t.find_element(By.CLASS_NAME, "value").text)
             for t in browser.find_elements(By.CSS_SELECTOR, ".tiles .tile")}
    assert {s: n for s, n in tiles.items() if n} == by_status
    assert number(browser.find_element(By.ID, "failed-hour").text) == grid["Failed"]
    assert number(browser.find_element(By.ID, "done-hour").text) == grid["Done"]
    assert "Payload exited with code 2" in browser.find_element(By.ID, "failures").text
    assert "LCG.RAL.uk" in browser.find_element(By.ID, "bans").text
    assert len(browser.find_elements(By.CSS_SELECTOR, "svg.chart polyline, svg.chart circle")
               ) >= 4

    browser.get(f"{matcher}/ui/sites")
    shot(browser, artifacts, "sites")
    row = browser.find_element(By.CSS_SELECTOR, f'tr[data-queue="{"/".join(CNAF)}"]')
    assert number(row.find_element(By.CSS_SELECTOR, '[data-field="running"]').text) == \
        running_cnaf
    ral = browser.find_element(By.ID, "site-LCG.RAL.uk")
    assert "banned" in ral.get_attribute("class")
    assert cern_user == 4  # two pilots there, two running jobs each
    assert f"{cern_user} / 10 running" in browser.find_element(By.ID, "site-LCG.CERN.cern").text

    browser.get(f"{matcher}/ui/taskqueues")
    shot(browser, artifacts, "taskqueues")
    shown = sum(number(c.text) for c in browser.find_elements(
        By.CSS_SELECTOR, '#taskqueues td[data-field="waiting"]'))
    assert shown == waiting
    browser.find_element(By.CSS_SELECTOR, "#taskqueues tbody tr a").click()
    shot(browser, artifacts, "taskqueue")
    assert "Next jobs" in browser.page_source

    browser.get(f"{matcher}/ui/jobs")
    shot(browser, artifacts, "jobs")
    first = browser.find_element(By.CSS_SELECTOR, "#jobs tbody tr")
    assert first.get_attribute("data-job") == str(newest)
    browser.find_element(By.NAME, "status").send_keys("Failed")
    browser.find_element(By.CSS_SELECTOR, "#job-search button").click()
    # The filtered page replaces this one: wait for it (under load it takes a while).
    WebDriverWait(browser, 60).until(lambda d: "status=Failed" in d.current_url)
    WebDriverWait(browser, 60).until(lambda d: d.execute_script(
        "return document.readyState") == "complete")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#jobs tbody tr[data-job]")) == \
        by_status["Failed"]

    browser.get(f"{matcher}/ui/pilots")
    shot(browser, artifacts, "pilots")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#pilots tr[data-pilot]")) == 4
    browser.find_element(By.CSS_SELECTOR, '#pilots tr[data-pilot="pilot-1"] a').click()
    shot(browser, artifacts, "pilot")
    assert browser.find_element(By.ID, "pilot-status").text == "Running"

    # The operator kills a waiting job: its page, the confirmation, the result.
    browser.get(f"{matcher}/ui/jobs/{victim}?explain={'/'.join(CERN)}")
    shot(browser, artifacts, "job")
    assert "It can run on" in browser.find_element(By.ID, "explain-verdict").text
    browser.find_element(By.ID, "kill").click()
    shot(browser, artifacts, "confirm-kill")
    browser.find_element(By.ID, "reason").send_keys("wrong input file")
    browser.find_element(By.ID, "confirm").click()
    # The form's answer is a redirect to the job's page: wait for it to load.
    status = WebDriverWait(browser, 60).until(
        expected_conditions.presence_of_element_located((By.ID, "job-status")))
    shot(browser, artifacts, "job-killed")
    assert status.text == "Killed"
    assert "Killed by operator:olga: wrong input file" in browser.find_element(
        By.ID, "history").text
    with db.factory() as session:
        assert session.get(Job, victim).status == "Killed"  # type: ignore[union-attr]

    # A user signs in to their own jobs only.
    browser.delete_all_cookies()
    sign_in(browser, matcher, grid["alice"])
    assert browser.current_url.endswith("/ui/jobs")
    shot(browser, artifacts, "user-jobs")
    owners = {cell.text for cell in browser.find_elements(
        By.CSS_SELECTOR, '#jobs tbody tr[data-job] td[data-field="owner"]')}
    assert owners == {"alice"}
