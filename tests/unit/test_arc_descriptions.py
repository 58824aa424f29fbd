"""ADL descriptions for an ARC-CE (agents.ce.adl) and the mapping of ARC's REST states to the
pilot statuses (agents.ce.arcrest), without a CE."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from agents.ce.adl import (
    ADL,
    BULK,
    NORDUGRID_ADL,
    DescriptionError,
    bulk,
    job_description,
    with_delegation,
)
from agents.ce.arcrest import FINAL_STATES, PILOT_STATUS, UNKNOWN, pilot_status
from taskqueue.pilots.records import FINAL_PILOT_STATES, PILOT_STATES, WAITING_STATES

#: The states of A-REX's REST interface (src/services/a-rex/rest/rest.cpp, 6.17).
ARC_REST_STATES = ("ACCEPTING", "ACCEPTED", "PREPARING", "PREPARED", "SUBMITTING", "QUEUING",
                   "RUNNING", "HELD", "EXITINGLRMS", "OTHER", "EXECUTED", "FINISHING",
                   "KILLING", "FINISHED", "FAILED", "KILLED", "WIPED")


def adl(tag: str) -> str:
    return f"{{{ADL}}}{tag}"


def test_a_description_holds_the_command_resources_and_files() -> None:
    text = job_description("/usr/bin/python3", ["-m", "pilot.cli", "--cores", "8",
                                                "--name", "a <b> & 'c' \"d\""],
                           name="pilot-1", queue="grid", cores=8, memory_mb=2048,
                           wall_minutes=90, environment={"GRIDPILOT_SITE": "LCG.A.b"},
                           input_files=["pilot.token"], output_files=["pilot.log"])
    root = ET.fromstring(text)
    assert root.tag == adl("ActivityDescription")
    assert root.findtext(f"{adl('ActivityIdentification')}/{adl('Name')}") == "pilot-1"
    exe = root.find(f"{adl('Application')}/{adl('Executable')}")
    assert exe is not None
    assert exe.findtext(adl("Path")) == "/usr/bin/python3"
    assert [a.text for a in exe.findall(adl("Argument"))] == [
        "-m", "pilot.cli", "--cores", "8", "--name", "a <b> & 'c' \"d\""]
    res = root.find(adl("Resources"))
    assert res is not None
    assert res.findtext(adl("QueueName")) == "grid"
    assert res.findtext(f"{adl('SlotRequirement')}/{adl('NumberOfSlots')}") == "8"
    assert res.findtext(f"{adl('SlotRequirement')}/{adl('SlotsPerHost')}") == "8"
    assert res.findtext(adl("IndividualPhysicalMemory")) == str(2048 * 1024 * 1024)
    assert res.findtext(adl("WallTime")) == str(90 * 60)
    env = root.find(f"{adl('Application')}/{adl('Environment')}")
    assert env is not None and env.findtext(adl("Value")) == "LCG.A.b"
    staging = root.find(adl("DataStaging"))
    assert staging is not None
    assert [f.findtext(adl("Name")) for f in staging.findall(adl("InputFile"))] == [
        "pilot.token"]
    # stdout and stderr are kept for download, with the other output files.
    assert [f.findtext(adl("Name")) for f in staging.findall(adl("OutputFile"))] == [
        "pilot.out", "pilot.err", "pilot.log"]


@pytest.mark.parametrize("word", ["$HOME", "`id`", "$(id)", "two\nlines", "a\rb"])
def test_a_command_line_a_shell_would_change_is_refused(word: str) -> None:
    with pytest.raises(DescriptionError, match="expand"):
        job_description("/bin/echo", [word])
    with pytest.raises(DescriptionError, match="expand"):
        job_description(f"/bin/{word}")


def test_such_values_may_travel_in_the_environment() -> None:
    text = job_description("/bin/sh", ["job.sh"], environment={"PATTERN": "$HOME `id`"})
    assert "$HOME `id`" in text


@pytest.mark.parametrize("name", ["", "/etc/passwd", "../up", "a/../b", "a//b", "./x", "x\n",
                                  "nul\0"])
def test_a_file_outside_the_session_directory_is_refused(name: str) -> None:
    with pytest.raises(DescriptionError, match="session directory"):
        job_description("/bin/true", input_files=[name])


@pytest.mark.parametrize("changes", [{"cores": 0}, {"memory_mb": 0}, {"wall_minutes": 0},
                                     {"environment": {"1BAD": "x"}},
                                     {"environment": {"A-B": "x"}},
                                     {"environment": {"OK": "nul\0"}}])
def test_impossible_resources_and_environments_are_refused(changes: dict[str, object]) -> None:
    with pytest.raises(DescriptionError):
        job_description("/bin/true", **changes)  # type: ignore[arg-type]


def test_a_delegation_is_written_once_into_the_data_staging() -> None:
    text = with_delegation(with_delegation(job_description("/bin/true"), "old"), "new")
    staging = ET.fromstring(text).find(adl("DataStaging"))
    assert staging is not None
    assert [d.text for d in staging.findall(f"{{{NORDUGRID_ADL}}}DelegationID")] == ["new"]
    # A description without a DataStaging element gets one.
    bare = f'<ActivityDescription xmlns="{ADL}"><Application/></ActivityDescription>'
    assert "new" in with_delegation(bare, "new")


def test_a_bulk_wraps_several_descriptions_and_refuses_what_is_not_adl() -> None:
    one = job_description("/bin/true")
    assert ET.fromstring(bulk([one])).tag == adl("ActivityDescription")
    many = ET.fromstring(bulk([one, '<?xml version="1.0"?>' + one]))
    assert many.tag == BULK and len(many) == 2
    with pytest.raises(DescriptionError, match="not XML"):
        bulk([one, "&(executable=/bin/true)"])
    with pytest.raises(DescriptionError, match="not an ADL"):
        bulk(["<job/>"])


def test_every_arc_state_has_a_pilot_status() -> None:
    assert set(PILOT_STATUS) == {*ARC_REST_STATES, UNKNOWN}
    assert set(PILOT_STATUS.values()) <= set(PILOT_STATES)
    assert pilot_status("SOMETHING-NEWER") is None


def test_a_job_not_yet_running_counts_as_a_waiting_pilot() -> None:
    for state in ("ACCEPTING", "ACCEPTED", "PREPARING", "PREPARED", "SUBMITTING", "QUEUING",
                  "HELD"):
        assert PILOT_STATUS[state] in WAITING_STATES, state
    for state in ("RUNNING", "EXECUTED", "FINISHING", "KILLING"):
        assert PILOT_STATUS[state] == "Running", state


def test_only_final_arc_states_give_final_pilot_statuses() -> None:
    for state, status in PILOT_STATUS.items():
        assert (status in FINAL_PILOT_STATES) == (state in FINAL_STATES), state
    assert pilot_status("FAILED") == "Failed" and pilot_status("KILLED") == "Aborted"
    assert pilot_status("WIPED") == pilot_status(UNKNOWN) == "Lost"
