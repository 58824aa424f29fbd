"""Why a job can or cannot run somewhere: each matching rule for a stored job against a queue
of the resources configuration or a pilot's resource description (the CLI's and the API's
``explain``)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from optimizers.chain import stored_description
from optimizers.classads import expression_check, why_not
from optimizers.datalocation import DatabaseCatalogue, ReplicaCatalogue, explain_site
from optimizers.description import JobDescription, JobDescriptionError
from optimizers.queueresources import resource_for_queue
from optimizers.resources import ResourcesConfig, explain_requirements, serves_vo
from taskqueue.core.definitions import JobRequirements, TaskQueueDefinition
from taskqueue.core.errors import InvalidInputError
from taskqueue.core.resources import Resource
from taskqueue.core.settings import Settings
from taskqueue.db.database import Session
from taskqueue.db.models import Job, SubmitPool
from taskqueue.matching.explain import RuleResult, explain_match
from taskqueue.matching.limits import site_bans
from taskqueue.queues.submitpools import get_submit_pools_for_queue, submit_pool_id
from taskqueue.queues.taskqueues import waiting_definition


@dataclass(frozen=True)
class Explanation:
    rules: list[RuleResult]

    @property
    def can_run(self) -> bool:
        return all(r.holds for r in self.rules)


def explain_job(session: Session, settings: Settings, resources: ResourcesConfig, job: Job, *,
                queue: str | None = None, resource: Resource | None = None,
                catalogue: ReplicaCatalogue | None = None) -> Explanation:
    """Each rule for ``job`` against ``queue`` ("SITE/CE/QUEUE") or ``resource``; a job with
    input files adds the data rule (does the site reach a replica of each?)."""
    if (queue is None) == (resource is None):
        raise InvalidInputError("explain needs either a queue (SITE/CE/QUEUE) or a resource")
    definition, desc = _definition_of(session, job, settings)
    rfc7: list[RuleResult] = []
    if queue is not None:
        site, ce, name = parse_queue_path(queue)
        pools = get_submit_pools_for_queue(session, site, ce, name)
        resource = resource_for_queue(resources, site, ce, name, job.vo, submit_pools=pools)
        if desc.requirements:
            rfc7 = [RuleResult(f"requirement {key}", holds, detail) for key, holds, detail
                    in explain_requirements(resources, desc.requirements, site, ce, name,
                                            vo=job.vo)]
    assert resource is not None
    mask, resource = _site_mask_rule(session, job.vo, resource)
    results = [_named(r, definition.expression, resource)
               for r in explain_match(definition, resource, expression_check(resource),
                                      of_queue=queue is not None)]
    results += mask
    if rfc7:  # the requirements themselves say more than "not among the pilot's pools"
        results = [r for r in results if r.rule != "SubmitPool"]
    data = (_data_rule(session, resources, job.vo, desc, resource, catalogue
                       or DatabaseCatalogue()) if desc.input_data else [])
    return Explanation(results + rfc7 + data
                       + _isolation_rule(settings, job.vo, resource, of_queue=queue is not None))


#: The tag a pilot whose payloads run isolated offers (pilot.protocol.ISOLATED_TAG).
ISOLATED_TAG = "isolated"


def _isolation_rule(settings: Settings, vo: str, resource: Resource, *,
                    of_queue: bool) -> list[RuleResult]:
    """A VO of ``[matcher] isolation_required_vos`` has its jobs go only to pilots that run
    payloads isolated: whether the pilot's description offers it (a queue's pilots offer it
    once their node's isolation passed its self-test, which the director cannot know)."""
    if vo not in settings.matcher.isolation_required_vos:
        return []
    if of_queue:
        return [RuleResult("isolation", True,
                           f"VO {vo} requires pilots that run payloads isolated (tag "
                           f"{ISOLATED_TAG!r}): this queue's pilots get its jobs where their "
                           "node has bubblewrap or apptainer")]
    offered = ISOLATED_TAG in (resource.tags or ())
    return [RuleResult("isolation", offered,
                       f"VO {vo} requires pilots that run payloads isolated (tag "
                       f"{ISOLATED_TAG!r}): this description "
                       + ("offers it" if offered else "does not offer it"))]


@dataclass(frozen=True)
class QueueVerdict:
    """One configured queue: whether the job can run there, and the rules that fail."""

    queue: str
    failed: list[RuleResult]

    @property
    def can_run(self) -> bool:
        return not self.failed


