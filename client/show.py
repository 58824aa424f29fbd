"""Tables and lines for people (the client prints JSON for scripts instead)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: Statuses after which nothing more happens to a job unless someone reschedules it.
FINAL = frozenset({"Done", "Failed", "Killed", "Deleted"})

#: What a terminal acts on instead of showing: the C0 controls but newline and tab (ESC
#: starts CSI and OSC sequences, CR rewrites a line), DEL, the C1 controls (U+009B is a CSI
#: of its own) and the bidirectional controls that reorder what follows (U+202E).
_UNPRINTABLE = dict.fromkeys(
    [*range(0x00, 0x09), *range(0x0b, 0x20), *range(0x7f, 0xa0), 0x061c, 0x200e, 0x200f,
     *range(0x202a, 0x202f), *range(0x2066, 0x206a)])


def printable(text: str) -> str:
    """``text`` without what a terminal would act on (see _UNPRINTABLE): what pilots,
    payloads and compute elements wrote is shown, never obeyed."""
    return text.translate(_UNPRINTABLE)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Left-aligned columns (numbers right-aligned), two spaces apart."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    numeric = [all(r[i].isdigit() or r[i] == "-" for r in cells) and bool(cells)
               for i in range(len(headers))]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w)
                 for v, w, num in zip(values, widths, numeric, strict=True)]
        return "  ".join(parts).rstrip()

    return "\n".join([line(list(headers)), *(line(r) for r in cells)])


def _cell(value: Any) -> str:
    if value is None or value == "":
        return "-"
    text = str(value)
    if text.endswith("Z") and len(text) == 27 and text[10] == "T":  # our ISO times
        return text[:19].replace("T", " ")
    return text


def jobs_table(jobs: Iterable[Mapping[str, Any]]) -> str:
    return table(("ID", "STATUS", "NAME", "GROUP", "SITE", "SUBMITTED (UTC)", "MINOR STATUS"),
                 [(j["job_id"], j["status"], j.get("job_name"), j.get("job_group"),
                   j.get("site"), j.get("submitted_at"), j.get("minor_status"))
                  for j in jobs])


def summary_table(summary: Mapping[str, Any]) -> str:
    rows = sorted(summary["by_status"].items())
    return table(("STATUS", "JOBS"), [*rows, ("total", summary["total"])])


def job_log(job: Mapping[str, Any]) -> str:
    """A job's status history and what its pilot reported."""
    lines = [f"job {job['job_id']}"
             + (f" ({job['job_name']})" if job.get("job_name") else "")
             + f": {job['status']} - {job['minor_status']}"]
    lines.append(table(("AT (UTC)", "STATUS", "SOURCE", "MINOR STATUS"),
                       [(h["at"], h["status"], h["source"], h["minor_status"])
                        for h in job.get("history", [])]))
    pilot = [("site", job.get("site")), ("CE", job.get("ce")),
             ("pilot", job.get("pilot_reference")), ("started", job.get("started_at")),
             ("last heartbeat", job.get("heartbeat_at")), ("CPU used (s)", job.get("cpu_used")),
             ("progress", job.get("progress")), ("exit code", job.get("exit_code")),
             ("ended", job.get("ended_at")), ("reschedules", job.get("reschedule_count"))]
    shown = [(k, v) for k, v in pilot if v not in (None, "")]
    if shown:
        lines.append("what its pilot reported:")
        lines += [f"  {k:<15} {_cell(v)}" for k, v in shown]
    return "\n".join(lines)


def bulk_lines(action: str, answer: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    lines = [f"{j['job_id']}: {j['status']}" for j in answer["jobs"]]
    lines += [f"{e['job_id']}: not {action}: {e['detail']}" for e in answer["errors"]]
    return "\n".join(lines)


def explanation(answer: Mapping[str, Any]) -> str:
    if "queues" in answer:
        return queue_verdicts(answer["queues"])
    lines = [f"[{'ok' if r['holds'] else 'NO'}] {r['rule']}: {r['detail']}"
             for r in answer["rules"]]
    lines.append("=> it can run there" if answer["can_run"] else "=> it cannot run there")
    return "\n".join(lines)


def queue_verdicts(queues: list[Mapping[str, Any]]) -> str:
    """A job against every configured queue: those that can run it, and for each other the
    first rule that fails."""
    lines = []
    for q in queues:
        if q["can_run"]:
            lines.append(f"[ok] {q['queue']}")
        else:
            first = q["failed"][0]
            more = f" (and {len(q['failed']) - 1} more)" if len(q["failed"]) > 1 else ""
            lines.append(f"[NO] {q['queue']}: {first['rule']}: {first['detail']}{more}")
    can = [q["queue"] for q in queues if q["can_run"]]
    if not queues:
        lines.append("=> no configured queue serves its VO")
    elif can:
        lines.append(f"=> {len(can)} of {len(queues)} configured queues can run it")
    else:
        lines.append(f"=> none of the {len(queues)} configured queues can run it")
    return "\n".join(lines)


def progress(counts: Mapping[str, int], total: int, elapsed: float) -> str:
    parts = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    ended = sum(n for s, n in counts.items() if s in FINAL)
    return f"[{elapsed:6.0f} s] {ended}/{total} ended: {parts}"


def pilot_log(answer: Mapping[str, Any]) -> str:
    """A pilot's log for people: what became of it, then its output and its error."""
    code = answer.get("exit_code")
    head = f"pilot {answer['reference']}: {answer['status']}"
    if code is not None:
        head += f", exit code {code}"
    if answer.get("reason"):
        head += f" ({answer['reason']})"
    lines = [head]
    if answer.get("note"):
        lines.append(f"note: {answer['note']}")
    if answer.get("hidden_lines"):
        lines.append(f"note: {answer['hidden_lines']} line(s) about other jobs on this pilot "
                     "are left out (the VO's operators read them)")
    for title, key in (("standard output", "stdout"), ("standard error", "stderr")):
        text = str(answer.get(key) or "")
        lines.append(f"--- {title} ({len(text.encode())} bytes) ---")
        if text:
            lines.append(text.rstrip("\n"))
    return "\n".join(lines)
