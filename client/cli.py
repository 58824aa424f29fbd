"""``gridpilot-client``: submit, follow and control jobs on a gridpilot service over HTTP."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click

from client import show
from client.config import ConfigError, resolve
from client.sandboxes import (
    OutputFolderError,
    SandboxFileError,
    executable_warnings,
    fetch_output,
    with_uploaded_inputs,
)
from client.sandboxes import upload as upload_sandbox
from client.service import Service, ServiceError

F = TypeVar("F", bound=Callable[..., Any])

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3
EXIT_PARTIAL, EXIT_NOT_DONE, EXIT_TIMEOUT, EXIT_NOT_FOUND = 4, 5, 6, 7

EPILOG = f"""\b
Exit codes:
  {EXIT_OK}  done
  {EXIT_REFUSED}  the service refused the request (its reason is printed) or failed
  {EXIT_USAGE}  wrong options, or no service URL or token configured
  {EXIT_UNREACHABLE}  the service could not be reached
  {EXIT_PARTIAL}  done for some jobs only: the others are listed with the reason
  {EXIT_NOT_DONE}  wait: a job ended other than Done; explain: the job cannot run there
  {EXIT_TIMEOUT}  wait: --timeout passed before every job ended
  {EXIT_NOT_FOUND}  no such job (or pilot): the ids that do not exist are named

\b
The service URL and token come from --url/--token/--token-file, else GRIDPILOT_URL,
GRIDPILOT_TOKEN, GRIDPILOT_TOKEN_FILE, else ~/.config/gridpilot/client.toml (url, token_file),
else the WLCG locations BEARER_TOKEN, BEARER_TOKEN_FILE, $XDG_RUNTIME_DIR/bt_u$UID.
The CAs trusted for an https URL: --ca-bundle, else GRIDPILOT_CA_BUNDLE, else the config
file's ca_bundle, else X509_CERT_DIR, else the system's store (a PEM file or a folder of
hashed CA certificates).
"""


class Exit(click.ClickException):
    """A failure with its own exit code, printed as one line."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.exit_code = code  # type: ignore[misc]  # click's exit status, per instance


def _service(ctx: click.Context) -> Service:
    opts = ctx.find_root().params
    try:
        config = resolve(url=opts["url"], token=opts["token"], token_file=opts["token_file"],
                         timeout=opts["timeout"], environ=os.environ,
                         ca_bundle=opts["ca_bundle"])
    except ConfigError as exc:
        raise Exit(str(exc), EXIT_USAGE) from exc
    return Service(config.url, config.token, timeout=config.timeout, verify=config.verify)


def _exit_code(status: int) -> int:
    """The exit code for a request the service answered with HTTP ``status`` (0: no answer)."""
    return {0: EXIT_UNREACHABLE, 404: EXIT_NOT_FOUND}.get(status, EXIT_REFUSED)


def _partial(ctx: click.Context, errors: Sequence[Mapping[str, Any]]) -> None:
    """Exit for the jobs a many-job command could not act on: the ids that do not exist
    named on standard error (exit code EXIT_NOT_FOUND), else EXIT_PARTIAL; nothing if none."""
    if not errors:
        return
    missing = [str(e["job_id"]) for e in errors if e.get("code") == 404]
    if missing:
        click.echo(f"no such job: {', '.join(missing)}", err=True)
        ctx.exit(EXIT_NOT_FOUND)
    ctx.exit(EXIT_PARTIAL)


