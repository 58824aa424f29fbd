"""The pilot's --wall-limit and --cpu-factor: the earlier of the option's and $JOBFEATURES'
wall limit counts, the features' CPU factor before the option's, and bad values are refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pilot.cli import parser, pilot_options
from pilot.features import write_features
from pilot.loop import Pilot

START = 1_800_000_000.0


def _pilot(tmp_path: Path, *extra: str) -> Pilot:
    args = parser().parse_args(["--matcher", "http://127.0.0.1:9", "--vo", "lhcb",
                                "--cores", "1", "--workdir", str(tmp_path / "work"), *extra])
    problems: list[str] = []
    options = pilot_options(args, "token", problems)
    assert options is not None, problems
    pilot = Pilot(options, clock=lambda: START)
    pilot.prepare(START)
    return pilot


@pytest.mark.parametrize(("features_wall", "option_wall", "left"),
                         [(1000, 3600, 1000), (7200, 3600, 3600), (None, 3600, 3600),
                          (1000, None, 1000)])
def test_the_earlier_wall_limit_counts(tmp_path: Path, features_wall: int | None,
                                       option_wall: int | None, left: float) -> None:
    jobfeatures = tmp_path / "job"
    write_features(jobfeatures, {"jobstart_secs": int(START),
                                 "wall_limit_secs_lrms": features_wall})
    extra = ["--job-features", str(jobfeatures)]
    if option_wall is not None:
        extra += ["--wall-limit", str(option_wall)]
    pilot = _pilot(tmp_path, *extra)
    assert pilot.limits(START).seconds_left(START) == left
    request = pilot.match_request(START, pilot.limits(START))
    assert request is not None and request["cpu_time"] == left - 60


def test_the_features_cpu_factor_comes_before_the_option(tmp_path: Path) -> None:
    jobfeatures = tmp_path / "job"
    write_features(jobfeatures, {"cpufactor_lrms": 2.0})
    both = _pilot(tmp_path, "--job-features", str(jobfeatures), "--wall-limit", "1060",
                  "--cpu-factor", "5")
    assert both.match_request(START, both.limits(START)) is not None
    assert both.limits(START).cpu_factor == 2.0
    option = _pilot(tmp_path, "--wall-limit", "1060", "--cpu-factor", "5")
    request = option.match_request(START, option.limits(START))
    assert request is not None and request["cpu_time"] == 5000


def test_no_limit_no_cpu_bound(tmp_path: Path) -> None:
    pilot = _pilot(tmp_path)
    request = pilot.match_request(START, pilot.limits(START))
    assert request is not None and "cpu_time" not in request


@pytest.mark.parametrize(("option", "value"), [("--wall-limit", "0"), ("--wall-limit", "nan"),
                                               ("--cpu-factor", "-1"), ("--cpu-factor", "inf")])
def test_bad_values_are_refused_clearly(tmp_path: Path, option: str, value: str) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    token.chmod(0o600)
    run = subprocess.run([sys.executable, "-m", "pilot.cli", "--matcher", "http://127.0.0.1:9",
                          "--vo", "lhcb", "--token-file", str(token), option, value],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert run.returncode == 2, run.stderr
    assert f"{option} must be a number > 0, got" in run.stderr
    assert "Traceback" not in run.stderr
