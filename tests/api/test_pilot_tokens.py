"""POST /api/v1/pilots/<reference>/token: a pilot's successor token, through the Flask test
client on every database: the same claims bound to the pilot, as long-lived as the one it
replaces, recorded on the pilot's record; none for a killed, ended or unknown pilot."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from functools import partial

import jwt
from flask import Flask

from matcher.runtime import runtime_of
from taskqueue.pilots.pilotlogs import record_ce_state
from taskqueue.pilots.records import record_new_pilots, record_submission
from tests.api.conftest import SECRET, TokenMaker
from tests.api.helpers import PILOT_REF, SITE, Api, assert_problem

CE, QUEUE = "ce503.cern.ch", "condor"


def _submitted(app: Flask, reference: str = PILOT_REF) -> None:
    """A pilot the site director submitted (its record exists, Submitted)."""
    runtime = runtime_of(app)
    now = datetime.now(UTC)
    runtime.transaction(partial(record_new_pilots, vo="lhcb", site=SITE, ce=CE, queue=QUEUE,
                                executor="local", references=[reference], now=now))
    runtime.transaction(partial(record_submission, reference=reference, native_id="7",
                                now=now))


def _claims(token: str) -> dict[str, object]:
    claims: dict[str, object] = jwt.decode(token, SECRET, algorithms=["HS256"],
                                           issuer="gridpilot")
    return claims


def test_a_pilot_gets_a_successor_with_the_same_claims_and_lifetime(
        client: Api, app: Flask, token: TokenMaker, operator_token: str) -> None:
    _submitted(app)
    old = token("director", "pilot", group="lhcb_pilot", site=SITE, pilot=PILOT_REF,
                lifetime=45)
    answer = client.ok("POST", f"/api/v1/pilots/{PILOT_REF}/token", old)
    new = _claims(answer["token"])
    assert {k: new[k] for k in ("sub", "role", "vo", "group", "site", "pilot")} == {
        "sub": "director", "role": "pilot", "vo": "lhcb", "group": "lhcb_pilot",
        "site": SITE, "pilot": PILOT_REF}
    assert new["exp"] - new["iat"] == 45  # type: ignore[operator]
    assert abs(new["iat"] - time.time()) < 60  # type: ignore[operator]
    assert answer["renewals"] == 1 and answer["expires_at"]
    # The successor renews in turn, and the record counts both.
    again = client.ok("POST", f"/api/v1/pilots/{PILOT_REF}/token", answer["token"])
    assert again["renewals"] == 2
    record = client.ok("GET", f"/api/v1/pilots/{PILOT_REF}", operator_token)
    assert record["token_renewals"] == 2
    assert record["token_renewed_at"] and record["token_expires_at"] == again["expires_at"]


def test_a_long_token_is_renewed_no_longer_than_the_configured_lifetime(
        client: Api, app: Flask, token: TokenMaker) -> None:
    _submitted(app)
    limit = runtime_of(app).settings.agents.pilot_token_lifetime
    old = token("director", "pilot", group="lhcb_pilot", site=SITE, pilot=PILOT_REF,
                lifetime=limit * 10)
    new = _claims(client.ok("POST", f"/api/v1/pilots/{PILOT_REF}/token", old)["token"])
    assert new["exp"] - new["iat"] == limit  # type: ignore[operator]


def test_a_token_for_any_reference_is_bound_to_the_pilot_it_renews_for(
        client: Api, app: Flask, site_pilot_token: str) -> None:
    _submitted(app)
    new = _claims(client.ok("POST", f"/api/v1/pilots/{PILOT_REF}/token",
                            site_pilot_token)["token"])
    assert new["pilot"] == PILOT_REF and new["site"] == SITE


def test_a_killed_pilot_gets_no_new_token(client: Api, app: Flask, own_pilot_token: str,
                                          operator_token: str) -> None:
    _submitted(app)
    client.ok("POST", f"/api/v1/pilots/{PILOT_REF}/kill", operator_token, status=202,
              json_body={})
    assert_problem(client.call("POST", f"/api/v1/pilots/{PILOT_REF}/token", own_pilot_token),
                   403, "killed", "olga")
    record = client.ok("GET", f"/api/v1/pilots/{PILOT_REF}", operator_token)
    assert record["token_renewals"] == 0


def test_an_ended_pilot_gets_no_new_token(client: Api, app: Flask,
                                          own_pilot_token: str) -> None:
    _submitted(app)
    runtime_of(app).transaction(partial(record_ce_state, vo="lhcb", reference=PILOT_REF,
                                        status="Done", reason="", exit_code=0,
                                        now=datetime.now(UTC)))
    assert_problem(client.call("POST", f"/api/v1/pilots/{PILOT_REF}/token", own_pilot_token),
                   403, "ended", "Done")


def test_an_unknown_pilot_gets_no_new_token(client: Api, own_pilot_token: str) -> None:
    assert_problem(client.call("POST", f"/api/v1/pilots/{PILOT_REF}/token", own_pilot_token),
                   403, "not known")


def test_a_pilot_may_not_renew_for_another(client: Api, app: Flask,
                                           own_pilot_token: str) -> None:
    _submitted(app, "pilot-2")
    assert_problem(client.call("POST", "/api/v1/pilots/pilot-2/token", own_pilot_token),
                   403, "pilot-1 only")


def test_users_operators_and_expired_tokens_get_none(
        client: Api, app: Flask, user_token: str, operator_token: str,
        token: TokenMaker) -> None:
    _submitted(app)
    for who in (user_token, operator_token):
        assert_problem(client.call("POST", f"/api/v1/pilots/{PILOT_REF}/token", who), 403)
    expired = token("director", "pilot", group="lhcb_pilot", pilot=PILOT_REF, lifetime=1)
    time.sleep(1.1)
    assert_problem(client.call("POST", f"/api/v1/pilots/{PILOT_REF}/token", expired), 401,
                   "expired")
