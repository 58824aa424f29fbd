"""Payloads isolated from each other and from the pilot.

A multi-payload pilot runs the jobs of different users side by side under one Unix account;
without isolation one payload can read another's files and signal its processes. Each
payload therefore runs in a sandbox of its own (unprivileged user, mount, PID and IPC
namespaces) that sees:

- the system read-only;
- its own job folder (its ``$JOBFEATURES`` and any ``$BEARER_TOKEN_FILE`` of the job are in
  it), read-write, at the same path as outside;
- a private, empty ``/tmp``;
- the site's ``--isolation-bind`` paths (shared areas), and the ``$MACHINEFEATURES`` folder;

and not the pilot's work folder (the other payloads' folders, the undelivered reports), nor its
``$JOBSTATUS`` folder, nor the processes of the pilot or of other payloads (a PID namespace:
``/proc`` shows the payload's own processes only).

Two tools do it behind one interface, :class:`Isolation`: bubblewrap (``bwrap``) and apptainer
(``apptainer exec``, with the same binds). ``--isolation auto`` takes the first that passes a
self-test at the pilot's start (a command actually run in a sandbox laid out as a payload's);
``none`` runs payloads bare, and is only taken on request or when no tool works, the pilot then
saying so loudly and recording it with the matcher.

The pilot still sees the payload's processes (with their pids of the pilot's namespace): its
reaper, CPU accounting and kill work on them as on a bare payload. The sandbox's first process
is the pilot's child; a sandbox dies with the pilot (``--die-with-parent``), and every process
in it dies with the payload's first process (the PID namespace ends with it).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("pilot")

#: The names ``--isolation`` takes; ``auto`` tries the tools in this order.
MODES = ("auto", "apptainer", "bwrap", "none")
TOOLS = ("apptainer", "bwrap")
#: Seconds the self-test may take.
SELF_TEST_TIMEOUT = 30.0


@dataclass(frozen=True)
class Bind:
    """A path of the node a payload sees at the same place."""

    path: Path
    writable: bool = False

    @classmethod
    def parse(cls, text: str) -> Bind:
        """``PATH`` (read-write) or ``PATH:ro`` (read-only); ValueError saying what is
        wrong."""
        path, writable = text, True
        if text.endswith(":ro"):
            path, writable = text[:-3], False
        elif text.endswith(":rw"):
            path = text[:-3]
        if not path.startswith("/"):
            raise ValueError(f"--isolation-bind needs an absolute path, got {text!r}")
        return cls(Path(os.path.normpath(path)), writable)


@dataclass(frozen=True)
class Layout:
    """What every sandbox of a pilot shows and hides."""

    #: The pilot's work folder: hidden, but for the payload's own job folder.
    workdir: Path
    #: Further paths of the pilot the payloads must not see ($JOBSTATUS).
    hidden: tuple[Path, ...] = ()
    #: Paths the payloads see: the site's shared areas, $MACHINEFEATURES.
    binds: tuple[Bind, ...] = ()


class Isolation:
    """Runs a payload's command in a sandbox; this base runs it bare (``none``)."""

    name = "none"

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.version = ""

    @property
    def isolated(self) -> bool:
        return self.name != "none"

    def describe(self) -> str:
        """The tool and its version, as the pilot reports it: "bwrap 0.8.0", "none"."""
        return f"{self.name} {self.version}".strip()

    def command(self, argv: Sequence[str], job_dir: Path,
                image: str | None = None) -> list[str]:
        """The command that runs ``argv`` in ``job_dir`` (the current folder) isolated, in
        the job's container ``image`` when it names one (ImageError when this isolation
        cannot run it)."""
        if image is not None:
            raise ImageError(f"payloads run bare here: no container image ({image})")
        return list(argv)

    def self_test(self) -> str:
        """Run a command in a sandbox laid out as a payload's; "" when it worked, else why
        not."""
        if not self.isolated:
            return ""
        self.layout.workdir.mkdir(parents=True, exist_ok=True)
        try:
            job = Path(tempfile.mkdtemp(prefix=".isolation-test-", dir=self.layout.workdir))
            other = Path(tempfile.mkdtemp(prefix=".isolation-other-", dir=self.layout.workdir))
        except OSError as exc:
            return f"cannot make a test folder in {self.layout.workdir}: {exc}"
        try:
            (other / "secret").write_text("x", encoding="ascii")
            # The job folder is writable, the pilot's other folders are not there.
            script = f'echo ok > probe && test ! -e "{other}/secret"'
            try:
                done = subprocess.run(self.command(["/bin/sh", "-c", script], job), cwd=job,
                                      stdin=subprocess.DEVNULL, capture_output=True,
                                      timeout=SELF_TEST_TIMEOUT, check=False)
            except (OSError, subprocess.SubprocessError) as exc:
                return f"{self.name} cannot run: {exc}"
            if done.returncode != 0:
                why = done.stderr.decode("utf-8", "replace").strip().splitlines()
                return (f"{self.name} self-test failed (exit {done.returncode})"
                        + (f": {why[-1]}" if why else ""))
            if not (job / "probe").is_file():
                return f"{self.name} self-test: the job folder was not writable in the sandbox"
            return ""
        finally:
            for folder in (job, other):
                shutil.rmtree(folder, ignore_errors=True)


