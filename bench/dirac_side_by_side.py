"""DIRAC's match path and gridpilot's, side by side in one run on this machine.

For each K of ``--k`` (10, 100, 1,000 by default) and each of ``--rounds`` rounds, the same
workload (bench/pilot_stream.py's: K distinct queue definitions of owner x CPU time x site x
platform x tags, ``--jobs`` waiting jobs spread over them with Zipf-like weights, user
priorities 1..5) is loaded afresh before each measurement, and one claimer takes ``--claims``
pilots one at a time, each built compatible with a job drawn among those still waiting:

- DIRAC (its own Python, ``--dirac-python``, a venv where ``pip install DIRAC==9.1.22
  mysqlclient`` was run; never the project's), on MariaDB database ``--dirac-database``:
  ``TaskQueueDB.matchAndGetJob`` alone (``dirac_tqdb``: the resource dictionary the Matcher
  builds for a generic pilot of the VO), and the full ``Matcher.selectJob`` (``dirac_matcher``:
  credentials, pilot version, site mask, job limits, TaskQueueDB, job attributes and status,
  the logging record, the JDL and optimizer parameters, the pilot's status and job mapping);
  the jobs are in JobDB (``Jobs``, ``JobJDLs``, loaded by INSERT) and put in their task queues
  by ``TaskQueueDB.insertJob``, one pilot row per claim in PilotAgentsDB. The configuration is a
  minimal dirac.cfg written to a temporary folder (``$DIRACSYSCONFIG``); the site mask answers
  from memory (a stand-in for the Resource Status System's cached answer: every site active).
  DIRAC's queues carry no memory requirement (gridpilot's jobs ask 2 GB, which every pilot
  has), and each job's pilot is drawn once, by the orchestrator, with pilot_stream's
  ``pilot_for`` (the worker then draws among the jobs still waiting, as pilot_stream does).
- gridpilot (this Python), on PostgreSQL and MariaDB databases of its own (made and dropped by
  bench/kit.py): the database's claim function alone (``gp_claim``: one autocommit call, as
  the match path makes it) and the match endpoint's
  ``taskqueue.pilots.pilotmatch.match_for_pilot`` (``gp_match``: the pilot's record looked
  up, the claim, payloads handed back), run by bench/pilot_stream.py's ``measure``; on
  request, ``taskqueue.matching.claim.claim_jobs`` alone (``gp_pyclaim``, the Python claim,
  the path of a database without the function).

Every measurement is checked with bench/pilot_stream.py's rules: no job handed out twice
(duplicates), every job handed out matches its pilot (violations), and on gridpilot's side no
empty answer while a matching job waited (misses). Commits are durable on both sides (the same
MariaDB server for both; its ``innodb_flush_log_at_trx_commit`` and ``sync_binlog`` are
printed). Before each K and backend, bench/calibration.py measures the machine's floor (a
durable single-row UPDATE and COMMIT per call); each line carries its rate as a multiple of it,
and a summary prints the ratios gridpilot/DIRAC per K.

DIRAC's venv (its full dependency set does not build here: gfal2-python needs the gfal2
C library; what the DIRAC side imports is enough; apt: libmariadb-dev, pkg-config, swig,
libssl-dev)::

    python3.11 -m venv /tmp/dirac-venv
    /tmp/dirac-venv/bin/pip install --no-deps DIRAC==9.1.22
    /tmp/dirac-venv/bin/pip install DIRACCommon==9.1.22 diraccfg diracx-client diracx-core \
        sqlalchemy mysqlclient M2Crypto opensearch-py psutil pyasn1 pyasn1-modules \
        python-dateutil pytz requests pydantic cachetools packaging typing_extensions \
        importlib_resources importlib_metadata pyparsing db12 certifi pyyaml

Run from the repository root (about four minutes a round with the defaults)::

    .venv/bin/python bench/dirac_side_by_side.py --dirac-python /tmp/dirac-venv/bin/python \
        --jobs 4000 --claims 2000 --rounds 3

The same file, run by DIRAC's Python with ``--dirac-worker``, is the DIRAC side: it reads its
task on stdin and writes its result on stdout (the orchestrator starts it; nothing of the
project is imported there, and nothing of DIRAC on the project's side).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DIRAC_GROUP = "benchvo_user"
PILOT_GROUP = "benchvo_pilot"
MODES = ("dirac_tqdb", "dirac_matcher", "gp_claim_postgresql", "gp_match_postgresql",
         "gp_claim_mariadb", "gp_match_mariadb")
#: Measured on request (--sides): the Python claim (claim_jobs), the path without a function.
EXTRA_MODES = ("gp_pyclaim_postgresql", "gp_pyclaim_mariadb")
PATHS = {"gp_claim": "claim_function", "gp_match": "matcher", "gp_pyclaim": "claim_jobs"}

# =========================================================================== DIRAC's side
# (run by DIRAC's Python: standard library, MySQLdb and DIRAC only)

DIRAC_CFG = """\
DIRAC
{{
  VirtualOrganization = {vo}
}}
Systems
{{
  Databases
  {{
    User = {user}
    Password = {password}
    Host = {host}
    Port = {port}
  }}
  WorkloadManagement
  {{
    Databases
    {{
      TaskQueueDB
      {{
        DBName = {db}
      }}
      JobDB
      {{
        DBName = {db}
      }}
      JobLoggingDB
      {{
        DBName = {db}
      }}
      PilotAgentsDB
      {{
        DBName = {db}
      }}
    }}
  }}
}}
Registry
{{
  DefaultGroup = {group}
  VO
  {{
    {vo}
    {{
      VOAdmin = user0
    }}
  }}
  Groups
  {{
    {group}
    {{
      Users = {users}
      Properties = NormalUser
      VO = {vo}
    }}
    {pilot_group}
    {{
      Users = pilot
      Properties = GenericPilot, LimitedDelegation
      VO = {vo}
    }}
  }}
  Users
  {{
{user_sections}
  }}
}}
Operations
{{
  Defaults
  {{
    Pilot
    {{
      CheckVersion = False
    }}
  }}
}}
"""

SCHEMA_FILES = ("JobDB.sql", "JobLoggingDB.sql", "PilotAgentsDB.sql")


class _ActiveSites:
    """The site mask, answered from memory: every site is usable (the Resource Status System
    answers the Matcher from a cache; this benchmark has no RSS to ask)."""

    def getUsableSites(self, siteNames: Any = None) -> dict[str, Any]:
        names = [siteNames] if isinstance(siteNames, str) else list(siteNames or [])
        return {"OK": True, "Value": names}


def _dirac_connect(task: dict[str, Any]) -> Any:
    mysqldb = importlib.import_module("MySQLdb")
    db = task["db"]
    return mysqldb.connect(host=db["host"], port=db["port"], user=db["user"],
                           passwd=db["password"], db=db["name"], autocommit=True)


def _dirac_schema(task: dict[str, Any], conn: Any) -> None:
    """Empty DIRAC tables in the benchmark's database: JobDB, JobLoggingDB and PilotAgentsDB
    from DIRAC's own .sql files; TaskQueueDB makes its tables itself."""
    wms = Path(importlib.import_module("DIRAC.WorkloadManagementSystem.DB").__file__ or "").parent
    cur = conn.cursor()
    cur.execute("SET FOREIGN_KEY_CHECKS = 0")
    cur.execute("SHOW TABLES")
    for (table,) in cur.fetchall():
        cur.execute(f"DROP TABLE `{table}`")
    cur.execute("SET FOREIGN_KEY_CHECKS = 1")
    for name in SCHEMA_FILES:
        text = (wms / name).read_text()
        lines = [ln for ln in text.splitlines() if not ln.strip().startswith("--")]
        for statement in "\n".join(lines).split(";"):
            statement = statement.strip()
            if statement and not statement.upper().startswith("USE "):
                cur.execute(statement)
    cur.close()