def explain_every_queue(session: Session, settings: Settings, resources: ResourcesConfig,
                        job: Job, *, catalogue: ReplicaCatalogue | None = None
                        ) -> list[QueueVerdict]:
    """The job against each queue of the resources configuration that serves its VO, as
    :func:`explain_job` explains it against one (the same rules the matcher applies)."""
    serves = serves_vo(job.vo)
    out = []
    for q in resources.queues():
        if serves(q):
            path = f"{q.site}/{q.ce}/{q.name}"
            result = explain_job(session, settings, resources, job, queue=path,
                                 catalogue=catalogue)
            out.append(QueueVerdict(path, [r for r in result.rules if not r.holds]))
    return out


def _site_mask_rule(session: Session, vo: str, resource: Resource
                    ) -> tuple[list[RuleResult], Resource]:
    """The site mask as the matcher applies it (taskqueue.matching.limits.claim_for_pilot): a
    resource whose every site is banned for the VO gets no job; one with some sites banned
    is matched for the others. The rule (when a site of the resource is banned) and the
    resource the other rules judge."""
    if not resource.site:
        return [], resource
    bans = {b.site: b for b in site_bans(session, vo) if b.site in resource.site}
    if not bans:
        return [], resource
    said = "; ".join(f"{site} is banned for VO {vo} by {b.banned_by} since "
                     f"{b.banned_at:%Y-%m-%d %H:%M} UTC ({b.reason})"
                     for site, b in sorted(bans.items()))
    left = resource.site - frozenset(bans)
    if not left:
        return [RuleResult("site mask", False, f"site mask: {said}")], resource
    return ([RuleResult("site mask", True, f"site mask: {said}; matched for "
                        f"{', '.join(sorted(left))}")], replace(resource, site=left))


def _data_rule(session: Session, resources: ResourcesConfig, vo: str, desc: JobDescription,
               resource: Resource, catalogue: ReplicaCatalogue) -> list[RuleResult]:
    """The data rule: a site of the resource reaches a replica of every input file."""
    replicas = catalogue.locate(session, vo, list(desc.input_data))
    if not resource.site:
        return [RuleResult("InputData", False, "InputData: the resource names no site, and the "
                           f"job runs only where its {len(desc.input_data)} input file(s) are")]
    verdicts = [explain_site(resources, vo, site, desc.input_data, replicas)
                for site in sorted(resource.site)]
    held = [detail for holds, detail in verdicts if holds]
    return [RuleResult("InputData", bool(held), held[0] if held else verdicts[0][1])]


def _named(result: RuleResult, expression: str | None, resource: Resource) -> RuleResult:
    """A failing Requirements expression's rule names the part that fails, with values."""
    if result.holds or result.rule != "Requirements expression" or expression is None:
        return result
    return RuleResult(result.rule, False, why_not(expression, resource))


def parse_queue_path(path: str) -> tuple[str, str, str]:
    parts = path.split("/")
    if len(parts) != 3 or not all(p.strip() for p in parts):
        raise InvalidInputError(f"a queue is named SITE/CE/QUEUE, got {path!r}")
    return parts[0], parts[1], parts[2]


def _definition_of(session: Session, job: Job, settings: Settings
                   ) -> tuple[TaskQueueDefinition, JobDescription]:
    try:
        desc = stored_description(job.description, job.description_format, job.bulk_index)
    except (JobDescriptionError, IndexError) as exc:
        raise InvalidInputError(f"job {job.id}'s description cannot be read: {exc}") from exc
    waiting = waiting_definition(session, job.id)
    if waiting is not None:
        return waiting, desc
    pool = (submit_pool_id(desc.requirements) if desc.requirements else None)
    if pool is not None and session.get(SubmitPool, pool) is None:
        pool = None
    req = JobRequirements(
        vo=job.vo, owner=job.owner, owner_group=job.owner_group, cpu_time=desc.cpu_time,
        processors=desc.processors, memory=desc.memory, job_type=desc.job_type,
        submit_pool=pool, expression=desc.requirements_expression, sites=desc.sites,
        banned_sites=desc.banned_sites, platforms=desc.platforms, tags=desc.tags,
        ces=desc.ces, gpus=desc.gpus)
    return TaskQueueDefinition.for_job(req, settings), desc

