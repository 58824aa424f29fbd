"""What a pilot the site director starts would present to the matcher, built from the
director's own PilotSpec through the pilot's command-line parser and its match request, without
starting a process."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

from agents.ce.base import PilotSpec
from agents.ce.config import ce_config
from agents.ce.registry import ComputeElements
from agents.context import AgentContext
from agents.director import Director, QueueTarget
from pilot.cli import parser, pilot_options
from pilot.loop import Pilot
from taskqueue.core.settings import Settings
from taskqueue.db.database import SessionFactory

#: The pilot's clock: it starts at this time and asks for its first job at once.
START = 1_800_000_000.0

SECRET = secrets.token_urlsafe(32)


@dataclass(frozen=True)
class Started:
    spec: PilotSpec
    pilot: Pilot
    #: Its first match request (None: it would ask for none).
    request: dict[str, Any] | None


def director_pilot(settings: Settings, resources: Path, site: str, ce: str, queue: str,
                   vo: str, pools: list[str], workdir: Path) -> Started:
    """The director's PilotSpec for one pilot of the queue (as if its Executor were "local"),
    and that pilot, set up from the spec's arguments, with its first match request."""
    settings = replace(settings, resources=replace(settings.resources, file=str(resources)),
                       auth=replace(settings.auth, secret=SECRET),
                       agents=replace(settings.agents, vo=vo, pilot_workdir=str(workdir)))
    # The director's _spec reads no database.
    ctx = AgentContext(settings, cast(SessionFactory, None), secret=SECRET)
    q = ctx.resources().queue(site, ce, queue)
    params = dict(q.parameters(vo))
    compute = ce_config(f"{site}/{ce}/{queue}", ce, {**params, "Executor": "local"})
    assert compute is not None
    target = QueueTarget(site=site, ce=ce, queue=queue, compute=compute, cores=1,
                         memory_mb=None, max_waiting=1, max_total=1, parameters=params)
    director = Director(ctx, ComputeElements(workdir, settings.agents))
    spec = director._spec(target, pools, "local-0123456789abcdef")
    assert spec.arguments[:2] == ["-m", "pilot.cli"], spec.arguments
    args = parser().parse_args(spec.arguments[2:])
    assert args.machine_features == spec.environment.get("MACHINEFEATURES")
    assert args.job_features == spec.environment.get("JOBFEATURES")
    problems: list[str] = []
    options = pilot_options(args, "token", problems)
    assert options is not None, problems
    pilot = Pilot(options, clock=lambda: START)
    pilot.prepare(START)
    return Started(spec, pilot, pilot.match_request(START, pilot.limits(START)))
