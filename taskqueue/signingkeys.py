"""The keys the service signs payloads' tokens with (ES256), kept in the database so that
every matcher instance signs with the same key and publishes the same set.

The newest key that is not retired signs. Once it has signed for ``rotation`` seconds, the
next request for a key retires it and makes a new one; a retired key stays published until
the last token it may have signed has expired (``keep_for`` seconds after it retired), then it
is deleted. The private half is stored encrypted (Fernet) with a key derived from the
service's signing secret, so that a copy of the database alone signs nothing; a key that no
longer decrypts (the secret changed) is retired and replaced the same way.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from sqlalchemy import delete, select

from taskqueue.db.database import Session
from taskqueue.db.models import SigningKey

ALGORITHM = "ES256"


@dataclass(frozen=True)
class ActiveKey:
    """The key that signs now: its id (the JWK thumbprint), its private half (PEM), when it
    began to sign, and whether this very call made it (stored by the caller's transaction,
    not committed yet)."""

    kid: str
    private_pem: bytes
    created_at: datetime
    made: bool = False


class KeyCache:
    """The key a process signed with last, and until when it may sign with it without
    reading the keys again (:meth:`keep`): a process's, shared by its threads (one tuple,
    replaced whole)."""

    def __init__(self) -> None:
        self._held: tuple[ActiveKey, datetime] | None = None

    def get(self, now: datetime) -> ActiveKey | None:
        held = self._held
        if held is None or not now < held[1]:
            return None
        return held[0]

    def keep(self, key: ActiveKey, until: datetime) -> None:
        self._held = (key, until)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _fernet(secret: str) -> Fernet:
    digest = hashlib.sha256(b"gridpilot signing keys\0" + secret.encode("utf-8")).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def public_jwk(key: ec.EllipticCurvePublicKey) -> dict[str, str]:
    """The public key as a JWK, with its RFC 7638 thumbprint as ``kid``."""
    numbers = key.public_numbers()
    jwk = {"crv": "P-256", "kty": "EC", "x": _b64(numbers.x.to_bytes(32, "big")),
           "y": _b64(numbers.y.to_bytes(32, "big"))}
    canonical = json.dumps(jwk, separators=(",", ":"), sort_keys=True).encode("ascii")
    return {**jwk, "kid": _b64(hashlib.sha256(canonical).digest()), "use": "sig",
            "alg": ALGORITHM}


def _new_key(session: Session, secret: str, now: datetime) -> ActiveKey:
    private = ec.generate_private_key(ec.SECP256R1())
    pem = private.private_bytes(serialization.Encoding.PEM,
                                serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    jwk = public_jwk(private.public_key())
    session.add(SigningKey(kid=jwk["kid"], algorithm=ALGORITHM, public_jwk=json.dumps(jwk),
                           private_key=_fernet(secret).encrypt(pem).decode("ascii"),
                           created_at=now))
    session.flush()
    return ActiveKey(jwk["kid"], pem, now, made=True)


def signing_key(session: Session, *, secret: str, now: datetime, rotation: int,
                keep_for: int) -> ActiveKey:
    """The key to sign with now, made, rotated or replaced as needed."""
    current = session.scalars(select(SigningKey).where(SigningKey.retired_at.is_(None))
                              .order_by(SigningKey.created_at.desc()).limit(1)).first()
    if current is not None and now < current.created_at + timedelta(seconds=rotation):
        try:
            pem = _fernet(secret).decrypt(current.private_key.encode("ascii"))
            return ActiveKey(current.kid, pem, current.created_at)
        except InvalidToken:
            pass  # the secret changed: a new key signs, this one stays published a while
    for old in session.scalars(select(SigningKey).where(SigningKey.retired_at.is_(None))):
        old.retired_at, old.drop_after = now, now + timedelta(seconds=keep_for)
    session.execute(delete(SigningKey).where(SigningKey.drop_after < now))
    return _new_key(session, secret, now)


def published_keys(session: Session, *, now: datetime) -> list[dict[str, Any]]:
    """The public keys that may have signed a token still valid, newest first (JWKs)."""
    rows = session.scalars(select(SigningKey).order_by(SigningKey.created_at.desc()))
    return [json.loads(k.public_jwk) for k in rows
            if k.drop_after is None or k.drop_after >= now]
