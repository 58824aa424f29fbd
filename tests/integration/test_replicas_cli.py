"""The real ``gridpilot replicas`` commands in a subprocess, on each backend's database."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import Database
from tests.integration.test_cli import ROOT, run

RESOURCES = str(ROOT / "conf" / "resources.toml")


def _gp(db: Database, tmp_path: Path, *args: str) -> tuple[int, str, str]:
    out = run(["replicas", *args], tmp_path, GRIDPILOT_DATABASE_URL=db.url,
              GRIDPILOT_RESOURCES_FILE=RESOURCES)
    return out.returncode, out.stdout, out.stderr


def test_add_list_remove(db: Database, tmp_path: Path) -> None:
    listing = tmp_path / "replicas.txt"
    listing.write_text("# LFN SE\n/lhcb/d/f1 CERN-DST\nLFN:/lhcb/d/f2 NOWHERE-SE  # a tape\n\n")
    code, out, err = _gp(db, tmp_path, "add", "--vo", "lhcb", "--from", str(listing))
    assert code == 0, err
    assert out.strip() == "2 new replicas (0 known already)"
    assert "lists the storage element NOWHERE-SE" in err
    code, out, err = _gp(db, tmp_path, "add", "--vo", "lhcb", "--se", "RAL-DST",
                         "/lhcb/d/f1", "/lhcb/d/f1")
    assert (code, out.strip(), err) == (0, "1 new replicas (1 known already)", "")
    code, out, _ = _gp(db, tmp_path, "list", "--vo", "lhcb", "--prefix", "/lhcb/d/")
    assert out.splitlines() == ["/lhcb/d/f1 CERN-DST", "/lhcb/d/f1 RAL-DST",
                                "/lhcb/d/f2 NOWHERE-SE"]
    code, out, _ = _gp(db, tmp_path, "remove", "--vo", "lhcb", "--se", "CERN-DST", "/lhcb/d/f1")
    assert out.strip() == "1 replicas removed"
    code, out, _ = _gp(db, tmp_path, "list", "--vo", "lhcb", "LFN:/lhcb/d/f1")
    assert out.splitlines() == ["/lhcb/d/f1 RAL-DST"]


def test_mistakes_are_one_clear_line(db: Database, tmp_path: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text("/lhcb/f1 CERN-DST\n/lhcb/f2\n")
    code, _out, err = _gp(db, tmp_path, "add", "--vo", "lhcb", "--from", str(bad))
    assert code == 2 and "line 2: expected 'LFN SE', got '/lhcb/f2'" in err
    code, _out, err = _gp(db, tmp_path, "add", "--vo", "lhcb", "/lhcb/f1")
    assert code == 2 and "need --se" in err
    code, _out, err = _gp(db, tmp_path, "add", "--vo", "lhcb", "--se", "X", "relative/f")
    assert code == 1 and "must be an absolute path" in err and "Traceback" not in err
    code, out, _ = _gp(db, tmp_path, "list", "--vo", "lhcb")
    assert out == ""  # nothing of the refused calls was stored


def test_hostile_inputs_store_nothing(db: Database, tmp_path: Path) -> None:
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"/lhcb/f1 CERN-DST\n\xff\xfe\n")
    code, _out, err = _gp(db, tmp_path, "add", "--vo", "lhcb", "--from", str(binary))
    assert code == 2 and "not UTF-8 text" in err and "Traceback" not in err
    for vo in ("", "two words", "x" * 65):
        code, _out, err = _gp(db, tmp_path, "add", "--vo", vo, "--se", "CERN-DST", "/lhcb/f1")
        assert code == 2 and "a VO is named by one word" in err, (vo, err)
    # A resources file that cannot be read is said before anything is stored.
    out = run(["replicas", "add", "--vo", "lhcb", "--se", "CERN-DST", "/lhcb/f1"], tmp_path,
              GRIDPILOT_DATABASE_URL=db.url,
              GRIDPILOT_RESOURCES_FILE=str(tmp_path / "missing.toml"))
    assert out.returncode == 1 and "does not exist" in out.stderr
    code, out_text, _ = _gp(db, tmp_path, "list", "--vo", "lhcb")
    assert out_text == ""
