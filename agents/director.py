"""The site director: pilots go where there is work.

Each cycle, for every queue of the resources configuration that serves the VO and names an
``Executor`` (a compute element: a PSI/J executor of this host, or an ARC-CE; see
agents.ce.registry), the director looks at the work that queue could run (its SubmitPools,
then the matching task queues and their waiting jobs), subtracts the pilots already waiting
there, and submits the difference, capped per cycle and by the queue's limits on waiting and
on live pilots. A pilot its CE has accepted but not started (ARC's ACCEPTED, PREPARING,
SUBMITTING; a batch system's queue) counts as waiting, so a CE that starts no pilot stops
getting new ones. Each pilot gets the matcher's URL, a token of its own (VO, site, and its
reference), its site/CE/queue, its SubmitPools, and the machine/job features the queue
configures. What becomes of the pilots is followed by agents.pilotstatus.

Several directors may run at once: the decision for a queue is taken under the lock of its
``director_queues`` row, and the pilots decided are recorded (status Submitting) in that same
transaction, so a second director counts them before deciding. The batch-system submission
itself happens after the commit; its outcome updates the records. A queue whose submissions
fail (its CE is down, refuses the credentials or the description) is skipped for a while,
longer after each failure, and the reason is logged and kept: the sites page shows it; the
records of the pilots that never reached the CE go, counted on the queue as unsent. A CE
whose requests used ``[agents] ce_turn_budget`` seconds of the cycle is asked nothing more in
it (agents.ce.budget): its pilots not yet sent are unsent alike, its other queues wait for the
next cycle. A queue whose last ``[agents] failed_starts`` pilots all ended before they reached
the matcher gets no more pilots until an operator retries it or one of its pilots reaches the
matcher; one whose last pilots found no job while work it could run was waiting is skipped
for a while (taskqueue.pilots.records.idle_pilot_streak).
"""

from __future__ import annotations

import math
import os
import stat
import sys
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

from agents.ce.base import (
    CA_FILE,
    TOKEN_FILE,
    CEError,
    CELoad,
    CELoads,
    CETurnOver,
    CEUnavailable,
    PilotSpec,
)
from agents.ce.bundle import BUNDLE_FILE, pilot_bundle
from agents.ce.config import SHIP_PILOT, CEConfig, CEConfigError, ce_config
from agents.ce.registry import ComputeElements
from agents.context import AgentContext
from optimizers.queueresources import pilot_launch
from optimizers.queuework import queue_pools_and_waiting
from optimizers.resources import Queue, serves_vo
from taskqueue.core.errors import ConfigurationError
from taskqueue.db.database import Session
from taskqueue.db.models import DirectorQueue
from taskqueue.pilots.records import (
    ALIVE_STATES,
    WAITING_STATES,
    count_pilots,
    count_starting,
    expire_submitting,
    failed_start_streak,
    idle_pilot_streak,
    lock_director_queue,
    record_ce_load,
    record_credential_warning,
    record_new_pilots,
    record_submission,
    record_submission_failure,
    retry_requests,
    starts_stopped,
    stop_for_failed_starts,
)
from taskqueue.tokens import issue_token

#: The group in pilot tokens: the VO's name and this.
PILOT_GROUP_SUFFIX = "_pilot"


@dataclass(frozen=True)
class QueueTarget:
    """A queue the director submits to, with what its configuration says."""

    site: str
    ce: str
    queue: str
    #: Where the pilots go.
    compute: CEConfig
    cores: int
    memory_mb: int | None
    max_waiting: int
    max_total: int
    parameters: dict[str, Any]

    @property
    def name(self) -> str:
        return f"{self.site}/{self.ce}/{self.queue}"

    @property
    def executor(self) -> str:
        return self.compute.executor


@dataclass(frozen=True)
class CERead:
    """One read of a CE's own state: when, what it said (None: the read failed), and why
    it failed."""

    at: datetime
    loads: CELoads | None
    error: str = ""


@dataclass
class DirectorReport:
    submitted: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    #: Queues whose CE credential will soon stop working, and why.
    warned: dict[str, str] = field(default_factory=dict)

    def line(self) -> str:
        total = sum(self.submitted.values())
        parts = [f"{total} pilot(s) submitted"]
        parts += [f"{n} to {q}" for q, n in sorted(self.submitted.items()) if n]
        parts += [f"{q} skipped ({why})" for q, why in sorted(self.skipped.items())]
        parts += [f"{q} failed ({why})" for q, why in sorted(self.failed.items())]
        parts += [f"{q} warned ({why})" for q, why in sorted(self.warned.items())]
        return "; ".join(parts)


