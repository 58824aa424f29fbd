"""Every process a payload starts ends with it, and its CPU time is counted.

A payload runs in a session of its own, but what it starts can leave that session (``setsid``)
and outlive it: once its parent exits, such a process is adopted by the nearest *child
subreaper* above it. The pilot makes itself that subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``),
so every process that escapes a payload becomes the pilot's child; it is not lost to init.

The pilot keeps, for each payload, its *family*: the processes descended from the payload's
first process (seen by scanning ``/proc``), those of its session or process group, and the
orphans the pilot adopted that carry the payload's ``GRIDPILOT_JOB_ID`` in their environment
(or, with one payload running, any orphan). When the payload ends, or the pilot stops, the
whole family is ended (SIGTERM, then SIGKILL), and the orphans are reaped with ``wait4``,
whose resource usage counts their CPU time (and that of the children they waited for) towards
the payload. Processes are known by pid and start time, so a reused pid is never signalled.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from pilot.logformat import concerning

log = logging.getLogger("pilot.reaper")

#: prctl(2) option: orphaned descendants are re-parented to this process, not to init.
PR_SET_CHILD_SUBREAPER = 36
#: Seconds the leftover processes of an ended payload get between SIGTERM and SIGKILL.
LEFTOVER_GRACE = 2.0
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def become_subreaper() -> bool:
    """Make this process the child subreaper of its descendants; False where it cannot be
    (not Linux, or a kernel older than 3.4): orphans then go to init and are ended only if
    they were seen while their parent lived."""
    with contextlib.suppress(OSError, AttributeError, TypeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    return False


@dataclass(frozen=True)
class Proc:
    """One process as ``/proc/<pid>/stat`` shows it."""

    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str
    #: Start time, clock ticks after boot: with the pid, it names the process.
    start: int
    #: CPU seconds of the process and of the children it waited for.
    cpu: float


def read_proc(pid: int) -> Proc | None:
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = os.read(fd, 4096)
        finally:
            os.close(fd)
        f = data.rsplit(b")", 1)[1].decode("ascii").split()
        ticks = sum(int(v) for v in f[11:15])  # utime stime cutime cstime
        return Proc(pid, int(f[1]), int(f[2]), int(f[3]), f[0], int(f[19]),
                    ticks / _CLOCK_TICKS)
    except (OSError, IndexError, ValueError):
        return None


def process_table() -> dict[int, Proc]:
    table = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                proc = read_proc(int(entry.name))
                if proc is not None:
                    table[proc.pid] = proc
    return table


def descendants(root: int, table: dict[int, Proc] | None = None) -> dict[int, Proc]:
    """The processes descended from ``root`` (not ``root`` itself), by their parents."""
    table = process_table() if table is None else table
    children: dict[int, list[Proc]] = {}
    for proc in table.values():
        children.setdefault(proc.ppid, []).append(proc)
    found: dict[int, Proc] = {}
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child.pid not in found and child.pid != root:
                found[child.pid] = child
                todo.append(child.pid)
    return found


def job_marker(pid: int) -> str | None:
    """The ``GRIDPILOT_JOB_ID`` in a process's environment, if any."""
    try:
        data = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    for item in data.split(b"\0"):
        if item.startswith(b"GRIDPILOT_JOB_ID="):
            return item.split(b"=", 1)[1].decode("ascii", "replace")
    return None


@dataclass
class Family:
    """The processes of one payload."""

    job_id: int
    root: int
    #: pid → start time of every process seen to belong to the payload (not the root).
    members: dict[int, int] = field(default_factory=dict)
    #: CPU seconds of members the pilot reaped itself (orphans it adopted).
    reaped_cpu: float = 0.0
    #: CPU seconds, as last seen, of the adopted orphans still alive.
    orphan_cpu: dict[int, float] = field(default_factory=dict)
    #: The most CPU seconds the root and the members were seen to have used together: what
    #: a sandboxed payload used when its sandbox is killed (pilot.isolation), its
    #: processes then not being waited for by the sandbox's first process.
    seen_cpu: float = 0.0

    def cpu_outside_root(self) -> float:
        """CPU time of the payload's processes that the root's own accounting misses."""
        return self.reaped_cpu + sum(self.orphan_cpu.values())


