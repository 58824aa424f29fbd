"""Building and inspecting the database schema through the alembic revisions."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

import migrations
from taskqueue.core.errors import ConfigurationError
from taskqueue.core.settings import DatabaseSettings

UPGRADE_HINT = "run `gridpilot db upgrade` first"
#: What each database says of a table that is not there.
_MISSING_TABLE = ("no such table", "does not exist", "doesn't exist", "undefinedtable")


def alembic_config(engine: Engine) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    cfg.set_main_option("sqlalchemy.url",
                        engine.url.render_as_string(hide_password=False).replace("%", "%%"))
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    cfg = alembic_config(engine)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def head_revision(engine: Engine) -> str | None:
    return ScriptDirectory.from_config(alembic_config(engine)).get_current_head()


def require_schema(database: DatabaseSettings) -> None:
    """Refuse, with the command that fixes it, a database gridpilot's schema is not in (an
    SQLite file that does not exist yet is not created here)."""
    url = database.url
    require_sqlite_file(url)
    shown = make_url(url).render_as_string(hide_password=True)
    from taskqueue.db.database import engine_for

    engine = engine_for(database, pool_size=1)
    try:
        revision = current_revision(engine)
    finally:
        engine.dispose()
    if revision is None:
        raise ConfigurationError(f"the database {shown} has no gridpilot schema yet: "
                                 f"{UPGRADE_HINT}")


def require_sqlite_file(url: str) -> None:
    """Refuse an SQLite URL whose file does not exist (connecting would create it empty)."""
    parsed = make_url(url)
    file = parsed.database
    if (parsed.get_backend_name() == "sqlite" and file not in (None, "", ":memory:")
            and not Path(str(file)).is_file()):
        raise ConfigurationError(f"the database file {parsed.database} does not exist: "
                                     f"{UPGRADE_HINT}")


def missing_table(exc: DBAPIError) -> bool:
    """Whether a database error says a table is missing (the schema was never built)."""
    text = f"{type(exc.orig).__name__} {exc.orig}".lower()
    return any(m in text for m in _MISSING_TABLE) and ("table" in text or "relation" in text)
