"""The site director: pilots go where there is work.

Each cycle, for every queue of the resources configuration that serves the VO and names a PSI/J
``Executor``, the director looks at the work that queue could run (its SubmitPools, then the
matching task queues and their waiting jobs), subtracts the pilots already waiting there, and
submits the difference, capped per cycle and by the queue's limits on waiting and on live
pilots. Each pilot gets the matcher's URL, a token of its own (VO, site, and its reference),
its site/CE/queue, its SubmitPools, and the machine/job features the queue configures.

Several directors may run at once: the decision for a queue is taken under the lock of its
``director_queues`` row, and the pilots decided are recorded (status Submitting) in that same
transaction, so a second director counts them before deciding. The batch-system submission
itself happens after the commit; its outcome updates the records. A queue whose submissions
fail is skipped for a while, longer after each failure, and the reason is logged and kept.
"""

from __future__ import annotations

import json
import math
import sys
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

from agents.context import AgentContext
from agents.executors import ExecutorPool, PilotSpec
from optimizers.classads import expression_check
from optimizers.queueresources import labels, resource_for_queue
from optimizers.resources import Queue, serves_vo
from taskqueue.database import Session
from taskqueue.matching import matching_queues
from taskqueue.pilots import (
    ALIVE_STATES,
    WAITING_STATES,
    count_pilots,
    expire_submitting,
    idle_pilot_streak,
    lock_director_queue,
    record_new_pilots,
    record_submission,
    record_submission_failure,
)
from taskqueue.submitpools import get_submit_pools_for_queue
from taskqueue.tokens import issue_token

#: The file in a pilot's folder its token is handed over in (the pilot removes it once read).
TOKEN_FILE = "pilot.token"
#: The group in pilot tokens: the VO's name and this.
PILOT_GROUP_SUFFIX = "_pilot"


@dataclass(frozen=True)
class QueueTarget:
    """A queue the director submits to, with what its configuration says."""

    site: str
    ce: str
    queue: str
    executor: str
    cores: int
    memory_mb: int | None
    max_waiting: int
    max_total: int
    parameters: dict[str, Any]

    @property
    def name(self) -> str:
        return f"{self.site}/{self.ce}/{self.queue}"


@dataclass
class DirectorReport:
    submitted: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)

    def line(self) -> str:
        total = sum(self.submitted.values())
        parts = [f"{total} pilot(s) submitted"]
        parts += [f"{n} to {q}" for q, n in sorted(self.submitted.items()) if n]
        parts += [f"{q} skipped ({why})" for q, why in sorted(self.skipped.items())]
        parts += [f"{q} failed ({why})" for q, why in sorted(self.failed.items())]
        return "; ".join(parts)


def targets(ctx: AgentContext) -> list[QueueTarget]:
    """The queues that serve the VO and name an executor."""
    vo = ctx.settings.agents.vo
    a = ctx.settings.agents
    out = []
    select = serves_vo(vo)
    for q in ctx.resources().queues():
        if not select(q):
            continue
        params = dict(q.parameters(vo))
        executor = params.get("Executor")
        if not isinstance(executor, str) or not executor:
            continue
        out.append(QueueTarget(
            site=q.site, ce=q.ce, queue=q.name, executor=executor,
            cores=_int(params.get("NumberOfProcessors"), 1),
            memory_mb=_int(params.get("MaxRAM"), 0) or None,
            max_waiting=_int(params.get("MaxWaitingPilots"), a.max_waiting_pilots),
            max_total=_int(params.get("MaxTotalPilots"), a.max_total_pilots),
            parameters=params))
    return out


def _int(value: Any, default: int) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else default


