"""How the pilot writes its log (standard error, which the compute element hands back): one
record a line, the further lines of a message indented, and a record that concerns one job
marked with its id (``[job 42]`` after the logger's name). The service shows each user the
records of their own jobs and the pilot-wide ones that name no other job
(taskqueue.pilots.pilotlogs.part_for_owner); operators read all of it.

A record names a job's executable, files or processes only with that job's mark."""

from __future__ import annotations

import logging

FORMAT = "%(asctime)s %(levelname)s %(name)s%(job_mark)s: %(message)s"
#: What a message's further lines start with: never the start of a record.
CONTINUATION = "    "
_ATTRIBUTE = "gridpilot_job"


def concerning(job_id: int | None) -> dict[str, int]:
    """The ``extra`` of a log call that concerns job ``job_id`` alone (None: no job known,
    for code that also runs outside a pilot)."""
    return {} if job_id is None else {_ATTRIBUTE: job_id}


class Formatter(logging.Formatter):
    """FORMAT, with the job mark and the further lines of a message indented (a payload's
    text in a message cannot pass for a record of its own)."""

    def __init__(self) -> None:
        super().__init__(FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        job_id = getattr(record, _ATTRIBUTE, None)
        record.job_mark = f" [job {job_id}]" if isinstance(job_id, int) else ""
        return super().format(record).replace("\n", "\n" + CONTINUATION)


def install(level: int) -> None:
    """The root logger writes to standard error in this format, from ``level`` up."""
    handler = logging.StreamHandler()
    handler.setFormatter(Formatter())
    logging.basicConfig(level=level, handlers=[handler])
