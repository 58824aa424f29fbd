"""/api/v1/sandboxes: upload (checksum first, so that bytes already stored are not sent
again) and download of the archives of files jobs take in and bring back.

Users and operators upload input sandboxes for themselves; a pilot uploads a job's output
sandbox for the job's owner, naming the job it holds. Downloads: a sandbox's owners, the
operators of an owner's VO, and a pilot holding a job that references it; anyone else is
answered 404, as if it did not exist.
"""

from __future__ import annotations

import hashlib
import logging
import re
from typing import Any

from flask import Blueprint, Response, url_for

from matcher import schemas
from matcher.api import ARCHIVE, JSON, Call, Param, endpoint
from matcher.auth import OPERATOR, PILOT, USER, Principal
from matcher.problems import Problem
from taskqueue.core.errors import NotFoundError
from taskqueue.db.database import Session
from taskqueue.files.sandboxes import (
    Uploader,
    check_quota,
    find_sandbox,
    is_owner,
    pilot_holds,
    readable_by_operator,
    readable_by_pilot,
    register_sandbox,
    usage_by_vo,
)
from taskqueue.files.sandboxstore import UploadTicket

log = logging.getLogger(__name__)
bp = Blueprint("sandboxes", __name__, url_prefix="/api/v1/sandboxes")
ALL = (USER, OPERATOR, PILOT)
_HEX = re.compile(r"[0-9a-f]{64}")
_ID = re.compile(r"sb:sha256:([0-9a-f]{64})")

PILOT_QUERY = (Param("job_id", "pilots: the job (held by the pilot) whose output this is",
                     "integer", minimum=1),
               Param("pilot_reference", "pilots: the pilot's reference"))


def _digest_of(sandbox_id: str) -> str:
    m = _ID.fullmatch(sandbox_id)
    if m is None:
        raise Problem(404, f"sandbox {sandbox_id[:100]} does not exist (a sandbox id is "
                      "sb:sha256: and 64 lower-case hex digits)")
    return m.group(1)


def _reference_of(principal: Principal, given: str | None) -> str:
    if principal.pilot is not None:
        if given is not None and given != principal.pilot:
            raise Problem(403, f"this token speaks for pilot {principal.pilot} only")
        return principal.pilot
    if not given:
        raise Problem(422, "a pilot must name its pilot_reference (and, to upload, the job_id "
                      "it uploads for)")
    return given


def _uploader(session: Session, call: Call, job_id: int | None,
              reference: str | None) -> tuple[Uploader, bool]:
    """Whom the sandbox is stored for, and whether it is a job's output (a pilot's upload)."""
    p = call.principal
    if p.role != PILOT:
        return Uploader(p.vo, p.subject, p.group), False
    if job_id is None:
        raise Problem(422, "a pilot uploads only job outputs: give the job_id it holds")
    job = pilot_holds(session, job_id, p.vo, _reference_of(p, reference))
    return Uploader(job.vo, job.owner, job.owner_group), True


def _check_size(call: Call, size: int) -> None:
    most = call.runtime.settings.sandboxes.max_upload_bytes
    if size > most:
        raise Problem(413, f"the sandbox is {size} bytes; at most {most} bytes may be uploaded "
                      "at once ([sandboxes] max_upload_bytes)")


def _ticket(ticket: UploadTicket | None, call: Call, sandbox_id: str, job_id: int | None,
            reference: str | None) -> dict[str, Any]:
    if ticket is not None:
        return {"url": ticket.url, "method": ticket.method, "headers": ticket.headers or {}}
    args: dict[str, Any] = {}
    if call.principal.role == PILOT:
        args = {"job_id": job_id, "pilot_reference": reference or call.principal.pilot}
    url = url_for("sandboxes.put_sandbox", sandbox_id=sandbox_id, _external=True,
                  **{k: v for k, v in args.items() if v is not None})
    return {"url": url, "method": "PUT", "headers": {"Content-Type": ARCHIVE}}


@endpoint(bp, "POST", "", tag="sandboxes", roles=ALL,
          summary="Start an upload: the archive's sha256 and size in; whether it is stored for "
                  "the caller already, or where to send the bytes (PUT the tar.gz there)",
          body={JSON: schemas.SANDBOX_REQUEST},
          responses={200: ("Stored already, or where to upload", schemas.SANDBOX_ANSWER)})
def start_upload(call: Call) -> dict[str, Any]:
    checksum, size = call.body["checksum"], call.body["size"]
    if not _HEX.fullmatch(checksum):
        raise Problem(422, "body.checksum must be the sha256 of the archive: 64 lower-case hex "
                      "digits")
    _check_size(call, size)
    sandbox_id = f"sb:sha256:{checksum}"
    job_id, reference = call.body.get("job_id"), call.body.get("pilot_reference")
    store = call.runtime.sandbox_store()

    quota = call.runtime.settings.sandboxes.user_quota_bytes

    def work(session: Session) -> str:
        who, output = _uploader(session, call, job_id, reference)
        if is_owner(session, sandbox_id, who.vo, who.owner):
            return "owned"
        if not output:  # refused before any byte travels
            check_quota(session, who, size, quota)
        if not store.presigned or store.size(sandbox_id) != size:
            return "new"
        # In object storage already. Recorded for nobody: the caller's own presigned upload
        # (the store checked the signed checksum), recorded now. Recorded for others: the
        # caller proves they hold the bytes by sending them to the matcher, which checks
        # them without storing them again (and nobody overwrites another's object).
        if find_sandbox(session, sandbox_id) is None:
            register_sandbox(session, sandbox_id, size, who, now=call.now, output=output,
                             quota=quota)
            return "owned"
        return "prove"

    outcome = call.runtime.transaction(work)
    if outcome == "owned":
        return {"sandbox_id": sandbox_id, "uploaded": True, "upload": None}
    ticket = store.upload_ticket(sandbox_id, size) if outcome == "new" else None
    return {"sandbox_id": sandbox_id, "uploaded": False,
            "upload": _ticket(ticket, call, sandbox_id, job_id, reference)}