class Director:
    """One site director; keep it for the life of the agent process (it holds the PSI/J
    executors, whose status callbacks keep the pilot records current)."""

    def __init__(self, ctx: AgentContext, executors: ExecutorPool | None = None) -> None:
        self.ctx = ctx
        self.executors = executors or ExecutorPool(ctx)

    def cycle(self) -> DirectorReport:
        report = DirectorReport()
        config = self.ctx.resources()
        for target in targets(self.ctx):
            queue = config.queue(target.site, target.ce, target.queue)
            self._serve(target, queue, report)
        return report

    # -- one queue ---------------------------------------------------------------------------

    def _serve(self, target: QueueTarget, queue: Queue, report: DirectorReport) -> None:
        ctx = self.ctx
        now = ctx.now()
        decided = ctx.transaction(lambda s: self._decide(s, target, now))
        if isinstance(decided, str):
            report.skipped[target.name] = decided
            return
        pools, references = decided
        if not references:
            return
        specs = [self._spec(target, pools, ref) for ref in references]
        submitted = 0
        for i, spec in enumerate(specs):
            try:
                native_id = self.executors.submit(target.executor, spec)
            except Exception as exc:  # any executor error: record it, back off the queue
                reason = f"{type(exc).__name__}: {exc}"[:250]
                ctx.log.error("submission to %s failed: %s", target.name, reason)
                unsent = [s.reference for s in specs[i:]]
                failures = ctx.transaction(partial(
                    record_submission_failure, site=target.site, ce=target.ce,
                    queue=target.queue, references=unsent, reason=reason, now=ctx.now(),
                    base_backoff=ctx.settings.agents.failure_backoff))
                report.failed[target.name] = f"{reason} (failure {failures} in a row)"
                break
            ctx.transaction(partial(record_submission, reference=spec.reference,
                                    native_id=native_id, now=ctx.now()))
            submitted += 1
        report.submitted[target.name] = submitted
        if submitted:
            ctx.log.info("%d pilot(s) submitted to %s", submitted, target.name)

    def _decide(self, session: Session, target: QueueTarget, now: datetime
                ) -> tuple[list[str], list[str]] | str:
        """Under the queue's lock: how many pilots to submit; records them as Submitting."""
        a = self.ctx.settings.agents
        state = lock_director_queue(session, target.site, target.ce, target.queue, now=now)
        if state.skip_until is not None and now < state.skip_until:
            return (f"{state.failures} failed submission(s), last: {state.last_error}; "
                    f"next try after {state.skip_until:%H:%M:%S}")
        expire_submitting(session, target.site, target.ce, target.queue, now=now)
        streak = idle_pilot_streak(session, target.site, target.ce, target.queue,
                                   length=max(3, target.max_waiting))
        if streak:
            record_submission_failure(
                session, target.site, target.ce, target.queue, [], now=now,
                base_backoff=a.failure_backoff,
                reason=f"the last {streak} pilots ended without running a job: their "
                       "resource description does not match the work the director saw")
            return f"the last {streak} pilots found no job; the queue is skipped for a while"
        pools = get_submit_pools_for_queue(session, target.site, target.ce, target.queue)
        resource = resource_for_queue(self.ctx.resources(), target.site, target.ce,
                                      target.queue, a.vo, submit_pools=pools)
        waiting_jobs = sum(q.waiting for q in matching_queues(session, resource,
                                                               expression_check(resource)))
        counts = count_pilots(session, target.site, target.ce, target.queue)
        waiting = sum(counts.get(s, 0) for s in WAITING_STATES)
        alive = sum(counts.get(s, 0) for s in ALIVE_STATES)
        # A pilot fills its cores with one-core jobs; a multi-core job takes several.
        needed = math.ceil(waiting_jobs / max(1, target.cores)) - waiting
        n = max(0, min(needed, a.pilots_per_cycle, target.max_waiting - waiting,
                       target.max_total - alive))
        references = [f"{target.executor}-{uuid.uuid4().hex[:16]}" for _ in range(n)]
        record_new_pilots(session, a.vo, target.site, target.ce, target.queue,
                          target.executor, references, now=now)
        return pools, references

    # -- what a pilot is started with --------------------------------------------------------

    def _spec(self, target: QueueTarget, pools: list[str], reference: str) -> PilotSpec:
        a = self.ctx.settings.agents
        base = Path(a.pilot_workdir).resolve() / reference
        params = target.parameters
        arguments = [
            "--matcher", self.ctx.settings.matcher.url, "--vo", a.vo, "--site", target.site,
            "--ce", target.ce, "--queue", target.queue, "--reference", reference,
            "--cores", str(target.cores), "--workdir", str(base / "work"),
            "--idle-timeout", str(a.pilot_idle_timeout),
            "--jobstatus", str(_jobstatus_dir(params, base, reference)),
        ]
        if target.memory_mb:
            arguments += ["--memory", str(target.memory_mb)]
        if a.pass_submit_pools:
            arguments += ["--submit-pools", ",".join(pools)]
        for platform in labels(params.get("Platform")):
            arguments += ["--platform", platform]
        for name, value in sorted(params.items()):
            if name not in _NOT_ATTRIBUTES and value is not None:
                arguments += ["--attribute", f"{name}={json.dumps(_plain(value))}"]
        for tag in labels(params.get("Tags")):
            arguments += ["--tag", tag]
        for tag in labels(params.get("RequiredTags")):
            arguments += ["--required-tag", tag]
        token_file = base / TOKEN_FILE
        arguments += ["--token-file", str(token_file)]
        environment: dict[str, str] = {}
        for key, name in (("MachineFeatures", "MACHINEFEATURES"),
                          ("JobFeatures", "JOBFEATURES")):
            value = params.get(key)
            if isinstance(value, str) and value:
                environment[name] = value
        command = list(a.pilot_command) or [sys.executable, "-m", "pilot.cli"]
        wall = _int(params.get("WallTime"), _int(params.get("MaxCPUTime"), 60))
        queue_name = params.get("BatchQueue")
        account = params.get("Account")
        return PilotSpec(
            reference=reference, executable=command[0], arguments=command[1:] + arguments,
            environment=environment, directory=base, cores=target.cores,
            token=self._token(target, reference), token_file=token_file,
            memory_mb=target.memory_mb, wall_minutes=wall,
            queue_name=queue_name if isinstance(queue_name, str) else None,
            account=account if isinstance(account, str) else None)

    def _token(self, target: QueueTarget, reference: str) -> str:
        """A token for this pilot alone: its VO, its site, its reference."""
        a = self.ctx.settings.agents
        return issue_token(self.ctx.secret, subject=reference, role="pilot", vo=a.vo,
                           group=f"{a.vo}{PILOT_GROUP_SUFFIX}", lifetime=a.pilot_token_lifetime,
                           site=target.site, pilot=reference)


#: Queue parameters that are not node attributes for ClassAd expressions: the director's own
#: settings, and those passed as resource fields.
_NOT_ATTRIBUTES = frozenset({
    "Executor", "MaxWaitingPilots", "MaxTotalPilots", "MachineFeatures", "JobFeatures",
    "JobStatusRoot", "BatchQueue", "Account", "WallTime", "VO", "Tags", "RequiredTags",
    "Platform", "NumberOfProcessors", "MaxRAM"})


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _jobstatus_dir(params: dict[str, Any], base: Path, reference: str) -> Path:
    root = params.get("JobStatusRoot")
    return Path(root) / reference if isinstance(root, str) and root else base / "jobstatus"
