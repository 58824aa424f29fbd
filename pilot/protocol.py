"""The wire format between pilots and the matcher: paths, the job a match hands out, the
no-match reasons and the commands a heartbeat answers with.

Standard library only: the pilot imports this module, and so does the matcher, which builds
its answers with these classes so that both sides agree by construction.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: Prefix of every API path.
API_PREFIX = "/api/v1"
MATCH_PATH = "/pilots/match"
HEARTBEAT_PATH = "/pilots/heartbeat"
SUBMIT_POOLS_PATH = "/pilots/submitpools"
#: Format with ``job_id``.
JOB_STATUS_PATH = "/pilots/jobs/{job_id}/status"
#: A token for the job's payload (POST; format with ``job_id``).
PAYLOAD_TOKEN_PATH = "/pilots/jobs/{job_id}/token"
#: Format with ``reference``.
PILOT_PATH = "/pilots/{reference}"
#: A pilot's successor token (POST, with its current one).
TOKEN_PATH = "/pilots/{reference}/token"
#: Sandboxes: start an upload (POST), download one (GET /sandboxes/<id>).
SANDBOXES_PATH = "/sandboxes"

#: Why a match request found no job.
NO_MATCHING_JOB = "no_matching_job"
HELD_BY_LIMITS = "held_by_limits"
SITE_BANNED = "site_banned"
#: The pilot must stop as a whole (an operator killed it, or its CE said it ended): it gets
#: no job, and stops its payloads (their jobs go back for rescheduling).
PILOT_KILLED = "pilot_killed"
NO_MATCH_REASONS: tuple[str, ...] = (NO_MATCHING_JOB, HELD_BY_LIMITS, SITE_BANNED,
                                     PILOT_KILLED)

#: The tag a pilot whose payloads run isolated from each other offers (pilot.isolation).
ISOLATED_TAG = "isolated"
#: What an isolated pilot offers besides: it runs jobs in an image folder (ContainerImage).
CONTAINER_TAG = "container"

#: The one command a heartbeat answer carries for a job: stop it, it is not this pilot's any
#: more (killed, deleted, rescheduled, or never given to it).
KILL = "kill"
#: A heartbeat answer's ``pilot_command`` is KILL when the pilot must stop as a whole (see
#: PILOT_KILLED); MatcherClient.heartbeat hands it back under this key (no job has id 0).
WHOLE_PILOT = 0

#: A heartbeat carries the tail of each running job's output (a peek at it while it runs),
#: at most this many characters a job, and at most PEEK_TOTAL_CHARS for all its jobs.
PEEK_CHARS = 4096
PEEK_TOTAL_CHARS = 256 * 1024
#: Longest output tail a final report may carry.
REPORT_TAIL_CHARS = 256 * 1024

#: Statuses a pilot reports on its jobs.
RUNNING = "Running"
DONE = "Done"
FAILED = "Failed"
RESCHEDULED = "Rescheduled"


@dataclass(frozen=True)
class JobPayload:
    """Everything a pilot needs to run one job."""

    job_id: int
    vo: str
    owner: str
    owner_group: str
    job_type: str
    executable: str
    arguments: list[str] = field(default_factory=list)
    environment: dict[str, str] = field(default_factory=dict)
    #: Requested CPU time in normalised seconds, processors and memory in MB (0: not given).
    cpu_time: int = 0
    processors: int = 1
    memory: int = 0
    #: GPUs the job needs (0: none).
    gpus: int = 0
    input_sandbox: list[str] = field(default_factory=list)
    output_sandbox: list[str] = field(default_factory=list)
    stdout: str | None = None
    stderr: str | None = None
    #: The file of the job's folder (from its input sandbox) its standard input is read from.
    stdin: str | None = None
    job_name: str | None = None
    #: The image the payload runs in (a path on the node); None: the node's own system.
    container_image: str | None = None
    #: The description exactly as submitted, and its format ("jdl" or "json").
    description: str = ""
    description_format: str = "jdl"
    #: Fields gridpilot does not interpret, for the payload.
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        # Shallow copies of the containers: dataclasses.asdict's deep copy costs more than the
        # rest of building a match answer.
        out = dict(self.__dict__)
        for name in ("arguments", "input_sandbox", "output_sandbox"):
            out[name] = list(out[name])
        out["environment"] = dict(self.environment)
        out["extra"] = dict(self.extra)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobPayload:
        """Read a payload from a match answer; raises ValueError naming a missing field or
        one of the wrong type."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a job in the match answer is {type(data).__name__}, not an "
                             "object")
        missing = [name for name in ("job_id", "vo", "owner", "owner_group", "job_type",
                                     "executable") if name not in data]
        if missing:
            raise ValueError(f"a job in the match answer lacks {', '.join(missing)}")
        fields = {k: v for k, v in data.items() if k in _FIELD_KINDS}
        for name, value in fields.items():
            if not _FIELD_KINDS[name](value):
                raise ValueError(f"field {name} of a job in the match answer has the wrong "
                                 f"type ({type(value).__name__})")
        if fields["job_id"] <= 0:
            raise ValueError(f"a job in the match answer has job_id {fields['job_id']}")
        return cls(**fields)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _text(value: Any) -> bool:
    return isinstance(value, str)


def _texts(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _maybe_text(value: Any) -> bool:
    return value is None or isinstance(value, str)


#: How each field of a JobPayload must look in a match answer.
_FIELD_KINDS: dict[str, Callable[[Any], bool]] = {
    "job_id": _integer, "vo": _text, "owner": _text, "owner_group": _text, "job_type": _text,
    "executable": _text, "arguments": _texts,
    "environment": lambda v: isinstance(v, dict) and all(
        isinstance(k, str) and isinstance(x, str) for k, x in v.items()),
    "cpu_time": _integer, "processors": _integer, "memory": _integer, "gpus": _integer,
    "input_sandbox": _texts, "output_sandbox": _texts, "stdin": _maybe_text, "stdout": _maybe_text,
    "stderr": _maybe_text, "job_name": _maybe_text, "container_image": _maybe_text,
    "description": _text,
    "description_format": _text, "extra": lambda v: isinstance(v, dict),
}
