"""Payloads' tokens through the Flask test client on every database: the issuer's published
configuration and keys, a token for a pilot's job that verifies against them with the WLCG
claims, narrowed scopes, refusals, and key rotation with tokens in flight."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import jwt
from flask import Flask
from sqlalchemy import select

from taskqueue.core.settings import Settings
from taskqueue.db.models import SigningKey, job_payloads_table
from taskqueue.signingkeys import _fernet
from tests.api.conftest import SECRET
from tests.api.helpers import PILOT_REF, Api, assert_problem
from tests.conftest import Database

TOKEN = "/api/v1/pilots/jobs/{}/token"


def _matched(client: Api, user_token: str, pilot_token: str, jdl: str | None = None) -> int:
    [job_id] = client.submit_jdl(user_token, *([jdl] if jdl else []))
    [job] = client.match(pilot_token, pilot_reference=PILOT_REF)["jobs"]
    assert job["job_id"] == job_id
    return job_id


def _ask(client: Api, token: str, job_id: int, reference: str = PILOT_REF) -> Any:
    return client.call("POST", TOKEN.format(job_id), token,
                       json_body={"pilot_reference": reference})


def _verified(client: Api, token: str) -> dict[str, Any]:
    """The token's claims, verified with the key the service publishes for its kid."""
    config = client.ok("GET", "/.well-known/openid-configuration", None)
    path = config["jwks_uri"].removeprefix(config["issuer"])
    keys = {k["kid"]: k for k in client.ok("GET", path, None)["keys"]}
    kid = jwt.get_unverified_header(token)["kid"]
    key = jwt.PyJWK(keys[kid])
    claims: dict[str, Any] = jwt.decode(token, key.key, algorithms=["ES256"],
                                        audience="https://wlcg.cern.ch/jwt/v1/any",
                                        issuer=config["issuer"])
    return claims


def test_the_issuer_publishes_its_configuration_and_keys(client: Api) -> None:
    config = client.ok("GET", "/.well-known/openid-configuration", None)
    assert config["issuer"] == client.settings.matcher.url.rstrip("/")
    assert config["jwks_uri"] == config["issuer"] + "/.well-known/jwks.json"
    assert config["id_token_signing_alg_values_supported"] == ["ES256"]
    assert client.ok("GET", "/.well-known/jwks.json", None) == {"keys": []}


def test_a_payload_token_is_its_owners_and_verifies_with_the_published_key(
        client: Api, user_token: str, pilot_token: str) -> None:
    job_id = _matched(client, user_token, pilot_token)
    answer = client.ok("POST", TOKEN.format(job_id), pilot_token,
                       json_body={"pilot_reference": PILOT_REF})
    claims = _verified(client, answer["token"])
    assert claims["sub"] == "alice" and claims["job_id"] == job_id
    assert claims["scope"].split() == ["storage.read:/", "storage.create:/lhcb/user/alice"]
    assert answer["scope"] == claims["scope"]
    assert claims["wlcg.ver"] == "1.0" and claims["wlcg.groups"] == ["/lhcb"]
    assert claims["exp"] - claims["iat"] == client.settings.tokens.payload_lifetime
    again = _verified(client, client.ok("POST", TOKEN.format(job_id), pilot_token,
                                        json_body={"pilot_reference": PILOT_REF})["token"])
    assert again["jti"] != claims["jti"]
    # Nothing of the signing secret's HS256 kind: the service's own verifier refuses it.
    assert_problem(client.call("GET", "/api/v1/jobs", answer["token"]), 401)


def test_a_job_narrows_its_scopes(client: Api, user_token: str, pilot_token: str) -> None:
    job_id = _matched(client, user_token, pilot_token,
                      '[ Executable = "/bin/true"; TokenScopes = {"storage.read:/lhcb/data"}; ]')
    token = _ask(client, pilot_token, job_id).get_json()["token"]
    assert _verified(client, token)["scope"] == "storage.read:/lhcb/data"


def test_a_job_cannot_widen_its_scopes(client: Api, user_token: str) -> None:
    for scope in ("storage.modify:/", "storage.create:/lhcb/user/bob", "storage.read",
                  "storage.create:/lhcb/user/alice/../bob"):
        assert_problem(client.call(
            "POST", "/api/v1/jobs", user_token,
            text=f'[ Executable = "/bin/true"; TokenScopes = {{"{scope}"}}; ]'), 422,
            "TokenScopes", "never widen")
    assert client.ok("GET", "/api/v1/jobs", user_token)["jobs"] == []


def test_no_token_for_another_pilots_job_nor_a_waiting_one(
        client: Api, user_token: str, pilot_token: str) -> None:
    job_id = _matched(client, user_token, pilot_token)
    assert_problem(_ask(client, pilot_token, job_id, "pilot-2"), 403, "not pilot pilot-2")
    [waiting] = client.submit_jdl(user_token)
    assert_problem(_ask(client, pilot_token, waiting), 403)
    assert_problem(_ask(client, pilot_token, 987654), 404)


def test_no_token_for_an_ended_job_nor_a_killed_pilot(
        client: Api, user_token: str, pilot_token: str, operator_token: str) -> None:
    job_id = _matched(client, user_token, pilot_token)
    assert client.report(pilot_token, job_id, "Done", exit_code=0).status_code == 200
    assert_problem(_ask(client, pilot_token, job_id), 409, "Done")
    other = _matched(client, user_token, pilot_token)
    client.ok("PUT", f"/api/v1/pilots/{PILOT_REF}", pilot_token,
              json_body={"site": "LCG.CERN.cern", "ce": "ce503.cern.ch", "queue": "condor",
                         "status": "Running"})
    client.ok("POST", f"/api/v1/pilots/{PILOT_REF}/kill", operator_token, status=202,
              json_body={})
    assert_problem(_ask(client, pilot_token, other), 403, "killed")


