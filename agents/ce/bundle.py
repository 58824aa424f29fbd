"""The pilot as one file a compute element can take along: a zip application (PEP 441) with
the ``pilot`` package and the pure-Python packages it needs (``requests`` and its own), run on
the worker node by any Python of the pilot's version (``python3 gridpilot-pilot.pyz ...``).

A grid site's worker nodes have a Python but not gridpilot: an ARC-CE's pilots get this file
as an input of their job, as DIRAC's pilots get their pilot files. It is built from what is
installed where the director runs, once per agent process, and the same installation gives
the same bytes (entries sorted, no times in them). Compiled modules are left out: the packages
taken all have pure-Python code for what the pilot uses (``charset_normalizer`` falls back to
its pure-Python detector).

Every pilot of an ARC-CE uploads it, so it is kept small: the modules the pilot never imports
(``LEFT_OUT``: those packages' tests, command lines, and the back ends of other platforms) are
left out, and the docstrings and comments of the rest are removed, keeping every line where it
was (a traceback from the bundle names the installed source's lines). With requests 2.32 that
makes 368 KB of 515, of which certifi's CA file is 129 KB.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import io
import tokenize
import zipfile
from pathlib import Path

#: The name the bundle has in a pilot's folder.
BUNDLE_FILE = "gridpilot-pilot.pyz"
#: What the bundle holds: the pilot, and what ``requests`` needs.
PACKAGES = ("pilot", "requests", "urllib3", "idna", "certifi", "charset_normalizer")
#: Files of those packages the bundle takes.
SUFFIXES = (".py", ".pem")
#: What the pilot never imports, by path in the bundle (a folder ends with "/"): tests,
#: command lines, WebAssembly and pyOpenSSL back ends, HTTP/2 (which needs h2), idna's codec.
LEFT_OUT = ("certifi/tests/", "certifi/__main__.py", "charset_normalizer/cli/",
            "charset_normalizer/__main__.py", "idna/cli.py", "idna/__main__.py",
            "idna/codec.py", "idna/compat.py", "requests/help.py",
            "urllib3/contrib/emscripten/", "urllib3/contrib/pyopenssl.py",
            "urllib3/http2/connection.py")
MAIN = b'''\
"""gridpilot's pilot, run from its bundle."""
import sys

from pilot.cli import main

sys.exit(main())
'''
#: 1980-01-01, the earliest time a zip entry can carry: no build time in the bundle.
EPOCH = (1980, 1, 1, 0, 0, 0)


@functools.cache
def pilot_bundle() -> bytes:
    """The bundle's bytes, built from the packages this process imports."""
    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        _add(zf, "__main__.py", MAIN)
        for name in PACKAGES:
            root = _package_root(name)
            for path in sorted(root.rglob("*")):
                entry = f"{name}/{path.relative_to(root).as_posix()}"
                if (path.is_file() and path.suffix in SUFFIXES
                        and "__pycache__" not in path.parts
                        and not entry.startswith(LEFT_OUT)):
                    data = path.read_bytes()
                    _add(zf, entry, compact(data) if path.suffix == ".py" else data)
    return raw.getvalue()


def compact(source: bytes) -> bytes:
    """Python ``source`` without its docstrings and comments, each line where it was; the
    source as it is when it cannot be read (it then fails on the node as it would here)."""
    try:
        text = source.decode("utf-8")
        tree = ast.parse(text)
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return source
    docstrings = {(node.body[0].lineno, node.body[0].col_offset) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef
                                | ast.AsyncFunctionDef)
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)
                  and isinstance(node.body[0].value.value, str)}
    lines = text.splitlines(keepends=True)
    # From the end, so that the positions of what is left to cut still hold.
    for token in reversed(tokens):
        (row, col), (end_row, end_col) = token.start, token.end
        if token.type == tokenize.COMMENT:
            line = lines[row - 1]
            lines[row - 1] = line[:col].rstrip() + line[len(line.rstrip("\r\n")):]
        elif (token.type == tokenize.STRING
              and (row, _byte_col(lines[row - 1], col)) in docstrings):
            tail = lines[end_row - 1][end_col:]
            lines[row - 1] = lines[row - 1][:col] + '""' + tail
            for blank in range(row, end_row):
                lines[blank] = "\n"
    return "".join(lines).encode("utf-8")


def _byte_col(line: str, col: int) -> int:
    """The UTF-8 byte offset of character ``col`` of ``line`` (what ast counts in)."""
    return len(line[:col].encode("utf-8"))


def bundle_digest() -> str:
    return hashlib.sha256(pilot_bundle()).hexdigest()


def _package_root(name: str) -> Path:
    module = importlib.import_module(name)
    if module.__file__ is None:
        raise RuntimeError(f"{name} is not installed as files: the pilot bundle needs it")
    return Path(module.__file__).parent


def _add(zf: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, date_time=EPOCH)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    zf.writestr(info, data)