def targets(ctx: AgentContext, report: DirectorReport | None = None) -> list[QueueTarget]:
    """The queues that serve the VO and name a compute element (a queue whose CE parameters
    are wrong is left out, and said so in ``report``)."""
    vo = ctx.settings.agents.vo
    a = ctx.settings.agents
    out = []
    select = serves_vo(vo)
    for q in ctx.resources().queues():
        if not select(q):
            continue
        params = dict(q.parameters(vo))
        name = f"{q.site}/{q.ce}/{q.name}"
        try:
            compute = ce_config(name, q.ce, params)
        except CEConfigError as exc:
            ctx.log.error("%s", exc)
            if report is not None:
                report.failed[name] = str(exc)
            continue
        if compute is None:
            continue
        launch = pilot_launch(ctx.resources(), q.site, q.ce, q.name, vo)
        out.append(QueueTarget(
            site=q.site, ce=q.ce, queue=q.name, compute=compute,
            cores=launch.cores, memory_mb=launch.memory_mb,
            max_waiting=_int(params.get("MaxWaitingPilots"), a.max_waiting_pilots),
            max_total=_int(params.get("MaxTotalPilots"), a.max_total_pilots),
            parameters=params))
    return out


def _int(value: Any, default: int) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else default


def compute_elements(ctx: AgentContext) -> ComputeElements:
    """The CEs of an agent process: pilots' folders under ``[agents] pilot_workdir``."""
    return ComputeElements(Path(ctx.settings.agents.pilot_workdir).resolve(),
                           ctx.settings.agents)


