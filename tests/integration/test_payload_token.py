"""A payload's own token through a real matcher and pilot: the payload finds in
``$BEARER_TOKEN_FILE`` a token of its job's owner, with storage.read in its scope, that
verifies against the key the service publishes; the pilot replaces it before it expires while
the payload runs (scaled from the issue: a 6 s lifetime, read at 0 s and at 8 s). The first
token comes with the match answer: on every database backend, the matcher serves no token
request for a payload that only reads its first token."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import jwt
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from gridpilot import schema
from gridpilot.devserver import matcher_server
from taskqueue.db.database import make_engine
from taskqueue.tokens import issue_token
from tests.conftest import Database
from tests.integration.test_pilot import ROOT, SECRET, Grid, _finish

#: Copies the token file at start and 8 s later, and notes where the file was.
READER = '''\
import os, shutil, sys, time
path = os.environ["BEARER_TOKEN_FILE"]
out = sys.argv[1]
with open(os.path.join(out, "where"), "w") as f:
    f.write(path + " " + oct(os.stat(path).st_mode & 0o777))
shutil.copy(path, os.path.join(out, "first"))
time.sleep(8)
shutil.copy(path, os.path.join(out, "second"))
with open(os.path.join(out, "read_at"), "w") as f:
    f.write(str(time.time()))
'''


@pytest.fixture()
def grid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Grid]:
    monkeypatch.setenv("GRIDPILOT_TOKENS_PAYLOAD_LIFETIME", "6")
    url = f"sqlite:///{tmp_path / 'gridpilot.db'}"
    engine = make_engine(url)
    schema.upgrade(engine)
    engine.dispose()
    with matcher_server(url, SECRET, ROOT / "conf" / "resources.toml", tmp_path) as base:
        yield Grid(base, tmp_path)


def _run_reader(grid: Grid, tmp_path: Path, reader: str, attributes: str = ""
                ) -> tuple[int, Path]:
    """Submit a job that runs ``reader`` (a script given its output folder; ``attributes``:
    more JDL attributes), run it to Done on one pilot; its id and output folder."""
    script = tmp_path / "reader.py"
    script.write_text(reader, encoding="utf-8")
    out = tmp_path / "out"
    out.mkdir()
    jdl = (f'[ Executable = "{sys.executable}"; Arguments = "{script} {out}"; {attributes}'
           'CPUTime = 600 ]')
    response = grid.user.post(f"{grid.base}/api/v1/jobs", data=jdl.encode(), timeout=30,
                              headers={"Content-Type": "text/plain"})
    assert response.status_code == 201, response.text
    [job_id] = response.json()["job_ids"]
    code, log = _finish(grid.pilot("--cores", "1", "--idle-timeout", "3"), timeout=120)
    assert code == 0, log
    assert grid.job(job_id)["status"] == "Done", log
    return job_id, out


def test_a_payload_reads_its_owners_token_and_finds_it_renewed(grid: Grid,
                                                              tmp_path: Path) -> None:
    job_id, out = _run_reader(grid, tmp_path, READER)
    where, mode = (out / "where").read_text().split()
    assert where == str(grid.tmp / "work" / f"job_{job_id}" / ".bearer_token")
    assert mode == "0o600"
    config = requests.get(f"{grid.base}/.well-known/openid-configuration", timeout=30).json()
    keys = {k["kid"]: k for k in requests.get(config["jwks_uri"], timeout=30).json()["keys"]}
    claims = []
    for name in ("first", "second"):
        token = (out / name).read_text().strip()
        key = jwt.PyJWK(keys[jwt.get_unverified_header(token)["kid"]])
        # Verified as the payload read it (the second was unexpired then).
        claims.append(jwt.decode(token, key.key, algorithms=["ES256"], issuer=config["issuer"],
                                 audience="https://wlcg.cern.ch/jwt/v1/any",
                                 options={"verify_exp": False}))
    first, second = claims
    assert first["sub"] == second["sub"] == "alice"
    assert "storage.read:/" in first["scope"].split()
    assert first["job_id"] == job_id and first["exp"] - first["iat"] == 6
    assert second["exp"] > first["exp"] and second["jti"] != first["jti"]
    # Read 8 s after the first, past the first's end: a later token, valid when read.
    read_at = float((out / "read_at").read_text())
    assert read_at > first["exp"]
    assert second["iat"] <= read_at < second["exp"]


#: Copies the token file at start.
FIRST_READER = '''\
import os, shutil, sys
shutil.copy(os.environ["BEARER_TOKEN_FILE"], os.path.join(sys.argv[1], "first"))
'''
TOKEN_ENDPOINT = "/api/v1/pilots/jobs/<int:job_id>/token"


@pytest.fixture()
def backend_grid(db: Database, tmp_path: Path) -> Iterator[Grid]:
    """A matcher on each database backend (on PostgreSQL and MariaDB, their claim
    function)."""
    with matcher_server(db.url, SECRET, ROOT / "conf" / "resources.toml", tmp_path) as base:
        yield Grid(base, tmp_path)


def _requests_served(grid: Grid) -> dict[str, float]:
    """The matcher's HTTP requests by endpoint, from its /metrics."""
    operator = issue_token(SECRET, subject="olga", role="operator", vo="lhcb",
                           group="lhcb_admin", lifetime=3600)
    response = requests.get(f"{grid.base}/metrics", timeout=30,
                            headers={"Authorization": f"Bearer {operator}"})
    assert response.status_code == 200, response.text
    served: dict[str, float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name == "gridpilot_http_requests_total":
                endpoint = sample.labels["endpoint"]
                served[endpoint] = served.get(endpoint, 0) + sample.value
    return served


def test_a_payload_finds_its_first_token_without_a_token_request(backend_grid: Grid,
                                                                tmp_path: Path) -> None:
    grid = backend_grid
    job_id, out = _run_reader(grid, tmp_path, FIRST_READER,
                              'TokenScopes = {"storage.read:/lhcb/data"}; ')
    token = (out / "first").read_text().strip()
    config = requests.get(f"{grid.base}/.well-known/openid-configuration", timeout=30).json()
    keys = {k["kid"]: k for k in requests.get(config["jwks_uri"], timeout=30).json()["keys"]}
    key = jwt.PyJWK(keys[jwt.get_unverified_header(token)["kid"]])
    claims = jwt.decode(token, key.key, algorithms=["ES256"], issuer=config["issuer"],
                        audience="https://wlcg.cern.ch/jwt/v1/any")
    assert claims["sub"] == "alice" and claims["job_id"] == job_id
    assert claims["scope"] == "storage.read:/lhcb/data"
    served = _requests_served(grid)
    assert served.get("/api/v1/pilots/match", 0) >= 1, served
    assert served.get(TOKEN_ENDPOINT, 0) == 0, served
