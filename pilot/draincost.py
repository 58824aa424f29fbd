"""``gridpilot-drain-cost``: for a site admin on a worker node, what draining or killing each
pilot there would waste, read from the pilots' ``$JOBSTATUS`` directories under their lock.

Run as ``gridpilot-drain-cost`` or ``python -m pilot.draincost``; ``--help`` says it all. The
table is sorted by what is cheapest to drain (use case 12, least critical first): pilots that can
postpone their last job, then the lowest priority factor, then the lowest draining waste.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from pilot.jobstatus import USED_CPU, JobStatusError, JobStatusValues, read_status
from pilot.waste import draining_waste, kill_waste, remaining_time

PROG = "gridpilot-drain-cost"
ROOT_ENV = "GRIDPILOT_JOBSTATUS_ROOT"
DEFAULT_ROOT = "/var/run/gridpilot/jobstatus"
DEFAULT_LOCK_TIMEOUT = 10.0

EXIT_OK = 0
EXIT_NO_PILOT = 1
EXIT_USAGE = 2

DESCRIPTION = """\
Show what draining or killing each pilot on this worker node would waste, from the pilots'
$JOBSTATUS directories (HEPiX machine/job features), each read under its lock.

With no DIR, every subdirectory of the root that holds a used_CPU file is a pilot's $JOBSTATUS
directory; with DIRs, exactly those are read (the root is then not scanned)."""

EPILOG = f"""\
columns (units):
  PILOT       the pilot's reference, or its directory name when the pilot wrote none
  CORES       cores in use by payloads / cores allocated to the pilot (? when not written)
  REMAINING   until the last payload is expected to end (H:MM:SS; idle: no payload runs)
  LIMIT       until the last payload must end, by its enforced limits (H:MM:SS; idle: no
              payload runs; assumed: the pilot knows no limit and assumes a week)
  DRAIN(core-h)  draining waste: core-hours left idle if the pilot starts no new payload
                 (? when the pilot did not write allocated_CPU: its idle cores are unknown)
  KILL(core-h)   kill waste: core-hours of payload work lost if the pilot is killed now
  POSTPONE    True: the pilot has decided to retire, draining costs only the wait
  PRIORITY    the pilot's priority factor (higher: more critical work)
  --json, --prometheus and --pick print seconds and core-seconds (an unknown value: null in
  JSON, "unknown" with --pick, no sample with --prometheus).
  --prometheus labels each pilot's series with rank="N", its place in the drain order (1:
  the cheapest to drain), not with its reference, so that the series stay the same as pilots
  come and go; the table, --json and --pick name the pilots.

order (cheapest to drain first: the least critical work first):
  1. pilots that can postpone their last job (already retiring) first,
  2. then the lowest priority factor,
  3. then the lowest draining waste (then the pilot name, for a stable order).
  --pick drain names the first pilot of that order; --pick kill names the least critical
  pilot by kill waste: lowest priority factor, then lowest kill waste.

A directory that cannot be read (missing keys, garbage values, lock held longer than
--lock-timeout) is reported on stderr with the reason and skipped.

exit status:
  0    at least one pilot was read and reported
  1    no pilot found (none under the root, or none readable), or an unexpected error;
       with --prometheus, no pilot is not an error: it prints its summary gauges and no
       pilot series, and exits 0 (so that "> f.prom.tmp && mv" keeps the file current)
  2    usage error
  130  interrupted (Ctrl-C)

environment:
  {ROOT_ENV}  the root scanned when no DIR is given (default {DEFAULT_ROOT})"""


@dataclass(frozen=True)
class PilotCost:
    """One pilot's costs at ``now``: times in seconds, wastes in core-seconds."""

    pilot: str
    directory: Path
    used_CPU: int
    allocated_CPU: int | None
    remaining_time: float
    remaining_time_enforced: float
    #: None when the pilot did not write allocated_CPU: its idle cores are not known.
    draining_waste: float | None
    kill_waste: float
    can_postpone: bool
    priority_factor: float
    #: The enforced end is the pilot's assumption (it knows no limit); None: not said.
    limit_assumed: bool | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"pilot": self.pilot, "directory": str(self.directory),
                "used_CPU": self.used_CPU, "allocated_CPU": self.allocated_CPU,
                "remaining_time": self.remaining_time,
                "remaining_time_enforced": self.remaining_time_enforced,
                "draining_waste": self.draining_waste, "kill_waste": self.kill_waste,
                "can_postpone": self.can_postpone, "priority_factor": self.priority_factor,
                "limit_assumed": self.limit_assumed}


def assess(directory: Path, values: JobStatusValues, now: float) -> PilotCost:
    """The costs of the pilot whose ``$JOBSTATUS`` in ``directory`` holds ``values``."""
    return PilotCost(
        pilot=values.pilot_reference or directory.name, directory=directory,
        used_CPU=values.used_CPU, allocated_CPU=values.allocated_CPU,
        remaining_time=remaining_time(values, now),
        remaining_time_enforced=remaining_time(values, now, enforced=True),
        draining_waste=(None if values.allocated_CPU is None
                        else draining_waste(values, now)),
        kill_waste=kill_waste(values, now),
        can_postpone=values.can_postpone_last_job, priority_factor=values.priority_factor,
        limit_assumed=values.limit_assumed)


