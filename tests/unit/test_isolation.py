"""The payloads' sandboxes (pilot.isolation): the commands built for each tool, the choice at
the pilot's start, and real payloads in bubblewrap sandboxes (skipped where it is not
installed): the grace of SIGTERM, the CPU time of a running payload, what it sees."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pilot.isolation import (
    Apptainer,
    Bind,
    Bubblewrap,
    ImageError,
    Isolation,
    Layout,
    choose,
    layout_for,
    start,
)
from pilot.loop import Pilot, PilotOptions
from pilot.payload import Payload, start_payload
from pilot.protocol import JobPayload
from pilot.resource import NodeDescription
from tests.helpers import write_token_file

BWRAP = shutil.which("bwrap")
needs_bwrap = pytest.mark.skipif(BWRAP is None, reason="bubblewrap is not installed")


def _after(cmd: list[str], *words: str) -> int:
    """Where the sequence ``words`` starts in ``cmd``."""
    for i in range(len(cmd)):
        if tuple(cmd[i:i + len(words)]) == words:
            return i
    raise AssertionError(f"{words} not in {cmd}")


def test_bwrap_shows_the_system_read_only_and_only_the_job_folder_of_the_work_folder(
        tmp_path: Path) -> None:
    work, status, shared = tmp_path / "work", tmp_path / "status", tmp_path / "shared"
    job = work / "job_7"
    for folder in (job, status, shared):
        folder.mkdir(parents=True)
    layout = Layout(work, (status,), (Bind(shared, writable=False),))
    cmd = Bubblewrap(layout, "/usr/bin/bwrap").command(["run", "a b"], job)
    assert cmd[0] == "/usr/bin/bwrap" and cmd[-3:] == ["--", "run", "a b"]
    for option in ("--die-with-parent", "--unshare-pid", "--unshare-ipc"):
        assert option in cmd
    assert ("--unshare-user" in cmd) == (os.geteuid() != 0)
    assert ("--cap-drop" in cmd) == (os.geteuid() == 0)
    root = _after(cmd, "--ro-bind", "/", "/")
    tmp = _after(cmd, "--tmpfs", "/tmp")
    bind = _after(cmd, "--ro-bind", str(shared), str(shared))
    hide_work = _after(cmd, "--tmpfs", str(work))
    hide_status = _after(cmd, "--tmpfs", str(status))
    back = _after(cmd, "--bind", str(job), str(job))
    # Later mounts cover earlier ones: the job folder comes back after the work folder goes.
    assert root < tmp < bind < hide_work < back and bind < hide_status < back
    assert _after(cmd, "--chdir", str(job)) > back
    assert _after(cmd, "--proc", "/proc") > root


def test_apptainer_runs_contained_with_the_same_binds(tmp_path: Path) -> None:
    work, shared = tmp_path / "work", tmp_path / "shared"
    job = work / "job_3"
    job.mkdir(parents=True)
    shared.mkdir()
    layout = Layout(work, (tmp_path / "absent",), (Bind(shared, writable=True),))
    tool = Apptainer(layout, str(tmp_path / "no-apptainer"), "/cvmfs/images/el9")
    cmd = tool.command(["run", "x"], job)
    assert cmd[:2] == [str(tmp_path / "no-apptainer"), "exec"]
    for option in ("--contain", "--pid", "--ipc", "--no-home"):
        assert option in cmd
    assert cmd[-3:] == ["/cvmfs/images/el9", "run", "x"]
    shared_bind = _after(cmd, "--bind", f"{shared}:{shared}:rw")
    hidden = _after(cmd, "--bind", f"{work / '.isolation-empty'}:{work}:ro")
    back = _after(cmd, "--bind", f"{job}:{job}:rw")
    assert shared_bind < hidden < back
    assert _after(cmd, "--pwd", str(job)) > back
    assert not any("absent" in word for word in cmd)  # what does not exist is not hidden
    assert (work / ".isolation-empty").is_dir()
    assert tool.version == ""  # no such program: no version


def test_binds_are_absolute_paths_read_write_or_read_only() -> None:
    assert Bind.parse("/cvmfs:ro") == Bind(Path("/cvmfs"), False)
    assert Bind.parse("/scratch/") == Bind(Path("/scratch"), True)
    assert Bind.parse("/data:rw") == Bind(Path("/data"), True)
    with pytest.raises(ValueError, match="absolute path, got 'cvmfs'"):
        Bind.parse("cvmfs")


def test_the_layout_shows_machine_features_and_hides_jobstatus(tmp_path: Path) -> None:
    layout = layout_for(tmp_path / "w", jobstatus=tmp_path / "s",
                        machine_features=str(tmp_path / "mf"))
    assert layout.hidden == (tmp_path / "s",)
    assert layout.binds == (Bind(tmp_path / "mf", False),)
    assert layout_for(tmp_path, jobstatus=None, machine_features="https://x/mf").binds == ()


def test_a_tool_that_fails_its_self_test_is_not_taken(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "w")
    broken = Bubblewrap(layout, "/bin/false")
    assert "self-test failed (exit 1)" in broken.self_test()
    bare = Isolation(layout)
    assert bare.self_test() == "" and not bare.isolated and bare.describe() == "none"


def test_a_named_tool_that_is_missing_stops_the_pilot_and_none_runs_bare(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # neither tool on it
    layout = Layout(tmp_path / "w")
    problem = start("bwrap", layout)
    assert problem == "--isolation bwrap: bwrap is not installed (not on the PATH)"
    chosen = choose("auto", layout)
    assert chosen.isolation.name == "none"
    assert chosen.refused == ["apptainer is not installed (not on the PATH)",
                              "bwrap is not installed (not on the PATH)"]
    bare = start("auto", layout)
    assert isinstance(bare, Isolation) and not bare.isolated


@needs_bwrap
def test_auto_takes_bubblewrap_after_running_a_sandbox(tmp_path: Path) -> None:
    chosen = choose("auto", Layout(tmp_path / "w"))
    assert chosen.isolation.name == "bwrap"
    assert chosen.isolation.describe().startswith("bwrap 0.")
    # The self-test leaves nothing behind.
    assert list((tmp_path / "w").iterdir()) == []


def _job(job_id: int, code: str) -> JobPayload:
    return JobPayload(job_id=job_id, vo="lhcb", owner="alice", owner_group="lhcb_user",
                      job_type="User", executable=sys.executable, arguments=["-c", code],
                      cpu_time=600)


def _start(tmp_path: Path, job_id: int, code: str,
           environment: dict[str, str] | None = None) -> Payload:
    work = tmp_path / "work"
    layout = Layout(work, binds=(Bind(Path(sys.prefix), False),))
    isolation = Bubblewrap(layout, BWRAP or "bwrap")
    now = time.time()
    job = _job(job_id, code)
    job.environment.update(environment or {})
    return start_payload(job, cores=1, memory_mb=0, root=work, now=now,
                         max_end=now + 600, cpu_factor=None, machine_features=None,
                         base_env=os.environ, isolation=isolation)


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 30
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


@needs_bwrap
def test_a_sandboxed_payload_sees_its_folder_only_and_gets_its_sigterm_grace(
        tmp_path: Path) -> None:
    other = tmp_path / "work" / "job_1"
    other.mkdir(parents=True)
    (other / "secret.txt").write_text("x")
    # What the sandbox shows of /tmp but the way to the job folder and the Python bound in
    # (both under /tmp when the checkout is: a CI clone there).
    shown = (sys.prefix,)
    code = (
        "import os, signal, sys, time\n"
        "def term(*_):\n"
        "    open('terminated', 'w').write('yes'); sys.exit(7)\n"
        "signal.signal(signal.SIGTERM, term)\n"
        f"shown = (os.getcwd(), *{shown!r})\n"
        "files = [f for d, _, fs in os.walk('/tmp') for f in fs\n"
        "         if not any(d == s or d.startswith(s + '/') for s in shown)]\n"
        "seen = [os.path.exists('../job_1/secret.txt'), files,\n"
        "        sorted(p for p in os.listdir('/proc') if p.isdigit())]\n"
        "open('seen', 'w').write(repr(seen))\n"
        "time.sleep(60)\n")
    payload = _start(tmp_path, 2, code)
    try:
        assert payload.isolated
        _wait_for(payload.directory / "seen")
        other_job, tmp, pids = eval((payload.directory / "seen").read_text())
        # /tmp is empty but for the way to the job folder (under /tmp here).
        assert other_job is False and tmp == []
        assert len(pids) <= 3  # the sandbox's init, the payload (and a thread's view at most)
        payload.stop("test", time.time())
        assert payload.wait() == 7
        assert (payload.directory / "terminated").read_text() == "yes"
    finally:
        if payload.process.poll() is None:
            payload.signal(signal.SIGKILL)
            payload.wait()


@needs_bwrap
def test_the_cpu_time_of_a_running_sandboxed_payload_counts(tmp_path: Path) -> None:
    code = ("import time\nend = time.process_time() + 1.0\n"
            "while time.process_time() < end: pass\nopen('busy', 'w').close()\n"
            "time.sleep(60)\n")
    payload = _start(tmp_path, 3, code)
    try:
        _wait_for(payload.directory / "busy")
        assert payload.cpu_used() >= 0.9
    finally:
        payload.signal(signal.SIGKILL)
        payload.wait()
    assert payload.cpu_used() >= 0.9


@needs_bwrap
def test_a_job_naming_another_jobs_file_as_its_token_file_gets_nothing_of_it(
        tmp_path: Path) -> None:
    """The job's own environment names the file; the pilot reads nothing for it (a copy
    into the job folder would hand any file the pilot can read to the payload)."""
    other = tmp_path / "work" / "job_1"
    other.mkdir(parents=True)
    (other / "secret.txt").write_text("bob's secret")
    code = ("import os\nname = os.environ['BEARER_TOKEN_FILE']\n"
            "print(name, os.path.exists(name), os.path.exists('.bearer_token'))\n")
    payload = _start(tmp_path, 4, code, {"BEARER_TOKEN_FILE": str(other / "secret.txt")})
    assert payload.wait() == 0
    assert payload.tail().split() == [str(other / "secret.txt"), "False", "False"]
    assert not (payload.directory / ".bearer_token").exists()


@pytest.mark.parametrize("mode", ["bwrap", "none"])
def test_an_isolated_pilot_offers_the_isolated_tag(tmp_path: Path, mode: str) -> None:
    if mode == "bwrap" and BWRAP is None:
        pytest.skip("bubblewrap is not installed")
    node = NodeDescription(vo="lhcb", reference="p-1", tags=("GPU",))
    pilot = Pilot(PilotOptions(matcher_url="http://127.0.0.1:9", token="a.b.c", node=node,
                               workdir=tmp_path / "w", cores=2, isolation=mode))
    now = time.time()
    pilot.prepare(now)
    assert pilot._isolate()
    resource = pilot.match_request(now, pilot.limits(now))
    assert resource is not None
    expected = ["GPU", "isolated", "container", "bwrap"] if mode == "bwrap" else ["GPU"]
    assert resource["tags"] == expected


def _pilot_cli(tmp_path: Path, *args: str, path: str) -> subprocess.CompletedProcess[str]:
    token = write_token_file(tmp_path / "pilot.token", "a.b.c")
    return subprocess.run(
        [sys.executable, "-m", "pilot.cli", "--matcher", "http://127.0.0.1:9", "--vo", "lhcb",
         "--token-file", str(token), "--workdir", str(tmp_path / "w"), *args],
        env={**os.environ, "PATH": path}, capture_output=True, text=True, timeout=60,
        check=False)


def test_a_pilot_told_to_use_a_missing_tool_says_so_and_exits_2(tmp_path: Path) -> None:
    done = _pilot_cli(tmp_path, "--isolation", "bwrap", path=str(tmp_path))
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "gridpilot-pilot: exit 2: --isolation bwrap: bwrap is not installed (not on the PATH)")
    assert "Traceback" not in done.stderr


def test_a_relative_isolation_bind_is_refused(tmp_path: Path) -> None:
    done = _pilot_cli(tmp_path, "--isolation-bind", "cvmfs:ro", path=os.environ["PATH"])
    assert done.returncode == 2
    assert "--isolation-bind needs an absolute path, got 'cvmfs:ro'" in done.stderr


# -- a job's own container image -------------------------------------------------------------

BUSYBOX = Path("/bin/busybox")
needs_busybox = pytest.mark.skipif(BWRAP is None or not BUSYBOX.is_file(),
                                   reason="bubblewrap or busybox-static is not installed")


def _image(tmp_path: Path) -> Path:
    """The smallest real image folder: one static program and the names it answers to."""
    image = tmp_path / "images" / "busybox"
    (image / "bin").mkdir(parents=True)
    (image / "etc").mkdir()
    shutil.copy(BUSYBOX, image / "bin" / "busybox")
    for name in ("sh", "cat", "echo", "ls", "test", "kill"):
        (image / "bin" / name).symlink_to("busybox")
    (image / "etc" / "image-name").write_text("busybox-test-image\n")
    (image / "lib").symlink_to("bin")
    return image


def test_busybox_is_there_in_ci() -> None:
    """CI installs busybox-static (.ci/run): the image tests below must not skip there."""
    if os.environ.get("GRIDPILOT_TEST_REQUIRE_SERVERS") == "1":
        assert BUSYBOX.is_file() and BWRAP is not None


@needs_busybox
def test_a_job_runs_in_its_image_folder_and_sees_its_own_folder_only(tmp_path: Path) -> None:
    image = _image(tmp_path)
    other = tmp_path / "work" / "job_1"
    other.mkdir(parents=True)
    (other / "secret.txt").write_text("x")
    work = tmp_path / "work"
    isolation = Bubblewrap(Layout(work), BWRAP or "bwrap")
    job = JobPayload(job_id=9, vo="lhcb", owner="alice", owner_group="lhcb_user",
                     job_type="User", executable="/bin/sh", container_image=str(image),
                     arguments=["-c", "cat /etc/image-name > seen; "
                                f"test -e {sys.executable} || echo no-host-python >> seen; "
                                f"test -e {other}/secret.txt || echo no-secret >> seen; "
                                "ls -l /lib >> seen"])
    now = time.time()
    payload = start_payload(job, cores=1, memory_mb=0, root=work, now=now, max_end=now + 60,
                            cpu_factor=None, machine_features=None, base_env=os.environ,
                            isolation=isolation)
    assert payload.wait() == 0, payload.tail()
    seen = (payload.directory / "seen").read_text().splitlines()
    assert seen[:3] == ["busybox-test-image", "no-host-python", "no-secret"]
    assert "-> bin" in seen[3]


def test_an_image_folder_that_is_not_there_fails_the_start_with_a_reason(
        tmp_path: Path) -> None:
    work = tmp_path / "work"
    isolation = Bubblewrap(Layout(work), BWRAP or "bwrap")
    job = JobPayload(job_id=3, vo="lhcb", owner="alice", owner_group="lhcb_user",
                     job_type="User", executable="/bin/sh",
                     container_image=str(tmp_path / "nowhere"))
    now = time.time()
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(ImageError, match="is not a folder on this node"):
        start_payload(job, cores=1, memory_mb=0, root=work, now=now, max_end=now + 60,
                      cpu_factor=None, machine_features=None, base_env=os.environ,
                      isolation=isolation)
    # Nothing of the start is left open (its output file was opened before the refusal).
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_bare_pilot_runs_no_image(tmp_path: Path) -> None:
    job = JobPayload(job_id=4, vo="lhcb", owner="alice", owner_group="lhcb_user",
                     job_type="User", executable="/bin/true", container_image="/cvmfs/x")
    now = time.time()
    with pytest.raises(ImageError, match="runs payloads bare"):
        start_payload(job, cores=1, memory_mb=0, root=tmp_path / "w", now=now,
                      max_end=now + 60, cpu_factor=None, machine_features=None,
                      base_env=os.environ, isolation=None)


def test_apptainer_runs_the_jobs_image_instead_of_the_sites(tmp_path: Path) -> None:
    image = tmp_path / "centos7.sif"
    image.write_bytes(b"SIF")
    apptainer = Apptainer(Layout(tmp_path / "work"), "apptainer", image="/")
    job_dir = tmp_path / "work" / "job_1"
    command = apptainer.command(["/bin/true"], job_dir, image=str(image))
    assert command[-2:] == [str(image), "/bin/true"]
    assert apptainer.command(["/bin/true"], job_dir)[-2:] == ["/", "/bin/true"]
    with pytest.raises(ImageError, match="not on this node"):
        apptainer.command(["/bin/true"], job_dir, image=str(tmp_path / "gone.sif"))
