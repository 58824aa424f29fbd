"""taskqueue.core.scopes: what a payload's token grants, and a job's narrower request."""

from __future__ import annotations

import pytest

from taskqueue.core.scopes import covers, granted_scopes, payload_scopes, scope_problem
from taskqueue.core.settings import TokenSettings


@pytest.mark.parametrize(("granted", "requested", "expected"), [
    ("storage.read:/", "storage.read:/", True),
    ("storage.read:/", "storage.read:/lhcb/data", True),
    ("storage.read:/lhcb", "storage.read:/lhcb/data/f", True),
    ("storage.read:/lhcb", "storage.read:/lhcb", True),
    ("storage.read:/lhcb", "storage.read:/lhcbx", False),
    ("storage.read:/lhcb/", "storage.read:/lhcb/x", True),
    ("storage.read:/lhcb", "storage.read:/lhcb/../atlas", False),
    ("storage.read:/lhcb", "storage.read:lhcb/x", False),
    ("storage.read:/", "storage.create:/", False),
    ("storage.read:/", "storage.read", False),
    ("compute.read", "compute.read", True),
    ("compute.read", "compute.read:/", False),
])
def test_covers(granted: str, requested: str, expected: bool) -> None:
    assert covers(granted, requested) is expected


def test_granted_scopes_fill_in_the_vo_and_owner_and_a_vo_may_have_its_own() -> None:
    tokens = TokenSettings(vo_storage_scopes={"belle": ("storage.read:/belle",)})
    assert granted_scopes(tokens, "lhcb", "alice") == (
        "storage.read:/", "storage.create:/lhcb/user/alice")
    assert granted_scopes(tokens, "belle", "bob") == ("storage.read:/belle",)


def test_a_request_within_the_grant_is_fine_and_a_wider_one_says_why() -> None:
    granted = ("storage.read:/", "storage.create:/lhcb/user/alice")
    assert scope_problem(["storage.create:/lhcb/user/alice/run1"], granted) is None
    why = scope_problem(["storage.create:/lhcb/user/bob"], granted)
    assert why is not None and "never widen" in why and "storage.create:/lhcb/user/bob" in why
    assert "at most" in (scope_problem(["storage.read:/"] * 40, granted) or "")
    assert "not a scope" in (scope_problem(["storage.read:/a b"], granted) or "")


def test_a_grant_narrowed_since_submission_narrows_the_token() -> None:
    assert payload_scopes(["storage.read:/a", "storage.create:/b"], ["storage.read:/"]) == (
        "storage.read:/a",)
    assert payload_scopes([], ["storage.read:/"]) == ("storage.read:/",)


def test_bad_settings_are_refused() -> None:
    from taskqueue.core.errors import ConfigurationError
    for bad in ({"payload_lifetime": 0}, {"payload_audience": ()},
                {"storage_scopes": ("storage.read:/ x",)}, {"issuer": "ftp://x"}):
        with pytest.raises(ConfigurationError):
            TokenSettings(**bad)
