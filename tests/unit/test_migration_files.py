"""No migration reads another migration's file: each carries the text it installs (a later
edit of one revision cannot change what another installs)."""

from __future__ import annotations

import re
from pathlib import Path

VERSIONS = Path(__file__).resolve().parents[2] / "migrations" / "versions"


def test_no_migration_reads_another_ones_file() -> None:
    offenders = []
    for path in sorted(VERSIONS.glob("[0-9]*.py")):
        own = path.name[:4]
        code = path.read_text(encoding="utf-8")
        named = {m for m in re.findall(r"\b(\d{4})_\w+\.(?:py|sql)\b", code) if m != own}
        if named or "importlib" in code or "spec_from_file_location" in code:
            offenders.append(f"{path.name}: {sorted(named) or 'imports by path'}")
    assert offenders == []


def test_the_check_sees_a_migration_that_loads_another() -> None:
    code = 'Path(__file__).with_name("0014_claim_function_postgresql.py")'
    assert re.findall(r"\b(\d{4})_\w+\.(?:py|sql)\b", code) == ["0014"]
