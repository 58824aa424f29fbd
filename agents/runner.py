"""``gridpilot agents``: the central loops in one process, each at its own interval.

Loops: optimizer (Received jobs through the chain), director (pilots to queues with work),
pilots (what the compute elements say of the pilots; kills passed on, logs of ended pilots
kept), submitpools (SubmitPool → queue mappings re-evaluated; unused pools dropped),
watchdog (silent jobs Stalled, rescheduled or failed), priorities (fair share), cleanup
(empty task queues), activity (the dashboard's counters and job-count snapshots), sandboxes
(expired sandboxes and pilot logs removed), purge (jobs ended longer ago than their status's
retention removed, with their history and sandboxes). Several agent processes may run at
once: each loop's turn is taken in the database (taskqueue.agentruns) and held by a
heartbeat while the loop runs (so a killed agent's turn is free, and due again, after
``[agents] turn_lease``), and every loop is itself safe to run twice at once.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from types import FrameType

from agents.context import AgentContext
from agents.director import Director, compute_elements
from agents.maintenance import (
    clean_up,
    recompute_shares,
    record_dashboard_activity,
    refresh_submit_pools,
)
from agents.metrics import AgentMetrics, MetricsServer
from agents.pilotstatus import PilotFollower, follow_pilots
from agents.purge import purge_ended_jobs
from agents.sandboxcleanup import SweepClock, clean_up_sandboxes
from agents.watchdog import watch_jobs
from optimizers.chain import optimize_received
from taskqueue.agentruns import finish_run, renew_run, start_run
from taskqueue.core.errors import DatabaseUnavailableError
from taskqueue.pilots.monitoring import FAILED_SUMMARY

#: The loops of ``gridpilot agents``, in the order they run.
LOOP_NAMES = ("optimizer", "director", "pilots", "submitpools", "watchdog", "priorities",
              "cleanup", "activity", "sandboxes", "purge")


@dataclass(frozen=True)
class Loop:
    name: str
    interval: int
    run: Callable[[], str]


def optimize(ctx: AgentContext) -> str:
    total_ok = total_failed = 0
    batch = ctx.settings.submit.optimizer_batch
    while True:
        result = ctx.transaction(lambda s: optimize_received(s, ctx.chain_context(),
                                                             limit=batch))
        total_ok += len(result.waiting)
        total_failed += len(result.failed)
        if len(result.waiting) + len(result.failed) < batch:
            break
    return f"{total_ok} job(s) now Waiting, {total_failed} failed"


#: How a turn's summary starts when the database could not be reached to take the turn.
NOT_RUN = "not run: "
#: Longest wait, in seconds, between rounds while the database cannot be reached.
MAX_DATABASE_WAIT = 60.0


class TurnKeeper:
    """Renews one loop's turn every ``every`` seconds, in a thread, while the loop runs."""

    def __init__(self, ctx: AgentContext, name: str, holder: str, *, every: float) -> None:
        self.ctx, self.name, self.holder, self.every = ctx, name, holder, every
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"turn-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stopped.wait(self.every):
            try:
                held = self.ctx.transaction(partial(renew_run, name=self.name,
                                                    holder=self.holder, now=self.ctx.now()))
            except Exception:  # the database may be back at the next beat
                self.ctx.log.exception("agent loop %s: its turn could not be renewed", self.name)
                continue
            if not held:
                self.ctx.log.warning("agent loop %s: its turn was taken over by another "
                                     "process (this one was silent too long)", self.name)


