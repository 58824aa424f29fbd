"""The ``gridpilot`` command line: the one place that reads the environment and the settings."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click
from sqlalchemy.exc import DBAPIError, OperationalError

from gridpilot import schema
from gridpilot.examples import EXAMPLES, example_text
from taskqueue.core.errors import ConfigurationError, GridpilotError
from taskqueue.core.settings import Settings, load_settings
from taskqueue.core.states import JobStatus
from taskqueue.db.database import engine_for, make_session_factory, run_in_transaction
from taskqueue.queues.shares import recompute_priorities
from taskqueue.queues.submitpools import delete_unused_submit_pools
from taskqueue.queues.taskqueues import delete_empty_queues

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_CONFIG = Path("conf/gridpilot.toml")
#: Commands that create the database or need none (others refuse a missing SQLite file
#: instead of creating it empty).
NO_DATABASE_NEEDED = frozenset({"db", "config", "token", "demo", "simulate", None})


def _require_database_file() -> None:
    """Refuse a missing SQLite file when the command about to run needs the database. Checked
    when a command runs, not when the command line is read, so that ``--help`` needs none."""
    root = click.get_current_context().find_root()
    if root.invoked_subcommand not in NO_DATABASE_NEEDED and isinstance(root.obj, Settings):
        schema.require_sqlite_file(root.obj.database.url)


def _friendly(fn: F) -> F:
    """Turn gridpilot's own errors and unreachable databases into one clear line, exit 1."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            _require_database_file()
            return fn(*args, **kwargs)
        except GridpilotError as exc:
            raise click.ClickException(str(exc)) from exc
        except DBAPIError as exc:
            if schema.missing_table(exc):
                raise click.ClickException(
                    f"the database has no gridpilot schema (or an old one): "
                    f"{schema.UPGRADE_HINT}") from exc
            if not isinstance(exc, OperationalError):
                raise
            raise click.ClickException(
                f"cannot use the database: {exc.orig or exc}".strip()) from exc

    return wrapper  # type: ignore[return-value]


@click.group()
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
              envvar="GRIDPILOT_CONFIG", default=None,
              help="Settings file (TOML). Default: $GRIDPILOT_CONFIG, else conf/gridpilot.toml "
                   "if it exists, else built-in defaults.")
@click.option("-v", "--verbose", is_flag=True, help="Log at DEBUG level.")
@click.pass_context
def cli(ctx: click.Context, config_path: Path | None, verbose: bool) -> None:
    """gridpilot: workload management for computing grids."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if ctx.invoked_subcommand == "config":
        return  # the example needs no settings (nor a valid settings file)
    if config_path is None and DEFAULT_CONFIG.is_file():
        config_path = DEFAULT_CONFIG
    try:
        ctx.obj = load_settings(config_path, os.environ)
    except GridpilotError as exc:
        raise click.ClickException(str(exc)) from exc


@cli.group("config")
def config_group() -> None:
    """The example configuration that ships with gridpilot."""


@config_group.command("example")
@click.argument("name", type=click.Choice(sorted(EXAMPLES)), default="gridpilot")
@_friendly
def config_example(name: str) -> None:
    """Print the commented example settings (or, with 'resources', the example resources
    tree): gridpilot config example > gridpilot.toml. Relative paths in a settings file
    count from its folder."""
    click.echo(example_text(name), nl=False)


@cli.group()
def db() -> None:
    """Create, upgrade and inspect the database schema."""


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True, help="Target revision.")
@click.pass_obj
@_friendly
def db_upgrade(settings: Settings, revision: str) -> None:
    """Bring the database schema up to REVISION (creating it if the database is empty)."""
    # Altering a large table may take longer than any request may.
    engine = engine_for(settings.database, statement_timeout=0)
    before = schema.current_revision(engine)
    schema.upgrade(engine, revision)
    after = schema.current_revision(engine)
    click.echo(f"database {engine.url.render_as_string(hide_password=True)}: "
               f"revision {before or '(empty)'} -> {after}")


@db.command("current")
@click.pass_obj
@_friendly
def db_current(settings: Settings) -> None:
    """Print the schema revision of the database and whether it is the newest."""
    engine = engine_for(settings.database)
    current = schema.current_revision(engine)
    head = schema.head_revision(engine)
    state = "up to date" if current == head else f"behind; run 'gridpilot db upgrade' ({head})"
    click.echo(f"{current or '(empty database)'} - {state}")


@cli.group()
def queues() -> None:
    """Inspect and maintain the task queues."""


@queues.command("list")
@click.option("--limit", type=click.IntRange(1), default=50, show_default=True,
              help="Show at most this many queues, largest first.")
@click.pass_obj
@_friendly
def queues_list(settings: Settings, limit: int) -> None:
    """Task queues with their waiting jobs and priorities."""
    from gridpilot.reports import queue_table

    factory = make_session_factory(engine_for(settings.database))
    with factory() as session:
        click.echo(queue_table(session, limit))


@queues.command("recompute")
@click.pass_obj
@_friendly
def queues_recompute(settings: Settings) -> None:
    """Recompute every task queue's fair-share priority now."""
    factory = make_session_factory(engine_for(settings.database))
    changed = run_in_transaction(factory, lambda s: recompute_priorities(s, settings))
    click.echo(f"{len(changed)} task queue priorities changed")


