"""The data step with replicas in a REAL Rucio server (Rucio's own server package over the
local PostgreSQL, on loopback), through Rucio's client library.

The server comes from the project's ``tools/rucio-localhost``: CI starts it and exports its
address; otherwise the ``rucio`` fixture starts it. When it cannot be started the tests fail in
CI (or with GRIDPILOT_TEST_REQUIRE_SERVERS / GRIDPILOT_TEST_REQUIRE_RUCIO) and are skipped
elsewhere.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

import pytest
from flask import Flask

from optimizers.chain import ChainContext, Identity, submissions_from_text, submit
from optimizers.datalocation import catalogue_for
from optimizers.resources import parse_resources
from optimizers.ruciocatalogue import RucioCatalogue, did_of
from taskqueue.core.errors import CatalogueUnavailableError
from taskqueue.core.settings import CatalogueSettings, Settings
from taskqueue.db.models import Job
from tests.api import conftest as api_fixtures
from tests.api.helpers import Api, assert_problem
from tests.conftest import Database

#: The API tests' fixtures: the matcher app on the test's database, and a user's token.
api_settings = api_fixtures.api_settings
make_app = api_fixtures.make_app
token = api_fixtures.token
user_token = api_fixtures.user_token

ROOT = Path(__file__).resolve().parents[2]
RUCIO_LOCALHOST = ROOT / "tools" / "rucio-localhost"
ME = Identity("lhcb", "alice", "lhcb_user")
GRID = """
[JobDescription]
SE = "list"
CloseSE = "list"

[Sites."S.A.org"]
HS06 = 10.0
SE = ["GPA-DST"]
[Sites."S.A.org".CEs."ce.a.org".Queues.long]
MaxCPUTime = 2880

[Sites."S.B.org"]
HS06 = 10.0
SE = ["GPB-DST"]
CloseSE = ["GPA-DST"]
[Sites."S.B.org".CEs."ce.b.org".Queues.grid]
MaxCPUTime = 2880
"""


@dataclass(frozen=True)
class RucioServer:
    url: str
    account: str
    username: str
    password_file: Path
    #: A path of this test session's own under /lhcb/ (the server's database outlives it).
    run: str

    def settings(self, **changes: str) -> CatalogueSettings:
        base = CatalogueSettings(backend="rucio", rucio_url=self.url, rucio_account=self.account,
                                 rucio_username=self.username,
                                 rucio_password_file=str(self.password_file), rucio_timeout=10)
        return replace(base, **changes)  # type: ignore[arg-type]

    def lfn(self, name: str) -> str:
        return f"/lhcb/{self.run}/{name}"


def _required() -> bool:
    return any(os.environ.get(name) not in (None, "", "0") for name in (
        "CI", "GRIDPILOT_TEST_REQUIRE_SERVERS", "GRIDPILOT_TEST_REQUIRE_RUCIO"))


def _tool(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(RUCIO_LOCALHOST), *args], capture_output=True, text=True,
                          timeout=timeout, check=False, cwd=ROOT)


@pytest.fixture(scope="session")
def rucio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RucioServer]:
    """A running Rucio server with this session's scope, RSEs GPA-DST and GPB-DST."""
    problem = ""
    try:
        up = _tool("up", timeout=1200)
        if up.returncode != 0:
            problem = f"exit code {up.returncode}: {up.stdout}{up.stderr}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        problem = f"{type(exc).__name__}: {exc}"
    if problem:
        message = f"{RUCIO_LOCALHOST} up failed: {problem.strip()[-2000:]}"
        if _required():
            pytest.fail(message)
        pytest.skip(message)
    env = dict(re.findall(r"export (\w+)=(\S+)", _tool("env", timeout=30).stdout))
    password = tmp_path_factory.mktemp("rucio") / "password"
    password.write_text(env["GRIDPILOT_TEST_RUCIO_PASSWORD"] + "\n", encoding="utf-8")
    server = RucioServer(env["GRIDPILOT_TEST_RUCIO_URL"], env["GRIDPILOT_TEST_RUCIO_ACCOUNT"],
                         env["GRIDPILOT_TEST_RUCIO_USERNAME"], password,
                         "run" + uuid.uuid4().hex[:12])
    client = _admin(server)
    existing = {rse["rse"] for rse in client.list_rses()}
    for rse in ("GPA-DST", "GPB-DST", "GPC-TAPE"):
        if rse not in existing:
            client.add_rse(rse, deterministic=True)
            client.add_protocol(rse, {
                "scheme": "file", "hostname": "localhost", "port": 0,
                "prefix": f"/tmp/gridpilot-rucio/storage/{rse}",
                "impl": "rucio.rse.protocols.posix.Default",
                "domains": {"lan": {"read": 1, "write": 1, "delete": 1},
                            "wan": {"read": 1, "write": 1, "delete": 1,
                                    "third_party_copy_read": 1,
                                    "third_party_copy_write": 1}}})
    client.add_scope(server.account, server.run)  # DIRAC's convention: /lhcb/<scope>/...
    yield server