def drain_order(cost: PilotCost) -> tuple[bool, float, float, str, str]:
    """Sort key, cheapest to drain first: can postpone, lowest priority, lowest draining
    waste (then name and directory, for a stable order)."""
    waste = math.inf if cost.draining_waste is None else cost.draining_waste
    return (not cost.can_postpone, cost.priority_factor, waste, cost.pilot,
            str(cost.directory))


def kill_order(cost: PilotCost) -> tuple[float, float, str, str]:
    """Sort key, cheapest to kill first: lowest priority, lowest kill waste."""
    return (cost.priority_factor, cost.kill_waste, cost.pilot, str(cost.directory))


def find_pilots(root: Path) -> list[Path]:
    """The pilot directories directly under ``root`` (those holding a used_CPU file), sorted.
    Raises OSError when ``root`` cannot be listed."""
    found = []
    with os.scandir(root) as entries:
        for entry in entries:
            try:
                if entry.is_dir() and os.path.lexists(os.path.join(entry.path, USED_CPU)):
                    found.append(Path(entry.path))
            except OSError:
                continue
    return sorted(found)


# -- output -----------------------------------------------------------------------------------


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _duration(seconds: float) -> str:
    total = round(seconds)
    return f"{total // 3600}:{total // 60 % 60:02d}:{total % 60:02d}"


def _core_hours(core_seconds: float | None) -> str:
    return "?" if core_seconds is None else f"{core_seconds / 3600:.2f}"


def _cores(cost: PilotCost) -> str:
    allocated = "?" if cost.allocated_CPU is None else str(cost.allocated_CPU)
    return f"{cost.used_CPU}/{allocated}"


def _times(cost: PilotCost) -> tuple[str, str]:
    """REMAINING and LIMIT: "idle" for a pilot with no payload (no time is running out)."""
    if cost.used_CPU == 0:
        return "idle", "idle"
    limit = _duration(cost.remaining_time_enforced)
    return _duration(cost.remaining_time), f"{limit} assumed" if cost.limit_assumed else limit


def render_table(costs: Sequence[PilotCost]) -> str:
    header = ("PILOT", "CORES", "REMAINING", "LIMIT", "DRAIN(core-h)", "KILL(core-h)",
              "POSTPONE", "PRIORITY")
    rows = [header] + [
        (c.pilot, _cores(c), *_times(c),
         _core_hours(c.draining_waste), _core_hours(c.kill_waste), str(c.can_postpone),
         f"{c.priority_factor:g}") for c in costs]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = []
    for row in rows:
        cells = [cell.ljust(w) if i in (0, 1, 6) else cell.rjust(w)
                 for i, (cell, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"


def render_pick(cost: PilotCost) -> str:
    """The directory on the first line, then one ``name value`` line per number."""
    lines = [str(cost.directory), f"pilot {cost.pilot}"]
    for key, value in cost.as_dict().items():
        if key in ("pilot", "directory"):
            continue
        if value is None:
            text = "unknown"
        elif isinstance(value, bool):
            text = str(value)
        else:
            text = _number(value)
        lines.append(f"{key} {text}")
    return "\n".join(lines) + "\n"


_METRICS: tuple[tuple[str, str, str], ...] = (
    ("gridpilot_pilot_used_cores", "used_CPU", "Cores in use by the pilot's payloads."),
    ("gridpilot_pilot_allocated_cores", "allocated_CPU",
     "Cores allocated to the pilot (absent when the pilot did not write allocated_CPU)."),
    ("gridpilot_pilot_remaining_seconds", "remaining_time",
     "Seconds until the pilot's last payload is expected to end."),
    ("gridpilot_pilot_remaining_enforced_seconds", "remaining_time_enforced",
     "Seconds until the pilot's last payload must end by its enforced limits."),
    ("gridpilot_pilot_draining_waste_core_seconds", "draining_waste",
     "Core-seconds left idle if the pilot is drained now."),
    ("gridpilot_pilot_kill_waste_core_seconds", "kill_waste",
     "Core-seconds of payload work lost if the pilot is killed now."),
    ("gridpilot_pilot_can_postpone", "can_postpone",
     "1 when the pilot has decided to retire (draining costs only the wait), else 0."),
    ("gridpilot_pilot_priority_factor", "priority_factor",
     "How critical the pilot's work is (higher: more critical)."),
)


def render_prometheus(costs: Sequence[PilotCost], unreadable: int) -> str:
    """node-exporter textfile collector format (gauges, no timestamps)."""
    lines = []

    def gauge(name: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} gauge")
        lines.extend(f"{name}{labels} {_number(value)}" for labels, value in samples)

    gauge("gridpilot_drain_cost_pilots", "Pilots whose $JOBSTATUS was read.",
          [("", len(costs))])
    gauge("gridpilot_drain_cost_unreadable",
          "Pilot $JOBSTATUS directories skipped because they could not be read.",
          [("", unreadable)])
    for name, field, help_text in _METRICS:
        samples = []
        for rank, cost in enumerate(costs, start=1):
            labels = f'{{rank="{rank}"}}'
            value = getattr(cost, field)
            if value is None:
                continue
            samples.append((labels, float(value)))
        gauge(name, help_text, samples)
    return "\n".join(lines) + "\n"


# -- command line -----------------------------------------------------------------------------


def _finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    return value


def _timeout(text: str) -> float:
    value = _finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directories", metavar="DIR", nargs="*", type=Path,
                        help="a pilot's $JOBSTATUS directory (default: every one under --root)")
    parser.add_argument("--root", type=Path, default=None,
                        help=f"directory holding one $JOBSTATUS directory per pilot "
                             f"(default: ${ROOT_ENV}, else {DEFAULT_ROOT})")
    fmt = parser.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true",
                     help="print a JSON list of objects (with --pick: one object)")
    fmt.add_argument("--prometheus", action="store_true",
                     help="print gauges in the node-exporter textfile collector format")
    parser.add_argument("--pick", choices=("drain", "kill"),
                        help="print only the best candidate: its directory, then its numbers")
    parser.add_argument("--now", type=_finite_float, default=None, metavar="UNIXTIME",
                        help="evaluate at this time (Unix seconds; default: now), for what-ifs")
    parser.add_argument("--lock-timeout", type=_timeout, default=DEFAULT_LOCK_TIMEOUT,
                        metavar="SECONDS",
                        help="skip a pilot whose lock stays held longer than this "
                             f"(default {DEFAULT_LOCK_TIMEOUT:g})")
    return parser