@queues.command("cleanup")
@click.pass_obj
@_friendly
def queues_cleanup(settings: Settings) -> None:
    """Delete task queues and SubmitPools that stayed empty past their grace periods."""
    factory = make_session_factory(engine_for(settings.database))
    now = datetime.now(UTC)
    gone = run_in_transaction(factory, lambda s: delete_empty_queues(s, settings, now=now))
    pools = run_in_transaction(factory, lambda s: delete_unused_submit_pools(
        s, now=now, grace=timedelta(seconds=settings.taskqueue.submit_pool_grace)))
    click.echo(f"deleted {len(gone)} empty task queues and {len(pools)} unused SubmitPools")


@cli.group()
def director() -> None:
    """What the site director does with each queue."""


@director.command("status")
@click.pass_obj
@_friendly
def director_status(settings: Settings) -> None:
    """Each queue the site director served: whether it submits, and if not why (failed
    submissions, failed polls of its CE, pilots failing to start), and its pilots that never
    reached its CE."""
    from agents.director import backing_off
    from taskqueue.pilots.sitestatus import director_states

    factory = make_session_factory(engine_for(settings.database))
    states = run_in_transaction(factory, director_states)
    now = datetime.now(UTC)
    if not states:
        click.echo("the site director has served no queue yet")
    for (site, ce, queue), state in sorted(states.items()):
        why = [w for w in (backing_off(state, now), state.starts_error if
                           state.failed_starts else "") if w]
        line = f"{site}/{ce}/{queue}: " + ("; ".join(why) if why else "submits")
        if state.unsent_pilots:
            line += f" ({state.unsent_pilots} pilot(s) never reached its CE)"
        click.echo(line)


@director.command("retry")
@click.argument("queue")
@click.option("--by", default=None, help="Who asks (kept on the queue's record and shown on "
              "the sites page). Default: the login name.")
@click.pass_obj
@_friendly
def director_retry(settings: Settings, queue: str, by: str | None) -> None:
    """Try QUEUE (SITE/CE/QUEUE, as the sites page names it) again at the director's next
    cycle: its back-off ends, whether its submissions or the polls of its CE failed."""
    import getpass

    from taskqueue.pilots.records import retry_queue

    parts = queue.split("/")
    if len(parts) != 3 or not all(p.strip() for p in parts):
        raise click.BadParameter(f"a queue is SITE/CE/QUEUE, as the sites page names it, not "
                                 f"{queue!r}", param_hint="QUEUE")
    site, ce, name = parts
    who = by or getpass.getuser()
    factory = make_session_factory(engine_for(settings.database))
    state = run_in_transaction(factory, lambda s: retry_queue(
        s, site, ce, name, by=who, now=datetime.now(UTC)))
    click.echo(f"{state.site}/{state.ce}/{state.queue}: tried again at the director's next "
               f"cycle (within [agents] director_interval, {settings.agents.director_interval} s)")


@cli.group()
def sandboxes() -> None:
    """Inspect and maintain the sandbox store."""


