"""MariaDB: the claims that threads of one matcher process make at the same time run as one
group, one CALL and one transaction, as they do on PostgreSQL (taskqueue.pilotmatch): a
durable commit then serves the whole group.

``gridpilot_claim_one`` is migration 0015's procedure without its own transaction (the same
text, its transaction statements taken out). ``gridpilot_claim_group(p_calls)`` takes the
calls' arguments as one JSON array of argument arrays (in the procedure's order; lists as
their JSON text, as a single call sends them), and calls ``gridpilot_claim_one`` for each in
order, in one READ COMMITTED transaction: each call sees what the calls before it did. Each
call answers with its own result set, in the calls' order. Any error rolls the whole group
back and is raised again: the caller then runs each claim alone.

Revision ID: 0029
Revises: 0028
Create Date: 2026-11-29 00:30:00.000000
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

from alembic import op

revision: str = "0029"
down_revision: str | None = "0028"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: What 0015's procedure has that its body without a transaction does not.
_OWN_TRANSACTION = (
    ("CREATE PROCEDURE gridpilot_claim(", "CREATE PROCEDURE gridpilot_claim_one("),
    ("""    DECLARE EXIT HANDLER FOR SQLEXCEPTION
    BEGIN
        ROLLBACK;
        RESIGNAL;
    END;
""", ""),
    ("""    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    START TRANSACTION;
""", ""),
    ("""     ORDER BY c.n;
    COMMIT;
END""", """     ORDER BY c.n;
END"""),
)

#: The procedure's inputs (JSON_VALUE hands each back as text, or NULL for a JSON null).
_ARGUMENTS = 19

GROUP_PROCEDURE = """
CREATE PROCEDURE gridpilot_claim_group(p_calls LONGTEXT)
MODIFIES SQL DATA
BEGIN
    DECLARE v_i INT DEFAULT 0;
    DECLARE v_n INT DEFAULT COALESCE(JSON_LENGTH(p_calls), 0);
    DECLARE EXIT HANDLER FOR SQLEXCEPTION
    BEGIN
        ROLLBACK;
        RESIGNAL;
    END;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    START TRANSACTION;
    WHILE v_i < v_n DO
        CALL gridpilot_claim_one(%s);
        SET v_i = v_i + 1;
    END WHILE;
    COMMIT;
END
""" % ", ".join(f"JSON_VALUE(p_calls, CONCAT('$[', v_i, '][{k}]'))" for k in range(_ARGUMENTS))


def _claim_procedure_0015() -> str:
    path = Path(__file__).with_name("0015_claim_procedure_mariadb.py")
    spec = importlib.util.spec_from_file_location("gridpilot_migration_0015", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text: str = module.CLAIM_PROCEDURE
    return text


def claim_one_procedure() -> str:
    """Migration 0015's procedure, without its own transaction."""
    text = _claim_procedure_0015()
    for old, new in _OWN_TRANSACTION:
        if text.count(old) != 1:
            raise RuntimeError("migration 0029: the claim procedure of 0015 is not the one "
                               "this revision was written for")
        text = text.replace(old, new)
    return text


def upgrade() -> None:
    if op.get_bind().dialect.name in ("mysql", "mariadb"):
        op.execute(claim_one_procedure())
        op.execute(GROUP_PROCEDURE)


def downgrade() -> None:
    if op.get_bind().dialect.name in ("mysql", "mariadb"):
        op.execute("DROP PROCEDURE IF EXISTS gridpilot_claim_group")
        op.execute("DROP PROCEDURE IF EXISTS gridpilot_claim_one")