def _complain(stderr: TextIO, message: str) -> None:
    print(f"{PROG}: {message}", file=stderr)


def _candidates(args: argparse.Namespace, stderr: TextIO) -> list[Path] | None:
    """The directories to read (None: the root cannot be listed, already reported)."""
    if args.directories:
        return list(args.directories)
    root = args.root if args.root is not None else Path(
        os.environ.get(ROOT_ENV) or DEFAULT_ROOT)
    try:
        found = find_pilots(root)
    except OSError as exc:
        _complain(stderr, f"cannot list the $JOBSTATUS root {root}: {exc.strerror or exc} "
                          f"(set --root or {ROOT_ENV})")
        return None
    if not found:
        _complain(stderr, f"no pilot $JOBSTATUS directory under {root}")
    return found


def _read(directory: Path, now: float, timeout: float, stderr: TextIO) -> PilotCost | None:
    try:
        return assess(directory, read_status(directory, timeout=timeout), now)
    except JobStatusError as exc:
        reason = str(exc)
    except Exception as exc:  # never a traceback for one bad directory
        reason = f"$JOBSTATUS {directory}: {type(exc).__name__}: {exc}"
    if directory.is_dir() and not (directory / USED_CPU).exists():
        try:
            if find_pilots(directory):
                reason += " (it holds pilot directories: did you mean --root?)"
        except OSError:
            pass
    _complain(stderr, f"skipped: {reason}")
    return None


def _emit(text: str, stdout: TextIO) -> None:
    try:
        stdout.write(text)
        stdout.flush()
    except BrokenPipeError:  # the reader went away (| head): not our error
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass


def _run(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    now = time.time() if args.now is None else args.now
    directories = _candidates(args, stderr)
    costs: list[PilotCost] = []
    unreadable = 0
    for directory in directories or []:
        cost = _read(directory, now, args.lock_timeout, stderr)
        if cost is None:
            unreadable += 1
        else:
            costs.append(cost)
    costs.sort(key=drain_order)
    if args.prometheus:
        _emit(render_prometheus(costs, unreadable), stdout)
        return EXIT_OK
    if not costs:
        if directories:
            _complain(stderr, "no pilot could be read")
        return EXIT_NO_PILOT
    if args.pick is not None:
        best = min(costs, key=drain_order if args.pick == "drain" else kill_order)
        text = (json.dumps(best.as_dict(), indent=2) + "\n" if args.json
                else render_pick(best))
    elif args.json:
        text = json.dumps([c.as_dict() for c in costs], indent=2) + "\n"
    else:
        text = render_table(costs)
    _emit(text, stdout)
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """The ``gridpilot-drain-cost`` command; returns the exit status (see ``--help``)."""
    parser = build_parser()
    try:
        args = parser.parse_args(None if argv is None else list(argv))
    except SystemExit as exc:  # --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if args.prometheus and args.pick is not None:
        parser.print_usage(sys.stderr)
        _complain(sys.stderr, "error: --pick cannot be combined with --prometheus")
        return EXIT_USAGE
    try:
        return _run(args, sys.stdout, sys.stderr)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # never a traceback
        _complain(sys.stderr, f"error: {type(exc).__name__}: {exc}")
        return EXIT_NO_PILOT


if __name__ == "__main__":
    raise SystemExit(main())