@dataclass
class Reaper:
    """Tracks the families of the running payloads and ends them."""

    pilot_pid: int = field(default_factory=os.getpid)
    families: dict[int, Family] = field(default_factory=dict)
    #: Orphans no payload could be named for: ended when no payload is running.
    strays: dict[int, int] = field(default_factory=dict)

    def adopt(self, job_id: int, root: int) -> Family:
        family = Family(job_id, root)
        self.families[job_id] = family
        return family

    def scan(self) -> None:
        """Bring every family up to date; reap the adopted orphans that have ended."""
        table = process_table()
        roots = {f.root: f for f in self.families.values()}
        owner: dict[int, Family] = {}
        for family in self.families.values():
            for pid, start in list(family.members.items()):
                proc = table.get(pid)
                if proc is not None and proc.start == start:
                    owner[pid] = family
                else:
                    del family.members[pid]
                    family.orphan_cpu.pop(pid, None)

        def family_of(proc: Proc) -> Family | None:
            """The family of the nearest known ancestor (or session, or process group)."""
            here: Proc | None = proc
            for _ in range(4096):
                if here is None:
                    return None
                for pid in (here.pid, here.sid, here.pgid):
                    if pid in owner:
                        return owner[pid]
                    if pid in roots:
                        return roots[pid]
                if here.ppid == self.pilot_pid or here.ppid <= 1:
                    return None
                here = table.get(here.ppid)
            return None

        for proc in table.values():
            if proc.pid == self.pilot_pid or proc.pid in roots:
                continue
            found = family_of(proc)
            if found is None and proc.ppid == self.pilot_pid:
                found = self._orphan_family(proc)
                if found is None:
                    self.strays.setdefault(proc.pid, proc.start)
                    self._reap_orphan(proc, None)
                    continue
            if found is None:
                continue
            family = found
            family.members.setdefault(proc.pid, proc.start)
            owner[proc.pid] = family
            if proc.ppid == self.pilot_pid:
                family.orphan_cpu[proc.pid] = proc.cpu
                self._reap_orphan(proc, family)
        for family in self.families.values():
            root = table.get(family.root)
            total = (root.cpu if root else 0.0) + sum(
                table[pid].cpu for pid in family.members if pid in table)
            family.seen_cpu = max(family.seen_cpu, total)
        if not self.families and self.strays:
            self._end_processes(self.strays, None, LEFTOVER_GRACE)

    def _orphan_family(self, proc: Proc) -> Family | None:
        marker = job_marker(proc.pid)
        for family in self.families.values():
            if marker == str(family.job_id):
                return family
        if len(self.families) == 1:
            return next(iter(self.families.values()))
        return None

    def _reap_orphan(self, proc: Proc, family: Family | None) -> bool:
        """Reap an adopted orphan if it has ended; count its CPU time. True if reaped."""
        try:
            pid, _status, usage = os.wait4(proc.pid, os.WNOHANG)
        except ChildProcessError:
            pid, usage = proc.pid, None
        if pid == 0:
            return False
        if family is not None:
            family.orphan_cpu.pop(proc.pid, None)
            family.members.pop(proc.pid, None)
            if usage is not None:
                family.reaped_cpu += usage.ru_utime + usage.ru_stime
        self.strays.pop(proc.pid, None)
        return True

    def signal(self, job_id: int, signum: int) -> None:
        """Send ``signum`` to every known process of the payload but its first one."""
        family = self.families.get(job_id)
        if family is not None:
            send(family.members, signum)

    def end(self, job_id: int, grace: float = LEFTOVER_GRACE) -> Family | None:
        """End every process of the payload (its first one has ended or is being ended
        by the caller): SIGTERM, SIGKILL after ``grace`` seconds; reap the orphans. Returns
        the family, with its CPU time complete."""
        family = self.families.get(job_id)
        if family is None:
            return None
        self.scan()
        self._end_processes(family.members, family, grace)
        del self.families[job_id]
        if family.members:
            log.warning("job %d: processes %s could not be ended", job_id,
                        sorted(family.members), extra=concerning(job_id))
        return family

    def end_all(self, grace: float = LEFTOVER_GRACE) -> None:
        """The pilot stops: end every family and every stray."""
        for job_id in list(self.families):
            self.end(job_id, grace)
        self.scan()
        self._end_processes(self.strays, None, grace)

    def _end_processes(self, members: dict[int, int], family: Family | None,
                       grace: float) -> None:
        if not members:
            return
        log.info("ending %d leftover process(es)%s", len(members),
                 f" of job {family.job_id}" if family else "",
                 extra=concerning(family.job_id if family else None))
        send(members, signal.SIGTERM)
        deadline = time.monotonic() + grace
        killed = False
        while members:
            self._forget_ended(members, family)
            if not members:
                break
            if not killed and time.monotonic() >= deadline:
                send(members, signal.SIGKILL)
                killed = True
                deadline = time.monotonic() + 10.0
            elif killed and time.monotonic() >= deadline:
                break
            time.sleep(0.05)

    def _forget_ended(self, members: dict[int, int], family: Family | None) -> None:
        """Drop from ``members`` the processes that are gone; reap the pilot's own."""
        for pid, start in list(members.items()):
            proc = read_proc(pid)
            if proc is None or proc.start != start:
                members.pop(pid, None)
                if family is not None:
                    family.orphan_cpu.pop(pid, None)
                continue
            if proc.ppid == self.pilot_pid:
                if family is not None:
                    family.orphan_cpu[pid] = proc.cpu
                if self._reap_orphan(proc, family):
                    members.pop(pid, None)


def send(members: dict[int, int], signum: int) -> None:
    """Signal the processes named by pid and start time that are still those processes."""
    for pid, start in list(members.items()):
        proc = read_proc(pid)
        if proc is None or proc.start != start:
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)
