"""The repository stands on its own: nothing in it points outside it, and every document it
cites under docs/ is there."""

from __future__ import annotations

import importlib
import re
import subprocess
from pathlib import Path

import pytest

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


CODE_PATH = re.compile(r"`((?:taskqueue|optimizers|matcher|pilot|client|agents|simulator|gridpilot"
                       r"|migrations)/[\w/]+\.py)`")
DOTTED = re.compile(r"`((?:taskqueue|optimizers|matcher|pilot|client|agents|simulator|gridpilot)"
                    r"(?:\.\w+)+)`")


def _resolves(dotted: str) -> bool:
    """Whether a dotted name is a module, or an attribute path inside one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


#: Dotted names in the documents that are files, not code (deploy/systemd/gridpilot.env.example).
_FILE_ENDINGS = (".toml", ".md", ".py", ".example", ".conf")
DOCUMENTS = sorted(str(p.relative_to(ROOT)) for p in [
    ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "bench" / "README.md",
    *(ROOT / "docs").glob("*.md")])


def _cited(doc: str) -> tuple[set[str], set[str]]:
    text = (ROOT / doc).read_text(encoding="utf-8")
    return (set(CODE_PATH.findall(text)),
            {n for n in DOTTED.findall(text) if not n.endswith(_FILE_ENDINGS)})


@pytest.mark.parametrize("doc", DOCUMENTS)
def test_the_code_a_document_names_is_there(doc: str) -> None:
    paths, names = _cited(doc)
    missing = sorted(p for p in paths if not (ROOT / p).is_file())
    missing += sorted(n for n in names if not _resolves(n))
    assert missing == []


def test_the_guides_to_the_code_name_much_of_it() -> None:
    """The glossary and the architecture are read for their names: the patterns find them."""
    assert {"docs/GLOSSARY.md", "docs/ARCHITECTURE.md", "docs/operator.md"} <= set(DOCUMENTS)
    for doc in ("docs/GLOSSARY.md", "docs/ARCHITECTURE.md"):
        paths, names = _cited(doc)
        assert len(paths) > 10 and len(names) > 3, doc
