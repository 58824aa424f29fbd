"""The alembic environment and the reviewed schema revisions of gridpilot's database."""
