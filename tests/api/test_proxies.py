"""Behind proxies: the forwarded headers of a peer in [matcher] trusted_proxies give the
client's address and the scheme, host and port it used (Secure cookies, upload URLs, the
OpenAPI server, the metrics allow list); from anyone else, and by default, they are ignored.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from matcher.dashboard import session as cookies
from matcher.proxies import TrustedProxies, address_in, networks
from taskqueue.core.errors import ConfigurationError
from taskqueue.core.settings import MatcherSettings, Settings
from tests.api.helpers import bearer
from tests.api.test_dashboard import cookie_header, csrf_of

PROXY = "10.1.0.5"
INNER_PROXY = "10.1.0.6"
CLIENT = "203.0.113.9"
PUBLIC = {"X-Forwarded-For": CLIENT, "X-Forwarded-Proto": "https",
          "X-Forwarded-Host": "gridpilot.example.org"}


def _behind(settings: Settings, **matcher: Any) -> Settings:
    return replace(settings, matcher=replace(settings.matcher, **matcher))


@pytest.fixture()
def proxied(make_app: Callable[[Settings], Flask], api_settings: Settings) -> FlaskClient:
    """The service behind two trusted proxies, whose metrics the client's address may read."""
    app = make_app(_behind(api_settings, trusted_proxies=(PROXY, f"{INNER_PROXY}/32"),
                           metrics_allow=(CLIENT,)))
    return app.test_client()


def _get(http: FlaskClient, path: str, peer: str, headers: dict[str, str],
         token: str | None = None) -> Any:
    return http.get(path, headers={**headers, **bearer(token)},
                    environ_base={"REMOTE_ADDR": peer})


def _server(http: FlaskClient, peer: str, headers: dict[str, str]) -> str:
    answer = _get(http, "/api/v1/openapi.json", peer, headers)
    assert answer.status_code == 200
    return str(answer.get_json()["servers"][0]["url"])


def test_nothing_is_trusted_by_default(client: Any) -> None:
    assert MatcherSettings().trusted_proxies == ()
    http: FlaskClient = client.client
    assert _server(http, "127.0.0.1", PUBLIC) == "http://localhost"
    form = http.get("/ui/login", headers=PUBLIC)
    assert "Secure" not in cookie_header(form, cookies.LOGIN_COOKIE)


def test_a_trusted_proxy_gives_the_public_url(proxied: FlaskClient) -> None:
    assert _server(proxied, PROXY, PUBLIC) == "https://gridpilot.example.org"
    assert _server(proxied, PROXY, {**PUBLIC, "X-Forwarded-Port": "8443"}) == (
        "https://gridpilot.example.org:8443")
    assert _server(proxied, PROXY, {**PUBLIC, "X-Forwarded-Port": "443"}) == (
        "https://gridpilot.example.org")
    assert _server(proxied, PROXY, {**PUBLIC, "X-Forwarded-Host": "gp.example.org:9443"}) == (
        "https://gp.example.org:9443")
    # The scheme's own port is left out, as a browser's Origin leaves it out.
    assert _server(proxied, PROXY, {**PUBLIC, "X-Forwarded-Host": "gp.example.org:443"}) == (
        "https://gp.example.org")
    # The same headers from a peer that is not a trusted proxy are the client's own words.
    assert _server(proxied, CLIENT, PUBLIC) == "http://localhost"
    assert _server(proxied, "10.1.0.7", PUBLIC) == "http://localhost"


def test_the_dashboard_cookies_are_secure_behind_a_tls_proxy(proxied: FlaskClient,
                                                             operator_token: str) -> None:
    environ = {"REMOTE_ADDR": PROXY}
    form = proxied.get("/ui/login", headers=PUBLIC, environ_base=environ)
    assert "Secure" in cookie_header(form, cookies.LOGIN_COOKIE)
    # The browser's Origin is the public one: the form's same-site check accepts it.
    answer = proxied.post("/ui/login", headers={**PUBLIC,
                                                "Origin": "https://gridpilot.example.org"},
                          environ_base=environ,
                          data={"token": operator_token,
                                "csrf": csrf_of(form.get_data(as_text=True))})
    assert answer.status_code == 302
    assert answer.headers["Location"] == "/ui/"
    assert "Secure" in cookie_header(answer, cookies.COOKIE)


def test_the_upload_url_handed_out_is_the_public_one(proxied: FlaskClient,
                                                     user_token: str) -> None:
    checksum = hashlib.sha256(b"sandbox bytes").hexdigest()
    answer = proxied.post("/api/v1/sandboxes", json={"checksum": checksum, "size": 13},
                          headers={**PUBLIC, **bearer(user_token)},
                          environ_base={"REMOTE_ADDR": PROXY})
    assert answer.status_code == 200, answer.get_data(as_text=True)
    assert answer.get_json()["upload"]["url"] == (
        f"https://gridpilot.example.org/api/v1/sandboxes/sb:sha256:{checksum}")


