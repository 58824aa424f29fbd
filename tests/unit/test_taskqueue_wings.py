"""The wings of taskqueue/ (docs/ARCHITECTURE.md): each imports only the wings below it, so the
package has no import running back up and no circle inside it either."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "taskqueue"

#: The wings each part of taskqueue/ may import, from the ground up; the modules at the top of
#: the package (tokens, scrapes, signouts, agentruns) stand on core and db.
ALLOWED: dict[str, set[str]] = {
    "core": {"core"},
    "db": {"core", "db"},
    "queues": {"core", "db", "queues"},
    "files": {"core", "db", "files"},
    "matching": {"core", "db", "queues", "matching"},
    "pilots": {"core", "db", "queues", "files", "matching", "pilots"},
    "top": {"core", "db"},
}
WINGS = sorted(w for w in ALLOWED if w != "top")


def _part(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else "top"


def _wings_imported(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module] if isinstance(node, ast.ImportFrom) and node.module
                 and node.level == 0 else [])
        for name in names:
            parts = name.split(".")
            if parts[0] == "taskqueue" and len(parts) > 1:
                found.add(parts[1] if parts[1] in ALLOWED else "top")
    return found


def test_each_wing_has_its_modules_and_a_purpose() -> None:
    for wing in WINGS:
        init = PACKAGE / wing / "__init__.py"
        assert ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))), wing
        assert len(list((PACKAGE / wing).glob("*.py"))) > 2, wing
    assert len(list(PACKAGE.glob("*.py"))) <= 8


@pytest.mark.parametrize("part", sorted(ALLOWED))
def test_a_wing_imports_only_the_wings_below_it(part: str) -> None:
    bad = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if _part(path) == part and (extra := _wings_imported(path) - ALLOWED[part]):
            bad[str(path.relative_to(ROOT))] = sorted(extra)
    assert bad == {}


def test_the_wing_check_sees_an_import_back_up(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from taskqueue.pilots.records import x\nimport taskqueue.tokens\n")
    assert _wings_imported(module) == {"pilots", "top"}
