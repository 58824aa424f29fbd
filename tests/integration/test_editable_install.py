"""The editable install of the README (``pip install -e '.[server]'``, also what ``make demo``
and ``make test`` run): setuptools builds it without its warning about folders named like
the packages, which it gives whenever it must install a meta path finder for a flat layout
whose root it cannot simply put on ``sys.path``."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("setup.cfg", "pyproject.toml", "README.md", "taskqueue", "optimizers", "matcher",
           "agents", "pilot", "client", "gridpilot", "migrations", "simulator",
           "psij-descriptors", "conf")


def test_the_editable_build_gives_no_warning(tmp_path: Path) -> None:
    source = tmp_path / "src"
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            source.mkdir(exist_ok=True)
            shutil.copy(path, source / name)
    # pip runs this hook of the build backend (setuptools, as pyproject.toml says).
    out = subprocess.run([sys.executable, "-W", "always", "-c",
                          "import setuptools.build_meta as b; print(b.build_editable('wheels'))"],
                         cwd=source, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "InformationOnly" not in out.stderr and "same name" not in out.stderr, out.stderr
    wheel = source / "wheels" / out.stdout.strip().splitlines()[-1]
    with zipfile.ZipFile(wheel) as archive:
        pth = [n for n in archive.namelist() if n.endswith(".pth")]
        assert len(pth) == 1, archive.namelist()
        assert archive.read(pth[0]).decode().split() == [str(source.resolve())]
