"""/api/v1/pilots: what pilots call. Match (a resource description in, jobs or a no-match
reason out), heartbeats, status reports, their SubmitPools, and their own registration. And
what operators (and users, for pilots that ran their jobs) ask of pilots: their records,
their logs, and a kill through their compute element."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial
from typing import Any

from flask import Blueprint
from werkzeug.exceptions import MethodNotAllowed

from matcher import schemas
from matcher.api import JSON, Call, Param, endpoint
from matcher.auth import ISSUER, OPERATOR, PILOT, USER, Principal
from matcher.payloadtokens import (
    PayloadGrant,
    described_scopes,
    payload_grant,
    payload_token_issuer,
    token_answer,
)
from matcher.problems import Problem
from matcher.views import iso, pilot_summary
from optimizers.chain import optimize_received, stored_description
from optimizers.classads import expression_check
from optimizers.description import (
    ASKED_SCOPES,
    JobDescription,
    JobDescriptionError,
    payload_fields,
)
from optimizers.queuework import queue_pools_and_waiting
from pilot import protocol
from pilot.protocol import ISOLATED_TAG, JobPayload
from taskqueue.core.errors import ConflictError, NotFoundError
from taskqueue.core.resources import Resource, parse_resource
from taskqueue.core.states import JobStatus
from taskqueue.db.database import Session
from taskqueue.db.models import Job
from taskqueue.files.sandboxes import attach_output
from taskqueue.matching.limits import NO_MATCH_NO_JOB
from taskqueue.pilots.pilotlogs import STORED, PilotLog, part_for_owner, request_kill, unpack_log
from taskqueue.pilots.pilotmatch import match_for_pilot
from taskqueue.pilots.pilotreports import (
    Beat,
    StatusReport,
    heartbeat,
    pilot_command,
    report_status,
)
from taskqueue.pilots.records import (
    FINAL_PILOT_STATES,
    PILOT_STATES,
    PilotFilter,
    PilotInfo,
    find_pilots,
    jobs_of_owner_on,
    last_pilot_report,
    note_empty_answer,
    pilot_of_vo,
    record_token_renewal,
    register_pilot,
    runs_of_pilot,
)
from taskqueue.queues.jobcontrol import fail_unreadable
from taskqueue.queues.submitpools import get_submit_pools_for_queue
from taskqueue.tokens import issue_token

bp = Blueprint("pilots", __name__, url_prefix="/api/v1/pilots")
log = logging.getLogger(__name__)


def pilot_resource(principal: Principal, data: dict[str, Any]) -> Resource:
    """The pilot's resource description, held to what its token allows: its VO, and its site
    and pilot reference when the token names them."""
    resource = parse_resource(data)
    if resource.vo != principal.vo:
        raise Problem(403, f"this token is for VO {principal.vo}, not {resource.vo}")
    if principal.site is not None:
        if resource.site is not None and resource.site != {principal.site}:
            raise Problem(403, f"this pilot token is for site {principal.site} only, not "
                          f"{', '.join(sorted(resource.site))}")
        resource = replace(resource, site=frozenset({principal.site}))
    if principal.pilot is not None:
        if resource.pilot_reference and resource.pilot_reference != principal.pilot:
            raise Problem(403, f"this token speaks for pilot {principal.pilot} only")
        resource = replace(resource, pilot_reference=principal.pilot)
    return resource


def _own_reference(principal: Principal, reference: str) -> str:
    if principal.pilot is not None and reference != principal.pilot:
        raise Problem(403, f"this token speaks for pilot {principal.pilot} only, not "
                      f"{reference}")
    return reference


@endpoint(bp, "POST", protocol.MATCH_PATH.removeprefix("/pilots"), tag="pilots",
          roles=(PILOT,),
          summary="Match: the pilot's resource description in; up to 'count' jobs it can run "
                  "out (each Matched to it), or no job and the reason",
          body={JSON: schemas.MATCH_REQUEST},
          responses={200: ("Jobs, or a no-match reason", schemas.MATCH_RESPONSE)})
def match(call: Call) -> dict[str, Any]:
    resource = pilot_resource(call.principal, call.body["resource"])
    if not resource.pilot_reference:
        raise Problem(422, "body.resource.pilot_reference is required: the jobs handed out "
                      "are recorded against it")
    count = call.body.get("count", 1)
    most = call.runtime.settings.matcher.max_jobs_per_match
    if count > most:
        raise Problem(422, f"body.count must be at most {most}, got {count}")
    if resource.vo in call.runtime.settings.matcher.isolation_required_vos and (
            resource.tags is None or ISOLATED_TAG not in resource.tags):
        call.runtime.metrics.inc("gridpilot_match_requests_total", {"outcome": "no_match"})
        call.runtime.metrics.inc("gridpilot_no_matches_total", {"reason": NO_MATCH_NO_JOB})
        return {"jobs": [], "no_match": {
            "reason": NO_MATCH_NO_JOB,
            "detail": f"the jobs of VO {resource.vo} go only to pilots that run payloads "
                      f"isolated (tag {ISOLATED_TAG!r}); this pilot offers no such tag"}}
    answer = match_for_pilot(call.runtime.match_database(), resource, now=call.now,
                             count=count, rng=call.runtime.random(),
                             expression_check=expression_check(resource))
    jobs, reason, detail = answer.jobs, answer.reason, answer.detail
    metrics = call.runtime.metrics
    if not jobs:
        metrics.inc("gridpilot_match_requests_total", {"outcome": "no_match"})
        metrics.inc("gridpilot_no_matches_total", {"reason": reason or ""})
        if reason == NO_MATCH_NO_JOB:
            _judge_empty_answer(call, resource)
        return {"jobs": [], "no_match": {"reason": reason, "detail": detail}}
    settings = call.runtime.settings
    payloads = []
    grants: list[tuple[dict[str, Any], PayloadGrant]] = []
    for job in jobs:
        try:
            handed_out, asked = handed(job)
            payloads.append(handed_out.to_dict())
            if settings.tokens.payload_tokens:
                if asked is None:  # stored before the asked scopes were stored with it
                    asked = described_scopes(DESCRIPTIONS.get, job.description,
                                             job.description_format, job.bulk_index)
                grants.append((payloads[-1], payload_grant(settings, job.vo, job.owner,
                                                           job.id, asked)))
        except Problem as exc:  # accepted by an earlier reader: failed, not drawn again
            call.runtime.transaction(partial(
                fail_unreadable, job_id=job.id, pilot_reference=resource.pilot_reference,
                reason=f"Stored description cannot be read: {exc.detail}", now=call.now))
            metrics.inc("gridpilot_jobs_failed_unreadable_total", {})
    if not payloads:
        metrics.inc("gridpilot_match_requests_total", {"outcome": "no_match"})
        return {"jobs": [], "no_match": {
            "reason": NO_MATCH_NO_JOB,
            "detail": "the jobs matched could not be read from their stored descriptions and "
                      "were failed"}}
    if grants:
        _first_tokens(call, grants)
    metrics.inc("gridpilot_match_requests_total", {"outcome": "matched"})
    metrics.inc("gridpilot_jobs_matched_total", {}, len(payloads))
    return {"jobs": payloads, "no_match": None}


def _first_tokens(call: Call, grants: list[tuple[dict[str, Any], PayloadGrant]]) -> None:
    """Put in each handed payload its first token (``token``, as the token endpoint answers:
    the same issuer and scopes), so that its pilot need not ask for it. Issued in a
    transaction of their own, after the claim: the claim commits in match_for_pilot (on
    PostgreSQL grouped with other processes' claims on a connection in autocommit), and
    issuing may write (a signing key made or rotated). The jobs are Matched to this pilot
    by then, and the checks of the token endpoint hold (the pilot was not to stop when it
    claimed them). A token that cannot be issued loses no job: the payloads go without
    theirs, and their pilot asks the endpoint, as a pilot older than this answer does."""
    issuer = payload_token_issuer(call.runtime)
    try:
        issued = call.runtime.transaction(
            lambda session: [issuer.issue(session, grant, call.now) for _, grant in grants])
    except Exception as exc:  # anything: the jobs are handed out without their tokens
        log.warning("payloads of jobs %s handed out without their first token: %s",
                    ", ".join(str(grant.job_id) for _, grant in grants), exc)
        call.runtime.metrics.inc("gridpilot_answer_tokens_failed_total", {}, len(grants))
        return
    for (handed_out, _), token in zip(grants, issued, strict=True):
        handed_out["token"] = token_answer(token)


def _judge_empty_answer(call: Call, resource: Resource) -> None:
    """Note on the record of a director's pilot answered "no job" whether work its queue
    could run was waiting (its own description misses it) or not (others took it first):
    the director judges its queue by the pilots that missed work only
    (taskqueue.pilots.records.idle_pilot_streak)."""
    config = call.runtime.resources()
    vo = call.principal.vo

    def waiting(session: Session, site: str, ce: str, queue: str) -> bool:
        def find() -> bool:
            try:
                _pools, n = queue_pools_and_waiting(session, config, site, ce, queue, vo)
            except NotFoundError:  # its queue left the configuration: nothing to judge by
                return False
            return n > 0

        return call.runtime.queue_work.get((vo, site, ce, queue), find)

    call.runtime.transaction(lambda session: note_empty_answer(
        session, vo, resource.pilot_reference, waiting))


def payload(job: Any) -> JobPayload:
    """What a pilot needs to run ``job``: the fields stored from its description when it was
    read at submission or optimization (job_payloads), or for a job stored without them, its
    description read again."""
    return handed(job)[0]


def handed(job: Any) -> tuple[JobPayload, tuple[str, ...] | None]:
    """:func:`payload`, and the scopes the job asks for its payload's token when they are
    known without reading its description (stored with its payload, or read with it); None
    for a payload stored before they were stored with it."""
    stored = job.payload
    asked: tuple[str, ...] | None
    if stored is not None:
        fields = json.loads(stored)
        scopes = fields.pop(ASKED_SCOPES, None)
        asked = None if scopes is None else tuple(scopes)
    else:
        try:
            desc = DESCRIPTIONS.get(job.description, job.description_format, job.bulk_index)
            fields = payload_fields(desc, job.id)
        except (JobDescriptionError, IndexError) as exc:  # stored text was accepted once
            raise Problem(500, f"job {job.id}'s stored description cannot be read: "
                          f"{exc}") from exc
        asked = desc.token_scopes
    return JobPayload(
        job_id=job.id, vo=job.vo, owner=job.owner, owner_group=job.owner_group,
        job_type=job.job_type, description=job.description,
        description_format=job.description_format, **fields), asked


class Descriptions:
    """The descriptions of the jobs handed out lately, read from their stored text, by a
    digest of that text, its format and the job's place in it: for the jobs stored without
    their payload (job_payloads, before migration 0042), the others' is read with the claim.

    The jobs of one bulk submission (a parametric description, a list of JSON jobs) share
    their text, and reading it again for each job (a ClassAd parse of the whole text) costs
    more than the rest of a match answer. Per process, bounded: at most ``size`` entries, a
    new one pushing out the oldest. An entry never goes stale: a job's stored text is never
    changed, and the same text always reads the same. The digest (BLAKE2b, 128 bits) keeps
    long texts out of memory; two texts with one digest do not occur in practice. A text that
    cannot be read (one stored before a limit of optimizers.jdl existed) is kept with its
    error, so that each later match of its jobs does not read it again."""

    def __init__(self, size: int = 2048) -> None:
        self.size = size
        self._entries: dict[tuple[bytes, str, int | None],
                            JobDescription | JobDescriptionError] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, text: str, fmt: str, bulk_index: int | None) -> JobDescription:
        """Job ``bulk_index`` of ``text`` (optimizers.chain.stored_description, which raises
        JobDescriptionError, kept and raised again, or IndexError, not kept)."""
        key = (hashlib.blake2b(text.encode("utf-8", "surrogatepass"),
                               digest_size=16).digest(), fmt, bulk_index)
        desc = self._entries.get(key)
        if desc is None:
            try:
                desc = stored_description(text, fmt, bulk_index)
            except JobDescriptionError as exc:  # kept without the frames of its parse
                desc = JobDescriptionError(exc.message, exc.field)
            entries = self._entries
            while len(entries) >= self.size:
                try:
                    del entries[next(iter(entries))]  # the oldest
                except (StopIteration, KeyError, RuntimeError):  # emptied by another thread
                    break
            entries[key] = desc
        if isinstance(desc, JobDescriptionError):
            raise desc.with_traceback(None)  # not the tracebacks of the earlier raises
        return desc


#: The process's descriptions read for match answers.
DESCRIPTIONS = Descriptions()


@endpoint(bp, "POST", protocol.HEARTBEAT_PATH.removeprefix("/pilots"), tag="pilots",
          roles=(PILOT,),
          summary="Heartbeat: the CPU time, progress and output tail of the pilot's jobs in; "
                  "commands out "
                  "(kill: the job is no longer this pilot's to run; pilot_command kill: the "
                  "pilot must stop as a whole, its payloads handed back for rescheduling)",
          body={JSON: schemas.HEARTBEAT_REQUEST},
          responses={200: ("Commands for the pilot", schemas.HEARTBEAT_RESPONSE)})
def beat(call: Call) -> dict[str, Any]:
    reference = _own_reference(call.principal, call.body["pilot_reference"])
    beats = [Beat(j["job_id"], j.get("cpu_used"), j.get("progress"), j.get("output_tail"))
             for j in call.body.get("jobs", [])]
    def work(session: Session) -> tuple[dict[int, str], str | None]:
        vo = call.principal.vo
        return (heartbeat(session, vo=vo, pilot_reference=reference, beats=beats,
                          now=call.now),
                pilot_command(session, vo=vo, pilot_reference=reference, now=call.now))

    commands, whole = call.runtime.transaction(work)
    answer: dict[str, Any] = {"commands": [{"job_id": job_id, "command": command}
                                           for job_id, command in sorted(commands.items())]}
    if whole is not None:
        answer["pilot_command"] = whole
    return answer


@endpoint(bp, "POST", "/jobs/<int:job_id>/status", tag="pilots", roles=(PILOT,),
          summary="Status report on one of the pilot's jobs: Running, Completing, Done or "
                  "Failed (with exit code, output tail and the output sandbox it uploaded), "
                  "or Rescheduled (the pilot must stop before the job ends; it runs again "
                  "elsewhere)",
          body={JSON: schemas.STATUS_REPORT},
          responses={200: ("The job's status afterwards", schemas.STATUS_ANSWER)})
def report(call: Call, job_id: int) -> dict[str, Any]:
    body = call.body
    reference = _own_reference(call.principal, body["pilot_reference"])
    status_report = StatusReport(JobStatus(body["status"]), body.get("minor_status", ""),
                                 body.get("exit_code"), body.get("output_tail"),
                                 body.get("cpu_used"))
    ctx = call.runtime.chain_context(call.now)

    output = body.get("output_sandbox")

    def work(session: Session) -> str:
        if output is not None:
            attach_output(session, job_id, output, vo=call.principal.vo,
                          pilot_reference=reference)
        status = report_status(session, job_id, status_report, vo=call.principal.vo,
                               pilot_reference=reference, now=call.now,
                               max_reschedules=call.runtime.settings.taskqueue.max_reschedules)
        if status == JobStatus.RECEIVED:  # rescheduled: through the chain again at once
            optimize_received(session, ctx, job_ids=[job_id])
            job = session.get(Job, job_id, populate_existing=True)
            assert job is not None
            return job.status
        return status.value

    return {"job_id": job_id, "status": call.runtime.transaction(work)}


@endpoint(bp, "GET", protocol.SUBMIT_POOLS_PATH.removeprefix("/pilots"), tag="pilots",
          roles=(PILOT, OPERATOR),
          summary="getSubmitPoolsForQueue: the SubmitPools whose requirements a queue meets",
          query=(Param("site", "the queue's site", required=True),
                 Param("ce", "the queue's CE", required=True),
                 Param("queue", "the queue's name", required=True)),
          responses={200: ("The queue's SubmitPools", schemas.SUBMIT_POOLS)})
def submit_pools(call: Call) -> dict[str, Any]:
    site, ce, queue = call.query["site"], call.query["ce"], call.query["queue"]
    if call.principal.site is not None and site != call.principal.site:
        raise Problem(403, f"this pilot token is for site {call.principal.site} only")
    pools = call.runtime.transaction(
        lambda session: get_submit_pools_for_queue(session, site, ce, queue))
    return {"site": site, "ce": ce, "queue": queue, "submit_pools": pools}


#: Paths under /pilots that are not pilot references.
RESERVED_REFERENCES = frozenset({"match", "heartbeat", "submitpools", "jobs"})
#: Those of them that are endpoints taking POST only.
POST_ONLY = frozenset({"match", "heartbeat"})


@endpoint(bp, "PUT", "/<reference>", tag="pilots", roles=(PILOT, OPERATOR),
          summary="Register a pilot, or update its site, CE, queue and status",
          body={JSON: schemas.PILOT_REGISTRATION},
          responses={200: ("The pilot's record", schemas.PILOT)})
def put_pilot(call: Call, reference: str) -> dict[str, Any]:
    if reference in RESERVED_REFERENCES:
        raise Problem(422, f"{reference!r} cannot be a pilot reference: /pilots/{reference} is "
                      "another endpoint")
    _own_reference(call.principal, reference)
    body = call.body
    if call.principal.site is not None and body["site"] != call.principal.site:
        raise Problem(403, f"this pilot token is for site {call.principal.site} only")
    info = PilotInfo(reference, body["site"], body["ce"], body["queue"], body["status"],
                     body.get("isolation"))

    def work(session: Session) -> dict[str, Any]:
        pilot = register_pilot(session, call.principal.vo, info, now=call.now)
        return {"reference": pilot.reference, "vo": pilot.vo, "site": pilot.site,
                "ce": pilot.ce, "queue": pilot.queue, "status": pilot.status,
                "submitted_at": iso(pilot.submitted_at),
                "last_seen_at": iso(pilot.last_seen_at)}

    return call.runtime.transaction(work)


@endpoint(bp, "POST", "/<reference>/token", tag="pilots",
          roles=(PILOT,),
          summary="A pilot's successor token, asked for with its current one before it "
                  "expires: the same claims, bound to the pilot's reference, for as long as "
                  "the current one was given (at most [agents] pilot_token_lifetime); none "
                  "for a pilot that was killed, that ended by its record, or that is not known",
          responses={200: ("The new token", schemas.PILOT_TOKEN),
                     403: ("No new token for this pilot", schemas.PROBLEM)})
def renew_pilot_token(call: Call, reference: str) -> dict[str, Any]:
    p = call.principal
    _own_reference(p, reference)
    if p.issuer != ISSUER or p.issued_at is None or p.expires_at is None:
        raise Problem(403, f"this token was issued by {p.issuer}: ask that issuer for a new one")
    lifetime = min(int(p.expires_at - p.issued_at),
                   call.runtime.settings.agents.pilot_token_lifetime)
    issued = call.now.timestamp()
    expires = datetime.fromtimestamp(int(issued) + max(1, lifetime), UTC)

    def work(session: Session) -> int:
        return record_token_renewal(session, p.vo, reference, now=call.now,
                                    expires_at=expires).token_renewals

    renewals = call.runtime.transaction(work)
    token = issue_token(call.runtime.secret, subject=p.subject, role=p.role, vo=p.vo,
                        group=p.group, lifetime=max(1, lifetime), site=p.site,
                        pilot=reference, now=issued)
    return {"token": token, "expires_at": iso(expires), "renewals": renewals}


@endpoint(bp, "GET", "", tag="pilots", roles=(OPERATOR,),
          summary="The VO's pilots, newest first, a page at a time: pass the answer's "
                  "next_after as 'after' for the next page",
          query=(Param("site", "only pilots at this site"),
                 Param("ce", "only pilots of this CE"),
                 Param("queue", "only pilots of this queue"),
                 Param("status", "only pilots in this status", enum=PILOT_STATES),
                 Param("after", "where the page starts: the next_after of the previous page",
                       "integer", minimum=0),
                 Param("limit", "pilots per page", "integer", minimum=1)),
          responses={200: ("A page of pilots", schemas.PILOT_LIST)})
def list_pilots(call: Call) -> dict[str, Any]:
    q = call.query
    limit = min(q["limit"], call.runtime.settings.matcher.max_page_size)
    which = PilotFilter(call.principal.vo, site=q.get("site"), ce=q.get("ce"),
                        queue=q.get("queue"), status=q.get("status"))
    rows = call.runtime.transaction(lambda session: [
        (p.id, pilot_summary(p))
        for p in find_pilots(session, which, before=q.get("after"), limit=limit)])
    return {"pilots": [summary for _, summary in rows],
            "next_after": rows[-1][0] if len(rows) == limit else None}


@endpoint(bp, "GET", "/<reference>", tag="pilots", roles=(PILOT, OPERATOR),
          summary="One pilot's record, the jobs it holds or held, and the last status it "
                  "reported on one of them",
          responses={200: ("The pilot", schemas.PILOT_RECORD)})
def get_pilot(call: Call, reference: str) -> dict[str, Any]:
    if reference in POST_ONLY:  # GET /pilots/match is the wrong method, not a pilot
        raise MethodNotAllowed(valid_methods=["POST"])
    if reference in RESERVED_REFERENCES:
        raise Problem(404, f"pilot {reference} does not exist in VO {call.principal.vo}")
    _own_reference(call.principal, reference)

    def work(session: Session) -> dict[str, Any]:
        pilot = pilot_of_vo(session, call.principal.vo, reference)
        if call.principal.site is not None and pilot.site != call.principal.site:
            raise Problem(403, f"this pilot token is for site {call.principal.site} only")
        report = last_pilot_report(session, call.principal.vo, reference)
        return {**pilot_summary(pilot),
                "jobs": [{"job_id": j.id, "status": j.status, "minor_status": j.minor_status}
                         for j in runs_of_pilot(session, call.principal.vo, reference)],
                "last_report": None if report is None else {
                    "job_id": report.job_id, "at": iso(report.at), "status": report.status,
                    "minor_status": report.minor_status}}

    return call.runtime.transaction(work)


def read_log(runtime: Any, pilot: Any) -> PilotLog:
    """The pilot's stored log; NotFoundError or ConflictError saying why there is none."""
    if pilot.log_state is None and pilot.native_id is not None \
            and pilot.status in FINAL_PILOT_STATES:
        raise ConflictError(f"pilot {pilot.reference} ended ({pilot.status}); its log is not "
                            "kept yet: the agents' pilots loop fetches it from its compute "
                            "element, every "
                            f"{runtime.settings.agents.pilot_status_interval} s; try again then")
    if pilot.log_state is None and pilot.native_id is not None:
        raise ConflictError(f"pilot {pilot.reference} has not ended yet ({pilot.status}): its "
                            "log is kept once its compute element says it ended")
    if pilot.log_state is None:
        raise NotFoundError(f"pilot {pilot.reference} was not submitted by the site director, "
                            "which keeps the logs of its own pilots only")
    if pilot.log_state != STORED or pilot.log_id is None:
        raise NotFoundError(f"pilot {pilot.reference} has no log: "
                            f"{pilot.log_note or pilot.log_state}")
    try:
        return unpack_log(runtime.sandbox_store().get(pilot.log_id),
                          limit=runtime.settings.agents.pilot_log_bytes)
    except FileNotFoundError:
        raise NotFoundError(f"pilot {pilot.reference}'s log was removed after the retention "
                            "period of sandboxes") from None


@endpoint(bp, "GET", "/<reference>/log", tag="pilots", roles=(USER, OPERATOR),
          summary="An ended pilot's standard output and error (the ends of each), as its "
                  "compute element gave them back; a user sees, of the pilots that ran their "
                  "jobs, the lines about their own jobs and the pilot-wide lines that name "
                  "no other job (hidden_lines: how many were left out)",
          responses={200: ("The pilot's log", schemas.PILOT_LOG)})
def get_pilot_log(call: Call, reference: str) -> dict[str, Any]:
    principal = call.principal

    def work(session: Session) -> tuple[Any, set[int] | None]:
        pilot = pilot_of_vo(session, principal.vo, reference)
        own = None
        if principal.role == USER:
            own = jobs_of_owner_on(session, principal.vo, reference, principal.subject)
            if not own:
                # A pilot that ran none of the user's jobs is none of their business: as if
                # it did not exist.
                raise NotFoundError(f"pilot {reference} does not exist in VO {principal.vo}")
        session.expunge(pilot)
        return pilot, own

    pilot, own = call.runtime.transaction(work)
    log = read_log(call.runtime, pilot)
    stdout, stderr = log.stdout, log.stderr
    hidden = 0
    if own is not None:  # a user: what concerns their own jobs
        parts = [part_for_owner(text, own) for text in (stdout, stderr)]
        stdout, stderr = parts[0].text, parts[1].text
        hidden = sum(part.hidden_lines for part in parts)
    return {"reference": pilot.reference, "status": pilot.status, "reason": pilot.reason,
            "exit_code": pilot.exit_code, "note": pilot.log_note, "stdout": stdout,
            "stderr": stderr, "hidden_lines": hidden}


@endpoint(bp, "POST", "/<reference>/kill", tag="pilots", roles=(OPERATOR,),
          summary="Kill a pilot, director-submitted or started by hand: from now on the "
                  "matcher gives it no job and answers its match requests and heartbeats "
                  "with kill (it stops its payloads, whose jobs are rescheduled once); a "
                  "pilot with a CE record is also killed through its CE at the site "
                  "director's next turn",
          responses={202: ("The request is noted", schemas.PILOT_SUMMARY)})
def kill_pilot(call: Call, reference: str) -> tuple[dict[str, Any], int]:
    if reference in RESERVED_REFERENCES:
        raise Problem(404, f"pilot {reference} does not exist in VO {call.principal.vo}")
    pilot = call.runtime.transaction(lambda session: pilot_summary(request_kill(
        session, call.principal.vo, reference, by=call.principal.subject, now=call.now)))
    return pilot, 202
