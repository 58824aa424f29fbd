"""A matcher process signs payloads' tokens with the key it read last, without reading the
signing keys again, for at most KEY_RECHECK seconds and never past the key's rotation: a
match answer's first tokens then cost no statement. A key made by the request itself is not
kept (its transaction may still fail), and a key retired by another matcher meanwhile is given
up within KEY_RECHECK, while it is still published (KEY_GRACE)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import jwt
import pytest
from sqlalchemy import event, update

from matcher.payloadtokens import KEY_GRACE, KEY_RECHECK, OwnIssuer, PayloadGrant
from taskqueue.core.settings import Settings
from taskqueue.db.models import SigningKey
from taskqueue.signingkeys import KeyCache
from tests.conftest import Database

SECRET = "a-test-secret-of-enough-length-0123456789"
GRANT = PayloadGrant("lhcb", "alice", 7, ("storage.read:/",))


@pytest.fixture()
def statements(db: Database) -> Iterator[list[str]]:
    seen: list[str] = []

    def note(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    event.listen(db.engine, "before_cursor_execute", note)
    try:
        yield seen
    finally:
        event.remove(db.engine, "before_cursor_execute", note)


def _kid(db: Database, issuer: OwnIssuer, now: datetime) -> str:
    with db.factory.begin() as s:
        token = issuer.issue(s, GRANT, now).token
    kid: str = jwt.get_unverified_header(token)["kid"]
    return kid


def test_a_kept_key_signs_without_a_statement(db: Database, settings: Settings,
                                              now: datetime, statements: list[str]) -> None:
    issuer = OwnIssuer(settings, SECRET, KeyCache())
    made = _kid(db, issuer, now)  # made by this request: not kept
    assert _kid(db, issuer, now + timedelta(seconds=1)) == made
    assert statements, "the key was read from the database"
    statements.clear()
    assert _kid(db, issuer, now + timedelta(seconds=2)) == made
    assert statements == []


def test_a_kept_key_is_read_again_after_its_recheck_and_its_rotation(
        db: Database, settings: Settings, now: datetime, statements: list[str]) -> None:
    issuer = OwnIssuer(settings, SECRET, KeyCache())
    first = _kid(db, issuer, now)
    _kid(db, issuer, now)  # kept from now on
    assert KEY_RECHECK < KEY_GRACE
    with db.factory.begin() as s:  # another matcher retires it
        s.execute(update(SigningKey).values(retired_at=now, drop_after=now + timedelta(
            seconds=settings.tokens.payload_lifetime + KEY_GRACE)))
    assert _kid(db, issuer, now + timedelta(seconds=KEY_RECHECK - 1)) == first
    statements.clear()
    second = _kid(db, issuer, now + timedelta(seconds=KEY_RECHECK))
    assert second != first and statements
    # A key is never used past its rotation, however recently it was read.
    short = replace(settings, tokens=replace(settings.tokens, key_rotation=2))
    issuer = OwnIssuer(short, SECRET, KeyCache())
    at = now + timedelta(seconds=KEY_RECHECK + 5)
    third = _kid(db, issuer, at)  # the second was older than 2 s: replaced
    assert third != second
    assert _kid(db, issuer, at + timedelta(seconds=1)) == third  # kept, until at + 2 s
    assert _kid(db, issuer, at + timedelta(seconds=2)) != third
