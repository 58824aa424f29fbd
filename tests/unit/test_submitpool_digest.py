from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from taskqueue.core.errors import InvalidRequirementsError
from taskqueue.queues.submitpools import canonical_requirements, canonical_text, submit_pool_id

REQ = {"SoftwareTag": ["VO-lhcb-gauss-v50", "VO-lhcb-boole-v30"], "Memory": 4000,
       "Platform": "x86_64-el9"}


def test_canonical_form() -> None:
    assert canonical_requirements({"b": [3, 1, 3], "a": "x", "c": 4000.0, "d": ["one"]}) == {
        "a": "x", "b": [1, 3], "c": 4000, "d": "one"}
    assert canonical_text({"b": 1.5, "a": [2, "z", 1]}) == '{"a":[1,2,"z"],"b":1.5}'


def test_digest_ignores_order_duplicates_and_number_spelling() -> None:
    same = {"Platform": "x86_64-el9", "Memory": 4000.0,
            "SoftwareTag": ["VO-lhcb-boole-v30", "VO-lhcb-gauss-v50", "VO-lhcb-boole-v30"]}
    assert submit_pool_id(REQ) == submit_pool_id(same)
    assert submit_pool_id(REQ) != submit_pool_id({**REQ, "Memory": 4001})
    assert len(submit_pool_id(REQ)) == 64


# The id must not depend on the interpreter: computed here and in two fresh interpreters with
# different hash seeds, it must be the same, and equal to the sha256 of the canonical text.


def test_digest_is_stable_across_interpreters_and_hash_seeds() -> None:
    code = ("import json,sys;from taskqueue.queues.submitpools import submit_pool_id;"
            "print(submit_pool_id(json.loads(sys.argv[1])))")
    digests = set()
    for seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", code, json.dumps(REQ)], env=env,
                             capture_output=True, text=True, check=True, timeout=60)
        digests.add(out.stdout.strip())
    digests.add(submit_pool_id(REQ))
    assert len(digests) == 1
    assert digests.pop() == _expected_digest()


def _expected_digest() -> str:
    import hashlib
    text = ('{"Memory":4000,"Platform":"x86_64-el9",'
            '"SoftwareTag":["VO-lhcb-boole-v30","VO-lhcb-gauss-v50"]}')
    return hashlib.sha256(text.encode()).hexdigest()


scalars = st.one_of(st.text(max_size=8), st.integers(-10**6, 10**6),
                    st.floats(allow_nan=False, allow_infinity=False, width=32))
values = st.one_of(scalars, st.lists(scalars, min_size=1, max_size=5))


@given(st.dictionaries(st.text(min_size=1, max_size=6).filter(str.strip), values, max_size=6),
       st.randoms(use_true_random=False))
def test_digest_ignores_key_and_list_order(req: dict[str, Any], rnd: Any) -> None:
    lowered = {k.lower() for k in req}
    if len(lowered) != len(req):
        with pytest.raises(InvalidRequirementsError, match="given twice"):
            submit_pool_id(req)
        return
    keys = list(req)
    rnd.shuffle(keys)
    shuffled: dict[str, Any] = {}
    for k in keys:
        v = req[k]
        if isinstance(v, list):
            v = list(v) + list(v)
            rnd.shuffle(v)
        shuffled[k] = v
    assert submit_pool_id(shuffled) == submit_pool_id(req)


@pytest.mark.parametrize(("req", "message"), [
    ({"A": None}, "'A' must be a string, a number or a list of them, got None"),
    ({"A": True}, "got True"),
    ({"A": {"x": 1}}, "got {'x': 1}"),
    ({"A": []}, "'A' is an empty list"),
    ({"A": float("nan")}, "'A' must be finite"),
    ({"": 1}, "non-empty strings"),
    ({"Memory": 1, "memory": 2}, "given twice"),
])
def test_bad_requirements_say_what_is_wrong(req: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidRequirementsError, match=message):
        submit_pool_id(req)