def _dirac_load(task: dict[str, Any], conn: Any, tqdb: Any) -> float:
    """The jobs in JobDB (by INSERT) and in their task queues (by ``TaskQueueDB.insertJob``,
    DIRAC's own path), and one pilot row per claim; returns the seconds taken."""
    t0 = time.perf_counter()
    queues, job_queue, priority = task["queues"], task["job_queue"], task["priority"]
    vo = task["vo"]
    cur = conn.cursor()
    jobs = []
    jdls = []
    for i, (q, prio) in enumerate(zip(job_queue, priority, strict=True)):
        spec = queues[q]
        jdl = (f'[Executable = "stream.sh"; Arguments = "{i}"; Owner = "{spec["owner"]}"; '
               f'OwnerGroup = "{DIRAC_GROUP}"; CPUTime = {spec["cpu_time"]}; '
               f'Priority = {prio}; VirtualOrganization = "{vo}"]')
        jobs.append((i + 1, "User", "Waiting", "Pilot Agent Submission", "Unknown",
                     spec["owner"], DIRAC_GROUP, vo, spec["site"] or "ANY", prio, f"job{i}"))
        jdls.append((i + 1, jdl, jdl, jdl))
    for lo in range(0, len(jobs), 1000):
        cur.executemany("INSERT INTO JobJDLs (JobID, JDL, JobRequirements, OriginalJDL) "
                        "VALUES (%s, %s, %s, %s)", jdls[lo:lo + 1000])
        cur.executemany(
            "INSERT INTO Jobs (JobID, JobType, Status, MinorStatus, ApplicationStatus, Owner, "
            "OwnerGroup, VO, Site, UserPriority, JobName, SubmissionTime, LastUpdateTime) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, UTC_TIMESTAMP(), "
            "UTC_TIMESTAMP())", jobs[lo:lo + 1000])
    pilots = [(f"dirac-pilot-{n}", "Submitted", vo) for n in range(task["claims"] + 1)]
    for lo in range(0, len(pilots), 1000):
        cur.executemany("INSERT INTO PilotAgents (PilotJobReference, Status, VO, "
                        "SubmissionTime, LastUpdateTime) VALUES (%s, %s, %s, "
                        "UTC_TIMESTAMP(), UTC_TIMESTAMP())", pilots[lo:lo + 1000])
    cur.close()
    for i, (q, prio) in enumerate(zip(job_queue, priority, strict=True)):
        spec = queues[q]
        definition: dict[str, Any] = {"Owner": spec["owner"], "OwnerGroup": DIRAC_GROUP,
                                      "CPUTime": spec["cpu_time"], "JobTypes": ["User"]}
        if spec["site"]:
            definition["Sites"] = [spec["site"]]
        if spec["platform"]:
            definition["Platforms"] = [spec["platform"]]
        if spec["tags"]:
            definition["Tags"] = sorted(spec["tags"])
        result = tqdb.insertJob(i + 1, definition, prio)
        if not result["OK"]:
            raise SystemExit(f"TaskQueueDB.insertJob({i + 1}): {result['Message']}")
    result = tqdb.recalculateTQSharesForAll()
    if not result["OK"]:
        raise SystemExit(f"TaskQueueDB.recalculateTQSharesForAll: {result['Message']}")
    return time.perf_counter() - t0


