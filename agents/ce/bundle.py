"""The pilot as one file a compute element can take along: a zip application (PEP 441) with
the ``pilot`` package and the pure-Python packages it needs (``requests`` and its own), run on
the worker node by any Python of the pilot's version (``python3 gridpilot-pilot.pyz ...``).

A grid site's worker nodes have a Python but not gridpilot: an ARC-CE's pilots get this file
as an input of their job, as DIRAC's pilots get their pilot files. It is built from what is
installed where the director runs, once per agent process, and the same installation gives
the same bytes (entries sorted, no times in them). Compiled modules are left out: the packages
taken all have pure-Python code for what the pilot uses (``charset_normalizer`` falls back to
its pure-Python detector).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import io
import zipfile
from pathlib import Path

#: The name the bundle has in a pilot's folder.
BUNDLE_FILE = "gridpilot-pilot.pyz"
#: What the bundle holds: the pilot, and what ``requests`` needs.
PACKAGES = ("pilot", "requests", "urllib3", "idna", "certifi", "charset_normalizer")
#: Files of those packages the bundle takes.
SUFFIXES = (".py", ".pem")
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
                if (path.is_file() and path.suffix in SUFFIXES
                        and "__pycache__" not in path.parts):
                    _add(zf, f"{name}/{path.relative_to(root).as_posix()}",
                         path.read_bytes())
    return raw.getvalue()


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