@sandboxes.command("usage")
@click.pass_obj
@_friendly
def sandboxes_usage(settings: Settings) -> None:
    """Sandboxes stored and their size, per VO."""
    from taskqueue.files.sandboxes import usage_by_vo

    factory = make_session_factory(engine_for(settings.database))
    rows = run_in_transaction(factory, usage_by_vo)
    click.echo(f"{'VO':<16} {'sandboxes':>10} {'MB':>12}")
    for u in rows:
        click.echo(f"{u.vo:<16} {u.sandboxes:>10} {u.bytes / 1e6:>12.3f}")
    click.echo(f"{'total':<16} {sum(u.sandboxes for u in rows):>10} "
               f"{sum(u.bytes for u in rows) / 1e6:>12.3f}")


@sandboxes.command("cleanup")
@click.pass_obj
@_friendly
def sandboxes_cleanup(settings: Settings) -> None:
    """Remove the sandboxes whose retention period has passed (what the agent loop does)."""
    from agents.context import AgentContext
    from agents.sandboxcleanup import clean_up_sandboxes

    factory = make_session_factory(engine_for(settings.database))
    click.echo(clean_up_sandboxes(AgentContext(settings, factory)))


@cli.group()
def replicas() -> None:
    """The replica catalogue: which storage elements hold each file (jobs with InputData run
    only at sites that reach a replica of every one of their files)."""


