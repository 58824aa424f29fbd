"""``--help`` never needs a database: an operator reads it before making one."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from agents.runner import LOOP_NAMES
from gridpilot.cli import cli


@pytest.mark.parametrize("command", [["serve"], ["agents"], ["submit"], ["jobs"], ["job"],
                                     ["explain"], ["queues", "list"], ["sandboxes", "usage"]])
def test_help_is_shown_without_a_database(tmp_path: Path, command: list[str]) -> None:
    env = {"GRIDPILOT_DATABASE_URL": f"sqlite:///{tmp_path / 'none.db'}"}
    result = CliRunner().invoke(cli, [*command, "--help"], env=env)
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"Usage: cli {' '.join(command)} ")
    assert not (tmp_path / "none.db").exists()


def test_a_command_still_refuses_a_missing_database_file(tmp_path: Path) -> None:
    env = {"GRIDPILOT_DATABASE_URL": f"sqlite:///{tmp_path / 'none.db'}"}
    result = CliRunner().invoke(cli, ["jobs"], env=env)
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        f"Error: the database file {tmp_path / 'none.db'} does not exist: "
        f"run `gridpilot db upgrade` first"]
    assert not (tmp_path / "none.db").exists()


def test_agents_help_lists_every_loop() -> None:
    result = CliRunner().invoke(cli, ["agents", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    listed = text.split("given): ", 1)[1].split(". ", 1)[0]
    assert tuple(listed.split(", ")) == LOOP_NAMES


def test_the_operators_guide_lists_every_loop() -> None:
    readme = (Path(__file__).resolve().parents[2] / "docs" / "operator.md").read_text(
        encoding="utf-8")
    line = readme.index("gridpilot agents    ")
    comment = " ".join(part.split("#", 1)[1].strip() for part in
                       readme[line:].split("\n\n", 1)[0].splitlines()[:3])
    assert tuple(comment.replace(",", " ").split()) == LOOP_NAMES
