"""``gridpilot-pilot``: the worker-node program's command line."""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from pilot import logformat
from pilot.client import Backoff, MatcherClient
from pilot.isolation import MODES, Bind
from pilot.loop import (
    EXIT_KILLED,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_TOKEN_EXPIRED,
    EXIT_UNREACHABLE,
    EXIT_UNSENT,
    EXIT_USAGE,
    LAST_ATTEMPT,
    Pilot,
    PilotOptions,
)
from pilot.output import MAX_OUTPUT_BYTES
from pilot.reaper import LEFTOVER_GRACE, become_subreaper
from pilot.replay import ReplayError, load_reports, replay
from pilot.resource import NodeDescription, detect_platform
from pilot.tls import CABundleError, trusted_cas
from pilot.token import (
    TokenError,
    forbid_dumping,
    read_token_fd,
    read_token_file,
    token_from_environment,
)

EPILOG = f"""\
Environment: GRIDPILOT_MATCHER_URL, GRIDPILOT_VO, GRIDPILOT_SITE, GRIDPILOT_CE, GRIDPILOT_QUEUE
and GRIDPILOT_PILOT_REFERENCE give defaults for the options of the same name; MACHINEFEATURES,
JOBFEATURES and JOBSTATUS are the HEPiX directories (or URLs, for the first two).

The CAs trusted for an https matcher: --ca-bundle, else GRIDPILOT_CA_BUNDLE, else
X509_CERT_DIR, else the system's store; each a PEM file or a folder of hashed CA certificates
(openssl rehash). A certificate that cannot be verified is said so, with the matcher's URL.

The pilot token comes from --token-file (mode 0600; the pilot removes the file once read) or
--token-fd, never from the environment: payloads run as the pilot's user and could read it in
/proc/<pid>/environ. A set GRIDPILOT_PILOT_TOKEN is refused (exit 2).

The pilot fills its cores: it asks the matcher for jobs that fit the free cores, memory and the
time left before its wall limit and any shutdown time, runs each as a subprocess in its own
work directory with its own $JOBFEATURES, heartbeats, obeys kill commands, reports exit codes
and output tails, and keeps $JOBSTATUS current for the site. It stops when it has had no job
for --idle-timeout seconds, when no time is left, when the drain file appears (after its
payloads end), or at the shutdown time (its payloads are stopped and handed back for
rescheduling).

SIGTERM or SIGINT is an immediate shutdown: a request to the matcher in flight (match,
download, upload, report) is given up at once, no new job starts, every payload gets SIGTERM
and, after --grace seconds, SIGKILL (with what it left running); their jobs are reported
Rescheduled in one last attempt of at most {LAST_ATTEMPT:g} s for all reports (no
--report-timeout then), the rest going to WORKDIR/undelivered-reports.json (exit 4). The
pilot is gone within --grace + about {LAST_ATTEMPT + 2 * LEFTOVER_GRACE:g} s.

A matcher that gives no readable answer for longer than --idle-timeout ends the pilot,
whatever it does: matching stops, running payloads are stopped as for SIGTERM (the matcher
reschedules their jobs once they fall silent), and reports and output uploads are given one
last attempt of {LAST_ATTEMPT:g} s, then kept in WORKDIR/undelivered-reports.json (exit 4;
exit 5 when nothing was left undelivered).

Exit codes:
  {EXIT_OK}  finished normally (idle, out of time, drained or shut down); every report delivered
  {EXIT_USAGE}  wrong options or environment
  {EXIT_REFUSED}  the matcher refused the pilot (bad token, wrong VO or site, wrong URL): it
     matched nothing more
  {EXIT_UNSENT}  some reports could not be delivered (before --report-timeout, or in the last
     attempt after a signal or a silent matcher); they are kept in
     WORKDIR/undelivered-reports.json, for gridpilot-pilot --replay FILE
  {EXIT_UNREACHABLE}  the matcher was never reached, or never gave an answer the pilot could
     read (wrong shape, redirected to another host, too large, too slow), before
     --idle-timeout (plus at most one --request-timeout); or it stopped answering for longer
     than --idle-timeout; or no request for work got a readable answer during the
     pilot's last --idle-timeout without a job
  {EXIT_KILLED}  the matcher told the pilot to stop (an operator killed it, or its CE said it
     ended): its payloads were stopped and handed back for rescheduling
  {EXIT_TOKEN_EXPIRED}  its token expired: the matcher refused to renew it (the pilot was killed or
     ended by its record), or it could not be renewed in time (the matcher did not answer,
     or the machine slept); its payloads were stopped, their reports kept as for {EXIT_UNSENT}
The reason for a non-zero exit code is the last line on stderr.
"""