@endpoint(bp, "PUT", "/<sandbox_id>", tag="sandboxes", roles=ALL,
          summary="Upload a sandbox's bytes (a tar.gz) to the matcher; the id must be the "
                  "sha256 of the bytes",
          body={ARCHIVE: {"type": "string", "format": "binary"}}, query=PILOT_QUERY,
          responses={201: ("The sandbox is stored", schemas.SANDBOX_STORED)})
def put_sandbox(call: Call, sandbox_id: str) -> tuple[dict[str, Any], int]:
    digest = _digest_of(sandbox_id)
    data: bytes = call.body
    _check_size(call, len(data))
    if not data:
        raise Problem(422, "the body is empty: send the sandbox's tar.gz")
    actual = hashlib.sha256(data).hexdigest()
    if actual != digest:
        raise Problem(422, f"the body's sha256 is {actual}, not the {digest} the id names: "
                      "the upload was damaged or is not this sandbox")
    store = call.runtime.sandbox_store()
    job_id, reference = call.query.get("job_id"), call.query.get("pilot_reference")

    quota = call.runtime.settings.sandboxes.user_quota_bytes
    wrote = False

    def work(session: Session) -> None:
        nonlocal wrote
        who, output = _uploader(session, call, job_id, reference)
        if not output and not is_owner(session, sandbox_id, who.vo, who.owner):
            # Under the owner's quota lock, before a byte is written.
            check_quota(session, who, len(data), quota)
        if store.size(sandbox_id) != len(data):
            if store.presigned:
                # New bytes go to the object store directly, through the URL that
                # POST /api/v1/sandboxes answers with.
                raise Problem(409, "this service keeps sandboxes in object storage: upload to "
                              "the URL POST /api/v1/sandboxes answers with")
            store.put(sandbox_id, data)
            wrote = True
        register_sandbox(session, sandbox_id, len(data), who, now=call.now, output=output,
                         quota=quota)

    try:
        call.runtime.transaction(work)
    except BaseException:
        if wrote:
            _discard_unrecorded(call, sandbox_id)
        raise
    return {"sandbox_id": sandbox_id, "size": len(data)}, 201


def _discard_unrecorded(call: Call, sandbox_id: str) -> None:
    """Remove bytes this request wrote when no record came of them (the cleanup agent sweeps
    what this cannot: the database may be the reason the request failed)."""
    try:
        if call.runtime.transaction(lambda s: find_sandbox(s, sandbox_id) is None):
            call.runtime.sandbox_store().delete(sandbox_id)
    except Exception:  # the request's own error is the one to answer
        log.warning("sandbox %s: bytes left for the cleanup agent", sandbox_id, exc_info=True)


@endpoint(bp, "GET", "/<sandbox_id>", tag="sandboxes", roles=ALL,
          summary="Download a sandbox (its owners, their VO's operators, a pilot holding a job "
                  "that references it): the tar.gz, or a redirect to the object store",
          query=(Param("pilot_reference", "pilots: the pilot's reference"),),
          responses={200: ("The sandbox's tar.gz", None),
                     307: ("Fetch it from the object store, at Location", None)},
          archive_responses=(200,))
def get_sandbox(call: Call, sandbox_id: str) -> Response:
    _digest_of(sandbox_id)
    p = call.principal
    reference = _reference_of(p, call.query.get("pilot_reference")) if p.role == PILOT else ""

    def work(session: Session) -> bool:
        if find_sandbox(session, sandbox_id) is None:
            return False
        if p.role == USER:
            return is_owner(session, sandbox_id, p.vo, p.subject)
        if p.role == OPERATOR:
            return readable_by_operator(session, sandbox_id, p.vo)
        return readable_by_pilot(session, sandbox_id, p.vo, reference)

    if not call.runtime.transaction(work):
        raise NotFoundError(f"sandbox {sandbox_id} does not exist or is not yours to read")
    store = call.runtime.sandbox_store()
    url = store.download_url(sandbox_id)
    if url is not None:
        return Response(status=307, headers={"Location": url})
    try:
        data = store.get(sandbox_id)
    except FileNotFoundError as exc:
        raise Problem(404, f"sandbox {sandbox_id} is recorded but its bytes are gone from "
                      "the store") from exc
    return Response(data, mimetype=ARCHIVE)


@endpoint(bp, "GET", "/usage", tag="sandboxes", roles=(OPERATOR,),
          summary="Sandboxes stored and their bytes, per VO",
          responses={200: ("Usage per VO", schemas.SANDBOX_USAGE)})
def usage(call: Call) -> dict[str, Any]:
    rows = call.runtime.transaction(usage_by_vo)
    return {"vos": [{"vo": u.vo, "sandboxes": u.sandboxes, "bytes": u.bytes} for u in rows]}


def sandbox_gauges(session: Session) -> list[tuple[str, dict[str, str], float]]:
    """The /metrics series of the sandbox store: sandboxes and bytes per VO."""
    out: list[tuple[str, dict[str, str], float]] = []
    for u in usage_by_vo(session):
        out.append(("gridpilot_sandboxes", {"vo": u.vo}, u.sandboxes))
        out.append(("gridpilot_sandbox_bytes", {"vo": u.vo}, u.bytes))
    return out
