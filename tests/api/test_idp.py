"""Tokens of a VO's identity provider: a real JWKS served over HTTP on loopback, keys made here
(RSA and EC), real signatures; rotation, removed keys, wrong issuers and audiences, expiry,
algorithm confusion, scopes and groups; the dashboard's sign-in with such a token."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from flask import Flask
from flask.testing import FlaskClient

from matcher.idp import IdentityProviders
from matcher.runtime import runtime_of
from taskqueue.core.errors import ConfigurationError
from taskqueue.core.settings import IssuerSettings, Settings, load_settings
from tests.api.conftest import TokenMaker
from tests.api.helpers import HELLO_JDL, VO, assert_problem
from tests.api.test_dashboard import csrf_of

ISSUER = "https://iam.lhcb.example.org/"
AUDIENCE = "https://gridpilot.example.org"
ALL_SCOPES = "openid compute.read compute.create compute.modify compute.cancel"


class Clock:
    """A monotonic clock the test moves by hand (how long keys are kept)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Key:
    kid: str
    alg: str
    private: Any

    def jwk(self) -> dict[str, Any]:
        algo = jwt.get_algorithm_by_name(self.alg)
        data: dict[str, Any] = json.loads(algo.to_jwk(self.private.public_key()))
        return {**data, "kid": self.kid, "use": "sig", "alg": self.alg}

    def public_pem(self) -> bytes:
        return bytes(self.private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))


def rsa_key(kid: str) -> Key:
    return Key(kid, "RS256", rsa.generate_private_key(public_exponent=65537, key_size=2048))


def ec_key(kid: str) -> Key:
    return Key(kid, "ES256", ec.generate_private_key(ec.SECP256R1()))


@dataclass
class Jwks:
    """An identity provider's key endpoint: serves the keys it holds now, counts its calls."""

    url: str
    keys: list[Key] = field(default_factory=list)
    hits: int = 0
    broken: bool = False


