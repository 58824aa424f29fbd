"""The acceptance scenario's own logic, without a grid: how it reads the tools' ``env`` output
and how its table counts what went wrong."""

from __future__ import annotations

from tests.acceptance.deploy import exports
from tests.acceptance.scenario import Report, starts, table


def test_exports_reads_shell_lines_as_the_shell_would() -> None:
    text = ("export GRIDPILOT_URL=https://localhost:4443\n"
            "# a comment\n"
            "export GRIDPILOT_TOKEN_FILE='/tmp/a folder/token'\n"
            'export QUOTED="x=y z"\n'
            "echo not an export\n")
    assert exports(text) == {"GRIDPILOT_URL": "https://localhost:4443",
                             "GRIDPILOT_TOKEN_FILE": "/tmp/a folder/token",
                             "QUOTED": "x=y z"}


def _row(job: int, status: str, expected: str, runs: int = 1, killed: int = 0,
         explain: bool | None = True, matched: int = 1,
         reschedules: int = 0) -> dict[str, object]:
    return {"label": f"j{job}", "job": job, "expected": expected, "status": status,
            "site": "S", "matched": matched, "runs": runs, "expected_runs": 1,
            "reschedules": reschedules, "explain": explain, "to_killed_pilot": killed,
            "pilot": "p"}


def test_the_table_counts_each_kind_of_failure() -> None:
    report = Report(jobs=[_row(1, "Done", "Done"), _row(2, "Waiting", "Done"),
                          _row(3, "Done", "Done", runs=2), _row(4, "Done", "Done", killed=1),
                          _row(5, "Done", "Done", explain=False),
                          # matched twice, started once: a match that went back unconfirmed
                          _row(6, "Done", "Done", matched=2)])
    report.check("something", True)
    report.check("something else", False)
    text = table(report)
    assert ("lost 1, run more often than rescheduled 1, matched to a killed pilot 1, "
            "explain disagreeing 1") in text
    assert "ok    something\n" in text and "FAIL  something else" in text
    assert "DISAGREES" in text and "2/1" in text
    # the jobs that broke a check come last, where a CI log's tail shows them; job 6 did not
    tail = text.split("FAIL  something else")[1]
    assert [line.split(" ")[1] for line in tail.split("\n") if line.startswith("job ")] == [
        "2", "3", "4", "5"]


def test_a_check_that_failed_once_stays_failed() -> None:
    report = Report()
    report.check("no job lost", False)
    report.check("no job lost", True)
    assert report.checks == {"no job lost": False}


def _history(*statuses: str) -> list[dict[str, object]]:
    return [{"at": "2026-12-07T00:00:00Z", "status": s, "minor_status": "", "source": "x"}
            for s in statuses]


def test_a_start_is_a_match_its_pilot_confirmed() -> None:
    # matched, the answer lost, back to its queue, matched again and run: one start
    assert starts(_history("Received", "Waiting", "Matched", "Waiting", "Matched", "Running",
                           "Done")) == 1
    # running, stalled, running again: still one start
    assert starts(_history("Waiting", "Matched", "Running", "Stalled", "Running", "Done")) == 1
    # rescheduled after it ran: two
    assert starts(_history("Waiting", "Matched", "Running", "Rescheduled", "Received",
                           "Waiting", "Matched", "Running", "Done")) == 2
    assert starts(_history("Received", "Waiting")) == 0
