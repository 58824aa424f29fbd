"""gridpilot jobs --status refuses a status that does not exist (it listed "0 job(s)")."""

from __future__ import annotations

from click.testing import CliRunner

from gridpilot.cli import cli


def test_an_unknown_status_is_refused_with_the_known_ones() -> None:
    result = CliRunner().invoke(cli, ["jobs", "--status", "Waitin"])
    assert result.exit_code == 2
    assert "'Waitin' is not one of" in result.output and "'waiting'" in result.output.lower()
