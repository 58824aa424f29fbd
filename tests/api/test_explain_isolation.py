"""Explain names the isolation a VO requires ([matcher] isolation_required_vos), through the
Flask test client on every database: a pilot's description without the tag fails the rule,
one with it passes, a queue's says what its pilots need; a VO that requires none has no such
rule."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from flask import Flask

from optimizers.jobexplain import ISOLATED_TAG
from pilot.protocol import ISOLATED_TAG as PILOT_ISOLATED_TAG
from taskqueue.core.settings import Settings
from tests.api.conftest import SECRET
from tests.api.helpers import SITE, VO, Api

QUEUE = f"{SITE}/ce503.cern.ch/condor"


def _isolation(answer: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in answer["rules"] if r["rule"] == "isolation"]


def test_the_tag_explain_names_is_the_pilots() -> None:
    assert ISOLATED_TAG == PILOT_ISOLATED_TAG


def test_explain_names_the_isolation_a_vo_requires(
        make_app: Callable[[Settings], Flask], api_settings: Settings,
        user_token: str) -> None:
    settings = replace(api_settings, matcher=replace(api_settings.matcher,
                                                     isolation_required_vos=(VO,)))
    api = Api(make_app(settings).test_client(), settings, SECRET)
    [job_id] = api.submit_jdl(user_token)
    resource = {"vo": VO, "site": SITE, "ce": "ce503.cern.ch", "queue": "condor"}

    def explain(**body: Any) -> dict[str, Any]:
        answer: dict[str, Any] = api.ok("POST", "/api/v1/taskqueues/explain", user_token,
                                        json_body={"job_id": job_id, **body})
        return answer

    bare = explain(resource=resource)
    [rule] = _isolation(bare)
    assert not rule["holds"] and "does not offer it" in rule["detail"]
    assert not bare["can_run"]
    isolated = explain(resource={**resource, "tags": ["isolated", "bwrap"]})
    [rule] = _isolation(isolated)
    assert rule["holds"] and "offers it" in rule["detail"]
    [rule] = _isolation(explain(queue=QUEUE))
    assert rule["holds"] and "bubblewrap or apptainer" in rule["detail"]


def test_a_vo_that_requires_no_isolation_has_no_such_rule(client: Api,
                                                          user_token: str) -> None:
    [job_id] = client.submit_jdl(user_token)
    answer = client.ok("POST", "/api/v1/taskqueues/explain", user_token,
                       json_body={"job_id": job_id, "queue": QUEUE})
    assert _isolation(answer) == []