class ImageError(OSError):
    """A job's container image cannot be run (missing, or of a kind the tool cannot run)."""


def _image_root(image: str, keep: Sequence[Path]) -> list[str]:
    """bwrap's arguments that make an unpacked image folder the sandbox's root: a tmpfs root,
    each top-level entry of the image bound read-only (links made again), except those the
    sandbox mounts itself or that hold one of the ``keep`` paths (the job's folder, the
    site's binds), which come from the node."""
    root = Path(image)
    if not root.is_dir():
        raise ImageError(f"container image {image} is not a folder on this node (an image "
                         "file needs apptainer)")
    held = {p.parts[1] for p in keep if len(p.parts) > 1}
    args = ["--tmpfs", "/"]
    try:
        entries = sorted(root.iterdir())
    except OSError as exc:
        raise ImageError(f"container image {image} cannot be read: {exc.strerror}") from exc
    for entry in entries:
        if entry.name in ("proc", "dev", "tmp") or entry.name in held:
            continue
        if entry.is_symlink():
            args += ["--symlink", os.readlink(entry), f"/{entry.name}"]
        else:
            args += ["--ro-bind", str(entry), f"/{entry.name}"]
    return args


def _tool_version(executable: str) -> str:
    """The version a tool prints ("bubblewrap 0.8.0" → "0.8.0"), "" if it says none."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run([executable, "--version"], capture_output=True, text=True,
                              timeout=10, check=False, stdin=subprocess.DEVNULL)
        words = done.stdout.split()
        if done.returncode == 0 and words:
            return words[-1]
    return ""


class Bubblewrap(Isolation):
    """bubblewrap: unprivileged namespaces, no image (the node's system, read-only)."""

    name = "bwrap"

    def __init__(self, layout: Layout, executable: str = "bwrap") -> None:
        super().__init__(layout)
        self.executable = executable
        self.version = _tool_version(executable)

    def command(self, argv: Sequence[str], job_dir: Path,
                image: str | None = None) -> list[str]:
        cmd = [self.executable, "--die-with-parent", "--unshare-pid", "--unshare-ipc"]
        # Unprivileged, bwrap needs a user namespace for the others; as root, it would keep
        # every capability (mounts, devices): the payload gets none.
        cmd += ["--unshare-user"] if os.geteuid() != 0 else ["--cap-drop", "ALL"]
        binds = [b for b in self.layout.binds if b.path.exists()]
        if image is None:
            cmd += ["--ro-bind", "/", "/"]
        else:
            cmd += _image_root(image, [job_dir, *(b.path for b in binds)])
        cmd += ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
        for bind in binds:
            cmd += ["--bind" if bind.writable else "--ro-bind", str(bind.path), str(bind.path)]
        # What is hidden goes after the binds (a shared area may hold the work folder), and
        # the job folder comes back last. In an image the node's folders are not there.
        for path in (self.layout.workdir, *self.layout.hidden):
            if path.is_dir() and (image is None or any(
                    path.is_relative_to(b.path) for b in binds)):
                cmd += ["--tmpfs", str(path)]
        cmd += ["--bind", str(job_dir), str(job_dir), "--chdir", str(job_dir), "--", *argv]
        return cmd


class Apptainer(Isolation):
    """apptainer (or singularity) ``exec``: contained (private /tmp, no home), its own PID
    and IPC namespaces, the same binds; the image is the site's (``--isolation-image``), by
    default the node's own root folder."""

    name = "apptainer"

    def __init__(self, layout: Layout, executable: str = "apptainer",
                 image: str = "/") -> None:
        super().__init__(layout)
        self.executable = executable
        self.image = image
        self.version = _tool_version(executable)
        #: An empty folder mounted over what must stay hidden.
        self.empty = layout.workdir / ".isolation-empty"

    def command(self, argv: Sequence[str], job_dir: Path,
                image: str | None = None) -> list[str]:
        cmd = [self.executable, "exec", "--contain", "--pid", "--ipc", "--no-home"]
        for bind in self.layout.binds:
            if bind.path.exists():
                cmd += ["--bind", f"{bind.path}:{bind.path}:{'rw' if bind.writable else 'ro'}"]
        hidden = [p for p in (self.layout.workdir, *self.layout.hidden) if p.is_dir()]
        if hidden:
            with contextlib.suppress(OSError):
                self.empty.mkdir(mode=0o555, exist_ok=True)
            for path in hidden:
                cmd += ["--bind", f"{self.empty}:{path}:ro"]
        if image is not None and not Path(image).exists():
            raise ImageError(f"container image {image} is not on this node")
        cmd += ["--bind", f"{job_dir}:{job_dir}:rw", "--pwd", str(job_dir),
                image or self.image, *argv]
        return cmd


@dataclass
class Choice:
    """The isolation the pilot took, and why the others were not."""

    isolation: Isolation
    refused: list[str] = field(default_factory=list)


def make(name: str, layout: Layout, *, image: str = "/") -> Isolation | None:
    """The isolation ``name`` names, None when its tool is not on the PATH."""
    if name == "none":
        return Isolation(layout)
    if name == "bwrap":
        found = shutil.which("bwrap")
        return Bubblewrap(layout, found) if found else None
    if name == "apptainer":
        found = shutil.which("apptainer") or shutil.which("singularity")
        return Apptainer(layout, found, image) if found else None
    raise ValueError(f"--isolation must be one of {', '.join(MODES)}, got {name!r}")


def choose(mode: str, layout: Layout, *, image: str = "/") -> Choice:
    """The isolation for ``mode``: a named tool that passes its self-test, or for ``auto``
    the first of :data:`TOOLS` that does; ``none`` when asked for or when nothing works
    (``refused`` then says why each tool was not taken)."""
    names = TOOLS if mode == "auto" else (mode,)
    refused: list[str] = []
    for name in names:
        isolation = make(name, layout, image=image)
        if isolation is None:
            refused.append(f"{name} is not installed (not on the PATH)")
            continue
        problem = isolation.self_test()
        if not problem:
            return Choice(isolation, refused)
        refused.append(problem)
    return Choice(Isolation(layout), refused)


def start(mode: str, layout: Layout, *, image: str = "/") -> Isolation | str:
    """The pilot's isolation at its start, logged; a str saying why when ``mode`` names a
    tool that does not work (the pilot then does not run: the site asked for it)."""
    choice = choose(mode, layout, image=image)
    isolation = choice.isolation
    if isolation.isolated:
        log.info("payloads run isolated: %s", isolation.describe())
        return isolation
    if mode not in ("auto", "none"):
        return f"--isolation {mode}: {'; '.join(choice.refused)}"
    if mode == "auto":
        log.warning("PAYLOADS RUN WITHOUT ISOLATION: no tool works (%s); every payload can "
                    "read the others' files and signal their processes",
                    "; ".join(choice.refused))
    else:
        log.warning("PAYLOADS RUN WITHOUT ISOLATION (--isolation none): every payload can "
                    "read the others' files and signal their processes")
    return isolation


def layout_for(workdir: Path, *, jobstatus: Path | None, machine_features: str | None,
               binds: Sequence[Bind] = ()) -> Layout:
    """The sandboxes' layout for a pilot with these folders."""
    shown = list(binds)
    if machine_features and machine_features.startswith("/"):
        shown.append(Bind(Path(machine_features)))
    hidden = (jobstatus.absolute(),) if jobstatus is not None else ()
    return Layout(workdir, hidden, tuple(shown))
