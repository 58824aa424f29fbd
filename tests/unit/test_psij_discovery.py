"""PSI/J finds the executor ``gridpilot`` in every install: from the checkout (its
psij-descriptors/ on sys.path), from a wheel (the folder in site-packages), and from an
editable install used outside the checkout, where importing the executor's module registers
it."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBE = ("import client.psij_executor\n"
         "from psij import JobExecutor\n"
         "print(sorted(JobExecutor.get_executor_names()))\n"
         "print(type(JobExecutor.get_instance('gridpilot', url='http://127.0.0.1:9', "
         "config=client.psij_executor.GridpilotExecutorConfig(token='t'))).__name__)\n")


def test_found_outside_the_checkout(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GRIDPILOT_URL")}
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    names, kind = out.stdout.splitlines()
    assert "'gridpilot'" in names and kind == "GridpilotJobExecutor"
    assert "Traceback" not in out.stderr and "WARNING" not in out.stderr


def test_the_module_and_the_descriptor_file_agree() -> None:
    from client.psij_executor import DESCRIPTOR

    spec = importlib.util.spec_from_file_location(
        "gridpilot_descriptor", ROOT / "psij-descriptors" / "gridpilot_descriptor.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (declared,) = module.__PSI_J_EXECUTORS__
    assert (declared.name, declared.version, declared.cls) == (
        DESCRIPTOR.name, DESCRIPTOR.version, DESCRIPTOR.cls)