def _dirac_description(pilot: dict[str, Any], reference: str, vo: str) -> dict[str, Any]:
    """A pilot's resource description, as a DIRAC pilot's JobAgent sends it."""
    return {"Site": pilot["site"], "GridCE": f"ce1.{pilot['site'].lower()}",
            "Platform": pilot["platform"], "CPUTime": pilot["cpu_time"],
            "Tag": sorted(pilot["tags"]), "RequiredTag": sorted(pilot["required_tags"]),
            "JobType": "User", "VirtualOrganization": vo, "PilotReference": reference,
            "PilotBenchmark": 10.0, "ReleaseVersion": "v9.1.22"}


def _comm(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def dirac_worker() -> int:
    """The DIRAC side of one measurement: the task on stdin, the result on stdout."""
    task = json.load(sys.stdin)
    db = task["db"]
    folder = Path(tempfile.mkdtemp(prefix="dirac_bench_cfg_"))
    users = sorted({q["owner"] for q in task["queues"]} | {"user0"})
    cfg = folder / "dirac.cfg"
    cfg.write_text(DIRAC_CFG.format(
        vo=task["vo"], user=db["user"], password=db["password"], host=db["host"],
        port=db["port"], db=db["name"], group=DIRAC_GROUP, pilot_group=PILOT_GROUP,
        users=", ".join(users),
        user_sections="\n".join(f"    {u}\n    {{\n      DN = /DC=bench/CN={u}\n    }}"
                                for u in users)))
    os.environ["DIRACSYSCONFIG"] = str(cfg)
    dirac = importlib.import_module("DIRAC")
    dirac.initialize(require_auth=False, log_level=task.get("log_level", "ERROR"))
    conn = _dirac_connect(task)
    _dirac_schema(task, conn)
    tqdb = importlib.import_module("DIRAC.WorkloadManagementSystem.DB.TaskQueueDB").TaskQueueDB()
    load_seconds = _dirac_load(task, conn, tqdb)
    mode = task["mode"]
    matcher: Any = None
    if mode == "dirac_matcher":
        matcher_module = importlib.import_module("DIRAC.WorkloadManagementSystem.Client.Matcher")
        matcher = matcher_module.Matcher(tqDB=tqdb)
        matcher.siteClient = _ActiveSites()
        properties = importlib.import_module("DIRAC.Core.Security.Properties")
        cred = {"properties": [properties.GENERIC_PILOT, properties.LIMITED_DELEGATION],
                "group": PILOT_GROUP, "DN": "/DC=bench/CN=pilot", "username": "pilot"}
    pilots = task["pilots"]  # one per job: compatible with that job's queue
    rng = random.Random(task["seed"])
    candidates = list(range(len(task["job_queue"])))
    taken = bytearray(len(candidates))
    handed: list[list[int]] = []  # [pilot's job number, job handed out or -1]
    latencies: list[float] = []
    errors: list[str] = []
    from kit import machine_cpu_seconds, proc_cpu  # bench/kit.py, with DIRAC's SQLAlchemy

    servers = [int(e.name) for e in os.scandir("/proc") if e.name.isdigit()
               and _comm(e.name) in ("mariadbd", "mysqld")]
    server0 = sum(c for p in servers if (c := proc_cpu(p)) is not None)
    busy0, total0 = machine_cpu_seconds()
    cpu0 = time.process_time()
    start = time.perf_counter()
    for n in range(task["claims"]):
        i = -1
        while candidates:
            pos = rng.randrange(len(candidates))
            if taken[candidates[pos]]:
                candidates[pos] = candidates[-1]
                candidates.pop()
                continue
            i = candidates[pos]
            break
        if i < 0:
            break
        description = _dirac_description(pilots[i], f"dirac-pilot-{n}", task["vo"])
        t0 = time.perf_counter()
        job = -1
        if matcher is None:
            resource = {k: description[k] for k in
                        ("Site", "GridCE", "Platform", "CPUTime", "Tag", "RequiredTag",
                         "JobType")}
            resource["OwnerGroup"] = [DIRAC_GROUP, PILOT_GROUP]  # a generic pilot's
            result = tqdb.matchAndGetJob(resource)
            if not result["OK"]:
                errors.append(result["Message"])
            elif result["Value"]["matchFound"]:
                job = int(result["Value"]["jobId"])
        else:
            try:
                answer = matcher.selectJob(description, cred)
            except Exception as exc:  # DIRAC's Matcher raises on what it cannot do
                errors.append(repr(exc))
                answer = {}
            if answer:
                job = int(answer["JobID"])
        latencies.append(time.perf_counter() - t0)
        if job > 0 and job <= len(taken):
            taken[job - 1] = 1
        handed.append([i, job - 1 if job > 0 else -1])
    window = time.perf_counter() - start
    client_cpu = time.process_time() - cpu0
    busy1, total1 = machine_cpu_seconds()
    server_cpu = sum(c for p in servers if (c := proc_cpu(p)) is not None) - server0
    busy = busy1 - busy0
    cur = conn.cursor()
    cur.execute("SELECT COUNT(*) FROM Jobs WHERE Status = 'Matched'")
    matched_rows = int(cur.fetchone()[0])
    cur.execute("SELECT COUNT(*) FROM tq_Jobs")
    left_in_queues = int(cur.fetchone()[0])
    cur.execute("SELECT COUNT(*) FROM LoggingInfo WHERE Status = 'Matched'")
    logging_rows = int(cur.fetchone()[0])
    cur.execute("SELECT COUNT(*) FROM JobToPilotMapping")
    pilot_mappings = int(cur.fetchone()[0])
    cur.execute("SELECT COUNT(*) FROM PilotAgents WHERE Status = 'Running'")
    running_pilots = int(cur.fetchone()[0])
    cur.execute("SELECT @@innodb_flush_log_at_trx_commit, @@sync_binlog, @@autocommit")
    flush, sync_binlog, autocommit = cur.fetchone()
    cur.close()
    conn.close()
    json.dump({"mode": mode, "handed": handed, "seconds": window, "latencies": latencies,
               "client_cpu_seconds": client_cpu, "errors": errors[:5],
               "server_cpu_seconds": server_cpu if servers else None,
               # As bench/pilot_stream.py reports it: cores busy in the window, and those
               # used by neither this claimer nor the database server.
               "load": {"cores": os.cpu_count(), "busy_cores": round(busy / window, 2),
                        "other_cores": round((busy - client_cpu - server_cpu) / window, 2),
                        "idle_share": round(1 - busy / (total1 - total0), 3),
                        "loadavg_1m": float(Path("/proc/loadavg").read_text().split()[0])},
               "error_count": len(errors), "load_seconds": load_seconds,
               "matched_rows": matched_rows, "left_in_queues": left_in_queues,
               "logging_rows": logging_rows, "pilot_mappings": pilot_mappings,
               "running_pilots": running_pilots,
               "innodb_flush_log_at_trx_commit": int(flush), "sync_binlog": int(sync_binlog),
               "session_autocommit": int(autocommit),
               "dirac_version": getattr(dirac, "__version__", None)}, sys.stdout)
    return 0


# =========================================================================== the orchestrator
# (run by the project's Python)


def _dirac_task(args: argparse.Namespace, k: int, mode: str, seed: int) -> dict[str, Any]:
    import pilot_stream as ps
    from sqlalchemy.engine import make_url

    wl = ps.make_workload(k, args.jobs, args.seed)
    rng = random.Random(f"dirac-pilots-{seed}-{k}")
    specs = [ps.queue_spec(q) for q in range(k)]
    pilots = []
    for q in wl.job_queue:
        p = ps.pilot_for(specs[q], rng, 1)
        pilots.append({"site": p.site, "platform": p.platform, "cpu_time": p.cpu_time,
                       "tags": sorted(p.tags), "required_tags": sorted(p.required_tags)})
    url = make_url(args.mariadb)
    return {
        "mode": mode, "vo": ps.VO, "seed": seed, "claims": min(args.claims, len(wl.job_queue)),
        "db": {"host": url.host or "127.0.0.1", "port": url.port or 3306,
               "user": url.username or "root", "password": url.password or "",
               "name": args.dirac_database},
        "queues": [{"owner": s.owner, "cpu_time": s.cpu_time, "site": s.site,
                    "platform": s.platform, "tags": sorted(s.tags)} for s in specs],
        "job_queue": wl.job_queue, "priority": wl.priority, "pilots": pilots,
        "log_level": args.dirac_log_level,
    }


def _check_dirac(task: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
    """pilot_stream's checks on what DIRAC handed out."""
    import pilot_stream as ps
    from kit import percentile_ms, rate

    specs = [ps.queue_spec(q) for q in range(len(task["queues"]))]
    seen: set[int] = set()
    duplicates = violations = empty = 0
    for pilot_job, job in out["handed"]:
        if job < 0:
            empty += 1
            continue
        if job in seen:
            duplicates += 1
        seen.add(job)
        p = task["pilots"][pilot_job]
        pilot = ps.Pilot(site=p["site"], platform=p["platform"], cpu_time=p["cpu_time"],
                         tags=frozenset(p["tags"]), required_tags=frozenset(p["required_tags"]),
                         processors=1, memory=ps.JOB_MEMORY)
        if not ps.matches(specs[task["job_queue"][job]], pilot):
            violations += 1
    claims = len(out["handed"])
    lat = sorted(out["latencies"])
    jobs = claims - empty
    return {
        "claims": claims, "jobs": jobs, "seconds": round(out["seconds"], 3),
        "claims_per_s": rate(claims, out["seconds"]), "jobs_per_s": rate(jobs, out["seconds"]),
        "p50_ms": percentile_ms(lat, 0.5), "p99_ms": percentile_ms(lat, 0.99),
        # One claimer, each pilot built for a job still waiting: every empty answer is a miss
        # (DIRAC's task queues emptied by matches stay until their cleanup, 5 minutes later,
        # and the match can pick its 10 queues among them).
        "empty_answers": empty, "misses": empty, "duplicates": duplicates,
        "violations": violations,
        "errors": out["error_count"], "error_samples": out["errors"],
        # TaskQueueDB alone takes jobs out of tq_Jobs; the Matcher also marks them Matched,
        # logs the status and maps each to its pilot (running).
        "database_agrees": (out["left_in_queues"] == len(task["job_queue"]) - jobs
                            and (out["mode"] != "dirac_matcher"
                                 or out["matched_rows"] == out["logging_rows"]
                                 == out["pilot_mappings"] == out["running_pilots"] == jobs)),
        "client_cpu_ms_per_claim": round(out["client_cpu_seconds"] * 1000 / claims, 3)
        if claims else None,
        "server_cpu_ms_per_claim": round(out["server_cpu_seconds"] * 1000 / claims, 3)
        if claims and out["server_cpu_seconds"] is not None else None,
        "server_cpu_scope": "all mariadb processes (other users' work included)",
        "load_seconds": round(out["load_seconds"], 1),
        "innodb_flush_log_at_trx_commit": out["innodb_flush_log_at_trx_commit"],
        "sync_binlog": out["sync_binlog"], "session_autocommit": out["session_autocommit"],
    }


def _machine_load() -> dict[str, Any]:
    return {"loadavg_1m": float(Path("/proc/loadavg").read_text().split()[0]),
            "cores": os.cpu_count()}


def measure_dirac(args: argparse.Namespace, k: int, mode: str, seed: int) -> dict[str, Any]:
    from kit import log

    task = _dirac_task(args, k, mode, seed)
    load_before = _machine_load()
    proc = subprocess.run([args.dirac_python, str(Path(__file__).resolve()), "--dirac-worker"],
                          input=json.dumps(task), capture_output=True, text=True,
                          timeout=args.timeout, check=False)
    if proc.returncode != 0:
        log(proc.stderr[-4000:])
        raise SystemExit(f"the DIRAC side ({mode}, K={k}) failed with code {proc.returncode}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if proc.stderr.strip():  # DIRAC logs its errors there (the level is ERROR)
        log(f"the DIRAC side said: {proc.stderr.strip()[-2000:]}")
    record = {"measure": "side_by_side", "side": mode, "backend": "mariadb", "k": k,
              "jobs_loaded": len(task["job_queue"]), **_check_dirac(task, out),
              "load": {**out["load"], "loadavg_1m_before": load_before["loadavg_1m"]},
              "dirac_version": out["dirac_version"]}
    return record


def measure_gridpilot(args: argparse.Namespace, url: str, backend: str, k: int, mode: str,
                      seed: int) -> dict[str, Any]:
    import pilot_stream as ps
    import queue_ops

    wl = ps.make_workload(k, args.jobs, args.seed)
    ps.load_workload(url, backend, wl)
    queue_ops.analyze(url, backend, vacuum=True)
    job_ids = ps.job_ids_by_number(url, len(wl.job_queue))
    path = PATHS[mode.rsplit("_", 1)[0]]
    record = ps.measure(url, backend, wl, job_ids, processes=1, count=1, seed=seed, path=path,
                        claims=min(args.claims, len(wl.job_queue)), seconds=args.seconds,
                        profile=None)
    ps.clear_vos(url, [ps.VO])
    keep = ("claims", "jobs", "seconds", "claims_per_s", "jobs_per_s", "p50_ms", "p99_ms",
            "empty_answers", "misses", "duplicates", "violations", "errors",
            "database_agrees", "client_cpu_ms_per_claim", "server_cpu_ms_per_claim",
            "statements_per_claim", "commits_per_claim", "load")
    return {"measure": "side_by_side", "side": mode, "backend": backend, "k": k,
            "jobs_loaded": len(job_ids), **{key: record.get(key) for key in keep}}


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


def summarize(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per K: each side's median rate of jobs handed out (matches/s) over the rounds, and the
    ratios gridpilot / DIRAC of those medians."""
    out = []
    for k in sorted({r["k"] for r in records}):
        med: dict[str, float | None] = {}
        floor: dict[str, float | None] = {}
        others: list[float] = []
        for mode in (*MODES, *EXTRA_MODES):
            rates = [r["jobs_per_s"] for r in records if r["k"] == k and r["side"] == mode
                     and r["jobs_per_s"] is not None]
            med[mode] = round(statistics.median(rates), 1) if rates else None
            xs = [r["x_floor"] for r in records if r["k"] == k and r["side"] == mode
                  and r.get("x_floor") is not None]
            floor[mode] = round(statistics.median(xs), 3) if xs else None
            others += [r["load"]["other_cores"] for r in records if r["k"] == k
                       and r["side"] == mode and r["load"].get("other_cores") is not None]
        out.append({
            "measure": "side_by_side_summary", "k": k, "matches_per_s": med,
            "x_floor": floor,
            "full_match_vs_dirac_matcher": {
                "postgresql": _ratio(med["gp_match_postgresql"], med["dirac_matcher"]),
                "mariadb": _ratio(med["gp_match_mariadb"], med["dirac_matcher"])},
            "claim_vs_dirac_tqdb": {
                "postgresql": _ratio(med["gp_claim_postgresql"], med["dirac_tqdb"]),
                "mariadb": _ratio(med["gp_claim_mariadb"], med["dirac_tqdb"])},
            # Cores other work kept busy during the measurements (min, median, max).
            "other_cores": ([min(others), statistics.median(others), max(others)]
                            if others else None),
            "rounds": len([r for r in records if r["k"] == k and r["side"] == "dirac_tqdb"]),
        })
    return out


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--dirac-worker", action="store_true",
                        help="the DIRAC side (run by DIRAC's Python; task on stdin)")
    parser.add_argument("--dirac-python", default="/tmp/dirac-venv/bin/python",
                        help="a Python with DIRAC 9.1.22 and mysqlclient installed "
                             "(default /tmp/dirac-venv/bin/python)")
    parser.add_argument("--mariadb", default="mysql+pymysql://root@127.0.0.1:3306/test",
                        help="a MariaDB server URL (its database only serves to create "
                             "the benchmark's own; default root@127.0.0.1:3306)")
    parser.add_argument("--postgres", default="postgresql+psycopg://postgres@127.0.0.1:5432/test",
                        help="a PostgreSQL server URL (likewise)")
    parser.add_argument("--dirac-database", default="dirac_bench",
                        help="the MariaDB database DIRAC's tables go in (made and dropped; "
                             "default dirac_bench)")
    parser.add_argument("--k", default="10,100,1000",
                        help="comma list of task-queue counts (default 10,100,1000)")
    parser.add_argument("--jobs", type=int, default=3000, help="waiting jobs (default 3000)")
    parser.add_argument("--claims", type=int, default=1000,
                        help="claims per measurement (default 1000)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds; each runs every side at every K in turn (default 1)")
    parser.add_argument("--sides", default=",".join(MODES),
                        help=f"comma list of sides to measure (default {','.join(MODES)})")
    parser.add_argument("--seed", type=int, default=1, help="the workload's seed (default 1)")
    parser.add_argument("--seconds", type=float, default=300.0,
                        help="stop a gridpilot measurement after this long (default 300)")
    parser.add_argument("--timeout", type=float, default=1200.0,
                        help="seconds a DIRAC measurement may take, load included (1200)")
    parser.add_argument("--calibration-seconds", type=float, default=3.0,
                        help="seconds of each calibration loop (default 3)")
    parser.add_argument("--dirac-log-level", default="ERROR",
                        help="DIRAC's log level on its side (default ERROR)")
    args = parser.parse_args(argv)
    try:
        args.k = [int(x) for x in args.k.split(",") if x.strip()]
    except ValueError:
        parser.error("--k: expected a comma list of integers")
    args.sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    unknown = sorted(set(args.sides) - set(MODES) - set(EXTRA_MODES))
    if unknown:
        parser.error(f"--sides: unknown {unknown}; choose among {[*MODES, *EXTRA_MODES]}")
    if (not args.k or min(args.k) < 1 or args.jobs < 1 or args.claims < 1 or args.rounds < 1
            or args.calibration_seconds <= 0):
        parser.error("--k, --jobs, --claims, --rounds and --calibration-seconds must be "
                     "positive")
    if not args.dirac_worker and any(s.startswith("dirac") for s in args.sides) \
            and not Path(args.dirac_python).exists():
        parser.error(f"--dirac-python {args.dirac_python} does not exist (see --help)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dirac_worker:
        return dirac_worker()
    import calibration as cal
    from kit import admin_statement, emit, end_on_signals, fresh_database, log

    end_on_signals()
    dirac = any(side.startswith("dirac") for side in args.sides)
    backends = sorted({"mariadb" if side.startswith("dirac") else side.rsplit("_", 1)[1]
                       for side in args.sides})
    servers = {"postgresql": args.postgres, "mariadb": args.mariadb}
    records: list[dict[str, Any]] = []
    with ExitStack() as stack:
        if dirac:
            admin_statement(args.mariadb, f"CREATE DATABASE IF NOT EXISTS {args.dirac_database}")
            stack.callback(admin_statement, args.mariadb,
                           f"DROP DATABASE IF EXISTS {args.dirac_database}")
        # gridpilot's databases; the MariaDB one also serves the calibration of DIRAC's server.
        urls = {b: stack.enter_context(fresh_database(servers[b], prefix="gp_dirac_bench")).url
                for b in backends}
        for rnd in range(args.rounds):
            for k in args.k:
                floors: dict[str, dict[str, Any]] = {}
                for backend, url in urls.items():
                    c = cal.calibrate(url, backend, seconds=args.calibration_seconds)
                    c.update(k=k, round=rnd)
                    emit(c)
                    floors[backend] = c
                # Interleaved: each side in turn, the order turned each round.
                turn = rnd % len(args.sides)
                for mode in args.sides[turn:] + args.sides[:turn]:
                    log(f"round {rnd + 1}, K={k}: {mode}")
                    if mode.startswith("dirac"):
                        record = measure_dirac(args, k, mode, args.seed + rnd)
                    else:
                        backend = mode.rsplit("_", 1)[1]
                        record = measure_gridpilot(args, urls[backend], backend, k, mode,
                                                   args.seed + rnd)
                    floor = floors[record["backend"]]["update_commit"]["per_s"]
                    record.update(round=rnd, floor_per_s=floor,
                                  x_floor=_ratio(record["jobs_per_s"], floor))
                    emit(record)
                    log(f"  {record['jobs_per_s']} matches/s ({record['x_floor']} x the "
                        f"floor {floor}/s), p50 {record['p50_ms']} ms, duplicates "
                        f"{record['duplicates']}, violations {record['violations']}, "
                        f"empty {record['empty_answers']}, errors {record['errors']}, "
                        f"other work {record['load'].get('other_cores')} cores")
                    records.append(record)
        for line in summarize(records):
            emit(line)
            log(f"K={line['k']}: {line['matches_per_s']}; full match / DIRAC Matcher "
                f"{line['full_match_vs_dirac_matcher']}; claim / TaskQueueDB "
                f"{line['claim_vs_dirac_tqdb']}")
    bad = [r for r in records if r["duplicates"] or r["violations"]
           or (r["side"].startswith("gp") and r.get("misses"))]
    return 1 if bad else 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        raise SystemExit(130) from None