class Agents:
    def __init__(self, ctx: AgentContext, names: Sequence[str] | None = None) -> None:
        self.ctx = ctx
        # Host and pid, and a random part: a restarted container's agent often gets the pid
        # of the one killed, and must not pass for it (its turn would wait for the interval).
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.ces = compute_elements(ctx)
        director = Director(ctx, self.ces)
        follower = PilotFollower(ctx, self.ces)
        a = ctx.settings.agents
        every: dict[str, tuple[int, Callable[[], str]]] = {
            "optimizer": (a.optimizer_interval, partial(optimize, ctx)),
            "director": (a.director_interval, lambda: director.cycle().line()),
            "pilots": (a.pilot_status_interval, partial(follow_pilots, follower)),
            "submitpools": (a.submit_pool_interval, partial(refresh_submit_pools, ctx)),
            "watchdog": (a.watchdog_interval, partial(watch_jobs, ctx)),
            "priorities": (a.priorities_interval, partial(recompute_shares, ctx)),
            "cleanup": (a.cleanup_interval, partial(clean_up, ctx)),
            "activity": (a.activity_interval, partial(record_dashboard_activity, ctx)),
            "sandboxes": (a.cleanup_interval, partial(
                clean_up_sandboxes, ctx,
                sweeps=SweepClock(ctx.settings.sandboxes.sweep_interval))),
            "purge": (ctx.settings.purge.interval, partial(purge_ended_jobs, ctx)),
        }
        assert tuple(every) == LOOP_NAMES
        unknown = sorted(set(names or ()) - set(every))
        if unknown:
            raise ValueError(f"no agent loop named {', '.join(unknown)}; the loops are "
                             f"{', '.join(every)}")
        self.loops = [Loop(name, interval, run) for name, (interval, run) in every.items()
                      if not names or name in names]
        self.stopping = False
        self.metrics = AgentMetrics(ctx, {loop.name: loop.interval for loop in self.loops})

    def run_once(self) -> dict[str, str]:
        """Every loop once, whatever its interval (unless another process runs it now)."""
        return {loop.name: self._turn(loop, force=True) for loop in self.loops}

    def run_forever(self, sleep: Callable[[float], None] = time.sleep) -> None:
        """Run the loops until SIGTERM or SIGINT, answering Prometheus meanwhile when
        ``[agents] metrics_bind`` says where."""
        self._install_signal_handlers()
        bind = self.ctx.settings.agents.metrics_bind
        server = MetricsServer(self.metrics, bind) if bind else None
        if server is not None:
            server.start()
        try:
            waits = 0  # rounds in a row in which the database could not be reached
            while not self.stopping:
                summaries = []
                for loop in self.loops:
                    if self.stopping:
                        break
                    summaries.append(self._turn(loop, force=False))
                if summaries and all(s.startswith(NOT_RUN) for s in summaries):
                    waits += 1
                    sleep(min(MAX_DATABASE_WAIT, 2.0 ** waits))  # back off while it is away
                else:
                    waits = 0
                    sleep(1.0)
        finally:
            if server is not None:
                server.stop()
            self.metrics.dispose()

    def _turn(self, loop: Loop, *, force: bool) -> str:
        ctx = self.ctx
        lease = ctx.settings.agents.turn_lease
        try:
            taken = ctx.transaction(partial(start_run, name=loop.name, holder=self.holder,
                                            now=ctx.now(), interval=loop.interval,
                                            lease=lease, force=force))
        except DatabaseUnavailableError as exc:  # the process waits for it, it does not die
            ctx.log.warning("agent loop %s not run: %s", loop.name, exc)
            return f"{NOT_RUN}{exc}"
        if not taken:
            return "not due, or running in another agent process"
        keeper = TurnKeeper(ctx, loop.name, self.holder, every=lease / 3)
        keeper.start()
        started, failed = time.monotonic(), False
        try:
            summary = loop.run()
        except Exception as exc:  # one loop's failure must not stop the others
            ctx.log.exception("agent loop %s failed", loop.name)
            summary, failed = f"{FAILED_SUMMARY}{type(exc).__name__}: {exc}", True
        finally:
            keeper.stop()
        self.metrics.record(loop.name, failed=failed, seconds=time.monotonic() - started)
        try:
            ctx.transaction(partial(finish_run, name=loop.name, holder=self.holder,
                                    now=ctx.now(), summary=summary))
        except DatabaseUnavailableError as exc:
            # The turn stays this process's until its lease passes; it is taken again then.
            ctx.log.warning("agent loop %s: its end could not be recorded: %s", loop.name, exc)
        ctx.log.info("%s: %s", loop.name, summary)
        return summary

    def _install_signal_handlers(self) -> None:
        def stop(signum: int, _frame: FrameType | None) -> None:
            self.ctx.log.info("agents stopping (%s)", signal.Signals(signum).name)
            self.stopping = True

        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, stop)
