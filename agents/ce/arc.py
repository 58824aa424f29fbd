"""Pilots through an ARC-CE's REST interface (agents.ce.arcrest is the client).

A pilot is one ARC job: its ADL description names the pilot's command, cores, memory, wall
time and queue, its standard output and error (kept in the session directory), and one input
file, the pilot's token, which is uploaded into the session directory after the submission:
the CE starts the job only once it is there, and the token is never in a description (the
CE shows those to its operators). The states of all of a CE's pilots come in one request,
and the exit codes and the CE's reasons for failures of those that ended in one more (A-REX's
records of the jobs); their outputs in one request per stream no longer than the limit kept,
OUTPUT_FETCHES pilots at a time; the CE forgets them in one request. The CE's errors become
the director's: unreachable or 5xx (retry later), refused credentials (the message names the
CE and the credential file), refused requests, and pilots the CE does not know (Lost).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from agents.ce import adl
from agents.ce.arcrest import (
    FINAL_STATES,
    UNKNOWN,
    ArcAuthError,
    ArcError,
    ArcRefused,
    ArcRestClient,
    ArcTurnOver,
    ArcUnavailable,
    ArcUnknownJob,
    ArcUnreachable,
    JobInfo,
    pilot_status,
)
from agents.ce.base import (
    STDERR_FILE,
    STDOUT_FILE,
    TOKEN_FILE,
    CECredentialError,
    CEError,
    CELoads,
    CEPilot,
    CERefused,
    CEState,
    CETurnOver,
    CEUnavailable,
    PilotOutput,
    PilotSpec,
    PilotUnknown,
)
from agents.ce.budget import TurnBudget
from agents.ce.config import CEConfig

log = logging.getLogger(__name__)

T = TypeVar("T")
_EXIT_CODE = re.compile(r"^exitcode=(-?\d+)\s*$", re.MULTILINE)
#: Most pilots whose outputs are fetched at the same time (each over a connection of its own).
OUTPUT_FETCHES = 8


def ce_error(exc: ArcError) -> CEError:
    """The director's error for what the ARC client raised."""
    message = str(exc)
    if isinstance(exc, ArcTurnOver):
        return CETurnOver(message)
    if isinstance(exc, ArcUnreachable | ArcUnavailable):
        return CEUnavailable(message)
    if isinstance(exc, ArcAuthError):
        return CECredentialError(message)
    if isinstance(exc, ArcUnknownJob):
        return PilotUnknown(message)
    return CERefused(message)


