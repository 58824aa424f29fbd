"""The claim function (PostgreSQL) and procedure (MariaDB) installed by ``upgrade head`` are
exactly their canonical files, taskqueue/matching/sql/claim_postgresql.sql and
claim_mariadb.sql: an edit of a file without a migration that installs it, or a migration that
installs other text, fails here.

PostgreSQL: the file is created in a schema of its own and both functions are compared as the
server prints them (``pg_get_functiondef``: arguments, result, settings and body). MariaDB:
``SHOW CREATE PROCEDURE`` gives the text as it was sent, which is compared with the file. Both
with whitespace runs made one space.
"""

from __future__ import annotations

import difflib
import re

import pytest
from sqlalchemy import text

from taskqueue.matching.sql import canonical_text
from tests.conftest import BACKENDS, Database

SERVERS = [b for b in ("postgresql", "mariadb") if b in BACKENDS]
if not SERVERS:
    pytest.skip("the claim function and procedure need a PostgreSQL or MariaDB server",
                allow_module_level=True)

pytestmark = pytest.mark.parametrize("database", SERVERS, indirect=True)

_SCRATCH = "gp_canonical_claim"


def _normal(sql: str) -> str:
    """``sql`` without the comment lines that open it, its whitespace runs made one space."""
    lines = sql.strip().splitlines()
    while lines and (lines[0].startswith("--") or not lines[0].strip()):
        lines.pop(0)
    return " ".join("\n".join(lines).split())


def _same(installed: str, canonical: str, what: str) -> None:
    a, b = _normal(installed), _normal(canonical)
    if a != b:
        diff = "\n".join(difflib.unified_diff(
            b.replace("; ", ";\n").splitlines(), a.replace("; ", ";\n").splitlines(),
            "canonical file", "installed", lineterm="", n=1))
        pytest.fail(f"the installed {what} differs from its canonical file:\n{diff}")


def _installed_postgresql(db: Database) -> tuple[str, str]:
    """(installed, canonical) function definitions as PostgreSQL prints them."""
    query = text("SELECT pg_get_functiondef(p.oid) FROM pg_proc p "
                 "JOIN pg_namespace n ON n.oid = p.pronamespace "
                 "WHERE p.proname = 'gridpilot_claim' AND n.nspname = :schema")
    with db.engine.begin() as conn:
        installed = conn.execute(query, {"schema": "public"}).scalars().all()
        conn.exec_driver_sql(f"CREATE SCHEMA {_SCRATCH}")
        try:
            conn.exec_driver_sql(f"SET LOCAL search_path TO {_SCRATCH}")
            conn.execute(text(canonical_text("postgresql")))
            canonical = conn.execute(query, {"schema": _SCRATCH}).scalar_one()
        finally:
            conn.exec_driver_sql(f"DROP SCHEMA {_SCRATCH} CASCADE")
    assert len(installed) == 1, f"{len(installed)} functions gridpilot_claim are installed"
    return installed[0], canonical.replace(f"{_SCRATCH}.gridpilot_claim", "public.gridpilot_claim")


def _installed_mariadb(db: Database) -> str:
    with db.engine.connect() as conn:
        row = conn.exec_driver_sql("SHOW CREATE PROCEDURE gridpilot_claim").one()
    created = str(row[2])
    # The server adds the definer, quotes the name and keeps no OR REPLACE: the rest is the
    # text as sent.
    return re.sub(r"^CREATE\s+DEFINER=\S+\s+PROCEDURE\s+`gridpilot_claim`",
                  "CREATE OR REPLACE PROCEDURE gridpilot_claim", created.strip())


def test_the_installed_claim_is_its_canonical_file(db: Database) -> None:
    if db.backend == "postgresql":
        installed, canonical = _installed_postgresql(db)
        _same(installed, canonical, "function gridpilot_claim")
    else:
        _same(_installed_mariadb(db), canonical_text("mariadb"), "procedure gridpilot_claim")


def test_a_changed_file_would_be_seen(db: Database) -> None:
    """The comparison sees a change of one comparison sign in the walk."""
    canonical = canonical_text("postgresql" if db.backend == "postgresql" else "mariadb")
    assert "t.memory <= p_mem" in canonical
    changed = canonical.replace("t.memory <= p_mem", "t.memory < p_mem")
    if db.backend == "postgresql":
        installed, _ = _installed_postgresql(db)
        with db.engine.begin() as conn:
            conn.exec_driver_sql(f"CREATE SCHEMA {_SCRATCH}")
            try:
                conn.exec_driver_sql(f"SET LOCAL search_path TO {_SCRATCH}")
                conn.execute(text(changed))
                other = conn.execute(text(
                    "SELECT pg_get_functiondef(p.oid) FROM pg_proc p JOIN pg_namespace n "
                    "ON n.oid = p.pronamespace WHERE p.proname = 'gridpilot_claim' "
                    "AND n.nspname = :schema"), {"schema": _SCRATCH}).scalar_one()
            finally:
                conn.exec_driver_sql(f"DROP SCHEMA {_SCRATCH} CASCADE")
        other = other.replace(f"{_SCRATCH}.gridpilot_claim", "public.gridpilot_claim")
        assert _normal(installed) != _normal(other)
    else:
        assert _normal(_installed_mariadb(db)) != _normal(changed)
