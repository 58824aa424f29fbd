"""``make demo`` installs only what the demo runs (the server extra); ``make test`` adds the
test extra. Read from ``make -n`` on a fresh copy (nothing is installed)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _dry_run(tmp_path: Path, target: str) -> list[str]:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    for name in ("Makefile", "setup.cfg", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    out = subprocess.run(["make", "-n", target], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60, check=True)
    return [line for line in out.stdout.splitlines() if "pip install" in line]


def test_make_demo_installs_only_the_server_extra(tmp_path: Path) -> None:
    installs = _dry_run(tmp_path, "demo")
    assert [line.split()[-1] for line in installs if " -e " in line] == ["'.[server]'"]


def test_make_test_installs_the_test_extra(tmp_path: Path) -> None:
    installs = _dry_run(tmp_path, "test")
    assert [line.split()[-1] for line in installs if " -e " in line] == ["'.[server,test]'"]
