"""What the pilot packs after a payload: output files within the per-job limit, the streams'
last bytes, and every missing or hostile output name reported, never followed."""

from __future__ import annotations

from pathlib import Path

from pilot.archive import unpack
from pilot.protocol import JobPayload
from pilot.sandbox import collect_outputs


def _job(*outputs: str) -> JobPayload:
    return JobPayload(job_id=7, vo="lhcb", owner="alice", owner_group="lhcb_user",
                      job_type="User", executable="/bin/true", output_sandbox=list(outputs))


def test_outputs_streams_and_what_is_missing(tmp_path: Path) -> None:
    job_dir = tmp_path / "job_7"
    job_dir.mkdir()
    (job_dir / "output.log").write_bytes(b"x" * 5000 + b"THE END\n")
    (job_dir / "small.txt").write_text("small")
    (job_dir / "big.bin").write_bytes(b"b" * 20000)
    (job_dir / "passwd").symlink_to("/etc/passwd")
    (tmp_path / "secret.txt").write_text("not yours")
    out = collect_outputs(_job("small.txt", "big.bin", "gone.txt", "passwd", "/etc/hosts",
                               "../secret.txt"), job_dir, [job_dir / "output.log"],
                          limit=8000)
    assert out.too_large == ["big.bin"]
    assert out.missing[0] == "gone.txt"
    assert "passwd (passwd is not a regular file)" in out.missing
    assert any(m.startswith("/etc/hosts (") for m in out.missing)
    assert any(m.startswith("../secret.txt (") for m in out.missing)
    status = out.minor_status()
    assert "Output files missing: gone.txt" in status and "over the size limit: big.bin" in status
    names = unpack(out.archive, tmp_path / "back")
    assert sorted(names) == ["output.log", "small.txt"]
    log = (tmp_path / "back" / "output.log").read_bytes()
    assert log.endswith(b"THE END\n") and len(log) == 4000  # its share of the limit
    assert out.sandbox_id.startswith("sb:sha256:")


def test_nothing_missing_says_nothing(tmp_path: Path) -> None:
    (tmp_path / "output.log").write_text("hi")
    out = collect_outputs(_job(), tmp_path, [tmp_path / "output.log"])
    assert out.minor_status() == "" and out.missing == [] and out.too_large == []