def _handled(fn: F) -> F:
    """The service's refusals as one line and an exit code, never a traceback."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ServiceError as exc:
            raise Exit(show.printable(exc.detail), _exit_code(exc.status)) from exc
        except (KeyError, TypeError, AttributeError) as exc:
            # An answer whose inner parts are not what a gridpilot service sends.
            raise Exit(f"unexpected answer from the service ({type(exc).__name__}: {exc})",
                       EXIT_REFUSED) from exc

    return wrapper  # type: ignore[return-value]


def _emit(as_json: bool, data: Any, text: str, raw: bool = False) -> None:
    """JSON (its escapes show every control character), else ``text`` for people: without
    the control characters a terminal would obey, unless ``raw`` (then exactly as it came:
    click would strip ANSI sequences from what goes to a file)."""
    if as_json:
        click.echo(json.dumps(data, indent=2))
    elif raw:
        click.echo(text, color=True)
    else:
        click.echo(show.printable(text))


json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print JSON for scripts instead of a table.")
raw_option = click.option(
    "--raw", is_flag=True, help="Print the text as it came, control characters and terminal "
    "escapes included (for a file; by default all but newline and tab are left out).")


@click.group(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--url", default=None, help="The service's base URL (else $GRIDPILOT_URL).")
@click.option("--token", default=None, help="The bearer token itself (prefer --token-file).")
@click.option("--token-file", default=None, help="A file holding the bearer token.")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=None,
              help="Seconds to wait for each answer (default 30).")
@click.option("--ca-bundle", default=None, metavar="PATH",
              help="PEM file, or folder of hashed CA certificates, of the CAs to trust for an "
                   "https URL (else $GRIDPILOT_CA_BUNDLE, the config file's ca_bundle, "
                   "$X509_CERT_DIR, the system's store).")
@click.version_option(package_name="gridpilot")
def cli(url: str | None, token: str | None, token_file: str | None,
        timeout: float | None, ca_bundle: str | None) -> None:
    """Submit jobs to a gridpilot service and follow, kill, reschedule or delete them."""


def _read_description(path: Path, fmt: str) -> tuple[str, str]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise Exit(f"{path}: cannot read it: {exc}", EXIT_USAGE) from exc
    if fmt == "auto":
        try:
            json.loads(text)
            fmt = "json"
        except ValueError:
            fmt = "jdl"  # a JDL is never valid JSON
    return text, fmt


@cli.command()
@click.argument("files", nargs=-1, required=True,
                type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["auto", "jdl", "json"]), default="auto",
              show_default=True, help="How the files are written (auto: JSON if it parses "
                                      "as JSON, else JDL).")
@json_option
@click.pass_context
@_handled
def submit(ctx: click.Context, files: tuple[Path, ...], fmt: str, as_json: bool) -> None:
    """Submit the jobs of FILES (JDL or JSON job descriptions); print their ids.

    Every file is read before anything is sent. Each file is one request: if the service
    refuses one, the jobs of the files before it stay submitted (they are printed).
    """
    descriptions = [(path, *_read_description(path, fmt)) for path in files]
    service = _service(ctx)
    submitted: list[dict[str, Any]] = []
    for path, text, kind in descriptions:
        for warning in executable_warnings(text, kind, path.parent):
            click.echo(show.printable(f"{path}: warning: {warning}"), err=True)
        try:
            # Local InputSandbox files travel as one uploaded sandbox (client.sandboxes).
            text = with_uploaded_inputs(text, kind, path.parent,
                                        lambda data: upload_sandbox(service, data))
            answer = service.submit(text, kind)
        except (SandboxFileError, json.JSONDecodeError) as exc:
            if submitted:
                _emit(as_json, {"jobs": submitted}, _submitted_lines(submitted))
            raise Exit(f"{path}: {exc}", EXIT_USAGE) from exc
        except ServiceError as exc:
            if submitted:
                _emit(as_json, {"jobs": submitted}, _submitted_lines(submitted))
            raise Exit(f"{path}: {exc.detail}", _exit_code(exc.status)) from exc
        submitted += answer["jobs"]
        for warning in answer.get("warnings") or []:
            click.echo(show.printable(f"{path}: warning: {warning}"), err=True)
    _emit(as_json, {"jobs": submitted}, _submitted_lines(submitted))
    if any(j["status"] == "Failed" for j in submitted):
        ctx.exit(EXIT_PARTIAL)


def _submitted_lines(jobs: Sequence[dict[str, Any]]) -> str:
    return "\n".join(f"{j['job_id']}" if j["status"] == "Waiting" else
                     f"{j['job_id']}  {j['status']}: {j['minor_status']}" for j in jobs)


def _ids(values: Sequence[str]) -> list[int]:
    """Job ids from the arguments; "-" reads more from standard input."""
    ids: list[int] = []
    for value in values:
        words = sys.stdin.read().split() if value == "-" else [value]
        for word in words:
            if not re.fullmatch(r"[0-9]{1,19}", word) or int(word) < 1:
                raise Exit(f"{word!r} is not a job id (a positive whole number)", EXIT_USAGE)
            ids.append(int(word))
    if not ids:
        raise Exit("no job id given", EXIT_USAGE)
    return ids


ids_argument = click.argument("job_ids", nargs=-1, required=True, metavar="ID... | -")


@cli.command()
@ids_argument
@json_option
@click.pass_context
@_handled
def status(ctx: click.Context, job_ids: tuple[str, ...], as_json: bool) -> None:
    """The status of each job."""
    service = _service(ctx)
    jobs, missing = [], []
    for job_id in _ids(job_ids):
        try:
            jobs.append(service.job(job_id))
        except ServiceError as exc:
            if exc.status not in (403, 404):
                raise
            missing.append({"job_id": job_id, "code": exc.status, "detail": exc.detail})
    _emit(as_json, {"jobs": jobs, "errors": missing}, show.jobs_table(jobs) + "".join(
        f"\n{m['job_id']}: {m['detail']}" for m in missing))
    _partial(ctx, missing)


def _since(value: str | None) -> str | None:
    """"2h", "30m", "3d", "1w" ago, or a time in ISO 8601, as the ISO time the API takes."""
    if value is None:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*([smhdw])\s*", value)
    if m is None:
        return value
    seconds = int(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[
        m.group(2)]
    return (datetime.now(UTC) - timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


@cli.command("list")
@click.option("--status", "status_", default=None, help="Only jobs in this status.")
@click.option("--site", default=None, help="Only jobs at this site.")
@click.option("--name", default=None, help="Only jobs of this JobName (NAME* for a prefix).")
@click.option("--group", default=None, help="Only jobs of this JobGroup (GROUP* for a prefix).")
@click.option("--since", default=None,
              help="Only jobs submitted since: 30m, 2h, 3d, 1w ago, or an ISO 8601 time.")
@click.option("--owner", default=None, help="Only this owner's jobs (operators).")
@click.option("--limit", type=click.IntRange(1), default=50, show_default=True,
              help="Show at most this many jobs.")
@click.option("--all", "everything", is_flag=True, help="Show every job (no --limit).")
@click.option("--oldest-first", is_flag=True, help="Oldest first (default: newest first).")
@click.option("--summary", is_flag=True, help="Only the number of jobs in each status.")
@json_option
@click.pass_context
@_handled
def list_command(ctx: click.Context, status_: str | None, site: str | None, name: str | None,
                 group: str | None, since: str | None, owner: str | None, limit: int,
                 everything: bool, oldest_first: bool, summary: bool, as_json: bool) -> None:
    """Your jobs (an operator's: the VO's), newest first, with filters; or a summary by
    status."""
    service = _service(ctx)
    filters = {"status": status_, "site": site, "job_name": name, "job_group": group,
               "since": _since(since), "owner": owner}
    if summary:
        counts = service.summary(filters)
        _emit(as_json, counts, show.summary_table(counts))
        return
    jobs = list(service.jobs(filters, newest_first=not oldest_first,
                             limit=None if everything else limit))
    text = show.jobs_table(jobs) + (f"\n({len(jobs)} shown: --limit or --all for more)"
                                    if not everything and len(jobs) == limit else "")
    _emit(as_json, {"jobs": jobs}, text)


def _bulk(ctx: click.Context, action: str, past: str, job_ids: tuple[str, ...],
          reason: str | None, as_json: bool) -> None:
    answer = _service(ctx).bulk(action, _ids(job_ids), reason)
    _emit(as_json, answer, show.bulk_lines(past, answer))
    _partial(ctx, answer["errors"])


reason_option = click.option("--reason", default=None, help="Why (kept in the job's history).")


@cli.command()
@ids_argument
@reason_option
@json_option
@click.pass_context
@_handled
def kill(ctx: click.Context, job_ids: tuple[str, ...], reason: str | None,
         as_json: bool) -> None:
    """Kill jobs: waiting ones leave their queue, running ones are stopped by their pilot."""
    _bulk(ctx, "kill", "killed", job_ids, reason, as_json)


@cli.command()
@ids_argument
@reason_option
@json_option
@click.pass_context
@_handled
def reschedule(ctx: click.Context, job_ids: tuple[str, ...], reason: str | None,
               as_json: bool) -> None:
    """Run jobs again from the start (back through the optimizer chain)."""
    _bulk(ctx, "reschedule", "rescheduled", job_ids, reason, as_json)


@cli.command()
@ids_argument
@json_option
@click.pass_context
@_handled
def delete(ctx: click.Context, job_ids: tuple[str, ...], as_json: bool) -> None:
    """Delete jobs (active ones are killed first)."""
    _bulk(ctx, "delete", "deleted", job_ids, None, as_json)


@cli.command()
@click.argument("job_id", type=click.IntRange(1))
@click.option("-d", "--dir", "folder", type=click.Path(file_okay=False, path_type=Path),
              default=None, help="Where to write it (default: ./job-ID).")
@click.option("--no-sandbox", is_flag=True,
              help="Only the output tail: do not fetch the OutputSandbox files.")
@json_option
@click.pass_context
@_handled
def output(ctx: click.Context, job_id: int, folder: Path | None, no_sandbox: bool,
           as_json: bool) -> None:
    """Fetch a job's output: its exit code, the tail of its standard output and error
    (written to DIR/output.txt) and the files of its OutputSandbox with its full standard
    output and error (unpacked into DIR)."""
    service = _service(ctx)
    answer = service.output(job_id)
    folder = folder or Path(f"job-{job_id}")
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / "output.txt"
    target.write_text(answer.get("output_tail") or "", encoding="utf-8")
    files = [str(target)]
    if answer.get("output_sandbox") and not no_sandbox:
        try:
            files += [str(folder / name) for name in
                      fetch_output(service, answer["output_sandbox"], folder)]
        except OutputFolderError as exc:
            raise Exit(f"{exc} (use another --dir, or --no-sandbox)", EXIT_USAGE) from exc
    answer["files"] = files
    code = answer["exit_code"] if answer["exit_code"] is not None else "-"
    _emit(as_json, answer, f"job {job_id} ({answer['status']}, exit code {code}): "
                           + ", ".join(files))


@cli.command()
@click.argument("job_id", type=click.IntRange(1))
@json_option
@raw_option
@click.pass_context
@_handled
def peek(ctx: click.Context, job_id: int, as_json: bool, raw: bool) -> None:
    """The tail of a job's output while it runs, as its pilot's last heartbeat sent it (once
    the job ended, the tail of its final report)."""
    service = _service(ctx)
    job = service.job(job_id)
    answer = service.output(job_id)
    answer["heartbeat_at"] = job.get("heartbeat_at")
    running = answer["status"] in ("Running", "Stalled", "Completing")
    head = f"job {job_id} ({answer['status']})" + (
        f", as of its pilot's heartbeat at {job['heartbeat_at']}"
        if running and job.get("heartbeat_at") else "")
    tail = answer.get("output_tail") or ""
    _emit(as_json, answer, f"{head}:\n{tail}".rstrip("\n") if tail
          else f"{head}: no output yet", raw)


@cli.command()
@click.argument("job_id", type=click.IntRange(1))
@json_option
@raw_option
@click.pass_context
@_handled
def log(ctx: click.Context, job_id: int, as_json: bool, raw: bool) -> None:
    """A job's status history and what its pilot reported."""
    job = _service(ctx).job(job_id)
    _emit(as_json, job, show.job_log(job), raw)


