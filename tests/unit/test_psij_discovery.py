"""PSI/J finds the executor ``gridpilot`` by its own discovery (the ``psij-descriptors``
folders of sys.path's entries) in every install, from any folder, before anything of gridpilot
is imported: from the checkout (its root on sys.path), from a wheel (the folder in
site-packages; tests/integration/test_package_data.py) and from an editable install (its .pth
file puts the checkout's root on sys.path)."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBE = ("from psij import JobExecutor\n"
         "print(sorted(JobExecutor.get_executor_names()))\n"
         "from client.psij_executor import GridpilotExecutorConfig\n"
         "print(type(JobExecutor.get_instance('gridpilot', url='http://127.0.0.1:9', "
         "config=GridpilotExecutorConfig(token='t'))).__name__)\n")
EDITABLE_PROBE = """
import sys, site
sys.path.append(sys.argv[1])  # psij and the rest, without the .pth files of that folder
site.addsitedir(sys.argv[2])  # the editable install alone, its .pth files read
import psij
(entry,) = psij.JobExecutor._executors["gridpilot"]
assert entry.ecls is not None, entry.exc
print(sorted(psij.JobExecutor.get_executor_names()), entry.plugin_path)
"""


def _environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GRIDPILOT_URL")}


def test_found_outside_the_checkout(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, env=_environ(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    names, kind = out.stdout.splitlines()
    assert "'gridpilot'" in names and kind == "GridpilotJobExecutor"
    assert "Traceback" not in out.stderr and "WARNING" not in out.stderr


def test_an_editable_install_is_found_from_any_folder(tmp_path: Path) -> None:
    """``pip install -e``, then psij imported in another folder with that install alone (no
    PYTHONPATH, not this test's own environment's install)."""
    prefix = tmp_path / "prefix"
    built = subprocess.run(
        # --ignore-installed: pip would otherwise remove this environment's own install.
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--ignore-installed",
         "--no-build-isolation", "--prefix", str(prefix), "--editable", str(ROOT)],
        capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    site = Path(sysconfig.get_path("purelib", vars={"base": str(prefix)}))
    assert site.is_dir(), sorted(prefix.rglob("*"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    found = subprocess.run([sys.executable, "-S", "-c", EDITABLE_PROBE,
                            sysconfig.get_path("purelib"), str(site)],
                           cwd=elsewhere, env=_environ(), capture_output=True, text=True,
                           timeout=120)
    assert found.returncode == 0, found.stderr
    names, _, path = found.stdout.strip().rpartition(" ")
    assert "'gridpilot'" in names and path == f"{ROOT}/client/psij_executor.py"
