"""Cost of verifying a bearer token per request: this service's HS256 tokens (verified once,
then cached until they expire) against an identity provider's RS256 and ES256 tokens
(signature checked on every request, keys from a JWKS served on loopback and kept).

    .venv/bin/python bench/tokens.py [--calls 5000]

Prints one JSON line per kind of token: microseconds per verification (median of 5 rounds).
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from matcher.auth import principal_from_header
from matcher.idp import IdentityProviders
from taskqueue.core.settings import IssuerSettings
from taskqueue.tokens import issue_token

SECRET = secrets.token_urlsafe(32)
ISSUER = "https://iam.example.org/"
AUDIENCE = "https://gridpilot.example.org"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000)
    args = parser.parse_args()
    keys = {"RS256": rsa.generate_private_key(public_exponent=65537, key_size=2048),
            "ES256": ec.generate_private_key(ec.SECP256R1())}
    jwks = {"keys": [{**json.loads(jwt.get_algorithm_by_name(alg).to_jwk(k.public_key())),
                      "kid": alg, "alg": alg, "use": "sig"} for alg, k in keys.items()]}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(jwks).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *a: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        issuer = IssuerSettings(issuer=ISSUER,
                                jwks_url=f"http://127.0.0.1:{server.server_address[1]}/jwk",
                                audiences=(AUDIENCE,), vo="lhcb", groups={"/lhcb": "lhcb_user"})
        providers = IdentityProviders((issuer,))
        now = int(time.time())
        claims = {"iss": ISSUER, "sub": "alice", "aud": AUDIENCE, "iat": now, "exp": now + 3600,
                  "scope": "compute.read compute.create", "wlcg.groups": ["/lhcb"]}
        tokens = {"HS256 (gridpilot, cached)": issue_token(
            SECRET, subject="alice", role="user", vo="lhcb", group="lhcb_user", lifetime=3600)}
        for alg, key in keys.items():
            tokens[f"{alg} (identity provider)"] = jwt.encode(claims, key, algorithm=alg,
                                                               headers={"kid": alg})
        for kind, token in tokens.items():
            header = f"Bearer {token}"
            principal_from_header(header, SECRET, providers)  # keys fetched, cache filled
            rounds = []
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(args.calls):
                    principal_from_header(header, SECRET, providers)
                rounds.append((time.perf_counter() - t0) / args.calls * 1e6)
            print(json.dumps({"bench": "token_verification", "token": kind,
                              "calls": args.calls, "us_per_call": round(
                                  statistics.median(rounds), 1),
                              "jwks_fetches": sum(
                                  s.fetches for s in [providers.key_set(ISSUER)] if s)}))
    finally:
        server.shutdown()
        server.server_close()


if __name__ == "__main__":
    main()
