"""An Executable that names a file of the job's folder which nothing brings there: the
warning the service gives at submission."""

from __future__ import annotations

from optimizers.description import executable_notes, looks_like_file

# -- the service -----------------------------------------------------------------------------

def test_file_like_names() -> None:
    assert looks_like_file("run.sh") and looks_like_file("bin/run") and looks_like_file("A.PY")
    assert not looks_like_file("python3") and not looks_like_file("echo")


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


def test_the_service_takes_a_listed_name_for_the_file() -> None:
    """Names the client uploads (or a description not read by it lists): by the file's own
    name, or a folder holding it."""
    assert executable_notes("process.sh", ["%s", "process.sh"]) == []
    assert executable_notes("./run.sh", ["/home/u/run.sh"]) == []
    assert executable_notes("bin/run.sh", ["file:///home/u/bin/"]) == []
    assert executable_notes("bin/run.sh", ["bin/run.sh"]) == []
    assert executable_notes("bin/run.sh", ["run.sh"]) != []
