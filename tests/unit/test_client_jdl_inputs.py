"""The client finds a JDL's InputSandbox as the service reads it: every entry it would upload
is a local file the service would otherwise refuse, and no local entry is skipped."""

from __future__ import annotations

from pathlib import Path

import pytest

from client.sandboxes import (
    SandboxFileError,
    is_local,
    jdl_input_sandboxes,
    with_uploaded_inputs,
)
from optimizers.description import JobDescriptionError
from optimizers.jdl import parse_jdl
from pilot.archive import unpack

DATA = Path(__file__).resolve().parents[1] / "data" / "jdl"
SID = "sb:sha256:" + "0" * 64


def _entries(text: str) -> list[str]:
    return [e for _s, _e, entries in jdl_input_sandboxes(text) for e in entries]


@pytest.mark.parametrize("path", sorted(DATA.glob("*.jdl")), ids=lambda p: p.name)
def test_the_client_reads_the_corpus_as_the_service_does(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    try:
        jobs = parse_jdl(text)
    except JobDescriptionError:
        return  # the service refuses it whatever the client sends
    if jobs[0].parameter is not None:
        return  # the entries are the templates, expanded by the service
    wanted = [e for e in jobs[0].input_sandbox]
    assert [e for e in _entries(text) if e.strip()] == wanted


@pytest.mark.parametrize(("jdl", "entries"), [
    # DIRAC's Job API: bare names and paths.
    ("InputSandbox = {jobDescription.xml, /home/u/run.py};", ["jobDescription.xml",
                                                               "/home/u/run.py"]),
    ("InputSandbox = jobDescription.xml;", ["jobDescription.xml"]),
    # Names with the characters a regex scan tripped over.
    ('InputSandbox = {"a{1}.txt", "$HOME.cfg", "b}.txt"};', ["a{1}.txt", "$HOME.cfg", "b}.txt"]),
    # Commented out: not an InputSandbox at all; a comment inside the list.
    ('# InputSandbox = {"old.txt"};\nInputSandbox = {"new.txt", # the data\n "x.txt"};',
     ["new.txt", "x.txt"]),
    ('[ // InputSandbox = {"no"};\n  InputSandbox = "yes.txt"; ]', ["yes.txt"]),
    # A string that only mentions it.
    ('Arguments = "InputSandbox = {x}"; Executable = "a";', []),
    # Inside a nested section it is not the job's.
    ('Requirements = [ InputSandbox = {"no"}; ]; InputSandbox = {"yes"};', ["yes"]),
    # A URI is quoted: unquoted, its // would start a comment (for the service too).
    ('inputsandbox = {"file:///tmp/x.txt"};', ["file:///tmp/x.txt"]),
])
def test_entries_are_found_as_written(jdl: str, entries: list[str]) -> None:
    assert _entries(jdl) == entries


def test_templates_lfns_and_ids_are_not_uploaded() -> None:
    for entry in ("in_%s.txt", "run_%n.cfg", "f_%(A)s", "message_PARAM_.sh", "out_%j",
                  "LFN:/lhcb/x", "lfn:/lhcb/y", SID):
        assert not is_local(entry), entry
    for entry in ("100%.txt", "a%b", "$HOME/x", "file:///tmp/x"):
        assert is_local(entry), entry


def test_local_files_with_odd_names_are_uploaded(tmp_path: Path) -> None:
    for name in ("a{1}.txt", "$x.cfg", "b}.txt", "é.txt"):
        (tmp_path / name).write_text(name)
    (tmp_path / "abs.txt").write_text("abs")
    stored: list[bytes] = []

    def store(data: bytes) -> str:
        stored.append(data)
        return SID

    text = (f'[ Executable = "a";\n  InputSandbox = {{"a{{1}}.txt", $x.cfg, "b}}.txt", '
            f'"é.txt", "file://{tmp_path}/abs.txt", "LFN:/lhcb/f", "in_%s"}};\n'
            '  Parameters = {"x"}; ]')
    out = with_uploaded_inputs(text, "jdl", tmp_path, store)
    assert sorted(unpack(stored[0], tmp_path / "back")) == sorted([
        "$x.cfg", "a{1}.txt", "abs.txt", "b}.txt", "é.txt"])
    (job,) = parse_jdl(out)
    assert job.input_sandbox == ("LFN:/lhcb/f", "in_x", SID)


def test_a_missing_file_uri_is_named(tmp_path: Path) -> None:
    with pytest.raises(SandboxFileError, match=r"file:///nowhere/x\.txt cannot be read"):
        with_uploaded_inputs('Executable = "a"; InputSandbox = {"file:///nowhere/x.txt"};',
                             "jdl", tmp_path, lambda data: SID)