def _vo_name(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    """A VO's name as the catalogue keys it: one word of at most 64 characters."""
    if not value or len(value) > 64 or any(c.isspace() or not c.isprintable() for c in value):
        raise click.BadParameter(f"a VO is named by one word of at most 64 characters, got "
                                 f"{value!r}")
    return value


@replicas.command("add")
@click.option("--vo", required=True, callback=_vo_name, help="The VO whose files these are.")
@click.option("--se", default=None, help="The storage element of every LFN given.")
@click.argument("lfns", nargs=-1)
@click.option("--from", "source", type=click.File("r"), default=None,
              help="Lines of 'LFN SE' to register ('-' for standard input).")
@click.pass_obj
@_friendly
def replicas_add(settings: Settings, vo: str, se: str | None, lfns: tuple[str, ...],
                 source: Any) -> None:
    """Register replicas: LFNS at --se, and/or the 'LFN SE' lines of --from."""
    from optimizers.datalocation import unknown_storage
    from optimizers.resources import load_resources
    from taskqueue.files.replicas import add_replicas

    pairs = _replica_lines(source) if source is not None else []
    if lfns:
        if se is None:
            raise click.UsageError("LFNs on the command line need --se")
        pairs += [(lfn, se) for lfn in lfns]
    if not pairs:
        raise click.UsageError("give LFNs with --se, or --from FILE")
    # The resources file is read before anything is stored: a broken one stores nothing.
    resources = load_resources(Path(settings.resources.file))
    factory = make_session_factory(engine_for(settings.database))
    added = run_in_transaction(factory, lambda s: add_replicas(s, vo, pairs,
                                                               now=datetime.now(UTC)))
    click.echo(f"{added} new replicas ({len(pairs) - added} known already)")
    for warning in unknown_storage(resources, vo, {se for _lfn, se in pairs}):
        click.echo(f"warning: {warning}", err=True)


def _replica_lines(source: Any) -> list[tuple[str, str]]:
    pairs = []
    try:
        lines = list(source)
    except UnicodeDecodeError as exc:
        raise click.UsageError(f"{source.name}: not UTF-8 text (byte {exc.start} cannot be "
                               "read)") from exc
    for number, line in enumerate(lines, 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) != 2:
            raise click.UsageError(f"{source.name} line {number}: expected 'LFN SE', got "
                                   f"{line.strip()!r}")
        pairs.append((words[0], words[1]))
    return pairs


@replicas.command("remove")
@click.option("--vo", required=True, callback=_vo_name, help="The VO whose files these are.")
@click.option("--se", default=None, help="Only the replicas at this storage element.")
@click.argument("lfns", nargs=-1, required=True)
@click.pass_obj
@_friendly
def replicas_remove(settings: Settings, vo: str, se: str | None, lfns: tuple[str, ...]) -> None:
    """Forget the replicas of LFNS (at --se only, when given)."""
    from taskqueue.files.replicas import remove_replicas

    factory = make_session_factory(engine_for(settings.database))
    removed = run_in_transaction(factory, lambda s: remove_replicas(s, vo, lfns, se=se))
    click.echo(f"{removed} replicas removed")


@replicas.command("list")
@click.option("--vo", required=True, callback=_vo_name, help="The VO whose files to list.")
@click.option("--se", default=None, help="Only the replicas at this storage element.")
@click.option("--prefix", default=None, help="Only files whose LFN starts with this.")
@click.option("--limit", type=click.IntRange(1), default=1000, show_default=True)
@click.argument("lfns", nargs=-1)
@click.pass_obj
@_friendly
def replicas_list(settings: Settings, vo: str, se: str | None, prefix: str | None,
                  limit: int, lfns: tuple[str, ...]) -> None:
    """List replicas (LFN and storage element), of LFNS or all."""
    from taskqueue.files.replicas import list_replicas

    factory = make_session_factory(engine_for(settings.database))
    rows = run_in_transaction(factory, lambda s: list_replicas(
        s, vo, lfns=lfns, se=se, prefix=prefix, limit=limit))
    for r in rows:
        click.echo(f"{r.lfn} {r.se}")


@cli.command("submit")
@click.argument("files", nargs=-1, required=True,
                type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="The files are JSON, not JDL.")
@click.option("--vo", default=None, help="VO to submit for (default: [submit] vo).")
@click.option("--group", default=None, help="Owner group (default: [submit] owner_group).")
@click.option("--owner", default=None, help="Owner (default: [submit] owner, else login name).")
@click.pass_obj
@_friendly
def submit_command(settings: Settings, files: tuple[Path, ...], as_json: bool,
                   vo: str | None, group: str | None, owner: str | None) -> None:
    """Submit the jobs of FILES (JDL, or JSON with --json); print their ids.

    Every file is checked before anything is stored: one bad file submits nothing.
    """
    from gridpilot import jobcommands

    identity = jobcommands.identity_from(settings, vo, group, owner)
    for job_id in jobcommands.submit_files(settings, files, as_json, identity):
        click.echo(job_id)


@cli.command("jobs")
@click.option("--status", default=None, help="Only jobs in this status (e.g. Waiting).",
              type=click.Choice([s.value for s in JobStatus], case_sensitive=False))
@click.option("--owner", default=None, help="Only this owner's jobs.")
@click.option("--site", default=None, help="Only jobs matched to this site.")
@click.option("--limit", type=click.IntRange(1), default=50, show_default=True)
@click.pass_obj
@_friendly
def jobs_command(settings: Settings, status: str | None, owner: str | None, site: str | None,
                 limit: int) -> None:
    """The newest jobs, with filters."""
    from gridpilot import jobcommands

    click.echo(jobcommands.list_jobs(settings, status, owner, site, limit))


@cli.command("job")
@click.argument("job_id", type=int)
@click.pass_obj
@_friendly
def job_command(settings: Settings, job_id: int) -> None:
    """One job: its description and status history."""
    from gridpilot import jobcommands

    click.echo(jobcommands.show_job(settings, job_id))


@cli.command("explain")
@click.argument("job_id", type=int)
@click.option("--queue", default=None, metavar="SITE/CE/QUEUE",
              help="A queue of the resources configuration.")
@click.option("--resource", "resource_file", default=None,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A resource description (JSON), as a pilot sends it.")
@click.pass_obj
@_friendly
def explain_command(settings: Settings, job_id: int, queue: str | None,
                    resource_file: Path | None) -> None:
    """Why JOB_ID can or cannot run on a queue or resource: every rule, held or not. With
    neither --queue nor --resource: every configured queue, and why each that cannot run it
    cannot.

    Exits 0 when the job can run there (on some queue), 3 when it cannot.
    """
    from gridpilot import jobcommands

    if queue is not None and resource_file is not None:
        raise click.UsageError("give --queue or --resource, not both")
    ok, text = jobcommands.explain(settings, job_id, queue, resource_file)
    click.echo(text)
    if not ok:
        raise SystemExit(3)


@cli.command("optimize")
@click.option("--batch", type=click.IntRange(1), default=None,
              help="Jobs per transaction (default: [submit] optimizer_batch).")
@click.option("--once", is_flag=True, help="One batch, then exit.")
@click.pass_obj
@_friendly
def optimize_command(settings: Settings, batch: int | None, once: bool) -> None:
    """Run the optimizer chain over Received jobs until none is left."""
    from gridpilot import jobcommands

    size = batch or settings.submit.optimizer_batch
    total_ok = total_failed = 0
    while True:
        ok, failed = jobcommands.optimize(settings, size)
        total_ok += ok
        total_failed += failed
        if once or ok + failed < size:
            break
    click.echo(f"{total_ok} job(s) now Waiting, {total_failed} failed")


@cli.command()
@click.option("--work", type=click.Path(file_okay=False, path_type=Path), default=Path("work"),
              show_default=True, help="Folder for the demo's SQLite database.")
@click.option("--jobs", "n_jobs", type=click.IntRange(1, 1_000_000), default=600,
              show_default=True, help="Number of jobs to submit.")
@click.option("--seed", type=int, default=7, show_default=True, help="Random seed.")
@click.option("--linger", type=click.FloatRange(0, 86400), default=None,
              help="Seconds the matcher and its dashboard stay up after the pilots finish "
                   "(Ctrl-C stops earlier). Default: 600 in a terminal, 0 otherwise (CI).")
@click.pass_obj
@_friendly
def demo(settings: Settings, work: Path, n_jobs: int, seed: int, linger: float | None) -> None:
    """A small grid on this machine: users submit, the site director starts pilots, the pilots
    run the jobs; the dashboard shows it at the address printed."""
    from gridpilot.demo import run_demo

    if linger is None:
        linger = 600.0 if sys.stdin.isatty() and sys.stdout.isatty() else 0.0
    run_demo(settings, work, n_jobs=n_jobs, seed=seed, echo=click.echo, linger=linger)


@cli.command()
@click.option("--bind", default=None, help="HOST:PORT to listen on (default: matcher.bind).")
@click.option("--workers", type=click.IntRange(1, 256), default=None,
              help="gunicorn worker processes (default: matcher.workers).")
@click.option("--access-log", default=None, metavar="FILE",
              help="Log every request to FILE, '-' for the standard output (default: "
                   "matcher.access_log; empty: none).")
@click.pass_obj
@_friendly
def serve(settings: Settings, bind: str | None, workers: int | None,
          access_log: str | None) -> None:
    """Run the matcher HTTP service under gunicorn. It says where it listens, with which
    database, and warns when [matcher] url, the URL the site director gives pilots, does not
    reach it."""
    from gridpilot.server import serve as run_server

    schema.require_schema(settings.database)
    run_server(settings, bind=bind, workers=workers, access_log=access_log)


@cli.command("agents")
@click.argument("names", nargs=-1)
@click.option("--once", is_flag=True, help="Run each loop once, then exit.")
@click.pass_obj
@_friendly
def agents_command(settings: Settings, names: tuple[str, ...], once: bool) -> None:
    """Run the central loops (all, or the NAMES given): optimizer, director, pilots,
    submitpools, watchdog, priorities, cleanup, activity, sandboxes, purge. Intervals come
    from [agents] ([purge] interval for the purge); several agent processes may run at
    once."""
    from agents.context import AgentContext
    from agents.runner import Agents

    logging.getLogger("agents").setLevel(logging.INFO)
    schema.require_schema(settings.database)
    needs_secret = not names or "director" in names
    secret = settings.auth.signing_secret() if needs_secret else ""
    judge = None
    if settings.agents.metrics_bind:  # operators' tokens as the matcher's /metrics takes them
        from matcher.idp import IdentityProviders
        from matcher.service import metrics_token_judge

        with contextlib.suppress(ConfigurationError):  # no secret: metrics token, addresses
            judge = metrics_token_judge(secret or settings.auth.signing_secret(),
                                        IdentityProviders(settings.auth.issuers))
    ctx = AgentContext(settings, make_session_factory(engine_for(settings.database)),
                       secret=secret, metrics_judge=judge)
    try:
        runner = Agents(ctx, names)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    if once:
        for name, summary in runner.run_once().items():
            click.echo(f"{name}: {summary}")
    else:
        runner.run_forever()


@cli.group()
def token() -> None:
    """Bearer tokens for users, pilots and operators."""


@token.command("issue")
@click.option("--role", type=click.Choice(["user", "pilot", "operator"]), required=True)
@click.option("--subject", required=True,
              help="Who: the user's name (it owns the jobs it submits), the pilot's or "
                   "director's name, the operator's name.")
@click.option("--vo", default=None, help="VO (default: submit.vo).")
@click.option("--group", default=None, help="Group (default: submit.owner_group).")
@click.option("--site", default=None, help="Pilot tokens: the one site the pilot may match "
                                           "for.")
@click.option("--pilot", "pilot_reference", default=None,
              help="Pilot tokens: the one pilot reference the token speaks for.")
@click.option("--lifetime", type=click.IntRange(1), default=None,
              help="Seconds the token is valid (default: auth.token_lifetime).")
@click.pass_obj
@_friendly
def token_issue(settings: Settings, role: str, subject: str, vo: str | None,
                group: str | None, site: str | None, pilot_reference: str | None,
                lifetime: int | None) -> None:
    """Print a signed token made with the configured secret."""
    from matcher.auth import issue_token

    try:
        click.echo(issue_token(settings.auth.signing_secret(), subject=subject, role=role,
                               vo=vo or settings.submit.vo,
                               group=group or settings.submit.owner_group,
                               lifetime=lifetime or settings.auth.token_lifetime, site=site,
                               pilot=pilot_reference))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc


def _seeds(_ctx: click.Context, _param: click.Parameter, value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        seeds = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(f"a comma-separated list of integers, not {value!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise click.BadParameter(f"one or more different integers, not {value!r}")
    return seeds


@cli.command("simulate")
@click.option("--preset", default="drain-week", show_default=True,
              help="The site, workload and drain events (see --list-presets).")
@click.option("--list-presets", is_flag=True, help="List the presets and exit.")
@click.option("--seeds", callback=_seeds, default=None,
              help="Comma-separated seeds (default: the preset's); every policy runs on each.")
@click.option("--nodes", type=click.IntRange(1, 100_000), default=None,
              help="Worker nodes (default: the preset's).")
@click.option("--days", type=click.FloatRange(0, 365, min_open=True), default=None,
              help="Days measured after the warm-up (default: the preset's).")
@click.option("--policy", "policy_names", multiple=True,
              help="Run only this policy (repeatable; default: all of them).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder for the PNG plots and the JSON figures (created when missing).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click.option("--workers", type=click.IntRange(1, 256), default=None,
              help="Processes running the simulations (default: one per core).")
def simulate(preset: str, list_presets: bool, seeds: list[int] | None, nodes: int | None,
             days: float | None, policy_names: tuple[str, ...], out: Path | None,
             as_json: bool, workers: int | None) -> None:
    """Simulate a grid site running gridpilot's pilots and compare policies: asks aware of
    the time left or blind to it, drain victims by drain cost, kill cost, at random or oldest
    first, pilots with many payloads or one. Prints occupancy, wastes, killed and rescheduled
    jobs (mean ± 95% interval over the seeds)."""
    import dataclasses
    import json

    from simulator.config import POLICIES, PRESETS
    from simulator.report import compare, render_table

    if list_presets:
        for name, p in PRESETS.items():
            click.echo(f"{name}: {p.description}")
        return
    chosen = PRESETS.get(preset)
    if chosen is None:
        raise click.BadParameter(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}",
                                 param_hint="--preset")
    scenario = chosen.scenario
    if nodes is not None:
        scenario = dataclasses.replace(scenario, nodes=nodes,
                                       drain_nodes=min(scenario.drain_nodes, nodes))
    if days is not None:
        scenario = dataclasses.replace(scenario, days=days)
    policies = POLICIES
    if policy_names:
        known = {p.name: p for p in POLICIES}
        unknown = [n for n in policy_names if n not in known]
        if unknown:
            raise click.BadParameter(f"unknown policy {unknown[0]!r}; known: "
                                     f"{', '.join(known)}", param_hint="--policy")
        policies = tuple(known[n] for n in dict.fromkeys(policy_names))
    comparison = compare(scenario, policies, seeds or chosen.seeds, workers=workers)
    figures = comparison.as_dict()
    figures["preset"] = preset
    if out is not None:
        from simulator.plots import write_plots

        try:
            files = write_plots(comparison, out)
            (out / "figures.json").write_text(json.dumps(figures, indent=2) + "\n",
                                              encoding="utf-8")
        except OSError as exc:
            raise click.ClickException(f"cannot write into {out}: {exc.strerror or exc}"
                                       ) from exc
        figures["files"] = [str(f) for f in [*files, out / "figures.json"]]
    if as_json:
        click.echo(json.dumps(figures, indent=2))
    else:
        click.echo(render_table(comparison), nl=False)
        if out is not None:
            click.echo(f"written: {', '.join(figures['files'])}")


def main() -> None:
    sys.exit(cli())  # pragma: no cover
