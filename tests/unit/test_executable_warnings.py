"""An Executable that names a file of the job's folder which nothing brings there: the
warnings the service and gridpilot-client give at submission."""

from __future__ import annotations

from pathlib import Path

from client.sandboxes import SCRIPT_SUFFIXES as CLIENT_SUFFIXES
from client.sandboxes import executable_warnings
from optimizers.description import SCRIPT_SUFFIXES, executable_notes, looks_like_file


def _script(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\necho hi\n")


# -- the service -----------------------------------------------------------------------------

def test_file_like_names() -> None:
    assert looks_like_file("run.sh") and looks_like_file("bin/run") and looks_like_file("A.PY")
    assert not looks_like_file("python3") and not looks_like_file("echo")
    assert CLIENT_SUFFIXES == SCRIPT_SUFFIXES


def test_the_service_warns_of_a_script_nothing_ships() -> None:
    (note,) = executable_notes("run.sh", [])
    assert 'Executable "run.sh"' in note and "ships no file" in note
    (note,) = executable_notes("bin/run", ["LFN:/lhcb/user/a/other.txt"])
    assert "ships no uploaded file" in note
    (note,) = executable_notes("run.sh", ["LFN:/lhcb/user/a/run.sh"])
    assert "LFN:/lhcb/user/a/run.sh" in note and "does not download" in note


def test_the_service_is_silent_when_it_cannot_know_better() -> None:
    sid = "sb:sha256:" + "0" * 64
    assert executable_notes("run.sh", [sid]) == []  # the sandbox may hold it
    assert executable_notes("python", []) == []  # a command of the PATH
    assert executable_notes("/opt/run.sh", []) == []
    assert executable_notes("$HOME/run.sh", []) == []
    assert executable_notes("run_%s.sh", []) == []


# -- the client ------------------------------------------------------------------------------

def test_the_client_checks_the_files_it_will_upload(tmp_path: Path) -> None:
    _script(tmp_path / "run.sh")
    _script(tmp_path / "tools" / "go.sh")
    ok = 'Executable = "run.sh"; InputSandbox = {"run.sh"};'
    assert executable_warnings(ok, "jdl", tmp_path) == []
    assert executable_warnings('Executable = "./tools/go.sh"; InputSandbox = {"tools"};',
                               "jdl", tmp_path) == []
    (flat,) = executable_warnings('Executable = "tools/go.sh"; InputSandbox = '
                                  '{"tools/go.sh"};', "jdl", tmp_path)
    assert 'Executable "tools/go.sh"' in flat and '"go.sh" is unpacked at the top' in flat
    (missing,) = executable_warnings('[ Executable = "other.sh"; InputSandbox = {run.sh}; ]',
                                     "jdl", tmp_path)
    assert 'Executable "other.sh" is not among the InputSandbox files' in missing
    assert executable_warnings('{"executable": "other.py", "input_sandbox": ["run.sh"]}',
                               "json", tmp_path) != []
    assert executable_warnings('{"executable": "run.sh", "input_sandbox": ["run.sh"]}',
                               "json", tmp_path) == []


def test_the_client_leaves_the_rest_to_the_service(tmp_path: Path) -> None:
    _script(tmp_path / "run.sh")
    sid = "sb:sha256:" + "0" * 64
    for text in ('Executable = "x.sh";',  # nothing local: the service warns
                 f'Executable = "x.sh"; InputSandbox = {{"run.sh", "{sid}"}};',
                 'Executable = "echo"; InputSandbox = {"run.sh"};',
                 'Executable = "/bin/x.sh"; InputSandbox = {"run.sh"};'):
        assert executable_warnings(text, "jdl", tmp_path) == [], text
    assert executable_warnings("not json", "json", tmp_path) == []


def test_the_service_takes_a_listed_name_for_the_file() -> None:
    """Names the client uploads (or a description not read by it lists): by the file's own
    name, or a folder holding it."""
    assert executable_notes("process.sh", ["%s", "process.sh"]) == []
    assert executable_notes("./run.sh", ["/home/u/run.sh"]) == []
    assert executable_notes("bin/run.sh", ["file:///home/u/bin/"]) == []
    assert executable_notes("bin/run.sh", ["bin/run.sh"]) == []
    assert executable_notes("bin/run.sh", ["run.sh"]) != []


def test_the_service_says_when_the_executable_climbs_out_of_the_folder() -> None:
    """"../x" is not a file of the job's folder, whatever the InputSandbox ships."""
    for name in ("../x", "a/../../run.sh", "./../bin/run.sh"):
        (note,) = executable_notes(name, ["x", "run.sh", "bin"])
        assert f'Executable "{name}" names a file outside the job\'s folder' in note
        assert "in the job's folder, but" not in note
    assert executable_notes("a/../run.sh", ["run.sh"]) == []  # stays inside
    (note,) = executable_notes("../" + "x" * 5000, [])
    assert len(note) < 600