def test_users_and_operators_get_no_payload_token(
        client: Api, user_token: str, pilot_token: str, operator_token: str) -> None:
    job_id = _matched(client, user_token, pilot_token)
    for token in (user_token, operator_token):
        assert_problem(_ask(client, token, job_id), 403)


def test_a_service_without_payload_tokens_says_so(
        make_app: Callable[[Settings], Flask], api_settings: Settings, user_token: str,
        pilot_token: str) -> None:
    settings = replace(api_settings, tokens=replace(api_settings.tokens, payload_tokens=False))
    api = Api(make_app(settings).test_client(), settings, SECRET)
    job_id = _matched(api, user_token, pilot_token)
    assert_problem(_ask(api, pilot_token, job_id), 404, "payload_tokens")


def test_a_rotated_key_stays_published_while_its_tokens_live(
        make_app: Callable[[Settings], Flask], api_settings: Settings, user_token: str,
        pilot_token: str) -> None:
    settings = replace(api_settings, tokens=replace(api_settings.tokens, key_rotation=1))
    api = Api(make_app(settings).test_client(), settings, SECRET)
    job_id = _matched(api, user_token, pilot_token)
    first = _ask(api, pilot_token, job_id).get_json()["token"]
    time.sleep(1.1)
    second = _ask(api, pilot_token, job_id).get_json()["token"]
    kids = [jwt.get_unverified_header(t)["kid"] for t in (first, second)]
    assert kids[0] != kids[1]
    published = [k["kid"] for k in api.ok("GET", "/.well-known/jwks.json", None)["keys"]]
    assert published == [kids[1], kids[0]]
    assert _verified(api, first)["job_id"] == _verified(api, second)["job_id"] == job_id


def _first_token(job: dict[str, Any]) -> dict[str, Any]:
    token: dict[str, Any] = job["token"]
    assert set(token) == {"token", "expires_at", "scope"}
    return token


def test_the_match_answer_carries_each_payloads_first_token(
        client: Api, user_token: str, pilot_token: str) -> None:
    plain, narrow = (client.submit_jdl(user_token, jdl)[0] for jdl in (
        '[ Executable = "/bin/true"; ]',
        '[ Executable = "/bin/true"; TokenScopes = {"storage.read:/lhcb/data"}; ]'))
    jobs = client.match(pilot_token, count=2, pilot_reference=PILOT_REF)["jobs"]
    assert [j["job_id"] for j in jobs] == [plain, narrow]
    scopes = []
    for job in jobs:
        given = _first_token(job)
        claims = _verified(client, given["token"])
        assert claims["sub"] == "alice" and claims["job_id"] == job["job_id"]
        assert claims["wlcg.groups"] == ["/lhcb"]
        assert given["scope"] == claims["scope"]
        assert claims["exp"] - claims["iat"] == client.settings.tokens.payload_lifetime
        scopes.append(claims["scope"])
    assert scopes == ["storage.read:/ storage.create:/lhcb/user/alice",
                      "storage.read:/lhcb/data"]
    # The endpoint still renews it, with the same scopes.
    again = _ask(client, pilot_token, narrow).get_json()
    assert again["scope"] == "storage.read:/lhcb/data"


def test_no_token_in_the_answer_of_a_service_without_payload_tokens(
        make_app: Callable[[Settings], Flask], api_settings: Settings, user_token: str,
        pilot_token: str) -> None:
    settings = replace(api_settings, tokens=replace(api_settings.tokens, payload_tokens=False))
    api = Api(make_app(settings).test_client(), settings, SECRET)
    api.submit_jdl(user_token)
    [job] = api.match(pilot_token, pilot_reference=PILOT_REF)["jobs"]
    assert "token" not in job
    assert api.ok("GET", "/.well-known/jwks.json", None) == {"keys": []}


def test_a_payload_stored_without_its_asked_scopes_gets_them_from_its_description(
        client: Api, db: Database, user_token: str, pilot_token: str) -> None:
    """A job whose payload was stored before the asked scopes were stored with it: its
    description says them."""
    [job_id] = client.submit_jdl(
        user_token, '[ Executable = "/bin/true"; TokenScopes = {"storage.read:/lhcb/data"}; ]')
    table = job_payloads_table
    with db.factory.begin() as s:
        stored = json.loads(s.execute(select(table.c.payload).where(
            table.c.job_id == job_id)).scalar_one())
        assert stored.pop("token_scopes") == ["storage.read:/lhcb/data"]
        s.execute(table.update().where(table.c.job_id == job_id).values(
            payload=json.dumps(stored, separators=(",", ":"))))
    [job] = client.match(pilot_token, pilot_reference=PILOT_REF)["jobs"]
    assert "token_scopes" not in job
    assert _verified(client, _first_token(job)["token"])["scope"] == "storage.read:/lhcb/data"


def test_a_token_that_cannot_be_issued_does_not_lose_the_job(
        client: Api, db: Database, user_token: str, pilot_token: str) -> None:
    """The key that signs is unusable (its stored private half decrypts to no key): the job
    is handed out without a token, and the pilot asks the endpoint as before."""
    with db.factory.begin() as s:
        s.add(SigningKey(kid="unusable", algorithm="ES256", public_jwk="{}",
                         private_key=_fernet(SECRET).encrypt(b"no key").decode("ascii"),
                         created_at=datetime.now(UTC)))
    [job_id] = client.submit_jdl(user_token)
    [job] = client.match(pilot_token, pilot_reference=PILOT_REF)["jobs"]
    assert job["job_id"] == job_id and "token" not in job
    assert client.job(user_token, job_id)["status"] == "Matched"