@pytest.fixture()
def jwks() -> Iterator[Jwks]:
    state = Jwks("")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state.hits += 1
            if state.broken:
                self.send_error(503)
                return
            body = json.dumps({"keys": [k.jwk() for k in state.keys]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}/jwk"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def issuer_settings(jwks: Jwks, **changes: Any) -> IssuerSettings:
    base = IssuerSettings(issuer=ISSUER, jwks_url=jwks.url, audiences=(AUDIENCE,), vo=VO,
                          groups={"/lhcb": "lhcb_user", "/lhcb/admins": "lhcb_admin",
                                  "/lhcb/pilots": "lhcb_pilot"},
                          operator_groups=("/lhcb/admins",), pilot_groups=("/lhcb/pilots",),
                          jwks_lifetime=300, refetch_interval=30, timeout=2)
    return replace(base, **changes)


@dataclass
class Provider:
    jwks: Jwks
    clock: Clock
    app: Flask
    http: FlaskClient
    rsa: Key
    ec: Key

    def token(self, key: Key | None = None, *, sub: str = "8d3c-alice", groups: Any = None,
              scope: str = ALL_SCOPES, lifetime: int = 3600, **claims: Any) -> str:
        key = key or self.rsa
        now = int(time.time())
        body: dict[str, Any] = {"iss": ISSUER, "sub": sub, "aud": AUDIENCE, "iat": now,
                                "nbf": now, "exp": now + lifetime, "scope": scope,
                                "wlcg.ver": "1.0", "jti": uuid.uuid4().hex,
                                "wlcg.groups": ["/lhcb"] if groups is None else groups}
        body.update(claims)
        body = {k: v for k, v in body.items() if v is not None}
        return jwt.encode(body, key.private, algorithm=key.alg, headers={"kid": key.kid})

    def call(self, method: str, path: str, token: str, **kwargs: Any) -> Any:
        return self.http.open(path, method=method,
                              headers={"Authorization": f"Bearer {token}"}, **kwargs)


@pytest.fixture()
def provider(jwks: Jwks, make_app: Callable[[Settings], Flask], api_settings: Settings
             ) -> Provider:
    keys = rsa_key("rsa-1"), ec_key("ec-1")
    jwks.keys = list(keys)
    issuer = issuer_settings(jwks)
    settings = replace(api_settings, auth=replace(api_settings.auth, issuers=(issuer,)))
    app = make_app(settings)
    clock = Clock()
    runtime_of(app).providers = IdentityProviders((issuer,), clock)
    return Provider(jwks, clock, app, app.test_client(), *keys)


def whoami(p: Provider, token: str) -> dict[str, Any]:
    response = p.call("GET", "/api/v1/whoami", token)
    assert response.status_code == 200, response.get_data(as_text=True)
    data: dict[str, Any] = response.get_json()
    return data


def test_a_users_rs256_token_submits_and_reads_its_jobs(provider: Provider) -> None:
    token = provider.token()
    me = whoami(provider, token)
    assert (me["subject"], me["role"], me["vo"], me["group"], me["issuer"]) == \
        ("8d3c-alice", "user", VO, "lhcb_user", ISSUER)
    assert me["scopes"] == ["compute.cancel", "compute.create", "compute.modify",
                            "compute.read"]
    response = provider.call("POST", "/api/v1/jobs", token, data=HELLO_JDL,
                             content_type="text/plain")
    assert response.status_code == 201, response.get_data(as_text=True)
    job_id = response.get_json()["job_ids"][0]
    job = provider.call("GET", f"/api/v1/jobs/{job_id}", token).get_json()
    assert job["owner"] == "8d3c-alice"
    assert job["owner_group"] == "lhcb_user"
    # The key set was fetched once for all of it.
    assert provider.jwks.hits == 1


def test_an_es256_token_of_an_admin_group_is_an_operator(provider: Provider) -> None:
    me = whoami(provider, provider.token(provider.ec, sub="olga",
                                         groups=["/lhcb", "/lhcb/admins"]))
    assert (me["role"], me["group"]) == ("operator", "lhcb_user")
    response = provider.call("GET", "/api/v1/sitemask",
                             provider.token(provider.ec, groups=["/lhcb/admins"]))
    assert response.status_code == 200, response.get_data(as_text=True)


def test_a_pilot_group_token_is_a_pilot(provider: Provider) -> None:
    me = whoami(provider, provider.token(groups=["/lhcb/pilots"]))
    assert (me["role"], me["group"]) == ("pilot", "lhcb_pilot")


def test_the_first_mapped_group_of_the_token_is_its_group(provider: Provider) -> None:
    me = whoami(provider, provider.token(groups=["/atlas", "/lhcb/pilots", "/lhcb"]))
    assert me["group"] == "lhcb_pilot"


def test_a_rotated_key_is_fetched_once_and_a_removed_key_stops_working(provider: Provider
                                                                      ) -> None:
    old = provider.token()
    assert whoami(provider, old)["subject"] == "8d3c-alice"
    assert provider.jwks.hits == 1
    # The provider rotates: a new key is published beside the old one.
    new_key = rsa_key("rsa-2")
    provider.jwks.keys.append(new_key)
    provider.clock.now += 31  # past refetch_interval, well within jwks_lifetime
    assert whoami(provider, provider.token(new_key, sub="bob"))["subject"] == "bob"
    assert provider.jwks.hits == 2
    # The old key is withdrawn (revoked); once the kept set is older than jwks_lifetime, it
    # is fetched again and the old key's tokens are refused.
    provider.jwks.keys.remove(provider.rsa)
    provider.clock.now += 300
    assert_problem(provider.call("GET", "/api/v1/whoami", old), 401, "'rsa-1'",
                   "not among the keys")
    assert whoami(provider, provider.token(new_key))["role"] == "user"


def test_unknown_key_ids_refetch_at_most_once_per_interval(provider: Provider) -> None:
    whoami(provider, provider.token())
    assert provider.jwks.hits == 1
    stranger = rsa_key("made-up")
    for _ in range(5):
        assert_problem(provider.call("GET", "/api/v1/whoami", provider.token(stranger)), 401,
                       "'made-up'", "not among the keys")
    # One refetch right away would be allowed only after refetch_interval; none happened.
    assert provider.jwks.hits == 1
    provider.clock.now += 30
    for _ in range(3):
        provider.call("GET", "/api/v1/whoami", provider.token(stranger))
    assert provider.jwks.hits == 2
    # A key signed with a key made by someone else under a published kid fails its signature.
    forged = Key("rsa-1", "RS256", stranger.private)
    assert_problem(provider.call("GET", "/api/v1/whoami", provider.token(forged)), 401,
                   "Signature verification failed")


@pytest.mark.parametrize(("claims", "fragment"), [
    ({"iss": "https://evil.example.org/"}, "issuer 'https://evil.example.org/' is not trusted"),
    ({"aud": "https://other-service.example.org"}, "audience is not one this service accepts"),
    ({"aud": None}, 'missing the "aud" claim'),
    ({"lifetime": -600}, "expired"),
    ({"nbf": int(time.time()) + 3600}, "not valid yet"),
    ({"sub": None}, 'missing the "sub" claim'),
    ({"groups": ["/atlas"]}, "none of the token's groups (/atlas)"),
    ({"groups": []}, "none of the token's groups (none)"),
    ({"groups": "/lhcb/x"}, "none of the token's groups (/lhcb/x)"),
    ({"groups": [1, 2]}, "must be a list of group names"),
    ({"scope": "openid profile"}, "grants none of the scopes"),
    ({"scope": ["compute.read"]}, "space-separated"),
    ({"sub": "x" * 300}, "longer than 255"),
])
def test_bad_tokens_are_refused_with_a_clear_401(provider: Provider, claims: dict[str, Any],
                                                 fragment: str) -> None:
    response = provider.call("GET", "/api/v1/whoami", provider.token(**claims))
    assert_problem(response, 401, fragment)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unsigned(header: dict[str, Any], claims: dict[str, Any]) -> str:
    return f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"


def _claims() -> dict[str, Any]:
    now = int(time.time())
    return {"iss": ISSUER, "sub": "mallory", "aud": AUDIENCE, "iat": now, "exp": now + 600,
            "scope": ALL_SCOPES, "wlcg.groups": ["/lhcb/admins"]}


def test_algorithm_confusion_is_refused(provider: Provider) -> None:
    # HS256 "signed" with the provider's public key (the classic confusion attack).
    head = _unsigned({"alg": "HS256", "typ": "JWT", "kid": "rsa-1"}, _claims())
    mac = hmac.new(provider.rsa.public_pem(), head.encode(), hashlib.sha256).digest()
    assert_problem(provider.call("GET", "/api/v1/whoami", f"{head}.{_b64(mac)}"), 401,
                   "signed with 'HS256'", "RS256 or ES256")
    # No signature at all.
    none = _unsigned({"alg": "none", "typ": "JWT", "kid": "rsa-1"}, _claims())
    assert_problem(provider.call("GET", "/api/v1/whoami", f"{none}."), 401,
                   "signed with 'none'")
    # An ES256 header on the RSA key's id: the key is for RS256 only.
    es = jwt.encode(_claims(), provider.ec.private, algorithm="ES256", headers={"kid": "rsa-1"})
    assert_problem(provider.call("GET", "/api/v1/whoami", es), 401, "is for RS256")
    # No key id.
    nokid = jwt.encode(_claims(), provider.rsa.private, algorithm="RS256")
    assert_problem(provider.call("GET", "/api/v1/whoami", nokid), 401, "names no key (kid)")
    # The service's own issuer name with the provider's key: verified as HS256, refused.
    own = jwt.encode({**_claims(), "iss": "gridpilot", "role": "operator", "vo": VO,
                      "group": "lhcb_admin"}, provider.rsa.private, algorithm="RS256",
                     headers={"kid": "rsa-1"})
    assert_problem(provider.call("GET", "/api/v1/whoami", own), 401, "not valid")


def test_scopes_bound_what_a_token_may_do(provider: Provider) -> None:
    reader = provider.token(scope="compute.read")
    assert provider.call("GET", "/api/v1/jobs", reader).status_code == 200
    assert_problem(provider.call("POST", "/api/v1/jobs", reader, data=HELLO_JDL,
                                 content_type="text/plain"),
                   403, "does not grant the scope compute.create")
    submitter = provider.token(scope="compute.create compute.read")
    job_id = provider.call("POST", "/api/v1/jobs", submitter, data=HELLO_JDL,
                           content_type="text/plain").get_json()["job_ids"][0]
    assert_problem(provider.call("POST", f"/api/v1/jobs/{job_id}/kill", submitter), 403,
                   "compute.cancel")
    assert_problem(provider.call("POST", "/api/v1/jobs/kill", submitter,
                                 json={"job_ids": [job_id]}), 403, "compute.cancel")
    assert_problem(provider.call("DELETE", f"/api/v1/jobs/{job_id}", submitter), 403,
                   "compute.cancel")
    assert_problem(provider.call("POST", f"/api/v1/jobs/{job_id}/reschedule", submitter), 403,
                   "compute.modify")
    # Nothing was changed by the refused calls.
    assert provider.call("GET", f"/api/v1/jobs/{job_id}", reader).get_json()["status"] != \
        "Killed"
    canceller = provider.token(scope="compute.cancel")
    response = provider.call("POST", f"/api/v1/jobs/{job_id}/kill", canceller)
    assert response.status_code == 200, response.get_data(as_text=True)


def test_local_tokens_still_work_beside_the_provider(provider: Provider,
                                                     token: TokenMaker) -> None:
    me = whoami(provider, token("alice", "user"))
    assert (me["issuer"], me["scopes"]) == ("gridpilot", None)
    assert_problem(provider.call("GET", "/api/v1/whoami", token("alice", "user",
                                                                 secret="x" * 32)),
                   401, "not valid")


def test_a_provider_that_cannot_be_reached(provider: Provider) -> None:
    provider.jwks.broken = True
    assert_problem(provider.call("GET", "/api/v1/whoami", provider.token()), 401,
                   "cannot be fetched")
    provider.jwks.broken = False
    provider.clock.now += 30
    assert whoami(provider, provider.token())["role"] == "user"
    # Keys already fetched stay in use while the provider is down.
    provider.jwks.broken = True
    provider.clock.now += 600
    assert whoami(provider, provider.token())["role"] == "user"


def sign_in(http: FlaskClient, token: str) -> Any:
    form = http.get("/ui/login")
    return http.post("/ui/login", data={"token": token,
                                        "csrf": csrf_of(form.get_data(as_text=True))})


def test_the_dashboard_signs_in_with_a_provider_token(provider: Provider) -> None:
    operator = provider.token(provider.ec, sub="olga", groups=["/lhcb/admins"],
                              scope="compute.read")
    response = sign_in(provider.http, operator)
    assert response.status_code == 302, response.get_data(as_text=True)
    page = provider.http.get("/ui/jobs")
    assert page.status_code == 200
    assert "olga" in page.get_data(as_text=True)
    # Its scopes still hold: a read-only token cannot kill through the dashboard.
    user = provider.token(scope="compute.create compute.read")
    job_id = provider.call("POST", "/api/v1/jobs", user, data=HELLO_JDL,
                           content_type="text/plain").get_json()["job_ids"][0]
    form = provider.http.get(f"/ui/jobs/{job_id}/kill")
    assert form.status_code == 200
    killed = provider.http.post(f"/ui/jobs/{job_id}/kill",
                                data={"csrf": csrf_of(form.get_data(as_text=True))})
    assert killed.status_code == 403
    assert "compute.cancel" in killed.get_data(as_text=True)
    # Bad tokens are told why on the sign-in page.
    other = provider.app.test_client()
    refused = sign_in(other, provider.token(lifetime=-600))
    assert refused.status_code == 401
    assert "expired" in refused.get_data(as_text=True)
    no_read = sign_in(other, provider.token(scope="compute.create"))
    assert no_read.status_code == 403
    assert "compute.read" in no_read.get_data(as_text=True)


def test_issuers_are_read_from_the_settings_file(tmp_path: Path) -> None:
    path = tmp_path / "gridpilot.toml"
    path.write_text(f'''
[auth]
secret = "{secrets.token_urlsafe(32)}"

[[auth.issuers]]
issuer = "{ISSUER}"
jwks_url = "https://iam.lhcb.example.org/jwk"
audiences = ["{AUDIENCE}", "https://wlcg.cern.ch/jwt/v1/any"]
vo = "lhcb"
groups = {{ "/lhcb" = "lhcb_user", "/lhcb/admins" = "lhcb_admin" }}
operator_groups = ["/lhcb/admins"]
''', encoding="utf-8")
    (issuer,) = load_settings(path, {}).auth.issuers
    assert issuer.issuer == ISSUER
    assert issuer.audiences == (AUDIENCE, "https://wlcg.cern.ch/jwt/v1/any")
    assert dict(issuer.groups) == {"/lhcb": "lhcb_user", "/lhcb/admins": "lhcb_admin"}
    assert issuer.algorithms == ("RS256", "ES256")


@pytest.mark.parametrize(("table", "fragment"), [
    ('issuer = "x"\njwks_url = "https://x/jwk"\nvo = "lhcb"\ngroups = {"/l" = "g"}',
     "audiences must name"),
    ('issuer = "x"\njwks_url = "ftp://x/jwk"\naudiences = ["a"]\nvo = "lhcb"\n'
     'groups = {"/l" = "g"}', "http(s) URL"),
    ('issuer = "x"\njwks_url = "https://x/jwk"\naudiences = ["a"]\nvo = "lhcb"\n'
     'groups = {"/l" = "g"}\nalgorithms = ["HS256"]', "algorithms must be among"),
    ('issuer = "x"\njwks_url = "https://x/jwk"\naudiences = ["a"]\nvo = "lhcb"',
     "groups must map"),
    ('issuer = "gridpilot"\njwks_url = "https://x/jwk"\naudiences = ["a"]\nvo = "lhcb"\n'
     'groups = {"/l" = "g"}', "own issuer"),
    ('issuer = "x"\njwks_url = "https://x/jwk"\naudiences = ["a"]\nvo = "lhcb"\n'
     'groups = {"/l" = "g"}\njwks = "?"', "unknown key jwks"),
])
def test_bad_issuer_settings_are_refused(tmp_path: Path, table: str, fragment: str) -> None:
    path = tmp_path / "gridpilot.toml"
    path.write_text(f"[[auth.issuers]]\n{table}\n", encoding="utf-8")
    with pytest.raises(ConfigurationError, match=None) as caught:
        load_settings(path, {})
    assert fragment in str(caught.value)


def test_a_submitter_uploads_its_input_sandbox_and_a_reader_asks_why(provider: Provider
                                                                     ) -> None:
    # Uploading the files a job takes in is part of submitting it (compute.create), not a
    # change of anything stored (compute.modify); explain only reads (compute.read).
    submitter = provider.token(scope="compute.create compute.read")
    data = b"input sandbox bytes"
    checksum = hashlib.sha256(data).hexdigest()
    start = provider.call("POST", "/api/v1/sandboxes", submitter,
                          json={"checksum": checksum, "size": len(data)})
    assert start.status_code == 200, start.get_data(as_text=True)
    put = provider.call("PUT", f"/api/v1/sandboxes/sb:sha256:{checksum}", submitter,
                        data=data, content_type="application/gzip")
    assert put.status_code == 201, put.get_data(as_text=True)
    job_id = provider.call("POST", "/api/v1/jobs", submitter, data=HELLO_JDL,
                           content_type="text/plain").get_json()["job_ids"][0]
    reader = provider.token(scope="compute.read")
    explained = provider.call("POST", "/api/v1/taskqueues/explain", reader,
                              json={"job_id": job_id,
                                    "queue": "LCG.CERN.cern/ce503.cern.ch/condor"})
    assert explained.status_code == 200, explained.get_data(as_text=True)
    # A read-only token still stores nothing.
    other = hashlib.sha256(b"other").hexdigest()
    assert_problem(provider.call("POST", "/api/v1/sandboxes", reader,
                                 json={"checksum": other, "size": 5}), 403, "compute.create")
    # A pilot's output upload stays a change of the job it holds (compute.modify).
    pilot = provider.token(groups=["/lhcb/pilots"], scope="compute.create compute.read")
    assert_problem(provider.call("POST", "/api/v1/sandboxes", pilot,
                                 json={"checksum": other, "size": 5, "job_id": job_id,
                                       "pilot_reference": "p-1"}), 403, "compute.modify")
