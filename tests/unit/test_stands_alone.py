"""The repository stands on its own: nothing in it points outside it, and every document it
cites under docs/ is there."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Spelled in two pieces so that this file does not cite it.
OUTSIDE = "../" + "shared"
DOC_PATH = re.compile(r"\bdocs/[\w./-]+?\.md\b")


def _tracked_text_files() -> dict[str, str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True,
                         timeout=60).stdout
    texts = {}
    for name in out.decode().split("\0"):
        path = ROOT / name
        if not name or not path.is_file():
            continue
        try:
            texts[name] = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
    return texts


def test_no_tracked_file_points_outside_the_repository() -> None:
    texts = _tracked_text_files()
    assert "README.md" in texts and "tests/unit/test_stands_alone.py" in texts  # files were read
    offenders = sorted(name for name, text in texts.items() if OUTSIDE in text)
    assert offenders == []


def test_every_cited_document_exists() -> None:
    missing = sorted({f"{name}: {cited}" for name, text in _tracked_text_files().items()
                      for cited in DOC_PATH.findall(text) if not (ROOT / cited).is_file()})
    assert missing == []


def test_the_readme_and_the_docstrings_cite_the_architecture_document() -> None:
    texts = _tracked_text_files()
    assert "docs/ARCHITECTURE.md" in texts["README.md"]
    bare = sorted(name for name, text in texts.items() if name.endswith(".py")
                  and re.search(r"(?<!docs/)ARCHITECTURE\.md", text))
    assert bare == []
