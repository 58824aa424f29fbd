"""The pilot-status loop: what the compute elements say of the pilots the director submitted.

Each turn, the pilots the director still follows (taskqueue.pilots.pilotlogs) are grouped by their
CE, and each CE is asked once for all of its pilots:

- an operator's kill request is passed on first; the CE taking it makes the pilot Aborted;
- the states the CE reports move the records forward (never back: a pilot that said Done
  itself stays Done); one the CE no longer knows is Lost, never counted as running;
- once the CE says pilots ended, their standard outputs and errors are fetched together
  (their ends, ``[agents] pilot_log_bytes`` each), kept in the sandbox store with the pilots'
  records, each pilot's own reason for a non-zero exit is recorded, and the CE forgets
  those pilots, all in one call.

A CE that does not answer is left alone for a while (longer after each failure in a row) and
its queues show the failed poll on the sites page, counted apart from failed submissions; its
pilots keep their records until it answers again, which ends the poll back-off of its queues.
A CE whose requests took ``[agents] ce_turn_budget`` seconds in the turn is asked nothing
more in it (agents.ce.budget): the logs it still owes are fetched next turn. A pilot whose CE
never confirms an end the pilot reported is let go after ``[agents] pilot_log_patience``.

A pilot that stays in one state of its CE (the CE's own word: ACCEPTING, HELD, QUEUING ...)
longer than that kind of state's timeout (``[agents] pilot_stage_timeout``,
``pilot_held_timeout``, ``pilot_queued_timeout``) is killed through the CE, its reason says
where it hung and for how long, and it is counted (the agents' metric
``gridpilot_director_pilots_stuck``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial

from agents.ce.base import (
    CEError,
    CEPilot,
    CEState,
    CETurnOver,
    ComputeElement,
    PilotUnknown,
)
from agents.ce.config import CEConfig, CEConfigError, ce_config
from agents.ce.registry import ComputeElements, state_timeouts
from agents.context import AgentContext
from taskqueue.core.errors import DatabaseUnavailableError, NotFoundError
from taskqueue.db.database import Session
from taskqueue.files.sandboxstore import SandboxStore, open_store
from taskqueue.pilots.pilotlogs import (
    FollowedPilot,
    exit_reason,
    mark_hanging,
    pack_log,
    pilots_to_follow,
    record_ce_state,
    record_killed,
    record_log,
    stop_following,
)
from taskqueue.pilots.records import FINAL_PILOT_STATES, record_ce_answered, record_ce_failure

ENDED = FINAL_PILOT_STATES


@dataclass
class FollowReport:
    moved: int = 0
    killed: int = 0
    #: Pilots that hung in a CE state past its timeout, to be killed.
    stuck: int = 0
    logs: int = 0
    unavailable: int = 0
    failed: dict[str, str] = field(default_factory=dict)
    #: CEs that used their time for the turn (``[agents] ce_turn_budget``), and what they said.
    deferred: dict[str, str] = field(default_factory=dict)

    def line(self) -> str:
        parts = [f"{self.moved} pilot(s) changed state", f"{self.killed} killed",
                 f"{self.logs} log(s) kept"]
        if self.stuck:
            parts.append(f"{self.stuck} stuck in a CE state past its timeout")
        if self.unavailable:
            parts.append(f"{self.unavailable} ended without a log")
        parts += [f"{ce} failed ({why})" for ce, why in sorted(self.failed.items())]
        parts += [f"{ce} left for the next turn ({why})"
                  for ce, why in sorted(self.deferred.items())]
        return "; ".join(parts)


class PilotFollower:
    """Keep one for the life of the agent process, sharing the director's CEs."""

    def __init__(self, ctx: AgentContext, ces: ComputeElements,
                 store: SandboxStore | None = None) -> None:
        self.ctx = ctx
        self.ces = ces
        self._store = store

    @property
    def store(self) -> SandboxStore:
        if self._store is None:
            self._store = open_store(self.ctx.settings)
        return self._store

    def turn(self) -> FollowReport:
        ctx = self.ctx
        report = FollowReport()
        self.ces.start_turn()
        followed = ctx.transaction(pilots_to_follow)
        groups: dict[CEConfig, list[FollowedPilot]] = defaultdict(list)
        for pilot in followed:
            config = self._config_of(pilot)
            if config is None:
                self._unfollowable(pilot, report)
            else:
                groups[config].append(pilot)
        for config, pilots in groups.items():
            if self.ces.resting(config):
                continue
            try:
                self._follow(self.ces.get(config), config, pilots, report)
                self.ces.answered(config)
                # A poll back-off of its queues ends: their submissions are tried again.
                ctx.transaction(partial(record_ce_answered, queues=_queues(pilots),
                                        now=ctx.now()))
                if self.ces.turn_over(config):
                    report.deferred[config.name] = (
                        f"it used its {ctx.settings.agents.ce_turn_budget} s for this turn "
                        "([agents] ce_turn_budget); the rest waits for the next turn")
            except DatabaseUnavailableError:
                raise
            except CETurnOver as exc:  # slow, not failing: the rest at the next turn
                self.ces.answered(config)
                ctx.transaction(partial(record_ce_answered, queues=_queues(pilots),
                                        now=ctx.now()))
                report.deferred[config.name] = str(exc)
                ctx.log.warning("following the pilots of %s: %s", config.name, exc)
            except Exception as exc:  # a CE's malformed answer is that CE's failure only
                if not isinstance(exc, CEError):
                    ctx.log.exception("following the pilots of %s failed", config.name)
                failures = self.ces.failed(config)
                reason = f"{config.name}: {exc}"
                report.failed[config.name] = f"{exc} (failure {failures} in a row)"
                ctx.log.error("following the pilots of %s failed: %s", config.name, exc)
                ctx.transaction(partial(record_ce_failure, queues=_queues(pilots),
                                        reason=reason, now=ctx.now(),
                                        base_backoff=ctx.settings.agents.failure_backoff))
        patience = timedelta(seconds=ctx.settings.agents.pilot_log_patience)
        report.unavailable += ctx.transaction(partial(stop_following, now=ctx.now(),
                                                      patience=patience))
        return report

    # -- one CE ----------------------------------------------------------------------------

    def _follow(self, ce: ComputeElement, config: CEConfig, pilots: list[FollowedPilot],
                report: FollowReport) -> None:
        ctx = self.ctx
        # Its pilots live on: what they run with (an ARC delegation) is renewed in time.
        ce.keep_credentials()
        by_ref = {p.reference: p for p in pilots}
        to_kill = [CEPilot(p.reference, p.native_id) for p in pilots
                   if p.kill_requested_by and p.status not in ENDED]
        if to_kill:
            for reference, error in ce.kill(to_kill).items():
                if error is None or isinstance(error, PilotUnknown):
                    # Taken, or nothing left to kill: either way the pilot is over.
                    p = by_ref[reference]
                    ctx.transaction(partial(record_killed, vo=p.vo, reference=reference,
                                            now=ctx.now()))
                    report.killed += 1
                else:
                    report.failed[f"kill {reference}"] = str(error)
        states = ce.states([CEPilot(p.reference, p.native_id) for p in pilots])
        ended: list[tuple[FollowedPilot, CEState]] = []
        for reference, state in states.items():
            followed = by_ref.get(reference)
            if followed is None:
                continue
            if ctx.transaction(partial(record_ce_state, vo=followed.vo, reference=reference,
                                       status=state.status, reason=state.reason,
                                       exit_code=state.exit_code, now=ctx.now(),
                                       ce_state=state.ce_state)):
                report.moved += 1
            if state.status in ENDED:
                ended.append((followed, state))
        self._kill_hanging(ce, config, [p for p in pilots if p.reference not in
                                        {f.reference for f, _ in ended}], report)
        if ended:
            self._keep_logs(ce, ended, report)

    def _kill_hanging(self, ce: ComputeElement, config: CEConfig,
                      pilots: list[FollowedPilot], report: FollowReport) -> None:
        """Kill through the CE the pilots that stayed in one of its states past that state's
        timeout (agents.ce.registry.state_timeouts); each keeps where it hung. A kill the CE
        does not take now is passed on again next turn, as an operator's is."""
        ctx = self.ctx
        timeouts = state_timeouts(config, ctx.settings.agents)
        hanging = ctx.transaction(partial(
            mark_hanging, pilots=[(p.vo, p.reference) for p in pilots if p.status not in ENDED],
            timeouts=timeouts, now=ctx.now()))
        if not hanging:
            return
        for p in hanging:
            ctx.log.warning("pilot %s at %s: stuck in %s for %d s: killing it", p.reference,
                            config.name, p.ce_state, p.seconds)
        report.stuck += len(hanging)
        by_ref = {p.reference: p for p in hanging}
        for reference, error in ce.kill([CEPilot(p.reference, p.native_id)
                                         for p in hanging]).items():
            if error is None or isinstance(error, PilotUnknown):
                p = by_ref[reference]
                ctx.transaction(partial(record_killed, vo=p.vo, reference=reference,
                                        now=ctx.now()))
                report.killed += 1
            else:
                report.failed[f"kill {reference}"] = str(error)

    def _keep_logs(self, ce: ComputeElement, ended: list[tuple[FollowedPilot, CEState]],
                   report: FollowReport) -> None:
        """Keep the ended pilots' logs, then have the CE forget those kept, in one call. A
        pilot whose output the CE would not give (but for one it forgot) stays followed, and
        its error is the CE's failure of this turn, once the others' logs are kept."""
        ctx = self.ctx
        outputs = ce.outputs([CEPilot(p.reference, p.native_id) for p, _ in ended],
                             ctx.settings.agents.pilot_log_bytes)
        kept: list[CEPilot] = []
        trouble: CEError | None = None
        for p, state in ended:
            output = outputs.get(p.reference)
            if output is None:
                continue  # no news: asked again next turn
            if isinstance(output, PilotUnknown):
                ctx.transaction(partial(record_log, vo=p.vo, reference=p.reference,
                                        log_id=None, size=0, note=str(output), now=ctx.now()))
                report.unavailable += 1
                continue
            if isinstance(output, CEError):
                trouble = trouble or output
                continue
            log_id, packed = pack_log(output.stdout, output.stderr)
            self.store.put(log_id, packed)
            note = "the ends of its output only" if output.truncated else ""
            ctx.transaction(partial(record_log, vo=p.vo, reference=p.reference, log_id=log_id,
                                    size=len(packed), note=note, now=ctx.now(),
                                    reason=exit_reason(output.stderr, state.exit_code)))
            report.logs += 1
            kept.append(CEPilot(p.reference, p.native_id))
        if kept:
            try:
                ce.clean(kept)
            except CEError as exc:  # the logs are kept; the CE's own cleanup will catch up
                ctx.log.warning("%s did not clean %d ended pilot(s): %s", ce.name, len(kept),
                                exc)
        if trouble is not None:
            raise trouble

    # -- where a pilot's CE is -------------------------------------------------------------

    def _config_of(self, pilot: FollowedPilot) -> CEConfig | None:
        """The CE of the pilot's queue as configured now; a PSI/J pilot's executor is its own
        record's when its queue left the configuration."""
        config = self.ctx.resources()
        name = f"{pilot.site}/{pilot.ce}/{pilot.queue}"
        try:
            queue = config.queue(pilot.site, pilot.ce, pilot.queue)
            found = ce_config(name, pilot.ce, dict(queue.parameters(pilot.vo)))
        except (NotFoundError, CEConfigError):
            found = None
        if found is not None and found.executor == pilot.executor:
            return found
        if pilot.executor != "arc":
            return CEConfig("psij", pilot.executor)
        return None

    def _unfollowable(self, p: FollowedPilot, report: FollowReport) -> None:
        why = (f"its CE ({p.site}/{p.ce}/{p.queue}, {p.executor}) is no longer in the "
               "resources configuration")
        ctx = self.ctx

        def work(session: Session) -> None:
            if p.status not in ENDED:
                record_ce_state(session, p.vo, p.reference, status="Lost", reason=why,
                                exit_code=None, now=ctx.now())
            record_log(session, p.vo, p.reference, log_id=None, size=0, note=why,
                       now=ctx.now())

        ctx.transaction(work)
        report.unavailable += 1


def _queues(pilots: list[FollowedPilot]) -> list[tuple[str, str, str]]:
    return sorted({(p.site, p.ce, p.queue) for p in pilots})


def follow_pilots(follower: PilotFollower) -> str:
    return follower.turn().line()
