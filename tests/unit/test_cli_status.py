"""gridpilot jobs --status refuses a status that does not exist (it listed "0 job(s)")."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from gridpilot.cli import cli


def test_an_unknown_status_is_refused_with_the_known_ones(tmp_path: Path) -> None:
    env = {"GRIDPILOT_DATABASE_URL": f"sqlite:///{tmp_path / 'g.db'}"}
    assert CliRunner().invoke(cli, ["db", "upgrade"], env=env).exit_code == 0
    result = CliRunner().invoke(cli, ["jobs", "--status", "Waitin"], env=env)
    assert result.exit_code == 2
    assert "'Waitin' is not one of" in result.output and "'waiting'" in result.output.lower()