def test_the_client_address_is_the_last_one_no_trusted_proxy_wrote(
        proxied: FlaskClient) -> None:
    """The metrics allow list names the client: it is admitted through the proxies, and a
    client that writes the allowed address into its own header is not."""
    def scrape(peer: str, forwarded: str) -> int:
        return int(_get(proxied, "/metrics", peer, {"X-Forwarded-For": forwarded}).status_code)

    assert scrape(PROXY, CLIENT) == 200
    assert scrape(PROXY, f"{CLIENT}, {INNER_PROXY}") == 200  # through both proxies
    assert scrape(PROXY, f"{CLIENT}, 198.51.100.7") == 401  # CLIENT is the other's claim
    assert scrape(PROXY, f"{CLIENT}, 198.51.100.7, {INNER_PROXY}") == 401
    assert scrape("198.51.100.7", CLIENT) == 401  # not a proxy: its header is ignored
    assert scrape(PROXY, f"{CLIENT}, not-an-address") == 401
    assert scrape(PROXY, "") == 401  # the proxy itself is not allowed


@pytest.mark.parametrize("headers", [
    {"X-Forwarded-Proto": "javascript"},
    {"X-Forwarded-Proto": "https;x=1"},
    {"X-Forwarded-Host": "evil.example.org/path"},
    {"X-Forwarded-Host": "user@evil.example.org"},
    {"X-Forwarded-Host": "a b"},
    {"X-Forwarded-Host": ""},
    {"X-Forwarded-Port": "99999"},
    {"X-Forwarded-Port": "0"},
    {"X-Forwarded-Port": "-1"},
    {"X-Forwarded-Port": "80 "},
    {"X-Forwarded-Host": "evil.example.org:0"},
    {"X-Forwarded-Host": "evil.example.org:123456"},
])
def test_values_that_are_no_scheme_host_or_port_are_ignored(proxied: FlaskClient,
                                                           headers: dict[str, str]) -> None:
    server = _server(proxied, PROXY, headers)
    assert server in ("http://localhost", "http://localhost:80"), server


def test_the_value_the_nearest_proxy_passed_on_counts() -> None:
    """A client's own X-Forwarded-Proto, appended to rather than replaced by a proxy, loses
    to the proxy's."""
    environ = _environ({"X-Forwarded-Proto": "http, https",
                        "X-Forwarded-Host": "client.example.org, gridpilot.example.org"})
    TrustedProxies(_app, (PROXY,)).apply(environ)
    assert (environ["wsgi.url_scheme"], environ["HTTP_HOST"]) == (
        "https", "gridpilot.example.org")
    assert environ["SERVER_PORT"] == "443"


def test_ipv6_peers_and_ipv4_mapped_addresses() -> None:
    trusted = networks(["2001:db8::/32", "10.1.0.0/16"])
    assert address_in("2001:db8::5", trusted)
    assert address_in("[2001:db8::5]", trusted)
    assert address_in("::ffff:10.1.2.3", trusted)
    assert not address_in("2001:db9::5", trusted)
    assert not address_in("10.2.0.1", trusted)
    assert not address_in("", trusted) and not address_in(None, trusted)
    assert not address_in("10.1.0.1", ())
    environ = _environ({"X-Forwarded-For": "2001:db8:1::9, 2001:db8::6",
                        "X-Forwarded-Host": "[2001:db8::1]:8443",
                        "X-Forwarded-Proto": "https"}, peer="2001:db8::5")
    TrustedProxies(_app, ("2001:db8::/48",)).apply(environ)
    assert environ["REMOTE_ADDR"] == "2001:db8:1::9"
    assert (environ["HTTP_HOST"], environ["SERVER_PORT"]) == ("[2001:db8::1]:8443", "8443")


@pytest.mark.parametrize("value", ["10.0.0.0/33", "proxy.example.org", "*", ""])
def test_bad_trusted_proxies_are_refused(value: str) -> None:
    with pytest.raises(ConfigurationError, match=r"matcher\.trusted_proxies: .* not an address"):
        MatcherSettings(trusted_proxies=(value,))


def _environ(headers: dict[str, str], peer: str = PROXY) -> dict[str, Any]:
    environ: dict[str, Any] = {"REMOTE_ADDR": peer, "wsgi.url_scheme": "http",
                               "HTTP_HOST": "127.0.0.1:8080", "SERVER_NAME": "127.0.0.1",
                               "SERVER_PORT": "8080"}
    for name, value in headers.items():
        environ["HTTP_" + name.upper().replace("-", "_")] = value
    return environ


def _app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    return []
