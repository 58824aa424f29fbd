"""The acceptance scenario's own logic, without a grid: how it reads the tools' ``env`` output
and how its table counts what went wrong."""

from __future__ import annotations

from tests.acceptance.deploy import exports
from tests.acceptance.scenario import Report, table


def test_exports_reads_shell_lines_as_the_shell_would() -> None:
    text = ("export GRIDPILOT_URL=https://localhost:4443\n"
            "# a comment\n"
            "export GRIDPILOT_TOKEN_FILE='/tmp/a folder/token'\n"
            'export QUOTED="x=y z"\n'
            "echo not an export\n")
    assert exports(text) == {"GRIDPILOT_URL": "https://localhost:4443",
                             "GRIDPILOT_TOKEN_FILE": "/tmp/a folder/token",
                             "QUOTED": "x=y z"}


def _row(job: int, status: str, expected: str, matched: int = 1, killed: int = 0,
         explain: bool | None = True) -> dict[str, object]:
    return {"label": f"j{job}", "job": job, "expected": expected, "status": status,
            "site": "S", "matched": matched, "expected_matches": 1, "reschedules": 0,
            "explain": explain, "to_killed_pilot": killed, "pilot": "p"}


def test_the_table_counts_each_kind_of_failure() -> None:
    report = Report(jobs=[_row(1, "Done", "Done"), _row(2, "Waiting", "Done"),
                          _row(3, "Done", "Done", matched=2), _row(4, "Done", "Done", killed=1),
                          _row(5, "Done", "Done", explain=False)])
    report.check("something", True)
    report.check("something else", False)
    text = table(report)
    assert ("lost 1, run more often than rescheduled 1, matched to a killed pilot 1, "
            "explain disagreeing 1") in text
    assert "ok    something\n" in text and "FAIL  something else" in text
    assert "DISAGREES" in text and "2/1" in text


def test_a_check_that_failed_once_stays_failed() -> None:
    report = Report()
    report.check("no job lost", False)
    report.check("no job lost", True)
    assert report.checks == {"no job lost": False}
