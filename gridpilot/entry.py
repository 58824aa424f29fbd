"""The ``gridpilot`` console script: the service commands, or a clear word about the extra
they need when only the pilot's or the client's part is installed."""

from __future__ import annotations

import sys

#: The modules only the 'server' extra installs.
SERVER_MODULES = frozenset({"sqlalchemy", "alembic", "flask", "werkzeug", "gunicorn",
                            "psycopg", "pymysql", "classad2", "htcondor", "psij", "jwt",
                            "packaging"})


def main() -> None:
    try:
        from gridpilot.cli import cli
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in SERVER_MODULES and exc.name != "click":
            raise
        sys.stderr.write(
            f"gridpilot: the service commands (db, serve, agents, submit, ...) need the "
            f"'server' extra, and {exc.name} is not installed: pip install "
            f"'gridpilot[server]'.\nThis installation has what the 'pilot' extra gives: "
            f"gridpilot-pilot, gridpilot-drain-cost and gridpilot-client.\n")
        sys.exit(2)
    sys.exit(cli())
