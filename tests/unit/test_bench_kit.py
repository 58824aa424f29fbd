"""The benchmarks' house rules: they run as scripts with their folder first on sys.path, so none
of them may be named like one of the project's packages (it would hide it), none patches
sys.path, and none reaches into another's private names (what they share is in bench/kit.py)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
SCRIPTS = sorted(BENCH.glob("*.py"))
NAMES = {p.stem for p in SCRIPTS}
PATCH = re.compile(r"sys\.path\s*(\[|\.insert|\.append|\.extend|=)")


def test_no_benchmark_hides_a_package_of_the_project() -> None:
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert {"taskqueue", "matcher", "optimizers", "pilot"} <= packages
    assert len(SCRIPTS) > 10 and "kit" in NAMES
    assert sorted(NAMES & packages) == []


def test_no_benchmark_patches_sys_path() -> None:
    assert sorted(p.name for p in SCRIPTS if PATCH.search(p.read_text())) == []


def _private_uses(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    aliases: dict[str, str] = {}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in NAMES:
                    aliases[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module in NAMES:
            found += [f"from {node.module} import {a.name}" for a in node.names
                      if a.name.startswith("_")]
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and node.attr.startswith("_")):
            found.append(f"{aliases[node.value.id]}.{node.attr}")
    return found


def test_no_benchmark_uses_another_ones_private_names() -> None:
    uses = {p.name: _private_uses(p) for p in SCRIPTS}
    assert any(p.name == "pilot_stream.py" for p in SCRIPTS)
    assert {name: found for name, found in uses.items() if found} == {}


def test_the_private_name_check_sees_a_private_use(tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text("import queue_ops as tq\nfrom kit import _admin\nx = tq._rate(1, 2)\n")
    assert sorted(_private_uses(script)) == ["from kit import _admin", "queue_ops._rate"]
