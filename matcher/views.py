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
            "ended_at": iso(job.ended_at)}