class ArcCE:
    """One ARC-CE, with its credentials (a token file, a proxy, or both: agents.ce.config);
    with a ``budget``, its
    requests take no more than that in one turn (agents.ce.budget)."""

    def __init__(self, config: CEConfig, *, timeout: float,
                 budget: TurnBudget | None = None) -> None:
        self.name = config.name
        self.client = ArcRestClient(
            config.endpoint,
            token_file=Path(config.token_file) if config.token_file else None,
            proxy_file=Path(config.proxy_file) if config.proxy_file else None,
            ca_bundle=Path(config.ca_bundle) if config.ca_bundle else None,
            timeout=timeout, budget=budget)
        #: What an ended job's A-REX files said, by (job, state): read once, not at every
        #: turn until its log is kept (a slow CE's turn is spent on new work, not on that).
        self._final: dict[tuple[str, str], CEState] = {}
        #: The streams of ended jobs already fetched, by (job, file), until the job is cleaned:
        #: a turn that runs out of its budget between a pilot's stdout and stderr does not
        #: fetch the stdout again, so that every turn of a slow CE makes progress.
        self._streams: dict[tuple[str, str], tuple[bytes, int]] = {}

    def _call(self, work: Callable[[], T]) -> T:
        try:
            return work()
        except ArcError as exc:
            raise ce_error(exc) from exc

    # -- the interface -----------------------------------------------------------------------

    def submit(self, specs: Sequence[PilotSpec]) -> list[str | CEError]:
        descriptions: list[str] = []
        out: list[str | CEError] = []
        for spec in specs:
            try:
                descriptions.append(description(spec))
            except adl.DescriptionError as exc:
                raise CERefused(f"{self.name}: pilot {spec.reference} cannot be described: "
                                f"{exc}") from exc
        results = self._call(lambda: self.client.submit(descriptions))
        # Jobs without their token would wait for it until the CE gives up: removed at the end,
        # in one request.
        orphans: list[str] = []
        silent: ArcError | None = None
        for spec, result in zip(specs, results, strict=True):
            if isinstance(result, ArcError):
                out.append(ce_error(result))
                continue
            if silent is not None:
                # The CE stopped answering: the other pilots do not each wait for its deadline.
                orphans.append(result)
                out.append(ce_error(silent))
                continue
            try:
                for name, data in spec.files.items():
                    self.client.upload(result, name, data)
                # The token last: the CE starts the job once its last input is there.
                self.client.upload(result, TOKEN_FILE, (spec.token + "\n").encode())
            except ArcError as exc:
                orphans.append(result)
                out.append(ce_error(exc))
                if isinstance(exc, ArcUnreachable):
                    silent = exc
                continue
            out.append(result)
        if orphans:
            try:
                # Also past the turn's budget (one request, two when some still run): a job
                # left without its token would wait on the CE until it gives up.
                with self._unbudgeted():
                    self._forget(orphans)
            except CEError as exc:  # what was submitted stays submitted; the CE cleans up later
                log.warning("%s: %d job(s) without their token not removed: %s", self.name,
                            len(orphans), exc)
        return out

    def states(self, pilots: Sequence[CEPilot]) -> dict[str, CEState]:
        by_id = {p.native_id: p.reference for p in pilots}
        found = self._call(lambda: self.client.statuses(list(by_id)))
        ended = [job_id for job_id, arc_state in found.items()
                 if job_id in by_id and arc_state in FINAL_STATES and arc_state != UNKNOWN
                 and (job_id, arc_state) not in self._final]
        infos = self._call(lambda: self.client.infos(ended)) if ended else {}
        out: dict[str, CEState] = {}
        for job_id, arc_state in found.items():
            reference = by_id.get(job_id)
            status = pilot_status(arc_state)
            if reference is None or status is None:
                continue  # a state this client does not know: the record stays as it is
            if arc_state == UNKNOWN:
                out[reference] = CEState("Lost", f"{self.client.ce} does not know it",
                                         ce_state=arc_state)
            elif arc_state in FINAL_STATES:
                final = self._final.get((job_id, arc_state))
                if final is None:
                    try:
                        final = self._ended(job_id, arc_state, status,
                                            infos.get(job_id, JobInfo("")))
                    except ArcTurnOver:
                        continue  # no news of it this turn: the CE used its time
                    self._final[(job_id, arc_state)] = final
                out[reference] = replace(final, ce_state=arc_state)
            else:
                out[reference] = CEState(status, ce_state=arc_state)
        # Kept for the jobs still followed only.
        self._final = {key: state for key, state in self._final.items() if key[0] in by_id}
        self._streams = {key: kept for key, kept in self._streams.items() if key[0] in by_id}
        return out

    def kill(self, pilots: Sequence[CEPilot]) -> dict[str, CEError | None]:
        by_id = {p.native_id: p.reference for p in pilots}
        answers = self._call(lambda: self.client.kill(list(by_id)))
        return {by_id[job_id]: None if error is None else ce_error(error)
                for job_id, error in answers.items() if job_id in by_id}

    def outputs(self, pilots: Sequence[CEPilot], limit: int) -> dict[str, PilotOutput | CEError]:
        if not pilots:
            return {}
        # Once the CE stops answering, the pilots not asked for yet do not each wait for its
        # deadline: they get that error at once.
        silent: list[ArcError] = []
        with ThreadPoolExecutor(max_workers=min(OUTPUT_FETCHES, len(pilots)),
                                thread_name_prefix="arc-output") as pool:
            fetched = list(pool.map(lambda p: self._output(p, limit, silent), pilots))
        return {p.reference: got for p, got in zip(pilots, fetched, strict=True)}

    def _output(self, pilot: CEPilot, limit: int, silent: list[ArcError]
                ) -> PilotOutput | CEError:
        streams: list[bytes] = []
        truncated = False
        if silent:
            return ce_error(silent[0])
        try:
            for name in (STDOUT_FILE, STDERR_FILE):
                kept = self._streams.get((pilot.native_id, name))
                if kept is not None and len(kept[0]) <= limit:
                    data, size = kept
                else:
                    try:
                        data, size = self.client.tail(pilot.native_id, name, limit)
                    except ArcRefused as exc:
                        if exc.status != 404:
                            raise
                        data, size = b"", 0  # the CE knows the pilot: it never wrote that file
                    self._streams[(pilot.native_id, name)] = (data, size)
                streams.append(data)
                truncated = truncated or size > limit
        except ArcError as exc:
            if isinstance(exc, ArcUnreachable):
                silent.append(exc)
            return ce_error(exc)
        return PilotOutput(streams[0], streams[1], truncated)

    def keep_credentials(self) -> None:
        self._call(self.client.keep_delegation)

    def credential_warning(self) -> str:
        return self.client.credential_warning()

    def clean(self, pilots: Sequence[CEPilot]) -> None:
        self._forget([p.native_id for p in pilots])
        gone = {p.native_id for p in pilots}
        self._streams = {key: kept for key, kept in self._streams.items()
                         if key[0] not in gone}

    def loads(self) -> CELoads:
        """What A-REX's information document (GLUE2) says of its queues' jobs, for all its
        users; it is as old as A-REX's information provider's last run."""
        return self._call(self.client.loads)

    @contextmanager
    def _unbudgeted(self) -> Iterator[None]:
        budget, self.client.budget = self.client.budget, None
        try:
            yield
        finally:
            self.client.budget = budget

    # -- what ended ----------------------------------------------------------------------------

    def _ended(self, job_id: str, arc_state: str, status: str, info: JobInfo) -> CEState:
        """An ended job: its exit code and, when it failed, why, from the CE's record of it
        (``info``); from A-REX's files of the job (a request each) only when that record is
        behind the state (not ended yet, or a job that finished without its exit code)."""
        behind = info.state not in FINAL_STATES or (
            arc_state == "FINISHED" and info.exit_code is None)
        reason = ""
        if arc_state == "FAILED":
            text = self._file_of(job_id, "failed") if behind else info.error
            reason = (text.strip().splitlines() or ["the CE says FAILED"])[0]
        elif arc_state == "KILLED":
            reason = "killed on the CE"
        elif arc_state == "WIPED":
            reason = "the CE wiped its session before it was followed to its end"
        exit_code = info.exit_code
        if behind and info.state != UNKNOWN:
            match = _EXIT_CODE.search(self._file_of(job_id, "diag"))
            exit_code = int(match.group(1)) if match else None
        return CEState(status, reason[:255], exit_code)

    def _file_of(self, job_id: str, name: str) -> str:
        try:
            return self.client.diagnose(job_id, name)
        except ArcUnknownJob:
            return ""  # the file is not there

    def _forget(self, job_ids: list[str]) -> None:
        """Kill (when still alive) and clean the jobs; what the CE no longer knows is gone
        already."""
        if not job_ids:
            return
        errors = self._call(lambda: self.client.clean(job_ids))
        alive = [j for j, e in errors.items() if e is not None
                 and not isinstance(e, ArcUnknownJob)]
        if alive:
            self._call(lambda: self.client.kill(alive))


def description(spec: PilotSpec) -> str:
    """The pilot's ADL description: its command and environment, its queue's cores, memory,
    wall time and batch queue; its token (and its bundle) as input files it gets by
    upload."""
    return adl.job_description(
        spec.executable, spec.arguments, name=f"gridpilot-{spec.reference}"[:64],
        queue=spec.queue_name, cores=spec.cores, memory_mb=spec.memory_mb,
        wall_minutes=max(1, spec.wall_minutes), environment=spec.environment,
        input_files=[*spec.files, TOKEN_FILE], stdout=STDOUT_FILE, stderr=STDERR_FILE)