class Director:
    """One site director; keep it for the life of the agent process (it holds the CEs, whose
    PSI/J executors watch the pilots they started)."""

    def __init__(self, ctx: AgentContext, ces: ComputeElements | None = None) -> None:
        self.ctx = ctx
        self.ces = ces or compute_elements(ctx)
        #: The CA certificates of [matcher] url that every pilot gets, read each cycle.
        self.ca_bundle: bytes | None = None
        #: Per queue, the operator's last retry request this process acted on.
        self._retries_seen: dict[str, datetime] = {}
        #: Per CE, its state as last read (``[agents] ce_info_period``).
        self._ce_reads: dict[str, CERead] = {}

    def cycle(self) -> DirectorReport:
        report = DirectorReport()
        try:
            self.ca_bundle = pilot_ca_bundle(self.ctx.settings.matcher.ca_bundle)
        except ConfigurationError as exc:
            # Pilots that could not verify the matcher would all fail: none is started.
            self.ctx.log.error("%s", exc)
            report.failed["matcher.ca_bundle"] = str(exc)
            return report
        config = self.ctx.resources()
        self.ces.start_turn()
        found = targets(self.ctx, report)
        self._forgive_retried(found)
        for target in found:
            queue = config.queue(target.site, target.ce, target.queue)
            self._serve(target, queue, report)
        return report

    # -- one queue ---------------------------------------------------------------------------

    def _forgive_retried(self, found: list[QueueTarget]) -> None:
        """The CEs of queues an operator asked to retry since this process last looked are
        not left alone any longer here (their database back-off ended with the request)."""
        asked = self.ctx.transaction(retry_requests)
        for target in found:
            at = asked.get((target.site, target.ce, target.queue))
            if at is not None and self._retries_seen.get(target.name) != at:
                self._retries_seen[target.name] = at
                self.ces.answered(target.compute)

    def _serve(self, target: QueueTarget, queue: Queue, report: DirectorReport) -> None:
        ctx = self.ctx
        if self.ces.turn_over(target.compute):
            # Its requests took their time for this cycle: its other queues wait for the next.
            report.skipped[target.name] = (
                f"its CE ({target.compute.name}) used its {ctx.settings.agents.ce_turn_budget} s "
                "for this cycle ([agents] ce_turn_budget); next cycle")
            return
        read = self._read_ce(target)
        warning = self._credential_warning(target)
        if warning:
            report.warned[target.name] = warning
        now = ctx.now()
        decided = ctx.transaction(lambda s: self._decide(s, target, now, read, warning))
        if isinstance(decided, str):
            report.skipped[target.name] = decided
            return
        pools, references = decided
        if not references:
            return
        specs = [self._spec(target, pools, ref) for ref in references]
        try:
            results: list[str | CEError] = list(self.ces.get(target.compute).submit(specs))
        except CEError as exc:  # the CE refused them all (down, credentials)
            results = [exc] * len(specs)
        except Exception as exc:  # a CE's bug must not stop the other queues
            ctx.log.exception("submission to %s failed", target.name)
            results = [CEError(f"{type(exc).__name__}: {exc}")] * len(specs)
        if any(isinstance(r, CEUnavailable) and not isinstance(r, CETurnOver)
               for r in results):
            self.ces.failed(target.compute)
        elif any(not isinstance(r, CEError) for r in results):
            self.ces.answered(target.compute)
        submitted = 0
        refused: list[str] = []
        reasons: list[str] = []
        for spec, result in zip(specs, results, strict=True):
            if isinstance(result, CEError):  # refused, or cut when the CE's turn was over
                refused.append(spec.reference)
                reasons.append(str(result))
                continue
            ctx.transaction(partial(record_submission, reference=spec.reference,
                                    native_id=result, now=ctx.now()))
            submitted += 1
        if refused:
            # A CE's error names the CE and what to check (shortened in the middle when
            # stored, taskqueue.pilots.records.storable). The pilots never reached it: their
            # records go, the queue counts them (records.record_submission_failure).
            reason = reasons[0]
            ctx.log.error("submission to %s failed: %s", target.name, reason)
            failures = ctx.transaction(partial(
                record_submission_failure, site=target.site, ce=target.ce,
                queue=target.queue, references=refused, reason=reason, now=ctx.now(),
                base_backoff=ctx.settings.agents.failure_backoff))
            report.failed[target.name] = f"{reason} (failure {failures} in a row)"
        report.submitted[target.name] = submitted
        if submitted:
            ctx.log.info("%d pilot(s) submitted to %s", submitted, target.name)

    def _credential_warning(self, target: QueueTarget) -> str:
        """Why the queue's CE credential will soon stop working ("" when it will not),
        logged and in the report once per cycle; no request to the CE."""
        try:
            warning = self.ces.get(target.compute).credential_warning()
        except Exception as exc:  # a CE's bug must not stop the submissions
            self.ctx.log.exception("checking the credential of %s failed", target.name)
            warning = f"its credential could not be checked: {type(exc).__name__}: {exc}"
        if warning:
            self.ctx.log.warning("%s: %s", target.name, warning)
        return warning

    def _read_ce(self, target: QueueTarget) -> CERead | None:
        """The CE's own state, read again once ``[agents] ce_info_period`` has passed since
        the last read (in this process); None when it is never read, or not now (it did not
        answer lately). A read that fails is kept as such, and stops nothing."""
        period = self.ctx.settings.agents.ce_info_period
        if not period or self.ces.resting(target.compute):
            return None
        name = target.compute.name
        read = self._ce_reads.get(name)
        now = self.ctx.now()
        if read is not None and (now - read.at).total_seconds() < period:
            return read
        try:
            loads = self.ces.get(target.compute).loads()
        except CETurnOver:
            return read  # it used its time for this cycle: read at the next one
        except CEError as exc:
            read = CERead(now, None, f"its state could not be read: {exc}")
        except Exception as exc:  # a CE's bug must not stop the submissions
            self.ctx.log.exception("reading the state of %s failed", name)
            read = CERead(now, None, f"its state could not be read: {type(exc).__name__}: "
                                     f"{exc}")
        else:
            if loads is None:
                return None  # this kind of CE says nothing of its load
            read = CERead(now, loads)
        if read.error:
            self.ctx.log.warning("%s: %s", name, read.error)
        self._ce_reads[name] = read
        return read

    def _decide(self, session: Session, target: QueueTarget, now: datetime,
                read: CERead | None = None, warning: str = ""
                ) -> tuple[list[str], list[str]] | str:
        """Under the queue's lock: how many pilots to submit; records them as Submitting.
        ``warning``: what is wrong with the CE's credential, kept for the sites page."""
        a = self.ctx.settings.agents
        state = lock_director_queue(session, target.site, target.ce, target.queue, now=now)
        record_credential_warning(state, warning)
        load = _queue_load(target, read, state)
        why = backing_off(state, now)
        if why:
            return why
        if self.ces.resting(target.compute):
            # It did not answer lately (this cycle, or the pilots loop, for another queue):
            # its other queues do not each wait for its deadline again.
            return f"its CE ({target.compute.name}) did not answer lately; left alone for now"
        expire_submitting(session, target.site, target.ce, target.queue, now=now)
        stopped = starts_stopped(session, state)
        if stopped:
            return stopped
        dead = failed_start_streak(session, target.site, target.ce, target.queue,
                                   length=a.failed_starts)
        if dead:
            reason = stop_for_failed_starts(session, state, dead, now=now)
            self.ctx.log.error("%s: %s", target.name, reason)
            return reason
        streak = idle_pilot_streak(session, target.site, target.ce, target.queue,
                                   length=max(3, target.max_waiting))
        if streak:
            record_submission_failure(
                session, target.site, target.ce, target.queue, [], now=now,
                base_backoff=a.failure_backoff,
                reason=f"the last {streak} pilots ended without running a job although "
                       "work their queue could run was waiting when they asked: their own "
                       "resource description does not match it")
            return (f"the last {streak} pilots found no job while work was waiting; the queue "
                    "is skipped for a while")
        pools, waiting_jobs = queue_pools_and_waiting(
            session, self.ctx.resources(), target.site, target.ce, target.queue, a.vo)
        counts = count_pilots(session, target.site, target.ce, target.queue)
        # A pilot its CE runs that has not reached the matcher yet has taken no job: it
        # counts as waiting, or every job would get a pilot per cycle until one asks.
        waiting = sum(counts.get(s, 0) for s in WAITING_STATES) + count_starting(
            session, target.site, target.ce, target.queue)
        alive = sum(counts.get(s, 0) for s in ALIVE_STATES)
        # A pilot fills its cores with one-core jobs; a multi-core job takes several.
        needed = math.ceil(waiting_jobs / max(1, target.cores)) - waiting
        n = max(0, min(needed, a.pilots_per_cycle, target.max_waiting - waiting,
                       target.max_total - alive))
        if n and load is not None:
            room, why = ce_room(load, target.max_waiting)
            if room <= 0:
                return f"its CE says it is full: {why}; no new pilot until it has room"
            n = min(n, room)
        references = [f"{target.executor}-{uuid.uuid4().hex[:16]}" for _ in range(n)]
        record_new_pilots(session, a.vo, target.site, target.ce, target.queue,
                          target.executor, references, now=now)
        return pools, references

    # -- what a pilot is started with --------------------------------------------------------

    def _spec(self, target: QueueTarget, pools: list[str], reference: str) -> PilotSpec:
        """The pilot's command; its paths are relative to the folder it starts in, which its
        CE chooses (a folder of the director's host, or its ARC session directory)."""
        a = self.ctx.settings.agents
        params = target.parameters
        launch = pilot_launch(self.ctx.resources(), target.site, target.ce, target.queue,
                              a.vo)
        arguments = [
            "--matcher", self.ctx.settings.matcher.url, "--reference", reference,
            "--workdir", "work", "--idle-timeout", str(a.pilot_idle_timeout),
            "--jobstatus", _jobstatus_dir(params, reference),
            *launch.arguments(pools if a.pass_submit_pools else None),
        ]
        arguments += ["--token-file", TOKEN_FILE]
        files: dict[str, bytes] = {}
        if self.ca_bundle is not None:
            files[CA_FILE] = self.ca_bundle
            arguments += ["--ca-bundle", CA_FILE]
        environment: dict[str, str] = {}
        for key, name in (("MachineFeatures", "MACHINEFEATURES"),
                          ("JobFeatures", "JOBFEATURES")):
            value = params.get(key)
            if isinstance(value, str) and value:
                environment[name] = value
        if a.pilot_command:
            command = list(a.pilot_command)
        elif target.compute.kind in SHIP_PILOT:
            command = ["/usr/bin/env", "python3", BUNDLE_FILE]
            files[BUNDLE_FILE] = pilot_bundle()
        else:
            command = [sys.executable, "-m", "pilot.cli"]
        queue_name = params.get("BatchQueue")
        account = params.get("Account")
        return PilotSpec(
            reference=reference, executable=command[0], arguments=command[1:] + arguments,
            environment=environment, cores=launch.cores,
            token=self._token(target, reference),
            memory_mb=launch.memory_mb, wall_minutes=launch.wall_minutes,
            queue_name=queue_name if isinstance(queue_name, str) else None,
            account=account if isinstance(account, str) else None, files=files)

    def _token(self, target: QueueTarget, reference: str) -> str:
        """A token for this pilot alone: its VO, its site, its reference."""
        a = self.ctx.settings.agents
        return issue_token(self.ctx.secret, subject=reference, role="pilot", vo=a.vo,
                           group=f"{a.vo}{PILOT_GROUP_SUFFIX}", lifetime=a.pilot_token_lifetime,
                           site=target.site, pilot=reference)


