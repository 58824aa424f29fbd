"""A fake PBS (qsub, qstat, qdel) and LSF (bsub, bjobs, bkill) for the site director's tests.

No PBS or LSF can run here, so PSI/J's real ``pbs`` and ``lsf`` executors are pointed at these
commands instead (tests/integration/test_director.py puts small wrappers named like the real
commands first on PATH; each runs ``python fakebatch.py COMMAND ARGS...``). The batch system is
a JSON file, ``$FAKEBATCH_STATE``: every submitted script is copied beside it (PSI/J deletes its
own copy once a job is final), every job starts queued, and nothing ever runs by itself: the
test moves jobs between states. Status queries answer in the formats PSI/J parses:
``qstat -f -F json -x IDS`` and ``bjobs -o "JOBID STAT ..." -json -a IDS``, and so do the job
listings (``qstat -u USER``, ``bjobs -a -noheader -o jobid -u USER``). Every call is logged
(argv) in the state file, so a test can see that the executors poll in bulk.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: Options of the status commands that take a value.
VALUED = {"-o", "-F", "-u", "-q"}


def update(path: Path, change: Callable[[dict[str, Any]], Any]) -> Any:
    """Read the state in ``path``, apply ``change`` under an exclusive lock, write it back
    atomically; returns what ``change`` returns. The tests move jobs with this too."""
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = json.loads(path.read_text()) if path.exists() else {}
        state.setdefault("next", 1000)
        state.setdefault("jobs", {})
        state.setdefault("calls", [])
        result = change(state)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(path)
        return result


def positional(args: list[str]) -> list[str]:
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in VALUED:
            skip = True
        elif not arg.startswith("-") and arg != "json":
            out.append(arg)
    return out


def submit(path: Path, kind: str, args: list[str]) -> str:
    script = Path(positional(args)[-1])

    def change(state: dict[str, Any]) -> str:
        number = state["next"]
        state["next"] = number + 1
        native_id = f"{number}.fakepbs" if kind == "pbs" else str(number)
        copy = path.parent / "scripts" / f"{number}.sh"
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(script, copy)
        state["jobs"][native_id] = {"kind": kind, "state": "Q" if kind == "pbs" else "PEND",
                                    "script": str(copy), "exit": None}
        return native_id

    native_id = update(path, change)
    return f"{native_id}\n" if kind == "pbs" else \
        f"Job <{native_id}> is submitted to default queue <normal>.\n"


def qstat(jobs: dict[str, Any], ids: list[str]) -> str:
    report: dict[str, Any] = {}
    for native_id in ids:
        job = jobs.get(native_id)
        if job is None or job["kind"] != "pbs":
            continue  # a real qstat complains on stderr; PSI/J takes a missing job as ended
        entry: dict[str, Any] = {"job_state": job["state"]}
        if job["exit"] is not None:
            entry["Exit_status"] = job["exit"]
        report[native_id] = entry
    return json.dumps({"timestamp": 0, "pbs_version": "fake", "pbs_server": "fake",
                       "Jobs": report})


def bjobs(jobs: dict[str, Any], ids: list[str]) -> str:
    records = []
    for native_id in ids:
        job = jobs.get(native_id)
        if job is None or job["kind"] != "lsf":
            records.append({"JOBID": native_id, "ERROR": f"Job <{native_id}> is not found"})
            continue
        records.append({"JOBID": native_id, "STAT": job["state"], "EXIT_REASON": "",
                        "KILL_REASON": "", "SUSPEND_REASON": ""})
    return json.dumps({"COMMAND": "bjobs", "JOBS": len(records), "RECORDS": records})


def listing(jobs: dict[str, Any], kind: str) -> str:
    """The job list: PBS's (two header lines, then one job a line, finished ones left out, as
    without -x) or LSF's (ids only, finished ones included, as with -a)."""
    ids = [i for i, job in jobs.items() if job["kind"] == kind
           and (kind == "lsf" or job["state"] != "F")]
    if kind == "lsf":
        return "".join(f"{i}\n" for i in ids)
    return ("Job ID          Username Queue    Jobname    S\n"
            "--------------- -------- -------- ---------- -\n"
            + "".join(f"{i} fake q gridpilot {jobs[i]['state']}\n" for i in ids))


def main(argv: list[str]) -> int:
    path = Path(os.environ["FAKEBATCH_STATE"])
    command, args = argv[0], argv[1:]
    update(path, lambda state: state["calls"].append([command, *args]))
    if command in ("qsub", "bsub"):
        sys.stdout.write(submit(path, "pbs" if command == "qsub" else "lsf", args))
        return 0
    if command in ("qstat", "bjobs"):
        jobs = update(path, lambda state: state["jobs"])
        if command == "qstat" and "-f" not in args:  # qstat -u USER: the user's live jobs
            sys.stdout.write(listing(jobs, "pbs"))
        elif command == "bjobs" and "-json" not in args:  # bjobs -a -noheader -o jobid -u USER
            sys.stdout.write(listing(jobs, "lsf"))
        else:
            ids = positional(args)
            sys.stdout.write(qstat(jobs, ids) if command == "qstat" else bjobs(jobs, ids))
        return 0
    if command in ("qdel", "bkill"):
        def cancel(state: dict[str, Any]) -> None:
            for native_id in positional(args):
                job = state["jobs"][native_id]
                job["state"], job["exit"] = ("F", 265) if command == "qdel" else ("EXIT", 130)
        update(path, cancel)
        return 0
    sys.stderr.write(f"fakebatch: unknown command {command}\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
