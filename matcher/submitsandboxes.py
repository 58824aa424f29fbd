"""A submission's InputSandbox: sandbox ids it may use, local files it may not.

Over the raw API a job's files must be uploaded first (``gridpilot-client submit`` packs and
uploads the local files a description lists, and submits the sandbox id in their place). An
``LFN:`` entry names a file in the VO's grid storage, which the payload fetches itself.
"""

from __future__ import annotations

from collections.abc import Sequence

from matcher.problems import Problem
from optimizers.chain import Identity, Submission
from pilot.archive import PREFIX, is_sandbox_id
from taskqueue.db.database import Session
from taskqueue.files.sandboxes import INPUT, reference, unusable_inputs

#: For each job of a submission (by its place in the bulk, None for a single job), the
#: The sandbox ids each submission's InputSandbox lists, in the order of the submissions (not
#: by bulk index: a parametric object in a JSON list numbers its jobs from 0 again).
Inputs = list[list[str]]


def input_sandboxes(submissions: Sequence[Submission]) -> Inputs:
    """The sandbox ids each job lists; 422 naming the first local file or malformed id."""
    out: Inputs = []
    for s in submissions:
        ids: list[str] = []
        for entry in s.description.input_sandbox:
            if entry[:4].upper() == "LFN:":
                continue
            if is_sandbox_id(entry):
                ids.append(entry)
            elif entry.startswith(PREFIX[:3]):
                raise Problem(422, f"InputSandbox entry {entry!r} is not a sandbox id: a "
                              "sandbox id is sb:sha256: and 64 lower-case hex digits")
            else:
                where = "" if s.bulk_index is None else f" (job {s.bulk_index} of the bulk)"
                client = ("gridpilot-client submit uploads the files an InputSandbox names, "
                          "but not a name made from each job's parameter: list the files "
                          "themselves" if s.description.parameter is not None else
                          "gridpilot-client submit does")
                raise Problem(422, f"InputSandbox lists the local file {entry!r}{where}, which "
                              f"was not uploaded: upload it first ({client}; or POST "
                              "/api/v1/sandboxes) and list the sandbox id instead", file=entry)
        out.append(ids)
    return out


def check_inputs(session: Session, inputs: Inputs, identity: Identity) -> None:
    """422 unless every sandbox listed exists and is the submitter's."""
    wanted = {sid for ids in inputs for sid in ids}
    bad = unusable_inputs(session, wanted, identity.vo, identity.owner)
    if bad:
        raise Problem(422, f"InputSandbox names sandbox {bad[0]}, which does not exist or "
                      f"is not yours: upload it first (POST /api/v1/sandboxes)",
                      sandboxes=bad)


def link_inputs(session: Session, job_ids: Sequence[int], inputs: Inputs) -> None:
    """Record that each stored job (``job_ids``, in the order of the submissions) references
    the sandboxes it lists (the jobs of a parametric bulk share them)."""
    links = [(job_id, sid) for job_id, ids in zip(job_ids, inputs, strict=True)
             for sid in ids]
    if links:
        reference(session, links, INPUT)