def _queue_load(target: QueueTarget, read: CERead | None, state: DirectorQueue
                ) -> CELoad | None:
    """The queue's load in the CE's last read, stored in its row for the sites page;
    None when there is no read or it failed (a failed read holds nothing back)."""
    if read is None:
        return None
    name = target.parameters.get("BatchQueue")
    queue = name if isinstance(name, str) and name else None
    load = read.loads.of(queue) if read.loads is not None else None
    error = read.error or (f"its CE publishes no queue {queue}" if queue else
                           "its CE publishes no count of its jobs")
    record_ce_load(state, load, error=error, read_at=read.at)
    return load


def ce_room(load: CELoad, max_waiting: int) -> tuple[int, str]:
    """How many more pilots the CE's own counts leave room for, and what limits them: the
    jobs waiting in its queue (all its users', DIRAC's rule) against the queue's
    MaxWaitingPilots, and its jobs in all against the MaxTotalJobs it publishes."""
    room = max_waiting - load.waiting
    why = (f"{load.waiting} job(s) wait in its queue, MaxWaitingPilots is {max_waiting} "
           f"({load.line()})")
    if load.max_total is not None and load.max_total - load.total < room:
        room = load.max_total - load.total
        why = f"it holds {load.total} job(s), its MaxTotalJobs is {load.max_total} " \
              f"({load.line()})"
    return room, why