def _env(name: str) -> str | None:
    return os.environ.get(name) or None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gridpilot-pilot", description="Pull jobs from a gridpilot matcher and run them on "
        "this worker node.", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = p.add_argument_group("the matcher and this pilot")
    where.add_argument("--matcher", default=_env("GRIDPILOT_MATCHER_URL"),
                       help="the matcher's base URL, e.g. https://wms.example.org")
    token = where.add_mutually_exclusive_group()
    token.add_argument("--token-file", type=Path,
                       help="file holding the pilot token, readable by its owner only (mode "
                            "0600); removed once read")
    token.add_argument("--token-fd", type=int, metavar="FD",
                       help="inherited file descriptor to read the pilot token from")
    where.add_argument("--ca-bundle", metavar="PATH",
                       help="PEM file, or folder of hashed CA certificates, of the CAs to "
                            "trust for an https matcher (default: $GRIDPILOT_CA_BUNDLE, else "
                            "$X509_CERT_DIR, else the system's store)")
    where.add_argument("--reference", default=_env("GRIDPILOT_PILOT_REFERENCE"),
                       help="this pilot's reference, as the site director recorded it "
                            "(default: HOST-PID-TIME)")
    node = p.add_argument_group("the resource description")
    node.add_argument("--vo", default=_env("GRIDPILOT_VO"), help="the VO whose jobs to run")
    node.add_argument("--site", default=_env("GRIDPILOT_SITE"), help="grid site name")
    node.add_argument("--ce", default=_env("GRIDPILOT_CE"), help="computing element")
    node.add_argument("--queue", default=_env("GRIDPILOT_QUEUE"), help="batch queue")
    node.add_argument("--platform", action="append", default=[], dest="platforms",
                      help="platform label (repeatable; default: detected, e.g. x86_64-el9)")
    node.add_argument("--tag", action="append", default=[], dest="tags",
                      help="a tag the node offers (repeatable)")
    node.add_argument("--required-tag", action="append", default=[], dest="required_tags",
                      help="a tag every job must carry (repeatable; also given as --tag)")
    node.add_argument("--attribute", action="append", default=[], dest="attributes",
                      metavar="NAME=VALUE",
                      help="a further attribute of the node for jobs' ClassAd Requirements "
                           "expressions (repeatable; VALUE is read as JSON when it parses, "
                           "e.g. CPUModel=\"EPYC\" or MaxRAM=8192)")
    node.add_argument("--submit-pools", default=None,
                      help="comma-separated SubmitPool ids the site director found for this "
                           "queue ('' for none); when absent the pilot asks the matcher "
                           "(getSubmitPoolsForQueue)")
    node.add_argument("--cores", type=int, default=None,
                      help="cores to fill (default: allocated_CPU of $JOBFEATURES, else all "
                           "CPUs of the node)")
    node.add_argument("--memory", type=int, default=None,
                      help="memory to fill, MB (default: mem_limit_MB of $JOBFEATURES)")
    node.add_argument("--gpus", default="",
                      help="comma-separated GPU device ids the pilot may hand out, e.g. 0,1 "
                           "(default: none): each payload that needs GPUs gets its own, in "
                           "CUDA_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES and ZE_AFFINITY_MASK")
    files = p.add_argument_group("HEPiX features and site controls")
    files.add_argument("--machine-features", default=_env("MACHINEFEATURES"),
                       help="$MACHINEFEATURES directory or URL")
    files.add_argument("--job-features", default=_env("JOBFEATURES"),
                       help="$JOBFEATURES directory or URL")
    files.add_argument("--jobstatus", type=Path, default=_env("JOBSTATUS"),
                       help="$JOBSTATUS directory the pilot keeps current for the site")
    files.add_argument("--drain-file", type=Path, default=None,
                       help="when this file exists, start no new payload and exit after the "
                            "running ones end")
    files.add_argument("--workdir", type=Path, default=Path("gridpilot-work"),
                       help="where payloads get their work directories (default: "
                            "./gridpilot-work); a job's directory is removed once its report "
                            "is built")
    files.add_argument("--keep-job-folders", action="store_true",
                       help="keep each finished job's directory (for debugging)")
    files.add_argument("--max-output-mb", type=int, default=MAX_OUTPUT_BYTES // 2**20,
                       help="MB of output a payload may keep per stream while it runs; beyond "
                            f"it only the end is kept (default {MAX_OUTPUT_BYTES // 2**20})")
    iso = p.add_argument_group("isolation of payloads")
    iso.add_argument("--isolation", choices=MODES, default=_env("GRIDPILOT_ISOLATION") or "auto",
                     help="how each payload is sandboxed (own user, mount, PID namespaces; "
                          "the system read-only, its job folder writable, a private /tmp, "
                          "nothing of other payloads or of the pilot): auto (default; "
                          "$GRIDPILOT_ISOLATION) takes the first of apptainer and bwrap that "
                          "passes a self-test at the start, else runs payloads bare and says "
                          "so; a named tool that fails stops the pilot (exit 2)")
    iso.add_argument("--isolation-bind", action="append", dest="isolation_binds",
                     metavar="PATH[:ro]", default=None,
                     help="a path of the node payloads see, read-write (PATH:ro read-only), "
                          "e.g. a shared software area (repeatable; default: "
                          "$GRIDPILOT_ISOLATION_BIND, paths separated by ':')")
    iso.add_argument("--isolation-image", default=_env("GRIDPILOT_ISOLATION_IMAGE") or "/",
                     metavar="IMAGE",
                     help="apptainer's image or folder, e.g. on CVMFS (default: the node's "
                          "own /)")
    timing = p.add_argument_group("timing")
    timing.add_argument("--idle-timeout", type=float, default=600.0,
                        help="stop after this many seconds without any job (default 600)")
    timing.add_argument("--request-timeout", type=float, default=30.0,
                        help="seconds one request to the matcher may take in all, its answer "
                             "included (default 30)")
    timing.add_argument("--heartbeat", type=float, default=60.0,
                        help="seconds between heartbeats (default 60)")
    timing.add_argument("--grace", type=float, default=30.0,
                        help="seconds between SIGTERM and SIGKILL for a payload (default 30)")
    timing.add_argument("--margin", type=float, default=60.0,
                        help="seconds kept free before a limit when matching (default 60)")
    timing.add_argument("--wall-limit", type=float, default=None, metavar="SECONDS",
                        help="the batch system's wall limit, real seconds from the pilot's "
                             "start (the earlier of it and $JOBFEATURES' counts)")
    timing.add_argument("--cpu-factor", type=float, default=None, metavar="HS06",
                        help="CPU power of one core, HS06, where the features give none; "
                             "the CPU time offered is the time left times this (default 1)")
    timing.add_argument("--backoff-cap", type=float, default=60.0,
                        help="longest wait between match attempts after no match or an "
                             "unreachable matcher, seconds (default 60; jittered)")
    timing.add_argument("--report-timeout", type=float, default=600.0,
                        help="how long to keep retrying undelivered reports at the end "
                             "(default 600; cut short by a signal or a silent matcher)")
    p.add_argument("--priority-factor", type=float, default=1.0,
                   help="how critical this pilot's work is, written to $JOBSTATUS for the "
                        "site's drain decisions (default 1.0)")
    p.add_argument("--replay", type=Path, metavar="FILE",
                   help="deliver the reports a pilot kept in FILE (its "
                        "WORKDIR/undelivered-reports.json, exit code 4) and exit: 0 when all "
                        "were delivered (FILE is removed), 4 when some are still undelivered "
                        "(FILE keeps them); needs only --matcher and the token")
    p.add_argument("-v", "--verbose", action="store_true", help="log every step")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logformat.install(logging.DEBUG if args.verbose else logging.INFO)
    problems = []
    if not args.matcher:
        problems.append("--matcher (or GRIDPILOT_MATCHER_URL) is required")
    if not args.vo and args.replay is None:
        problems.append("--vo (or GRIDPILOT_VO) is required")
    forbid_dumping()
    # What a payload starts and leaves behind is adopted by the pilot, not by init.
    become_subreaper()
    token = ""
    try:
        token_from_environment(os.environ)
        if args.token_file is not None:
            token = read_token_file(args.token_file)
        elif args.token_fd is not None:
            token = read_token_fd(args.token_fd)
        else:
            problems.append("a token is required: --token-file or --token-fd")
    except TokenError as exc:
        problems.append(str(exc))
    verify: str | bool = True
    try:
        verify, _ = trusted_cas(args.ca_bundle, os.environ)
    except CABundleError as exc:
        problems.append(str(exc))
    if not 0 <= args.priority_factor < float("inf"):
        problems.append(f"--priority-factor must be a number >= 0, got {args.priority_factor}")
    for name in ("cores", "memory", "max_output_mb"):
        value = getattr(args, name)
        if value is not None and value < 1:
            problems.append(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    for name in ("wall_limit", "cpu_factor"):
        value = getattr(args, name)
        if value is not None and not 0 < value < float("inf"):
            problems.append(f"--{name.replace('_', '-')} must be a number > 0, got {value}")
    if problems:
        for problem in problems:
            print(f"gridpilot-pilot: {problem}", file=sys.stderr)
        return EXIT_USAGE
    if args.replay is not None:
        return _replay(args, token, verify)
    options = pilot_options(args, token, problems, verify=verify)
    if options is None:
        for problem in problems:
            print(f"gridpilot-pilot: {problem}", file=sys.stderr)
        return EXIT_USAGE
    summary = Pilot(options).run()
    print(summary.line())
    if summary.exit_code != EXIT_OK:
        print(f"gridpilot-pilot: exit {summary.exit_code}: "
              f"{summary.error or summary.stopped_because}", file=sys.stderr)
    return summary.exit_code


def pilot_options(args: argparse.Namespace, token: str, problems: list[str], *,
                  verify: str | bool = True) -> PilotOptions | None:
    """The pilot's options from its parsed command line (None, with ``problems`` added to,
    when they are wrong); ``verify``: the CAs to trust (pilot.tls)."""
    attributes: dict[str, object] = {}
    for item in args.attributes:
        name, sep, text = item.partition("=")
        if not sep or not name.strip():
            problems.append(f"--attribute must be NAME=VALUE, got {item!r}")
            continue
        try:
            attributes[name.strip()] = json.loads(text)
        except ValueError:
            attributes[name.strip()] = text
    binds: list[Bind] = []
    texts = args.isolation_binds
    if texts is None:
        texts = [t for t in (_env("GRIDPILOT_ISOLATION_BIND") or "").split(":") if t]
        # "PATH:ro" split at ":" comes back together.
        texts = _rejoin(texts)
    for text in texts:
        try:
            binds.append(Bind.parse(text))
        except ValueError as exc:
            problems.append(str(exc))
    gpus = gpu_ids(args.gpus, problems)
    if problems:
        return None
    pools = None
    if args.submit_pools is not None:
        pools = tuple(p.strip() for p in args.submit_pools.split(",") if p.strip())
    reference = args.reference or f"{socket.gethostname()}-{os.getpid()}-{int(time.time())}"
    node = NodeDescription(
        vo=args.vo, reference=reference, site=args.site, ce=args.ce, queue=args.queue,
        platforms=tuple(args.platforms) or (detect_platform(),),
        attributes=tuple(attributes.items()),
        tags=tuple(dict.fromkeys([*args.tags, *args.required_tags])),
        required_tags=tuple(args.required_tags), submit_pools=pools)
    options = PilotOptions(
        matcher_url=args.matcher, token=token or "", node=node, workdir=args.workdir.resolve(),
        machine_features=args.machine_features, job_features=args.job_features,
        jobstatus=args.jobstatus, drain_file=args.drain_file, cores=args.cores,
        memory_mb=args.memory, gpus=gpus, idle_timeout=args.idle_timeout,
        request_timeout=args.request_timeout,
        heartbeat_interval=args.heartbeat, grace=args.grace, margin=args.margin,
        backoff_cap=args.backoff_cap, report_timeout=args.report_timeout,
        priority_factor=args.priority_factor, keep_job_folders=args.keep_job_folders,
        max_output_bytes=args.max_output_mb * 2**20, wall_limit=args.wall_limit,
        cpu_factor=args.cpu_factor, verify=verify, isolation=args.isolation,
        isolation_binds=tuple(binds), isolation_image=args.isolation_image)
    return options


#: Most GPU devices one pilot hands out.
MAX_GPUS = 64


def gpu_ids(text: str, problems: list[str]) -> tuple[str, ...]:
    """The device ids of ``--gpus`` (``0,1``), each named once; a wrong list adds to
    ``problems``."""
    ids = tuple(part.strip() for part in text.split(",")) if text.strip() else ()
    bad = [i for i in ids if not i or not all(c.isalnum() or c in "-_.:" for c in i)]
    if bad:
        problems.append(f"--gpus must be comma-separated device ids such as 0,1, got {text!r}")
    elif len(set(ids)) != len(ids):
        problems.append(f"--gpus names a device twice: {text!r}")
    elif len(ids) > MAX_GPUS:
        problems.append(f"--gpus names {len(ids)} devices, at most {MAX_GPUS} are taken")
    return ids


def _rejoin(parts: list[str]) -> list[str]:
    """$GRIDPILOT_ISOLATION_BIND split at ":": "ro" and "rw" belong to the path before."""
    out: list[str] = []
    for part in parts:
        if part in ("ro", "rw") and out:
            out[-1] = f"{out[-1]}:{part}"
        else:
            out.append(part)
    return out


def _replay(args: argparse.Namespace, token: str, verify: str | bool) -> int:
    try:
        reports = load_reports(args.replay, args.reference)
    except ReplayError as exc:
        print(f"gridpilot-pilot: {exc}", file=sys.stderr)
        return EXIT_USAGE
    code, line = replay(MatcherClient(args.matcher, token, timeout=args.request_timeout,
                                      verify=verify),
                        args.replay, reports,
                        timeout=args.report_timeout,
                        backoff=Backoff(1.0, args.backoff_cap))
    print(line)
    if code != EXIT_OK:
        print(f"gridpilot-pilot: exit {code}: {line}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
