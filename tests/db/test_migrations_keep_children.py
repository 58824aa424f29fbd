"""No migration drops, on SQLite, a table whose rows other tables' rows hang on with
ON DELETE CASCADE (or SET NULL / SET DEFAULT).

SQLite alters most things by copying the table: alembic's batch mode (and any hand-written
recreate) creates the new table, copies the rows, drops the old table and renames the new one.
With foreign keys on (as gridpilot always runs SQLite, taskqueue.db.database), dropping the old
table first deletes its rows, and with them, silently, every child row that references them
with ON DELETE CASCADE (or nulls the children's keys with SET NULL): the copy keeps the parent's
rows but the children are gone.

The test upgrades an SQLite database through every migration, one revision at a time, as
``gridpilot`` does (foreign keys on), and watches every DROP TABLE the migrations send: at that
moment no other table may reference the dropped one with such an action. Watching the
statements rather than counting rows seeded in every child table needs no made-up rows (which
every new table, CHECK and trigger would have to be taught), sees a recreate however it is
written (batch mode, raw SQL), and names the revision, the table and the child. Only SQLite
copies tables this way; PostgreSQL and MariaDB alter them in place (and refuse to drop a table
still referenced), so there is nothing to watch there.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alembic import command
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, event

from gridpilot import schema
from taskqueue.db.database import make_engine

#: What a DROP TABLE of a parent does to its children's rows.
HARMFUL = ("CASCADE", "SET NULL", "SET DEFAULT")
_DROP = re.compile(r'^\s*DROP\s+TABLE\s+(?:IF\s+EXISTS\s+)?["`\[]?(\w+)', re.IGNORECASE)


@dataclass(frozen=True)
class Harm:
    revision: str
    dropped: str
    child: str
    action: str

    def __str__(self) -> str:
        return (f"revision {self.revision} drops table {self.dropped} (a copy, e.g. "
                f"batch_alter_table), and {self.child} references it ON DELETE {self.action}: "
                f"on SQLite with foreign keys on, every {self.child} row is "
                f"{'deleted' if self.action == 'CASCADE' else 'changed'}")


@contextmanager
def watching(engine: Engine, found: list[Harm], revision: Callable[[], str]) -> Iterator[None]:
    """Add to ``found`` each DROP TABLE sent on ``engine`` while another table references the
    dropped one with a harmful ON DELETE action and foreign keys are on (``revision()``: the
    revision being applied)."""

    def watch(conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        match = _DROP.match(statement)
        if not match:
            return
        dropped = match.group(1).lower()
        raw = conn.connection.dbapi_connection  # sqlite3's own: no events, same transaction
        if not raw.execute("PRAGMA foreign_keys").fetchone()[0]:
            return
        tables = [row[0] for row in raw.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")]
        for child in tables:
            if child.lower() == dropped:
                continue
            for key in raw.execute(f'PRAGMA foreign_key_list("{child}")'):
                parent, action = str(key[2]).lower(), str(key[6]).upper()
                if parent == dropped and action in HARMFUL:
                    found.append(Harm(revision(), dropped, child, action))

    event.listen(engine, "before_cursor_execute", watch)
    try:
        yield
    finally:
        event.remove(engine, "before_cursor_execute", watch)


def harmful_drops(engine: Engine) -> list[Harm]:
    """Upgrade ``engine``'s (empty SQLite) database through every revision, one at a time,
    and return the harmful drops (:func:`watching`) each sent."""
    config = schema.alembic_config(engine)
    revisions = [script.revision for script in
                 reversed(list(ScriptDirectory.from_config(config).walk_revisions()))]
    found: list[Harm] = []
    applying = [""]
    with watching(engine, found, lambda: applying[0]):
        for revision in revisions:
            applying[0] = revision
            with engine.begin() as conn:
                config.attributes["connection"] = conn
                command.upgrade(config, revision)
    assert schema.current_revision(engine) == schema.head_revision(engine)
    return found


def test_no_migration_drops_a_table_with_cascading_children(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'gridpilot.db'}")
    try:
        harms = harmful_drops(engine)
    finally:
        engine.dispose()
    assert not harms, "\n".join(map(str, dict.fromkeys(harms)))


def test_the_watch_sees_batch_mode_copy_a_parent_of_cascading_children(tmp_path: Path) -> None:
    """The watch itself: alembic's batch mode copying a parent whose cascading child holds a
    row is reported, and the child's row is indeed gone while the parent's is kept."""
    engine = make_engine(f"sqlite:///{tmp_path / 'gridpilot.db'}")
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE parent (id INTEGER PRIMARY KEY, n INTEGER)")
            conn.exec_driver_sql("CREATE TABLE child (id INTEGER PRIMARY KEY, parent_id "
                                 "INTEGER REFERENCES parent (id) ON DELETE CASCADE)")
            conn.exec_driver_sql("INSERT INTO parent VALUES (1, 1)")
            conn.exec_driver_sql("INSERT INTO child VALUES (1, 1)")
        found: list[Harm] = []
        with watching(engine, found, lambda: "test"), engine.begin() as conn:
            operations = Operations(MigrationContext.configure(conn))
            with operations.batch_alter_table("parent", recreate="always") as batch:
                batch.alter_column("n", new_column_name="m")
        assert found == [Harm("test", "parent", "child", "CASCADE")]
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM parent").scalar() == 1
            assert conn.exec_driver_sql("SELECT count(*) FROM child").scalar() == 0
    finally:
        engine.dispose()
