"""An Executable that names a file of the job's folder: how the pilot finds and starts it, as
DIRAC's job wrapper does."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from pilot.payload import resolve_executable

PATH = os.defpath  # /bin and /usr/bin: sh and echo are there


def _script(path: Path, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\necho hi\n")
    path.chmod(mode)
    return path


def test_a_shipped_file_runs_by_its_path_and_is_made_executable(tmp_path: Path) -> None:
    script = _script(tmp_path / "run.sh")
    assert resolve_executable("run.sh", tmp_path, PATH) == str(script.absolute())
    assert stat.S_IMODE(script.stat().st_mode) == 0o744  # u+x only, as asked


def test_a_relative_path_into_the_folder_is_found_there(tmp_path: Path) -> None:
    script = _script(tmp_path / "bin" / "run.sh", 0o755)
    assert resolve_executable("bin/run.sh", tmp_path, PATH) == str(script.absolute())
    assert resolve_executable("./bin/run.sh", tmp_path, PATH) == str(
        (tmp_path / "./bin/run.sh").absolute())
    assert stat.S_IMODE(script.stat().st_mode) == 0o755


def test_a_name_without_slash_on_the_path_is_the_path_s_program(tmp_path: Path) -> None:
    """DIRAC's job wrapper looks a name without "/" up on the PATH first."""
    _script(tmp_path / "sh")
    assert resolve_executable("sh", tmp_path, PATH) == "sh"
    assert stat.S_IMODE((tmp_path / "sh").stat().st_mode) == 0o644


def test_what_is_not_a_file_of_the_folder_is_left_as_it_is(tmp_path: Path) -> None:
    (tmp_path / "adir").mkdir()
    assert resolve_executable("missing.sh", tmp_path, PATH) == "missing.sh"
    assert resolve_executable("adir", tmp_path, PATH) == "adir"
    assert resolve_executable("/bin/true", tmp_path, PATH) == "/bin/true"
    assert resolve_executable("bad\0name", tmp_path, PATH) == "bad\0name"


def test_a_link_is_followed_but_its_target_keeps_its_mode(tmp_path: Path) -> None:
    target = _script(tmp_path / "elsewhere" / "t.sh")
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "run.sh").symlink_to(target)
    assert resolve_executable("run.sh", tmp_path / "job", PATH) == str(
        (tmp_path / "job" / "run.sh").absolute())
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


def test_a_name_that_climbs_out_of_the_folder_changes_no_mode_outside(tmp_path: Path) -> None:
    """"../x" or a path through a linked folder names a file outside the job's folder: it is
    not the sandbox's to make executable, and is left as it is."""
    outside = _script(tmp_path / "x")
    job = tmp_path / "job"
    job.mkdir()
    (job / "linked").symlink_to(tmp_path)
    assert resolve_executable("../x", job, PATH) == "../x"
    assert resolve_executable("linked/x", job, PATH) == "linked/x"
    assert resolve_executable("sub/../../x", job, PATH) == "sub/../../x"
    assert stat.S_IMODE(outside.stat().st_mode) == 0o644


def test_odd_names_are_left_as_they_are(tmp_path: Path) -> None:
    (tmp_path / "run.sh").mkdir()  # a folder named like a script
    assert resolve_executable("run.sh", tmp_path, PATH) == "run.sh"
    assert resolve_executable("run.sh; rm -rf", tmp_path, PATH) == "run.sh; rm -rf"
    loop = tmp_path / "loop.sh"
    loop.symlink_to(loop)
    assert resolve_executable("loop.sh", tmp_path, PATH) == "loop.sh"
    assert resolve_executable("x" * 5000, tmp_path, PATH) == "x" * 5000
