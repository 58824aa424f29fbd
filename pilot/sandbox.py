"""The pilot's side of sandboxes: before a payload starts, fetch, verify and unpack its input
sandboxes into its folder; after it ends, pack its output files with its standard output and
error, upload them for the job's owner, and hand the sandbox id to the final report.

Standard library and ``requests`` only. Every failure says what went wrong: a transient one
(the matcher or the store cannot be reached) lets the job run elsewhere, a permanent one
(a damaged or unsafe archive, a sandbox refused) fails it.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from pilot import protocol, tls, transfer
from pilot.archive import (
    MAX_MEMBERS,
    MAX_UNPACKED_BYTES,
    Member,
    UnsafeArchiveError,
    checksum_of,
    is_sandbox_id,
    pack,
    read_inside,
    safe_name,
    sandbox_id,
    unpack,
)
from pilot.client import MatcherClient, RefusedError, TransientError, problem_detail
from pilot.logformat import concerning
from pilot.payloadtoken import TOKEN_FILE_NAME

log = logging.getLogger("pilot")

#: Bytes of output files, standard output and error one job may bring back.
OUTPUT_LIMIT = 10 * 1024 * 1024
#: Largest sandbox archive the pilot downloads (as large as the files it may unpack to).
MAX_DOWNLOAD_BYTES = MAX_UNPACKED_BYTES
#: Failed uploads of one job's output before its report goes without it.
UPLOAD_ATTEMPTS = 5


class StoreUnavailableError(TransientError):
    """The object store (not the matcher) cannot take the upload now."""


class SandboxError(Exception):
    """A job's input cannot be made ready; ``transient`` when trying elsewhere may help."""

    def __init__(self, message: str, *, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


# -- input --------------------------------------------------------------------------------


def fetch_inputs(client: MatcherClient, job: protocol.JobPayload, directory: Path,
                 reference: str, *, max_bytes: int = MAX_UNPACKED_BYTES,
                 max_members: int = MAX_MEMBERS) -> list[str]:
    """Download, verify and unpack every input sandbox of ``job`` into ``directory``;
    return the names unpacked. Entries that are not sandbox ids (``LFN:`` files) are the
    payload's to fetch."""
    names: list[str] = []
    for entry in job.input_sandbox:
        if not is_sandbox_id(entry):
            continue
        data = download(client, entry, reference)
        try:
            names += unpack(data, directory, max_bytes=max_bytes, max_members=max_members)
        except UnsafeArchiveError as exc:
            raise SandboxError(f"input sandbox {entry} refused: {exc}", transient=False) from exc
        except OSError as exc:
            raise SandboxError(f"input sandbox {entry} cannot be unpacked: {exc}",
                               transient=True) from exc
    return names


def download(client: MatcherClient, sandbox: str, reference: str) -> bytes:
    """The verified bytes of one sandbox (from the matcher, or from the object store its
    answer redirects to)."""
    url = f"{client.api}{protocol.SANDBOXES_PATH}/{sandbox}"
    try:
        response = transfer.request(client.http, "GET", url, deadline=client.timeout,
                                    params={"pilot_reference": reference}, follow=False,
                                    max_bytes=MAX_DOWNLOAD_BYTES)
        if response.status_code in (301, 302, 303, 307, 308):
            # A presigned URL: it carries its own signature, never the pilot's token.
            response = transfer.request(tls.trusting(requests.Session(), client.http.verify),
                                        "GET",
                                        response.headers["Location"], deadline=client.timeout,
                                        follow=False, max_bytes=MAX_DOWNLOAD_BYTES)
    except (requests.RequestException, KeyError) as exc:
        raise SandboxError(f"input sandbox {sandbox} cannot be downloaded: {exc}",
                           transient=True) from exc
    if response.status_code >= 500 or response.status_code == 429:
        raise SandboxError(f"input sandbox {sandbox} cannot be downloaded now: "
                           f"{response.status_code}", transient=True)
    if response.status_code >= 400:
        raise SandboxError(f"input sandbox {sandbox} refused ({response.status_code}): "
                           f"{problem_detail(response)}", transient=False)
    data = response.content
    if hashlib.sha256(data).hexdigest() != checksum_of(sandbox):
        raise SandboxError(f"input sandbox {sandbox} arrived damaged (its sha256 differs)",
                           transient=True)
    return data


# -- output -------------------------------------------------------------------------------


@dataclass
class Outputs:
    """A finished job's packed output, what could not be packed, and the upload's attempts."""

    job_id: int
    archive: bytes
    #: Output files missing or refused, and those left out for the size limit.
    missing: list[str] = field(default_factory=list)
    too_large: list[str] = field(default_factory=list)
    attempts: int = 0
    #: The job was killed on request: the service refusing its outputs is expected then.
    killed: bool = False

    @property
    def sandbox_id(self) -> str:
        return sandbox_id(self.archive)

    def minor_status(self) -> str:
        """What the report's minor status says of the outputs ("" when all went well)."""
        parts = []
        if self.missing:
            parts.append("Output files missing: " + ", ".join(self.missing))
        if self.too_large:
            parts.append("Output files over the size limit: " + ", ".join(self.too_large))
        return "; ".join(parts)[:255]


def collect_outputs(job: protocol.JobPayload, directory: Path, streams: list[Path], *,
                    limit: int = OUTPUT_LIMIT) -> Outputs:
    """Pack the job's standard output and error (their last bytes, when larger than half
    the limit between them) and its OutputSandbox files while they fit in ``limit``."""
    members: list[Member] = []
    budget = limit
    stream_names = set()
    for path in streams:
        try:
            data = path.read_bytes()
        except OSError:
            continue
        share = limit // (2 * max(1, len(streams)))
        members.append(Member(path.name, data[-share:] if len(data) > share else data))
        budget -= len(members[-1].data)
        stream_names.add(path.name)
    out = Outputs(job.job_id, b"")
    for name in job.output_sandbox:
        try:
            clean = safe_name(name)
        except ValueError as exc:
            out.missing.append(f"{name} ({exc})")
            continue
        if clean in stream_names:
            continue
        if clean == TOKEN_FILE_NAME:
            out.missing.append(f"{name} (the payload's token is never kept)")
            continue
        try:
            data, executable = read_inside(directory, clean)
        except (ValueError, OSError) as exc:
            out.missing.append(name if "does not exist" in str(exc) else f"{name} ({exc})")
            continue
        if len(data) > budget:
            out.too_large.append(name)
            continue
        budget -= len(data)
        stream_names.add(clean)
        members.append(Member(clean, data, executable))
    out.archive = pack(members)
    return out


def upload(client: MatcherClient, outputs: Outputs, reference: str) -> str:
    """Store the outputs for the job's owner; return the sandbox id. Raises
    :class:`TransientError` or :class:`RefusedError` like the matcher client."""
    data = outputs.archive
    body = {"checksum": hashlib.sha256(data).hexdigest(), "size": len(data),
            "job_id": outputs.job_id, "pilot_reference": reference}
    answer = client.start_upload(body)
    if answer.get("uploaded"):
        return str(answer["sandbox_id"])
    ticket: dict[str, Any] = answer.get("upload") or {}
    url = str(ticket.get("url", ""))
    headers = {str(k): str(v) for k, v in (ticket.get("headers") or {}).items()}
    ours = url.startswith(client.api)
    try:
        # A presigned URL of the object store: no token goes there.
        http = client.http if ours else tls.trusting(requests.Session(), client.http.verify)
        response = transfer.request(http, "PUT", url,
                                    data=data, headers=headers, deadline=client.timeout,
                                    follow=False)
    except requests.RequestException as exc:
        raise (TransientError if ours else StoreUnavailableError)(
            f"output upload of job {outputs.job_id}: {exc}") from exc
    if response.status_code >= 500 or response.status_code == 429:
        raise (TransientError if ours else StoreUnavailableError)(
            f"output upload of job {outputs.job_id}: {response.status_code}")
    if response.status_code >= 400:
        raise RefusedError(response.status_code, problem_detail(response))
    if not ours:  # the store has the bytes: the matcher records them
        answer = client.start_upload(body)
        if not answer.get("uploaded"):
            raise TransientError(f"output of job {outputs.job_id} not recorded after upload")
    return outputs.sandbox_id


def attach_output(client: MatcherClient, outputs: Outputs, reference: str,
                  body: dict[str, Any]) -> bool:
    """Upload the outputs and put their sandbox id in the report ``body``. Returns False when
    the upload failed for now and should be tried again with the report (while the matcher
    cannot be reached the report could not go either). After :data:`UPLOAD_ATTEMPTS`
    failures of the object store, or a refusal, the report goes without it, its minor status
    saying why: the job's final status is never held back for good."""
    try:
        body["output_sandbox"] = upload(client, outputs, reference)
        return True
    except TransientError as exc:
        if isinstance(exc, StoreUnavailableError):
            outputs.attempts += 1
        if outputs.attempts < UPLOAD_ATTEMPTS:
            log.warning("output of job %d not uploaded yet: %s", outputs.job_id, exc,
                        extra=concerning(outputs.job_id))
            return False
        why = f"Output sandbox not uploaded after {outputs.attempts} attempts: {exc}"
    except RefusedError as exc:
        why = f"Output sandbox refused: {exc.detail}"
        if outputs.killed:  # expected for a killed job, whose report says it was killed
            log.info("job %d (killed): %s", outputs.job_id, why, extra=concerning(outputs.job_id))
            return True
    log.error("job %d: %s", outputs.job_id, why, extra=concerning(outputs.job_id))
    body["minor_status"] = (f"{body['minor_status']}; {why}" if body.get("minor_status")
                            else why)[:255]
    return True

