"""The pilot's loop: fill the allocated cores with payloads while time remains, keep the
matcher and ``$JOBSTATUS`` informed, stop cleanly when the node is drained or shut down.

One thread, one loop that wakes a few times a second. Each turn it: reads the dynamic machine
and job features (shutdown times) and the operator's drain file; stops everything if the
shutdown time has come; reaps payloads that ended and queues their reports; stops payloads past
their wall limit or killed by the matcher; sends heartbeats when due; sends queued reports; and,
unless it is retiring, asks for jobs while cores are free and time is left. Reports survive a
matcher that is down: they wait in order and are retried with back-off, up to a deadline at the
end of the pilot's life.

Nothing keeps a pilot alive that should stop: SIGTERM or SIGINT ends the request in flight at
once (pilot.transfer.interrupt), stops the payloads and makes one last, short attempt
(:data:`LAST_ATTEMPT`) at the reports; a matcher silent for longer than the idle timeout
stops the payloads as a shutdown does and ends every retry (matching, uploads, reports),
what is undelivered going to the file for ``--replay``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Any

from pilot import protocol, transfer
from pilot.archive import is_sandbox_id
from pilot.client import Backoff, MatcherClient, RefusedError, TransientError
from pilot.features import Features, Limits
from pilot.isolation import Bind, Isolation, layout_for
from pilot.isolation import start as start_isolation
from pilot.jobstatus import RunningPayload, compute_status, locked, write_status
from pilot.logformat import concerning
from pilot.output import MAX_OUTPUT_BYTES, REPORT_REFUSALS, plainer_report, remove_folder
from pilot.payload import Payload, fresh_job_folder, start_payload, wait_all
from pilot.payloadtoken import PayloadTokens
from pilot.planning import (
    gpu_environment,
    memory_left,
    payload_cores,
    payload_gpus,
    payload_max_end,
    what_to_ask,
)
from pilot.reaper import LEFTOVER_GRACE, Reaper
from pilot.renewal import TokenRenewal
from pilot.resource import NodeDescription
from pilot.sandbox import (
    OUTPUT_LIMIT,
    Outputs,
    SandboxError,
    attach_output,
    collect_outputs,
    fetch_inputs,
)

log = logging.getLogger("pilot")

#: Exit codes of gridpilot-pilot.
EXIT_OK = 0
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_UNSENT = 4
EXIT_UNREACHABLE = 5
EXIT_KILLED = 6
EXIT_TOKEN_EXPIRED = 7
#: The stop reason of a pilot the matcher told to stop as a whole (an operator killed it, or
#: its CE said it ended): its payloads are stopped and handed back for rescheduling.
KILLED_BY_MATCHER = "killed: the matcher told this pilot to stop"
#: Seconds of the last attempt at the reports (and the final registration) after a signal
#: or once the matcher has been silent too long; each request gets at most this long.
LAST_ATTEMPT = 5.0
#: Seconds a payload's token may take to arrive: a payload does not wait longer to start (it
#: starts without one and the pilot asks again), nor the pilot's loop for a renewal.
PAYLOAD_TOKEN_WAIT = 15.0
#: The minor status of a job whose pilot is fetching its input sandboxes.
INPUT_DOWNLOAD = "Input sandbox download"
#: Why a payload is stopped when the matcher refuses its start: the job went back to its
#: queue (or to another pilot) before this pilot's Running report arrived.
NOT_THIS_PILOTS = "the job is no longer this pilot's"
#: What the matcher answers a Running report on a job that is not this pilot's (any more):
#: given to another pilot (403), unknown (404), no longer active (409).
NOT_OURS = frozenset({403, 404, 409})


@dataclass(frozen=True)
class PilotOptions:
    matcher_url: str
    token: str
    node: NodeDescription
    workdir: Path
    machine_features: str | None = None
    job_features: str | None = None
    jobstatus: Path | None = None
    drain_file: Path | None = None
    #: Cores and memory (MB) to fill; None: from $JOBFEATURES (cores: else the node's CPUs).
    cores: int | None = None
    memory_mb: int | None = None
    #: GPU device ids the pilot may hand out (``--gpus``), each to one payload at a time.
    gpus: tuple[str, ...] = ()
    #: Stop after this many seconds without a payload and without a match.
    idle_timeout: float = 600.0
    #: Seconds one request to the matcher may take in all, its answer included.
    request_timeout: float = 30.0
    heartbeat_interval: float = 60.0
    #: Seconds between SIGTERM and SIGKILL when a payload is stopped.
    grace: float = 30.0
    #: Do not start a job when less than this many seconds remain before a limit.
    margin: float = 60.0
    #: The batch system's wall limit in real seconds from the pilot's start, as the site
    #: director gives it (None: only $JOBFEATURES tells); the earlier end counts.
    wall_limit: float | None = None
    #: CPU power of one core (HS06), used where the features give no factor.
    cpu_factor: float | None = None
    backoff_base: float = 1.0
    backoff_cap: float = 60.0
    #: How long the pilot keeps trying to deliver reports after its last payload ended.
    report_timeout: float = 600.0
    priority_factor: float = 1.0
    tick: float = 0.2
    #: Seconds between two looks at the payloads' processes (see pilot.reaper) and outputs.
    scan_interval: float = 1.0
    #: Bytes of output each payload may keep per stream while it runs (see pilot.output).
    max_output_bytes: int = MAX_OUTPUT_BYTES
    #: Keep finished jobs' folders (for debugging); by default they go once reported.
    keep_job_folders: bool = False
    #: Bytes of output files, standard output and error one job may bring back.
    output_limit: int = OUTPUT_LIMIT
    #: The CAs trusted for an https matcher (pilot.tls.trusted_cas): True is the system's.
    verify: str | bool = True
    #: How payloads are isolated (pilot.isolation): auto, apptainer, bwrap or none; the
    #: site's paths they see; apptainer's image.
    isolation: str = "auto"
    isolation_binds: tuple[Bind, ...] = ()
    isolation_image: str = "/"


@dataclass
class Summary:
    started: int = 0
    done: int = 0
    failed: int = 0
    killed: int = 0
    rescheduled: int = 0
    unsent: int = 0
    stopped_because: str = ""
    exit_code: int = EXIT_OK
    #: Why the exit code is not EXIT_OK, in words for the batch system's error file.
    error: str = ""

    def line(self) -> str:
        return (f"pilot finished ({self.stopped_because}): {self.started} payloads started, "
                f"{self.done} done, {self.failed} failed, {self.killed} killed, "
                f"{self.rescheduled} handed back for rescheduling, {self.unsent} reports "
                f"undelivered")


@dataclass
class _Report:
    job_id: int
    body: dict[str, Any]
    #: The job's packed output, uploaded before the report goes.
    outputs: Outputs | None = None
    #: How often the matcher refused it (4xx): each refusal makes it plainer
    #: (pilot.output.plainer_report).
    refusals: int = 0


@dataclass
class Pilot:
    options: PilotOptions
    client: MatcherClient | None = None
    clock: Callable[[], float] = time.time
    features: Features = field(init=False)
    payloads: dict[int, Payload] = field(default_factory=dict)
    #: The GPU devices each running payload got, by job id.
    gpus_held: dict[int, tuple[str, ...]] = field(default_factory=dict)
    outbox: list[_Report] = field(default_factory=list)
    #: Jobs the matcher said are not this pilot's while their payload ran: stopped, and
    #: nothing is reported nor uploaded for them.
    disowned: set[int] = field(default_factory=set)
    summary: Summary = field(default_factory=Summary)
    retiring: str = ""
    _signalled: str = ""
    #: Why the matcher told the pilot to stop as a whole ("" while it has not).
    _killed: str = ""
    _last_attempt_end: float | None = None
    #: When the pilot last got a readable answer to a match request (or to the SubmitPools
    #: request before it), and since when asking has failed (None while it does not).
    _asked_answered: float | None = None
    _asking_fails_since: float | None = None
    reaper: Reaper = field(default_factory=Reaper)
    #: The running payloads' token files (pilot.payloadtoken).
    payload_tokens: PayloadTokens = field(init=False)
    #: The sandbox payloads run in, chosen at the start (pilot.isolation).
    isolation: Isolation | None = None

    def __post_init__(self) -> None:
        o = self.options
        self.features = Features(o.machine_features, o.job_features)
        self.started = self.clock()
        self.client = self.client or MatcherClient(o.matcher_url, o.token,
                                                   timeout=o.request_timeout,
                                                   verify=o.verify)
        self.match_backoff = Backoff(o.backoff_base, o.backoff_cap)
        self.report_backoff = Backoff(o.backoff_base, o.backoff_cap)
        self.renewal = TokenRenewal(o.token, wall=self.clock)
        client = self.client
        self.payload_tokens = PayloadTokens(
            lambda job_id: client.payload_token(job_id, self.node.reference,
                                                deadline=PAYLOAD_TOKEN_WAIT),
            wall=self.clock)

    # -- the loop ----------------------------------------------------------------------------

    def prepare(self, now: float) -> None:
        """Cores, memory and node description, from the options and the features."""
        o = self.options
        limits = self.limits(now)
        self.cores = o.cores or limits.cores or os.cpu_count() or 1
        self.memory_mb = o.memory_mb or limits.memory_mb
        self.node = o.node

    def limits(self, now: float) -> Limits:
        """The features' limits, with the wall limit and CPU factor the options give."""
        o = self.options
        limits = self.features.limits(now)
        factor = limits.cpu_factor or o.cpu_factor
        wall_end = limits.wall_end
        if o.wall_limit is not None:
            own = self.started + o.wall_limit
            wall_end = own if wall_end is None else min(wall_end, own)
        if factor == limits.cpu_factor and wall_end == limits.wall_end:
            return limits
        return replace(limits, cpu_factor=factor, wall_end=wall_end,
                       wall_left=None if wall_end is None else max(0.0, wall_end - now))

    def match_request(self, now: float, limits: Limits) -> dict[str, Any] | None:
        """The resource description of a match request for the free cores and the memory the
        running payloads leave now (None: no time left for another job)."""
        ask = what_to_ask(free_cores=self._free_cores(),
                          seconds_left=limits.seconds_left(now), margin=self.options.margin,
                          cpu_factor=limits.cpu_factor, cpu_left=limits.cpu_left,
                          cores=self.cores, free_memory_mb=self._free_memory())
        if ask is None:
            return None
        return self.node.resource(free_cores=ask.processors, free_memory_mb=ask.memory,
                                  cpu_time_left=ask.cpu_time_left,
                                  free_gpus=len(self.options.gpus) - len(self._held_gpus()))

    def run(self) -> Summary:
        o = self.options
        now = self.clock()
        self.prepare(now)
        o.workdir.mkdir(parents=True, exist_ok=True)
        if not self._isolate():
            return self.summary
        self._install_signal_handlers()
        log.info("pilot %s: %d cores, %s MB, matcher %s", o.node.reference, self.cores,
                 self.memory_mb or "unknown", o.matcher_url)
        self._register("Running")
        pools_known = o.node.submit_pools is not None or not (o.node.site and o.node.ce
                                                               and o.node.queue)
        next_match = next_beat = now
        next_report = now
        idle_since: float | None = now
        next_scan = now
        self._write_jobstatus(now)
        while True:
            now = self.clock()
            if self.payloads and now >= next_scan:
                self.reaper.scan()
                for p in self.payloads.values():
                    p.cap_output(o.max_output_bytes)
                next_scan = now + o.scan_interval
            limits = self.limits(now)
            shutdown = limits.shutdown
            if self._signalled:
                self._shutdown(f"pilot received {self._signalled}")
                break
            if self._killed:
                self._stop_killed()
                break
            if shutdown is not None and now >= shutdown:
                self._shutdown("the node's shutdown time has come")
                break
            if self.renewal.expired():
                self._token_expired()
                break
            if self.renewal.due() and not self._signalled:
                self._renew_token()
            # A shutdown time ahead only shortens the time left that matching offers (see
            # _fill); a drain file stops matching at once.
            if not self.retiring and o.drain_file is not None and o.drain_file.exists():
                self._retire(f"drain file {o.drain_file} exists", now)
            silence = self._silence()
            if silence:  # its payloads' jobs are rescheduled elsewhere by now: stop them
                self._shutdown(silence)
                break
            self._reap(now)
            self._enforce(now)
            if not self._signalled:
                self.payload_tokens.renew(self.payloads)
            # After a signal, no request more: the next turn stops.
            if now >= next_beat and self.payloads and not self._signalled:
                self._heartbeat(now)
                next_beat = now + o.heartbeat_interval
            if self.outbox and now >= next_report and not self._signalled:
                next_report = now + self._flush_reports()
            if not pools_known and now >= next_match and not self._signalled:
                pools_known = self._fetch_submit_pools()
                if not pools_known:
                    next_match = now + self.match_backoff.next_delay()
            if pools_known and not self.retiring and now >= next_match:
                next_match = self._fill(now, limits, shutdown)
            if self.payloads:
                idle_since = None
            elif self.retiring:
                break
            else:
                idle_since = idle_since or now
                # The clock read again: a match request may have taken its whole deadline.
                if self.clock() - idle_since >= o.idle_timeout:
                    self._end_idle(idle_since)
                    break
            time.sleep(o.tick)
        self.summary.stopped_because = self.retiring
        self.reaper.end_all(min(o.grace, LEFTOVER_GRACE))
        self._deliver_remaining()
        assert self.client is not None
        silence = self._silence()
        if self.summary.exit_code == EXIT_OK and not self.client.reached:
            self.summary.exit_code = EXIT_UNREACHABLE
            what = ("never gave a readable answer" if self.client.last_failure_unreadable
                    else "was never reached")
            self.summary.error = (f"the matcher at {o.matcher_url} {what}: "
                                  f"{self.client.last_failure or 'no answer'}")
        elif self.summary.exit_code == EXIT_OK and silence:
            self.summary.exit_code = EXIT_UNREACHABLE
            self.summary.error = f"{silence}: {self.client.last_failure}"
        if self.summary.exit_code not in (EXIT_REFUSED, EXIT_UNREACHABLE,
                                          EXIT_TOKEN_EXPIRED) and not silence \
                and self._last_attempt_left() > 0:
            # Not to a matcher that does not answer: one more wait.
            self._register("Aborted" if self._killed else "Done")
        self._remove_jobstatus()
        return self.summary

    # -- matching and starting ---------------------------------------------------------------

    def _free_cores(self) -> int:
        return self.cores - sum(p.cores for p in self.payloads.values())

    def _held_gpus(self) -> set[str]:
        """The GPU devices of running payloads (those of ended ones are forgotten)."""
        self.gpus_held = {job_id: devices for job_id, devices in self.gpus_held.items()
                          if job_id in self.payloads}
        return {device for devices in self.gpus_held.values() for device in devices}

    def _free_memory(self) -> int | None:
        return memory_left(self.memory_mb, (p.memory_mb for p in self.payloads.values()))

    def _fill(self, now: float, limits: Limits, shutdown: float | None) -> float:
        """Ask for jobs while cores are free; return when to ask next."""
        assert self.client is not None
        o = self.options
        while self._free_cores() > 0 and not self._signalled:
            resource = self.match_request(now, limits)
            if resource is None:
                if not self.payloads:
                    self._retire("no time left for another job", now)
                return now + o.backoff_cap
            try:
                answer = self.client.match(resource, count=1)
            except TransientError as exc:
                log.warning("matcher unavailable: %s", exc)
                self._asking_failed()
                return now + self.match_backoff.next_delay()
            except RefusedError as exc:
                self._refused("match requests", exc)
                return now
            self._asking_answered()
            if answer.reason == protocol.PILOT_KILLED:
                log.info("the matcher says stop: %s", answer.detail)
                self._killed = answer.detail or "pilot killed"
                return now
            if not answer.jobs:
                log.debug("no match: %s (%s)", answer.reason, answer.detail)
                return now + self.match_backoff.next_delay()
            self.match_backoff.reset()
            for job in answer.jobs:
                self._start(job, now, limits, shutdown, answer.tokens.get(job.job_id))
        return now

    def _start(self, job: protocol.JobPayload, now: float, limits: Limits,
               shutdown: float | None, token: str | None = None) -> None:
        """Start ``job`` (``token``: its payload's first token, when the match answer
        carried one; else it is asked for)."""
        o = self.options
        cores = payload_cores(job.processors, self._free_cores())
        gpus = payload_gpus(job.gpus, o.gpus, self._held_gpus())
        max_end = payload_max_end(now, limits.wall_end, shutdown)
        memory = job.memory or (int(self.memory_mb * cores / self.cores)
                                if self.memory_mb else 0)
        assert self.client is not None
        inputs = any(is_sandbox_id(entry) for entry in job.input_sandbox)
        if inputs and not self._confirm(job.job_id):
            return
        if inputs and self._signalled:  # no download: the job goes back at once
            self.summary.rescheduled += 1
            self.outbox.append(_Report(job.job_id, {
                "status": protocol.RESCHEDULED,
                "minor_status": f"Pilot stopped: pilot received {self._signalled}"}))
            return
        directory = fresh_job_folder(o.workdir, job.job_id)
        try:
            fetch_inputs(self.client, job, directory, self.node.reference)
        except SandboxError as exc:  # unsafe or refused: Failed; unreachable: run elsewhere
            log.error("job %d: %s", job.job_id, exc, extra=concerning(job.job_id))
            if exc.transient:
                self.summary.rescheduled += 1
            else:
                self.summary.failed += 1
            self.outbox.append(_Report(job.job_id, {
                "status": protocol.RESCHEDULED if exc.transient else protocol.FAILED,
                "minor_status": f"Input sandbox: {exc}"[:255]}))
            return
        try:
            payload = start_payload(job, cores=cores, memory_mb=memory, root=o.workdir, now=now,
                                    max_end=max_end, cpu_factor=limits.cpu_factor,
                                    machine_features=o.machine_features,
                                    base_env=os.environ, fresh=False,
                                    token_file=self.payload_tokens.first(
                                        job.job_id, directory, token),
                                    isolation=self.isolation,
                                    gpu_env=gpu_environment(gpus) if o.gpus else None)
        except OSError as exc:
            log.error("job %d cannot start: %s", job.job_id, exc, extra=concerning(job.job_id))
            self.summary.failed += 1
            self.outbox.append(_Report(job.job_id, {
                "status": protocol.FAILED, "exit_code": 127,
                "minor_status": f"Payload could not start: {exc}"[:255]}))
            return
        payload.family = self.reaper.adopt(job.job_id, payload.process.pid)
        payload.max_end_assumed = limits.wall_end is None and shutdown is None
        self.payloads[job.job_id] = payload
        self.gpus_held[job.job_id] = gpus
        self.summary.started += 1
        log.info("job %d started on %d core(s): %s", job.job_id, cores, job.executable,
                 extra=concerning(job.job_id))
        self.outbox.append(_Report(job.job_id, {"status": protocol.RUNNING}))
        self._write_jobstatus(now)

    def _confirm(self, job_id: int) -> bool:
        """Say Running before a download that may take a while: a Matched job its pilot has
        not confirmed goes back to its task queue after the matcher's short lease. False
        when the matcher says the job is no longer this pilot's."""
        assert self.client is not None
        body = {"status": protocol.RUNNING, "minor_status": INPUT_DOWNLOAD}
        try:
            self.client.report(job_id, {"pilot_reference": self.node.reference, **body})
        except TransientError as exc:
            log.warning("job %d: Running not delivered yet: %s", job_id, exc,
                        extra=concerning(job_id))
            self.outbox.append(_Report(job_id, body))
        except RefusedError as exc:
            log.error("job %d is not this pilot's to run any more: %s", job_id, exc,
                      extra=concerning(job_id))
            return False
        return True

    # -- running payloads --------------------------------------------------------------------

    def _reap(self, now: float) -> None:
        for job_id, p in list(self.payloads.items()):
            code = p.poll()
            if code is None:
                continue
            del self.payloads[job_id]
            # What the payload left running ends with it; its CPU time counts.
            self.reaper.end(job_id, min(self.options.grace, LEFTOVER_GRACE))
            if job_id in self.disowned:
                self.disowned.discard(job_id)
                self.summary.killed += 1
                log.info("job %d stopped (%s); nothing to report", job_id, NOT_THIS_PILOTS,
                         extra=concerning(job_id))
                self._finished(p)
                self._write_jobstatus(now)
                continue
            body: dict[str, Any] = {"exit_code": code, "output_tail": p.tail(),
                                    "cpu_used": p.cpu_used()}
            why = p.stopping[1] if p.stopping else ""
            if why == "killed by the matcher":
                self.summary.killed += 1
                body.update(status=protocol.FAILED, minor_status="Payload killed on request")
            elif why:
                self.summary.failed += 1
                body.update(status=protocol.FAILED, minor_status=f"Payload stopped: {why}")
            elif code == 0:
                self.summary.done += 1
                body.update(status=protocol.DONE)
            else:
                self.summary.failed += 1
                body.update(status=protocol.FAILED)
            log.info("job %d ended with exit code %d", job_id, code, extra=concerning(job_id))
            outputs = collect_outputs(p.job, p.directory, [p.stdout_path, *filter(
                None, [p.stderr_path])], limit=self.options.output_limit)
            outputs.killed = why == "killed by the matcher"
            if outputs.minor_status():
                body["minor_status"] = "; ".join(filter(None, [body.get("minor_status"),
                                                               outputs.minor_status()]))[:255]
            self.outbox.append(_Report(job_id, body, outputs))
            self._finished(p)
            self._write_jobstatus(now)

    def _enforce(self, now: float) -> None:
        for p in self.payloads.values():
            if p.stopping is None and now >= p.max_end:
                p.stop("wall limit reached", now)
            p.enforce(now, self.options.grace)

    def _heartbeat(self, now: float) -> None:
        assert self.client is not None
        running = [p for p in self.payloads.values() if p.poll() is None]
        peek = min(protocol.PEEK_CHARS, protocol.PEEK_TOTAL_CHARS // max(1, len(running)))
        beats = [{"job_id": p.job_id, "cpu_used": round(p.cpu_used(), 2),
                  "output_tail": p.tail()[-peek:]} for p in running]
        try:
            try:
                commands = self.client.heartbeat(self.node.reference, beats)
            except RefusedError as exc:
                # Whatever the matcher did not take, the beats themselves still go.
                log.warning("heartbeat refused (%s); sending it without output tails", exc)
                commands = self.client.heartbeat(self.node.reference, [
                    {k: b[k] for k in ("job_id", "cpu_used")} for b in beats])
        except (TransientError, RefusedError) as exc:
            log.warning("heartbeat not delivered: %s", exc)
            return
        if commands.pop(protocol.WHOLE_PILOT, None) == protocol.KILL:
            log.info("the matcher says this pilot must stop")
            self._killed = self._killed or "pilot killed"
        for job_id, command in commands.items():
            payload = self.payloads.get(job_id)
            if command == protocol.KILL and payload is not None:
                log.info("job %d: the matcher says kill", job_id, extra=concerning(job_id))
                payload.stop("killed by the matcher", now)

    # -- reports -----------------------------------------------------------------------------

    def _flush_reports(self, until: float | None = None) -> float:
        """Send queued reports in order (none after ``until``, a time.monotonic()); return
        the delay before trying again."""
        assert self.client is not None
        while self.outbox:
            if (until is not None and time.monotonic() >= until) or (
                    until is None and self._signalled):
                return self.report_backoff.next_delay()
            report = self.outbox[0]
            if report.outputs is not None:
                if not attach_output(self.client, report.outputs, self.node.reference,
                                     report.body):
                    return self.report_backoff.next_delay()
                report.outputs = None
            try:
                self.client.report(report.job_id, {"pilot_reference": self.node.reference,
                                                   **report.body})
            except TransientError as exc:
                log.warning("report on job %d not delivered yet: %s", report.job_id, exc,
                            extra=concerning(report.job_id))
                return self.report_backoff.next_delay()
            except RefusedError as exc:
                if exc.status in NOT_OURS and report.body.get("status") == protocol.RUNNING:
                    # Its start was not recorded: the job runs elsewhere, or will. (A final
                    # report goes on below: sent plainer, as a refusal may be passing.)
                    self._disown(report.job_id, exc)
                    self.outbox.pop(0)
                    continue
                if report.refusals < REPORT_REFUSALS:
                    report.refusals += 1
                    report.body = plainer_report(report.body, report.refusals, exc.status)
                    log.warning("report on job %d refused (%s); sending a plainer one",
                                report.job_id, exc, extra=concerning(report.job_id))
                    continue
                log.error("report on job %d refused: %s", report.job_id, exc,
                          extra=concerning(report.job_id))
            self.outbox.pop(0)
            self.report_backoff.reset()
        return 0.0

    def _disown(self, job_id: int, exc: RefusedError) -> None:
        """The matcher says the job is not this pilot's: its payload, if it still runs,
        stops now (it may be running on another node already), and what is queued about
        it is dropped."""
        log.error("job %d is not this pilot's to run any more: %s", job_id, exc,
                  extra=concerning(job_id))
        self.outbox[1:] = [r for r in self.outbox[1:] if r.job_id != job_id]
        payload = self.payloads.get(job_id)
        if payload is not None:
            self.disowned.add(job_id)
            payload.stop(NOT_THIS_PILOTS, self.clock())

    def _deliver_remaining(self) -> None:
        """Deliver the queued reports, retrying until --report-timeout; but after a signal,
        or once the matcher has been silent for longer than --idle-timeout, make only one
        last attempt of :data:`LAST_ATTEMPT` seconds. What is left goes to a file."""
        deadline = self.clock() + self.options.report_timeout
        if self.renewal.expired():  # every one would be refused: all go to the file
            deadline = self.clock()
        while self.outbox and self.clock() < deadline and not self._hurry():
            delay = self._flush_reports()
            if self.outbox:
                self._pause(min(delay, max(0.0, deadline - self.clock())))
        if self.outbox and self._hurry() and not self.renewal.expired():
            left = self._last_attempt_left()
            if left > 0:
                log.info("last attempt at %d report(s) (%s)", len(self.outbox), self._hurry())
                self._flush_reports(until=time.monotonic() + left)
        if self.outbox:
            self.summary.unsent = len(self.outbox)
            path = self.options.workdir / "undelivered-reports.json"
            path.write_text(json.dumps([
                {"job_id": r.job_id, "pilot_reference": self.node.reference, **r.body}
                for r in self.outbox]), encoding="utf-8")
            kept = f"{len(self.outbox)} reports could not be delivered; kept in {path}"
            if self.summary.exit_code == EXIT_TOKEN_EXPIRED:
                self.summary.error = f"{self.summary.error}; {kept}"
            else:
                self.summary.exit_code, self.summary.error = EXIT_UNSENT, kept
            log.error("%s", self.summary.error)

    # -- retiring and stopping ---------------------------------------------------------------

    def _asking_failed(self) -> None:
        if self._asking_fails_since is None:
            self._asking_fails_since = self.clock()

    def _asking_answered(self) -> None:
        self._asked_answered, self._asking_fails_since = self.clock(), None

    def _end_idle(self, idle_since: float) -> None:
        """No payload for --idle-timeout: the pilot retires, and exits EXIT_UNREACHABLE when
        its requests for work all failed meanwhile (the matcher unreachable, or its answers
        unreadable: wrong shape, too large, too slow) rather than being answered "no
        match"."""
        o = self.options
        self.retiring = f"no job for {o.idle_timeout:.0f} s"
        answered = self._asked_answered is not None and self._asked_answered >= idle_since
        if self._asking_fails_since is None or answered or self.summary.exit_code != EXIT_OK:
            return
        assert self.client is not None
        if not self.client.reached:  # said at the end, as for a pilot that never asked
            return
        self.summary.exit_code = EXIT_UNREACHABLE
        self.summary.error = (f"the matcher at {o.matcher_url} gave no readable answer to a "
                              f"match request for {o.idle_timeout:g} s: "
                              f"{self.client.last_failure}")

    def _silence(self) -> str:
        """Why the pilot stops waiting for its matcher ("" while it answers): no readable
        answer for longer than --idle-timeout."""
        assert self.client is not None
        since = self.client.failing_since
        if since is None or time.monotonic() - since <= self.options.idle_timeout:
            return ""
        return (f"the matcher at {self.options.matcher_url} has not answered for "
                f"{self.options.idle_timeout:g} s")

    def _hurry(self) -> str:
        """Why no retry may go on ("" when none): a signal, or a silent matcher."""
        if self._signalled:
            return f"pilot received {self._signalled}"
        return self._silence()

    def _last_attempt_left(self) -> float:
        """Seconds left of the last attempt (infinite while nothing hurries the pilot). The
        first call starts it and bounds every request from then on by what is left."""
        if not self._hurry():
            return float("inf")
        now = time.monotonic()
        if self._last_attempt_end is None:
            self._last_attempt_end = now + LAST_ATTEMPT
        left = self._last_attempt_end - now
        assert self.client is not None
        self.client.timeout = max(0.1, min(self.client.timeout, left))
        return left

    def _pause(self, seconds: float) -> None:
        """Sleep, but wake at once for a signal or a silent matcher."""
        end = time.monotonic() + seconds
        while not self._hurry() and time.monotonic() < end:
            time.sleep(min(self.options.tick, max(0.0, end - time.monotonic())))

    def _refused(self, what: str, exc: RefusedError) -> None:
        """The matcher refuses this pilot (bad token, wrong VO or site, wrong URL): trying
        again will not help, so it matches nothing more and exits with EXIT_REFUSED."""
        why = f"the matcher refused this pilot's {what} ({exc.status}: {exc.detail})"
        log.error("%s", why)
        if self.summary.exit_code != EXIT_REFUSED:
            self.summary.exit_code = EXIT_REFUSED
            self.summary.error = why
        self._retire(why, self.clock())

    def _retire(self, why: str, now: float) -> None:
        if not self.retiring:
            log.info("retiring: %s", why)
            self.retiring = why
            self._write_jobstatus(now)

    def _shutdown(self, why: str) -> None:
        """Stop every payload now and hand its job back for rescheduling."""
        self.retiring = why
        running = list(self.payloads.values())
        wait_all(running, self.options.grace)
        for p in running:
            self.reaper.end(p.job_id, min(self.options.grace, LEFTOVER_GRACE))
            self.summary.rescheduled += 1
            self.outbox.append(_Report(p.job_id, {
                "status": protocol.RESCHEDULED, "minor_status": f"Pilot stopped: {why}"[:255],
                "output_tail": p.tail(), "cpu_used": p.cpu_used()}))
            self._finished(p)
        self.payloads.clear()

    def _renew_token(self) -> None:
        """Ask the matcher for the token's successor; send it from now on."""
        assert self.client is not None
        try:
            token = self.client.renew_token(self.node.reference)
        except TransientError as exc:
            delay = self.renewal.failed()
            log.warning("token not renewed yet (%s); trying again in %.0f s, %.0f s before it "
                        "expires", exc, delay, self.renewal.left())
            return
        except RefusedError as exc:
            self.renewal.stop(f"{exc.status}: {exc.detail}")
            log.error("the matcher gives this pilot no new token (%s): it works on until its "
                      "token expires in %.0f s", self.renewal.stopped, self.renewal.left())
            return
        self.client.use_token(token)
        self.renewal.renewed(token)
        log.info("token renewed (%d so far): it expires in %.0f s", self.renewal.renewals,
                 self.renewal.left())

    def _token_expired(self) -> None:
        """The token expired (its renewal was refused, failed until the end, or the machine
        slept through it): no request would be accepted any more. The payloads are stopped
        and their reports kept in the file for --replay; the pilot exits EXIT_TOKEN_EXPIRED."""
        why = ("its renewal was refused: " + self.renewal.stopped if self.renewal.stopped
               else "it was not renewed in time (the matcher did not answer, or the machine "
                    "was suspended)")
        message = f"the pilot's token expired after {self.renewal.renewals} renewal(s); {why}"
        log.error("%s", message)
        self._shutdown("its token expired")
        if self.summary.exit_code in (EXIT_OK, EXIT_UNSENT):
            self.summary.exit_code, self.summary.error = EXIT_TOKEN_EXPIRED, message

    def _stop_killed(self) -> None:
        """The matcher told the pilot to stop as a whole: its payloads are stopped (SIGTERM,
        SIGKILL after --grace) and handed back for rescheduling, and it exits EXIT_KILLED."""
        self._shutdown(KILLED_BY_MATCHER)
        if self.summary.exit_code == EXIT_OK:
            self.summary.exit_code = EXIT_KILLED
            self.summary.error = f"{KILLED_BY_MATCHER} ({self._killed})"

    def _finished(self, p: Payload) -> None:
        """The report on ``p`` is built (exit code, CPU time, output tail): its token is
        renewed no more, and its folder goes."""
        self.payload_tokens.finished(p.job_id)
        if not self.options.keep_job_folders:
            remove_folder(p.directory)

    def _install_signal_handlers(self) -> None:
        def handler(signum: int, _frame: FrameType | None) -> None:
            self._signalled = signal.Signals(signum).name
            # A request in flight (a match, an upload, a report) ends now, not at its
            # deadline; the loop then stops the payloads.
            transfer.interrupt()

        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            try:
                signal.signal(signum, handler)
            except ValueError:  # not the main thread (tests): no handlers
                return

    # -- the site's view ---------------------------------------------------------------------

    def _write_jobstatus(self, now: float) -> None:
        if self.options.jobstatus is None:
            return
        payloads = [RunningPayload(p.cores, p.started, p.expected_end, p.max_end,
                                   p.max_end_assumed) for p in self.payloads.values()]
        try:
            write_status(self.options.jobstatus, compute_status(
                self.cores, payloads, now=now, can_postpone=bool(self.retiring),
                priority_factor=self.options.priority_factor,
                pilot_reference=self.node.reference))
        except (OSError, ValueError) as exc:
            log.warning("$JOBSTATUS %s cannot be written: %s", self.options.jobstatus, exc)

    def _remove_jobstatus(self) -> None:
        """A pilot that has exited costs nothing to drain: its $JOBSTATUS goes, so the site's
        drain-cost tool lists only live pilots."""
        directory = self.options.jobstatus
        if directory is None:
            return
        try:
            with locked(directory, exclusive=True):
                for entry in directory.iterdir():
                    if entry.name != "used_CPU":
                        entry.unlink()
                (directory / "used_CPU").unlink()
            directory.rmdir()
        except OSError as exc:
            log.warning("$JOBSTATUS %s cannot be removed: %s", directory, exc)

    def _isolate(self) -> bool:
        """Choose the payloads' sandbox, and offer the tags protocol.ISOLATED_TAG and the
        tool's name with it; False (exit EXIT_USAGE) when the tool the site named does not
        work."""
        o = self.options
        layout = layout_for(o.workdir, jobstatus=o.jobstatus,
                            machine_features=o.machine_features, binds=o.isolation_binds)
        chosen = start_isolation(o.isolation, layout, image=o.isolation_image)
        if isinstance(chosen, str):
            log.error("%s", chosen)
            self.summary.exit_code, self.summary.error = EXIT_USAGE, chosen
            self.summary.stopped_because = "isolation unavailable"
            return False
        self.isolation = chosen
        if chosen.isolated:  # jobs that ask for it (Tags) go only to isolated pilots
            extra = tuple(t for t in (protocol.ISOLATED_TAG, protocol.CONTAINER_TAG,
                                      chosen.name) if t not in self.node.tags)
            self.node = replace(self.node, tags=(*self.node.tags, *extra))
        return True

    def _register(self, status: str) -> None:
        n = self.node
        if not (n.site and n.ce and n.queue):
            return
        assert self.client is not None
        try:
            self.client.register(n.reference, site=n.site, ce=n.ce, queue=n.queue,
                                 status=status, isolation=self.isolation.describe()
                                 if self.isolation else None)
        except TransientError as exc:
            log.warning("pilot registration (%s) not delivered: %s", status, exc)
        except RefusedError as exc:
            if status == "Running":
                self._refused("registration", exc)
            else:
                log.warning("pilot registration (%s) refused: %s", status, exc)

    def _fetch_submit_pools(self) -> bool:
        assert self.client is not None
        n = self.node
        assert n.site and n.ce and n.queue
        try:
            pools = self.client.submit_pools(n.site, n.ce, n.queue)
        except TransientError as exc:
            log.warning("SubmitPools not fetched: %s", exc)
            self._asking_failed()
            return False
        except RefusedError as exc:
            self._refused("SubmitPools request", exc)
            return False
        self.node = NodeDescription(**{**n.__dict__, "submit_pools": tuple(pools)})
        log.info("SubmitPools of %s/%s/%s: %s", n.site, n.ce, n.queue, pools or "none")
        return True
