"""The matcher's JSON answers (orjson) read the same as Flask's ``jsonify`` made them:
same values, same order of keys, dates as Flask writes them, and what orjson cannot write
(an integer beyond 64 bits) still answered."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from flask import Flask, jsonify

from matcher.api import json_response


@dataclass
class Point:
    x: int
    y: str


@pytest.fixture()
def app() -> Flask:
    app = Flask("json-response-test")
    app.json.sort_keys = False  # type: ignore[attr-defined]  # as matcher.app sets it
    return app


@pytest.mark.parametrize("payload", [
    {"jobs": [{"job_id": 7, "arguments": ["a", "é"], "extra": {}}], "no_match": None},
    {"z": 1, "a": 2.5, "m": [True, False, None]},
    {"when": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), "point": Point(1, "p")},
    {"big": 2**70, "small": -(2**63)},
    {1: "an integer key"},
    [1, "two", {"three": 3}],
])
def test_an_answer_reads_as_jsonify_wrote_it(app: Flask, payload: Any) -> None:
    with app.app_context():
        ours = json_response(payload, 201)
        theirs = jsonify(payload)
    assert ours.status_code == 201
    assert ours.mimetype == "application/json"
    assert json.loads(ours.get_data()) == json.loads(theirs.get_data())
    assert list(json.loads(ours.get_data())) == list(json.loads(theirs.get_data()))
