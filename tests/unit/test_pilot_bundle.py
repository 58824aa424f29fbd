"""The pilot bundle (issue 34 item 10): every ARC pilot uploads it, so it holds only what the
pilot imports, its sources without docstrings and comments; it still runs the pilot, and each
of its modules means what the installed one means, line for line."""

from __future__ import annotations

import ast
import io
import subprocess
import sys
import zipfile
from pathlib import Path

from agents.ce.bundle import BUNDLE_FILE, LEFT_OUT, PACKAGES, _package_root, compact, pilot_bundle


def _without_docstrings(tree: ast.AST) -> str:
    for node in ast.walk(tree):
        if (isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                and node.body and isinstance(node.body[0], ast.Expr)
                and isinstance(node.body[0].value, ast.Constant)
                and isinstance(node.body[0].value.value, str)):
            node.body[0].value.value = ""
    return ast.dump(tree)


def test_each_module_means_what_the_installed_one_means_line_for_line() -> None:
    bundle = zipfile.ZipFile(io.BytesIO(pilot_bundle()))
    checked = 0
    for entry in bundle.infolist():
        name = entry.filename
        if not name.endswith(".py") or name == "__main__.py":
            continue
        package, _, rest = name.partition("/")
        installed = (_package_root(package) / rest).read_text(encoding="utf-8")
        shipped = bundle.read(entry).decode("utf-8")
        assert len(shipped) < len(installed) or '"""' not in installed, name
        assert shipped.count("\n") == installed.count("\n"), name
        assert _without_docstrings(ast.parse(shipped)) == \
            _without_docstrings(ast.parse(installed)), name
        checked += 1
    assert checked > 50
    assert not [e.filename for e in bundle.infolist() if e.filename.startswith(LEFT_OUT)]
    assert {e.filename.split("/")[0] for e in bundle.infolist()} == {*PACKAGES, "__main__.py"}


def test_a_line_keeps_its_number_and_its_code() -> None:
    source = (b'"""Module\n\ndoc."""\nimport os  # why\n\n\ndef f(x):\n    """One\n    two."""\n'
              b'    # alone\n    return "#" + x  # tail\n')
    assert compact(source) == (b'""\n\n\nimport os\n\n\ndef f(x):\n    ""\n\n\n'
                               b'    return "#" + x\n')
    assert compact(b"def broken(:\n") == b"def broken(:\n"  # left as it is


def test_the_pilot_runs_from_the_bundle(tmp_path: Path) -> None:
    (tmp_path / BUNDLE_FILE).write_bytes(pilot_bundle())
    # Outside this installation: only the bundle's packages are there to import.
    answer = subprocess.run([sys.executable, "-I", BUNDLE_FILE, "--help"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert answer.returncode == 0, answer.stderr
    assert "--matcher" in answer.stdout
    check = subprocess.run(
        [sys.executable, "-I", "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
         "import requests, urllib3, idna, charset_normalizer, pilot.loop, pilot.sandbox; "
         "print(requests.__file__)", BUNDLE_FILE], cwd=tmp_path, capture_output=True,
        text=True, timeout=60)
    assert check.returncode == 0, check.stderr
    assert BUNDLE_FILE in check.stdout
