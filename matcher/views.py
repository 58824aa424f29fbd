"""How stored rows look in answers."""

from __future__ import annotations

from datetime import datetime
from typing import Any


def iso(value: datetime | None) -> str | None:
    """A UTC time as ISO 8601 with a Z, or None."""
    if value is None:
        return None
    return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def job_summary(job: Any) -> dict[str, Any]:
    return {"job_id": job.id, "vo": job.vo, "owner": job.owner, "owner_group": job.owner_group,
            "status": job.status, "minor_status": job.minor_status, "job_type": job.job_type,
            "site": job.site, "submitted_at": iso(job.submitted_at),
            "ended_at": iso(job.ended_at), "job_name": job.job_name,
            "job_group": job.job_group}


def pilot_summary(pilot: Any) -> dict[str, Any]:
    return {"reference": pilot.reference, "vo": pilot.vo, "site": pilot.site, "ce": pilot.ce,
            "queue": pilot.queue, "status": pilot.status, "reason": pilot.reason,
            "executor": pilot.executor, "native_id": pilot.native_id,
            "submitted_at": iso(pilot.submitted_at), "last_seen_at": iso(pilot.last_seen_at),
            "updated_at": iso(pilot.updated_at), "exit_code": pilot.exit_code,
            "log": log_state(pilot), "log_note": pilot.log_note,
            "kill_requested_by": pilot.kill_requested_by,
            "heard_after_end_at": iso(pilot.heard_after_end_at),
            "token_renewals": pilot.token_renewals,
            "token_renewed_at": iso(pilot.token_renewed_at),
            "token_expires_at": iso(pilot.token_expires_at),
            "ce_state": pilot.ce_state, "ce_state_since": iso(pilot.ce_state_since),
            "hung_in": pilot.hung_in, "isolation": pilot.isolation}


def log_state(pilot: Any) -> str:
    """Where the pilot's log stands: followed, stored, unavailable, or none (a pilot the
    director did not submit)."""
    if pilot.log_state is not None:
        return str(pilot.log_state)
    return "followed" if pilot.native_id is not None else "none"