@cli.command()
@click.argument("job_id", type=click.IntRange(1))
@click.option("--queue", default=None, metavar="SITE/CE/QUEUE",
              help="A queue of the service's resources configuration.")
@click.option("--resource", "resource_file", default=None,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A resource description (JSON), as a pilot sends it.")
@json_option
@click.pass_context
@_handled
def explain(ctx: click.Context, job_id: int, queue: str | None, resource_file: Path | None,
            as_json: bool) -> None:
    """Why a job can or cannot run on a queue or resource: every matching rule. With neither
    --queue nor --resource: every configured queue, and why each that cannot run it cannot."""
    if queue is not None and resource_file is not None:
        raise Exit("give --queue or --resource, not both", EXIT_USAGE)
    resource = None
    if resource_file is not None:
        try:
            resource = json.loads(resource_file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise Exit(f"{resource_file}: not a readable JSON resource description: {exc}",
                       EXIT_USAGE) from exc
    answer = _service(ctx).explain(job_id, queue=queue, resource=resource)
    _emit(as_json, answer, show.explanation(answer))
    if not answer["can_run"]:
        ctx.exit(EXIT_NOT_DONE)


@cli.command()
@ids_argument
@click.option("--timeout", "limit", type=click.FloatRange(min=0), default=None,
              help="Give up after this many seconds (exit 6).")
@click.option("--interval", type=click.FloatRange(min=0.1), default=5.0, show_default=True,
              help="Seconds between two looks.")
@json_option
@click.pass_context
@_handled
def wait(ctx: click.Context, job_ids: tuple[str, ...], limit: float | None, interval: float,
         as_json: bool) -> None:
    """Wait until every job has ended, with a progress line; exit 0 only if all are Done."""
    service = _service(ctx)
    ids = list(dict.fromkeys(_ids(job_ids)))
    last: dict[int, dict[str, Any]] = {}
    started = time.monotonic()
    shown = ""
    tty = sys.stderr.isatty()
    while True:
        for job_id in ids:
            if job_id not in last or last[job_id]["status"] not in show.FINAL:
                last[job_id] = service.job(job_id)
        counts = Counter(j["status"] for j in last.values())
        line = show.progress(counts, len(ids), time.monotonic() - started)
        if tty:
            click.echo("\r" + line, nl=False, err=True)
        elif line.split("]", 1)[1] != shown.split("]", 1)[-1]:
            click.echo(line, err=True)
        shown = line
        if all(j["status"] in show.FINAL for j in last.values()):
            break
        if limit is not None and time.monotonic() - started >= limit:
            if tty:
                click.echo(err=True)
            raise Exit(f"still not ended after {limit:g} s: " + ", ".join(
                str(i) for i in ids if last[i]["status"] not in show.FINAL), EXIT_TIMEOUT)
        time.sleep(interval)
    if tty:
        click.echo(err=True)
    jobs = [last[i] for i in ids]
    _emit(as_json, {"jobs": jobs}, show.jobs_table(jobs))
    if any(j["status"] != "Done" for j in jobs):
        ctx.exit(EXIT_NOT_DONE)


@cli.command()
@json_option
@click.pass_context
@_handled
def whoami(ctx: click.Context, as_json: bool) -> None:
    """Who the service takes you for: subject, role, VO, group, token issuer and expiry."""
    me = _service(ctx).whoami()
    _emit(as_json, me, "\n".join(f"{k:<11} {show._cell(v)}" for k, v in me.items()))


@cli.command("pilot-log")
@click.argument("reference")
@json_option
@raw_option
@click.pass_context
@_handled
def pilot_log(ctx: click.Context, reference: str, as_json: bool, raw: bool) -> None:
    """An ended pilot's standard output and error (the ends of each), as its compute element
    gave them back. Operators read any pilot of their VO; users, the lines about their own
    jobs of the pilots that ran them (`gridpilot-client log ID` names a job's pilot)."""
    answer = _service(ctx).pilot_log(reference)
    _emit(as_json, answer, show.pilot_log(answer), raw)


@cli.command("pilot-kill")
@click.argument("reference")
@json_option
@click.pass_context
@_handled
def pilot_kill(ctx: click.Context, reference: str, as_json: bool) -> None:
    """Kill a pilot (operators), started by the site director or by hand: the matcher gives
    it no job and tells it to stop (it hands its jobs back, one reschedule each); one the
    director submitted is also killed through its CE at the director's next turn."""
    answer = _service(ctx).kill_pilot(reference)
    _emit(as_json, answer, f"pilot {reference} ({answer['status']}): it gets no job and is "
                           "told to stop" + (", and the site director kills it through its CE "
                                             "at its next turn" if answer.get("native_id")
                                             else ""))


def main() -> None:
    cli()  # pragma: no cover
