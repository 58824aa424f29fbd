"""What draining or killing a pilot costs, from its ``$JOBSTATUS`` values (HEPiX machine/job
features; the keys are described in :mod:`pilot.jobstatus`).

Units: ``now`` and every time key are Unix seconds; :func:`remaining_time` is in seconds, the
wastes are in core-seconds (cores * seconds; divide by 3600 for core-hours).

- remaining_time = last_exp_job_end - now (last_max_job_end - now for the enforced bound)
- draining_waste = (allocated_CPU - used_CPU) * (first_exp_job_end - now) + add_final_exp_waste:
  the core-seconds left idle if the pilot starts no new payload and its running payloads end as
  expected (the free cores wait for the last payload, and so does every payload's cores once it
  ends).
- kill_waste = add_uncom_time + used_CPU * (now - last_job_start): the core-seconds of work the
  running payloads have done so far, lost if they are killed now.

Clamping (values are estimates; none is ever negative):

- remaining_time: an end already in the past gives 0 (the payloads are expected to end, or be
  stopped, any moment).
- draining_waste: the idle-core count ``allocated - used`` is taken as at least 0 (an
  over-committed pilot has no idle core); the time term is NOT clamped, because once
  ``first_exp_job_end`` is past, ``(allocated - used) * (first_exp - now) + add_final_exp_waste``
  still equals the free cores' idle time until ``last_exp_job_end`` plus the payloads' expected
  idle time, which is the better estimate; only the total is clamped at 0 (reached when the last
  expected end is past). So draining_waste is non-increasing in ``now``.
- kill_waste: a ``now`` before ``last_job_start`` (a clock step, a what-if in the past) counts as
  ``last_job_start``: no payload has done negative work. So kill_waste is non-decreasing in
  ``now``, and never below ``add_uncom_time``.
"""

from __future__ import annotations

from pilot.jobstatus import JobStatusValues


def remaining_time(values: JobStatusValues, now: float, enforced: bool = False) -> float:
    """Seconds until the last payload is expected to end (``enforced``: must end), ≥ 0."""
    end = values.last_max_job_end if enforced else values.last_exp_job_end
    return max(0.0, end - now)


def draining_waste(values: JobStatusValues, now: float, allocated: int | None = None) -> float:
    """Core-seconds left idle if the pilot is drained at ``now``, ≥ 0. ``allocated`` cores:
    None takes ``values.allocated_CPU``, and when that is unknown too, ``used_CPU`` (no idle
    free core is counted)."""
    if allocated is None:
        allocated = values.allocated_CPU if values.allocated_CPU is not None else values.used_CPU
    idle_cores = max(0, allocated - values.used_CPU)
    return max(0.0, idle_cores * (values.first_exp_job_end - now) + values.add_final_exp_waste)


def kill_waste(values: JobStatusValues, now: float) -> float:
    """Core-seconds of payload work lost if the pilot is killed at ``now``, ≥ 0."""
    elapsed = max(0.0, now - values.last_job_start)
    return max(0.0, values.add_uncom_time + values.used_CPU * elapsed)
