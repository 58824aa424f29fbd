"""The canonical texts of the database claim functions: ``claim_postgresql.sql`` (the
PL/pgSQL function) and ``claim_mariadb.sql`` (the stored procedure), both named
``gridpilot_claim``. A migration installs each from a copy of its own; the tests hold what
``upgrade head`` installs equal to these files."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

_HERE = Path(__file__).resolve().parent


def canonical_text(database: Literal["postgresql", "mariadb"]) -> str:
    """The statement that creates the claim function of ``database``, as its file holds it."""
    return (_HERE / f"claim_{database}.sql").read_text(encoding="utf-8")
