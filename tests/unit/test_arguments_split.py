"""Arguments without quotes or backslashes are split without shlex, exactly as shlex splits
them (a parametric bulk splits one argument string per job)."""

from __future__ import annotations

import random
import shlex

import pytest

from optimizers.description import _arguments

CASES = ["a b  c", " x\t y\n", "", "   ", "a\x0bb", "é ü", "#x y", "%n 1", "a;b|c&d",
         "\r\n-v --n=3 ", "a\x0cb c\u00a0d", "$HOME ${X} `y`"]


@pytest.mark.parametrize("text", CASES)
def test_plain_arguments_split_as_shlex_splits_them(text: str) -> None:
    assert _arguments({"Arguments": ("Arguments", text)}) == tuple(shlex.split(text))


def test_random_plain_arguments_split_as_shlex_splits_them() -> None:
    rng = random.Random(7)
    alphabet = "ab #;$\t\r\n\x0b\x0c\u00a0\u2003é%-="
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(12)))
        assert _arguments({"Arguments": ("Arguments", text)}) == tuple(shlex.split(text)), text


def test_quoted_arguments_still_go_through_shlex() -> None:
    assert _arguments({"Arguments": ("Arguments", 'a "b c" d\\ e')}) == ("a", "b c", "d e")