def _admin(server: RucioServer) -> object:
    from rucio.client import Client

    return Client(rucio_host=server.url, auth_host=server.url, account=server.account,
                  auth_type="userpass", creds={"username": server.username,
                                               "password": server.password_file.read_text()
                                               .strip()}, timeout=30)


def _register(server: RucioServer, rse: str, *names: str) -> None:
    client = _admin(server)
    client.add_replicas(rse, [{**did_of(server.lfn(name)), "bytes": 1, "adler32": "00020002"}
                              for name in names])  # type: ignore[attr-defined]


def test_the_did_of_an_lfn_follows_diracs_convention() -> None:
    assert did_of("/lhcb/data/2024/run1.dst") == {"scope": "data",
                                                  "name": "/lhcb/data/2024/run1.dst"}
    assert did_of("/lhcb") == {"scope": "lhcb", "name": "/lhcb"}


def test_locate_asks_rucio(rucio: RucioServer, db: Database) -> None:
    _register(rucio, "GPA-DST", "f1", "f2")
    _register(rucio, "GPB-DST", "f1")
    catalogue = catalogue_for(rucio.settings())
    assert isinstance(catalogue, RucioCatalogue)
    with db.factory() as s:
        found = catalogue.locate(s, "lhcb", [rucio.lfn("f1"), rucio.lfn("f2"),
                                             rucio.lfn("never")])
    assert found == {rucio.lfn("f1"): frozenset({"GPA-DST", "GPB-DST"}),
                     rucio.lfn("f2"): frozenset({"GPA-DST"})}


def test_the_chain_places_jobs_from_rucio(rucio: RucioServer, db: Database,
                                          now: datetime) -> None:
    _register(rucio, "GPA-DST", "c1")
    _register(rucio, "GPB-DST", "c2")
    _register(rucio, "GPC-TAPE", "c3")
    ctx = ChainContext(Settings(), parse_resources(GRID, "grid.toml"), now, random.Random(3),
                       RucioCatalogue(rucio.settings()))
    texts = [f'[Executable = "a"; InputData = {{"LFN:{rucio.lfn("c1")}"}};]',
             f'[Executable = "a"; InputData = {{"{rucio.lfn("c1")}", "{rucio.lfn("c2")}"}};]',
             f'[Executable = "a"; InputData = "{rucio.lfn("c3")}";]',
             f'[Executable = "a"; InputData = "{rucio.lfn("lost")}";]']
    with db.factory.begin() as s:
        result = submit(s, [sub for t in texts for sub in submissions_from_text(t, "jdl")], ME,
                        ctx)
    with db.factory() as s:
        jobs = [s.get(Job, i) for i in result.stored]
    assert [j.status for j in jobs if j] == ["Waiting", "Waiting", "Failed", "Failed"]
    assert jobs[2] is not None and "(" + rucio.lfn("c3") + " is at GPC-TAPE)" in (
        jobs[2].minor_status)
    assert jobs[3] is not None and jobs[3].minor_status == (
        f"InputData: no replica of {rucio.lfn('lost')} in Rucio at {rucio.url}")


def test_a_server_that_does_not_answer(rucio: RucioServer, db: Database) -> None:
    gone = RucioCatalogue(rucio.settings(rucio_url="http://127.0.0.1:9"))
    with db.factory() as s, pytest.raises(CatalogueUnavailableError, match="did not answer"):
        gone.locate(s, "lhcb", [rucio.lfn("f1")])


def test_refused_credentials(rucio: RucioServer, db: Database, tmp_path: Path) -> None:
    # An account of its own: Rucio's client keeps a valid token per account on disk, and uses
    # it before the password.
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-password")
    refused = RucioCatalogue(rucio.settings(rucio_password_file=str(wrong),
                                            rucio_account="nobody" + uuid.uuid4().hex[:8]))
    with db.factory() as s, pytest.raises(CatalogueUnavailableError, match="Rucio at"):
        refused.locate(s, "lhcb", [rucio.lfn("f1")])


def test_a_submission_while_rucio_is_away_is_503_and_stores_nothing(
        rucio: RucioServer, make_app: Callable[[Settings], Flask], api_settings: Settings,
        user_token: str) -> None:
    settings = replace(api_settings, catalogue=rucio.settings(rucio_url="http://127.0.0.1:9"))
    client = Api(make_app(settings).test_client(), settings, "")
    response = client.call("POST", "/api/v1/jobs", user_token,
                           text=f'Executable = "a"; InputData = "{rucio.lfn("f1")}";')
    assert_problem(response, 503, "did not answer")
    assert client.ok("GET", "/api/v1/jobs", user_token)["jobs"] == []
    # A job without input data does not need the catalogue.
    client.ok("POST", "/api/v1/jobs", user_token, status=201, text='Executable = "a";')