def backing_off(state: DirectorQueue, now: datetime) -> str:
    """Why the queue is skipped now, naming what failed (its submissions, or the polls of its
    CE) and when it is tried next; "" when it is not."""
    why = []
    if state.skip_until is not None and now < state.skip_until:
        why.append(f"{state.failures} failed submission(s) in a row, last: "
                   f"{state.last_error}; next try after {state.skip_until:%H:%M:%S}")
    if state.poll_skip_until is not None and now < state.poll_skip_until:
        why.append(f"{state.poll_failures} failed poll(s) of its CE in a row, last: "
                   f"{state.poll_error}; next try after {state.poll_skip_until:%H:%M:%S}, "
                   "or at its next successful poll")
    return "; ".join(why)


#: The most bytes [matcher] ca_bundle may have: it is read every cycle and shipped with every
#: pilot (the IGTF's whole set of CAs is far smaller).
MAX_CA_BUNDLE_BYTES = 16 * 1024 * 1024


def pilot_ca_bundle(path: str) -> bytes | None:
    """The PEM CA certificates of ``[matcher] ca_bundle`` (None when it is empty), which the
    director ships to every pilot as ``CA_FILE``."""
    if not path:
        return None
    try:
        # Looked at before it is opened: a FIFO would block the director, a device never end.
        found = os.stat(path)
        if not stat.S_ISREG(found.st_mode):
            raise ConfigurationError(f"matcher.ca_bundle {path} is not a regular file: it must "
                                     "be a PEM file of the CA certificates of matcher.url")
        if found.st_size > MAX_CA_BUNDLE_BYTES:
            raise ConfigurationError(
                f"matcher.ca_bundle {path} has {found.st_size} bytes, more than the "
                f"{MAX_CA_BUNDLE_BYTES} a file of CA certificates shipped with every pilot "
                "may have: give only the CAs of matcher.url")
        with open(path, "rb") as file:
            data = file.read(MAX_CA_BUNDLE_BYTES + 1)
    except OSError as exc:
        raise ConfigurationError(f"matcher.ca_bundle {path} cannot be read (it must be a PEM "
                                 f"file of the CA certificates of matcher.url): "
                                 f"{exc.strerror or exc}") from exc
    if len(data) > MAX_CA_BUNDLE_BYTES:
        raise ConfigurationError(f"matcher.ca_bundle {path} grew past {MAX_CA_BUNDLE_BYTES} "
                                 "bytes while it was read")
    if b"-----BEGIN CERTIFICATE-----" not in data:
        raise ConfigurationError(f"matcher.ca_bundle {path} holds no PEM certificate (-----BEGIN "
                                 "CERTIFICATE-----): it must be the CA certificates of "
                                 "matcher.url")
    return data


def _jobstatus_dir(params: dict[str, Any], reference: str) -> str:
    """Where the pilot keeps $JOBSTATUS: under the queue's JobStatusRoot (a folder the site
    reads), else in the pilot's own folder."""
    root = params.get("JobStatusRoot")
    return str(Path(root) / reference) if isinstance(root, str) and root else "jobstatus"
