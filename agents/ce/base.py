"""What the site director needs of a compute element, whatever its kind.

A compute element (CE) takes pilots, says what became of them, kills them, gives back their
outputs and forgets them, each for many pilots at once. The director and the pilot-status
loop speak only this interface; each kind (agents.ce.psij: the PSI/J batch executors;
agents.ce.arc: ARC-CE over REST) implements it, and agents.ce.registry builds the one a
queue's configuration names.

A pilot's files are named relative to the folder it starts in (its batch job's working
directory, or its ARC session directory): the kind decides where that folder is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

#: The file in a pilot's folder its token is handed over in (the pilot removes it once read).
TOKEN_FILE = "pilot.token"
#: The file in a pilot's folder holding the CA certificates of the matcher's https URL
#: ([matcher] ca_bundle), given to the pilot as --ca-bundle.
CA_FILE = "matcher-ca.pem"
#: The pilot's standard output and error, in its folder.
STDOUT_FILE = "pilot.out"
STDERR_FILE = "pilot.err"


@dataclass(frozen=True)
class PilotSpec:
    """One pilot to start: the command, its environment and what to ask the batch system for.

    The token travels as a file (``TOKEN_FILE`` in the pilot's folder, readable by the pilot's
    account only), never in the environment, where payloads could read it in
    ``/proc/<pilot pid>/environ``, nor on the command line, nor in a CE's job description."""

    reference: str
    executable: str
    #: Paths in the arguments are relative to the pilot's folder.
    arguments: list[str]
    environment: dict[str, str]
    token: str = field(default="", repr=False)
    cores: int = 1
    memory_mb: int | None = None
    wall_minutes: int = 60
    #: The batch system's queue (partition) and the account to charge, when the queue names
    #: them.
    queue_name: str | None = None
    account: str | None = None
    #: Files the pilot needs in its folder besides its token (the pilot bundle, when the
    #: worker nodes do not have gridpilot), by name.
    files: dict[str, bytes] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class CELoad:
    """What a CE says of one of its queues (an ARC-CE: its GLUE2 ComputingShare): the jobs it
    runs and holds for every user, and the limits it publishes (None: not published)."""

    #: The CE's name of the queue ("" for the CE as a whole).
    queue: str
    running: int
    #: Accepted and not running: in the batch system's queue, or not yet handed to it.
    waiting: int
    total: int
    free_slots: int | None = None
    max_running: int | None = None
    max_total: int | None = None
    #: Other names of the queue (an ARC share's MappingQueue: the batch queue it maps to).
    aliases: tuple[str, ...] = ()

    def line(self) -> str:
        limits = [f"{n} {what}" for what, n in (("free slot(s)", self.free_slots),
                                                  ("at most running", self.max_running),
                                                  ("at most in all", self.max_total))
                  if n is not None]
        return (f"{self.running} running, {self.waiting} waiting, {self.total} in all"
                + (f" ({', '.join(limits)})" if limits else ""))


@dataclass(frozen=True)
class CELoads:
    """What a CE says of all its queues at once."""

    loads: tuple[CELoad, ...]

    def of(self, queue: str | None) -> CELoad | None:
        """The load of ``queue`` (its name or one of its aliases); with None, of the CE's
        only queue, else of the CE as a whole."""
        queues = [x for x in self.loads if x.queue]
        if queue:
            return next((x for x in queues if x.queue == queue), None) or next(
                (x for x in queues if queue in x.aliases), None)
        if len(queues) == 1:
            return queues[0]
        return next((x for x in self.loads if not x.queue), None)


@dataclass(frozen=True)
class CEPilot:
    """A pilot as its CE knows it."""

    reference: str
    native_id: str


@dataclass(frozen=True)
class CEState:
    """What a CE says of one pilot: its status among taskqueue.pilots.records.PILOT_STATES, why (for
    Failed, Aborted and Lost), and its exit code when it ended and the CE knows it."""

    status: str
    reason: str = ""
    exit_code: int | None = None
    #: The CE's own word for the state ("ACCEPTING", "QUEUED" ...): how long a pilot stays
    #: in each is timed (agents.ce.registry.state_timeouts).
    ce_state: str = ""


@dataclass(frozen=True)
class PilotOutput:
    """A pilot's standard output and error, each at most the limit asked for (its end, which
    says why the pilot stopped)."""

    stdout: bytes
    stderr: bytes
    #: Whether either stream was longer than the limit and lost its beginning.
    truncated: bool = False


#: What kind of wait each of a CE's states before a pilot runs is, each with a timeout of its
#: own ([agents] pilot_stage_timeout, pilot_held_timeout, pilot_queued_timeout): the CE's own
#: steps before the batch system has the pilot, held in the batch system, queued there.
STAGE, HELD, QUEUED = "stage", "held", "queued"


class CEError(Exception):
    """A CE did not do what was asked. The message is for the operator: it names the CE and
    what to check. ``retryable``: the same request may work later (the CE is down or busy)."""

    retryable = False


class CEUnavailable(CEError):
    """The CE did not answer, or answered that it cannot serve now (connection refused, a
    timeout, 5xx, 503)."""

    retryable = True


class CETurnOver(CEUnavailable):
    """The CE used its time for this turn (``[agents] ce_turn_budget``, agents.ce.budget):
    what was not done waits for the next turn. The CE answered, slowly: not a failure that
    leaves it alone for a while."""


class CECredentialError(CEError):
    """The CE refused the credentials (an expired, wrong or unreadable token or proxy)."""


class CERefused(CEError):
    """The CE refused the request itself (a description it does not accept, a queue it does
    not have)."""


class PilotUnknown(CEError):
    """The CE does not know the pilot (it lost it, or cleaned it already)."""


class ComputeElement(Protocol):
    """One CE, as the director uses it. Every call may raise CEError; CEUnavailable is the
    one to retry later."""

    #: How the CE is named in logs and on the sites page: its kind and endpoint.
    name: str

    def submit(self, specs: Sequence[PilotSpec]) -> list[str | CEError]:
        """Start the pilots; for each spec in order, the CE's id of the pilot, or why that
        one was refused. Raises when the CE refused them all (down, credentials)."""

    def states(self, pilots: Sequence[CEPilot]) -> dict[str, CEState]:
        """What the CE says now of the pilots, by reference, in as few requests as the CE
        allows. A pilot missing from the answer has no news; one the CE no longer knows is
        reported Lost."""

    def kill(self, pilots: Sequence[CEPilot]) -> dict[str, CEError | None]:
        """Ask the CE to kill the pilots; by reference, None when the CE took the request."""

    def outputs(self, pilots: Sequence[CEPilot], limit: int) -> dict[str, PilotOutput | CEError]:
        """The ended pilots' standard outputs and errors, each cut to its last ``limit``
        bytes, by reference; in a pilot's place the error that kept its output (PilotUnknown:
        the CE forgot it)."""

    def clean(self, pilots: Sequence[CEPilot]) -> None:
        """Forget the ended pilots: remove their folders and the CE's records of them."""

    def keep_credentials(self) -> None:
        """Keep what the CE holds of the credential valid while its pilots live (an ARC-CE
        reached with a proxy: its delegation, renewed before it ends), whether or not
        pilots are submitted. Cheap: nothing is asked of the CE while nothing is due."""

    def credential_warning(self) -> str:
        """Why the CE's credential will soon stop working (a token near its end that its
        file has not replaced), "" when nothing is wrong; asks nothing of the CE."""

    def loads(self) -> CELoads | None:
        """What the CE says now of its queues' jobs, in one or two requests; None when this
        kind of CE says nothing of its load."""
