"""The one settings object, loaded once by an entry point and passed down.

Values come from, in rising precedence: the defaults below, a TOML file
(``conf/gridpilot.toml`` documents every key), and ``GRIDPILOT_<SECTION>_<KEY>`` environment
variables (``GRIDPILOT_DATABASE_URL`` overrides ``[database] url``). Library code never reads
the environment: only :func:`load_settings` does, with the mapping its caller hands it.
"""

from __future__ import annotations

import collections
import dataclasses
import ipaddress
import json
import math
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from taskqueue.core.errors import ConfigurationError

ENV_PREFIX = "GRIDPILOT_"

#: CPU-time segments in seconds (per core): 6 min, 30 min, 1 h, 2 h, 6 h, 12 h, 1 d, 2 d, 3 d,
#: 4 d, 6 d, 8 d, 10 d, 12.5 d. The reference system's, with 2 h added: a pilot in its last
#: hours (before its wall limit or a shutdown) otherwise takes only jobs of up to 1 h. Measured
#: with ``bench/match_rules.py`` (a week of a 100-node site): the 2 h segment raises the
#: occupancy of multi-payload pilots while work waits from 96.1% to 97.0%; more segments
#: below a day gain little more (97.2% with 2 h and 4 h) and let more jobs that run longer
#: than they asked reach the wall limit (19 a week instead of 11; 35 with ten segments below
#: a day), as a bucket close to a job's request leaves it no slack.
DEFAULT_CPU_SEGMENTS: tuple[int, ...] = (
    360, 1800, 3600, 7200, 21600, 43200, 86400, 172800, 259200, 345600, 518400, 691200,
    864000, 1080000,
)


#: How to make a secret, as every refusal says.
MAKE_SECRET = "python3 -c \"import secrets; print(secrets.token_urlsafe(32))\""
#: Least estimated entropy of a secret, in bits: a token_urlsafe(32) secret (43 characters)
#: scores 185 to 230, a phrase such as "api-signing-secret-0123456789" about 110.
MIN_SECRET_BITS = 128
#: Words that mark a shipped example value (compared without case and punctuation): the
#: placeholders of deploy/systemd/gridpilot.env.example and conf/gridpilot.toml among them.
PLACEHOLDER_MARKS = ("changeme", "replaceme", "placeholder", "yoursecret", "randomcharacters",
                     "xxxxxxxx")


def secret_bits(secret: str) -> float:
    """An estimate of a secret's entropy: its length times the Shannon entropy of its
    characters (0 for "aaaa...", about 4.9 bits a character for token_urlsafe output); a
    secret that repeats itself ("0123456789" * 4) counts its first repetition only."""
    period = next((p for p in range(1, len(secret) // 2 + 1)
                   if all(secret[i] == secret[i - p] for i in range(p, len(secret)))),
                  len(secret))
    unit = secret[:period]
    counts = collections.Counter(unit)
    n = len(unit)
    return max(0.0, -sum(c * math.log2(c / n) for c in counts.values()))


def check_secret(secret: str, where: str, env: str) -> None:
    """Refuse a shipped placeholder or a secret of low entropy, saying how to make one."""
    folded = "".join(ch for ch in secret.lower() if ch.isalnum())
    mark = next((m for m in PLACEHOLDER_MARKS if m in folded), None)
    how = f"set {env} to the output of '{MAKE_SECRET}'"
    if mark is not None:
        raise ConfigurationError(f"{where} is a placeholder (it contains {mark!r}), not a "
                                 f"secret: {how}")
    bits = secret_bits(secret)
    if bits < MIN_SECRET_BITS:
        raise ConfigurationError(
            f"{where} is too weak: {len(secret)} characters, about {bits:.0f} bits of entropy "
            f"(at least {MIN_SECRET_BITS} needed): {how}")


def url_password_placeholder(url: str) -> str | None:
    """The placeholder mark in a database URL's password, if it holds one."""
    rest = url.split("://", 1)[-1]
    if "@" not in rest:
        return None
    userinfo = rest.rsplit("@", 1)[0]
    if ":" not in userinfo:
        return None
    folded = "".join(ch for ch in userinfo.split(":", 1)[1].lower() if ch.isalnum())
    return next((m for m in PLACEHOLDER_MARKS if m in folded), None)


@dataclass(frozen=True)
class DatabaseSettings:
    #: SQLAlchemy URL; the embedded default is an SQLite file in the work folder.
    url: str = "sqlite:///work/gridpilot.db"
    #: Echo SQL statements to the log (debugging only).
    echo: bool = False
    #: Seconds to make a connection, to wait for a pooled one, and that the server lets one
    #: statement run (0: no limit) before the transaction fails with 503 "try again".
    connect_timeout: float = 5.0
    pool_timeout: float = 10.0
    statement_timeout: float = 20.0
    #: Seconds a request's statement may run before the service checks, on a connection of its
    #: own, that the database still answers (again every as many seconds): a database that
    #: does not answer fails the request with 503 "try again" then, instead of at the
    #: statement timeout; a statement the database is still running goes on (0: no check).
    liveness_after: float = 2.0
    #: The URL names a pooler in transaction mode (PgBouncer's pool_mode = transaction), not
    #: PostgreSQL itself: consecutive transactions of one connection may run on different
    #: server connections, so no statement is prepared on the server and no startup option is
    #: sent (the statement timeout is then the server's own: ALTER ROLE or ALTER DATABASE ...
    #: SET statement_timeout).
    transaction_pooler: bool = False

    def __post_init__(self) -> None:
        for name in ("connect_timeout", "pool_timeout", "statement_timeout", "liveness_after"):
            if getattr(self, name) < 0:
                raise ConfigurationError(
                    f"database.{name} must not be negative, got {getattr(self, name)}")
        if self.transaction_pooler and not self.url.startswith("postgresql"):
            raise ConfigurationError(
                "database.transaction_pooler is for a PostgreSQL URL that names a pooler "
                "such as PgBouncer (postgresql+psycopg://...), not for "
                f"{self.url.split(':', 1)[0]}")
        mark = url_password_placeholder(self.url)
        if mark is not None:
            raise ConfigurationError(
                f"database.url (GRIDPILOT_DATABASE_URL) holds a placeholder password (it "
                f"contains {mark!r}): set the database user's real password")


@dataclass(frozen=True)
class TaskQueueSettings:
    #: Upper bounds of the CPU-time buckets, in normalised seconds, ascending.
    cpu_time_segments: tuple[int, ...] = DEFAULT_CPU_SEGMENTS
    #: Significant bits kept when processors and memory are rounded up into buckets.
    significant_bits: int = 3
    #: Share of each owner group; a group not listed gets ``default_share``.
    shares: Mapping[str, float] = field(default_factory=dict)
    default_share: float = 1.0
    #: Groups whose members' jobs share task queues (no per-owner split).
    job_sharing_groups: tuple[str, ...] = ()
    #: Seconds an empty task queue is kept before it is deleted.
    empty_queue_grace: int = 600
    #: Seconds a SubmitPool without pending jobs is kept before it is deleted.
    submit_pool_grace: int = 3600
    #: Times a job may be rescheduled (by its owner, its pilot or an agent); the next
    #: reschedule fails it instead.
    max_reschedules: int = 3

    def __post_init__(self) -> None:
        segs = self.cpu_time_segments
        if not segs or any(s <= 0 for s in segs) or list(segs) != sorted(set(segs)):
            raise ConfigurationError(
                f"taskqueue.cpu_time_segments must be positive, strictly ascending seconds, "
                f"got {list(segs)}")
        if not 1 <= self.significant_bits <= 16:
            raise ConfigurationError(
                f"taskqueue.significant_bits must be between 1 and 16, got {self.significant_bits}")
        for group, share in self.shares.items():
            if share <= 0:
                raise ConfigurationError(
                    f"taskqueue.shares.{group} must be a positive number, got {share}")
        if self.default_share <= 0:
            raise ConfigurationError(
                f"taskqueue.default_share must be a positive number, got {self.default_share}")
        for name in ("empty_queue_grace", "submit_pool_grace", "max_reschedules"):
            if getattr(self, name) < 0:
                raise ConfigurationError(
                    f"taskqueue.{name} must not be negative, got {getattr(self, name)}")


@dataclass(frozen=True)
class ResourcesSettings:
    #: The resources configuration: sites, CEs, queues and their parameters (TOML).
    file: str = "conf/resources.toml"


@dataclass(frozen=True)
class SubmitSettings:
    """Whom ``gridpilot submit`` submits as when run by an operator on the service host (the
    HTTP API takes the identity from the caller's token instead)."""

    vo: str = "lhcb"
    owner_group: str = "lhcb_user"
    #: Empty: the login name of the user running the command.
    owner: str = ""
    #: Jobs the optimizer loop takes per transaction.
    optimizer_batch: int = 1000


def check_network(item: str, where: str) -> None:
    """Refuse ``item`` unless it is an IP address or network (``where`` names the setting)."""
    try:
        ipaddress.ip_network(item, strict=False)
    except ValueError as exc:
        raise ConfigurationError(
            f"{where}: {item!r} is not an address or network such as 127.0.0.1 or "
            "10.1.0.0/16") from exc


@dataclass(frozen=True)
class MatcherSettings:
    """The HTTP service (``gridpilot serve``)."""

    #: Where gunicorn listens, and the URL pilots and clients use to reach the service.
    bind: str = "127.0.0.1:8080"
    url: str = "http://127.0.0.1:8080"
    #: A PEM file, on the service's host, of the CA certificates that verify ``url``'s
    #: https certificate: the site director ships it with every pilot (``--ca-bundle``).
    #: Empty: pilots trust their node's CAs ($X509_CERT_DIR, else the system's store).
    ca_bundle: str = ""
    #: gunicorn worker processes; each holds its own database connections.
    workers: int = 2
    #: Threads per worker. 1: gunicorn's sync workers (one request at a time, a connection
    #: closed after each answer). More (the default, 4): its gthread workers, which answer
    #: other pilots while one request waits for the database, keep a pilot's connection open
    #: between its requests (no TCP connect and close for each one), and on PostgreSQL send
    #: the claims their threads make at once to the database as one group with one commit
    #: (taskqueue.db.groupcommit); each also keeps one more thread for /healthz, so that a
    #: balancer's check is answered while every request thread waits for a hung database.
    threads: int = 4
    #: Seconds a worker may spend on one request before gunicorn restarts it.
    timeout: int = 30
    #: Seconds a request may take to arrive, from its first byte to its last (head and body),
    #: before its connection is closed: a client sending part of a request and then nothing
    #: (or a byte at a time) no longer holds a request thread. Threaded workers only.
    read_timeout: float = 30.0
    #: Seconds after which /healthz answers 503 while a worker's request threads have had no
    #: room for another request (all busy with none coming free, or a request waiting for
    #: one), so that a balancer sends work elsewhere (0: never). Threaded workers only.
    starved_after: float = 10.0
    #: Where each request is logged (gunicorn's access log): a file, "-" for the standard
    #: output, empty for no access log.
    access_log: str = ""
    #: Requests after which a worker is replaced (bounds the ClassAd library's small leak).
    max_requests: int = 20000
    #: Largest request body accepted, in bytes.
    max_body_bytes: int = 1024 * 1024
    #: Most jobs one match request may ask for.
    max_jobs_per_match: int = 64
    #: Jobs and task queues listed per page by default, and at most.
    page_size: int = 100
    max_page_size: int = 1000
    #: Folder where each worker process leaves its metrics for /metrics to add up (created
    #: 0700; refused when it is a symbolic link or another user's); empty: "metrics" beside
    #: the SQLite database, or a new private temporary folder.
    metrics_dir: str = ""
    #: Who may scrape /metrics besides an operator token: a long-lived secret a scraper sends
    #: as its bearer token (at least 32 characters), and addresses or networks allowed without
    #: a token (the client's address: the connection's peer, or the address a trusted proxy
    #: forwards; e.g. ["127.0.0.1", "10.1.0.0/16"]).
    metrics_token: str = ""
    metrics_allow: tuple[str, ...] = ()
    #: Proxies in front of the service whose X-Forwarded-For, -Proto, -Host and -Port headers
    #: are believed (addresses or networks of the connection's peer): behind them the service
    #: knows the client's address and the URL and scheme the client used. None by default:
    #: the headers are ignored.
    trusted_proxies: tuple[str, ...] = ()
    #: VOs whose jobs go only to pilots that run payloads isolated from each other (they
    #: offer the tag "isolated", pilot.isolation): a pilot without it gets none of their jobs.
    isolation_required_vos: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.metrics_token and len(self.metrics_token) < 32:
            raise ConfigurationError("matcher.metrics_token must be at least 32 characters "
                                     "long (or empty: no metrics token)")
        if self.metrics_token:
            check_secret(self.metrics_token, "matcher.metrics_token",
                         "GRIDPILOT_MATCHER_METRICS_TOKEN")
        for name in ("metrics_allow", "trusted_proxies"):
            for item in getattr(self, name):
                check_network(item, f"matcher.{name}")
        for name in ("workers", "threads", "timeout", "max_body_bytes", "max_jobs_per_match",
                     "page_size", "max_page_size"):
            if getattr(self, name) < 1:
                raise ConfigurationError(
                    f"matcher.{name} must be at least 1, got {getattr(self, name)}")
        if not self.read_timeout > 0:
            raise ConfigurationError(
                f"matcher.read_timeout must be above 0 seconds, got {self.read_timeout}")
        if self.starved_after < 0:
            raise ConfigurationError(
                f"matcher.starved_after must not be negative, got {self.starved_after}")
        if self.page_size > self.max_page_size:
            raise ConfigurationError("matcher.page_size must not exceed matcher.max_page_size")


#: Signature algorithms an identity provider's tokens may use (never HS*, never none).
ISSUER_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "ES256", "ES384")


@dataclass(frozen=True)
class IssuerSettings:
    """A VO's identity provider whose tokens (WLCG profile JWTs) the matcher accepts, verified
    with the public keys it publishes (JWKS), and how their claims map onto gridpilot's."""

    #: The token's ``iss``, exactly (e.g. "https://lhcb-auth.example.org/").
    issuer: str = ""
    #: Where the issuer publishes its keys (its OpenID configuration's jwks_uri).
    jwks_url: str = ""
    #: The token's ``aud`` must hold one of these (e.g. the service URL, or
    #: "https://wlcg.cern.ch/jwt/v1/any").
    audiences: tuple[str, ...] = ()
    algorithms: tuple[str, ...] = ("RS256", "ES256")
    #: The VO every token of this issuer acts for.
    vo: str = ""
    #: ``wlcg.groups`` values → gridpilot group; the token's first listed group found here wins.
    groups: Mapping[str, str] = field(default_factory=dict)
    #: Groups whose members act as operators, or as pilots; everyone else is a user.
    operator_groups: tuple[str, ...] = ()
    pilot_groups: tuple[str, ...] = ()
    #: The claim that names the caller (the owner of the jobs it submits).
    subject_claim: str = "sub"
    #: Seconds a fetched key set is used before it is fetched again (a removed key stops
    #: working after at most this long) ...
    jwks_lifetime: int = 300
    #: ... and the least seconds between two fetches caused by a key the set does not hold.
    refetch_interval: int = 30
    #: Seconds to wait for the key set, and clock skew allowed on exp/nbf/iat.
    timeout: float = 5.0
    leeway: int = 60

    def __post_init__(self) -> None:
        where = f"auth.issuers[{self.issuer or '?'}]"
        for name in ("issuer", "jwks_url", "vo"):
            if not getattr(self, name).strip():
                raise ConfigurationError(f"{where}.{name} must be set")
        if not self.jwks_url.startswith(("https://", "http://")):
            raise ConfigurationError(f"{where}.jwks_url must be an http(s) URL, got "
                                     f"{self.jwks_url!r}")
        if not self.audiences:
            raise ConfigurationError(f"{where}.audiences must name at least one audience")
        if not self.groups:
            raise ConfigurationError(f"{where}.groups must map at least one of the token's "
                                     "wlcg.groups onto a gridpilot group")
        bad = [a for a in self.algorithms if a not in ISSUER_ALGORITHMS]
        if bad or not self.algorithms:
            raise ConfigurationError(f"{where}.algorithms must be among "
                                     f"{', '.join(ISSUER_ALGORITHMS)}, got {bad or '[]'}")
        for name in ("jwks_lifetime", "refetch_interval", "leeway"):
            if getattr(self, name) < 0:
                raise ConfigurationError(f"{where}.{name} must not be negative")
        if self.timeout <= 0:
            raise ConfigurationError(f"{where}.timeout must be positive")


@dataclass(frozen=True)
class AuthSettings:
    """Bearer tokens: signed JWTs (HS256) carrying a role, a VO, a group and a subject, and
    tokens of the VOs' identity providers (``issuers``)."""

    #: The signing secret; keep it out of files others can read (GRIDPILOT_AUTH_SECRET).
    secret: str = ""
    #: Or a file holding it (first line), for deployments that mount secrets as files.
    secret_file: str = ""
    #: Seconds a token issued by ``gridpilot token issue`` stays valid by default.
    token_lifetime: int = 86400
    #: Identity providers whose tokens are accepted too (``[[auth.issuers]]`` tables).
    issuers: tuple[IssuerSettings, ...] = ()

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for issuer in self.issuers:
            if issuer.issuer == "gridpilot":
                raise ConfigurationError("auth.issuers: 'gridpilot' is this service's own issuer")
            if issuer.issuer in seen:
                raise ConfigurationError(f"auth.issuers: {issuer.issuer} is listed twice")
            seen.add(issuer.issuer)

    def signing_secret(self) -> str:
        """The secret, read from ``secret_file`` when that is set; refuses an empty one."""
        secret = self.secret
        if self.secret_file:
            try:
                secret = Path(self.secret_file).read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise ConfigurationError(
                    f"auth.secret_file {self.secret_file} cannot be read: {exc}") from exc
        where = f"auth.secret_file {self.secret_file}" if self.secret_file else "auth.secret"
        if len(secret) < 16:
            raise ConfigurationError(
                "auth.secret (or auth.secret_file) must hold a secret of at least 16 "
                "characters: set GRIDPILOT_AUTH_SECRET, e.g. to the output of "
                f"'{MAKE_SECRET}'")
        check_secret(secret, where, "GRIDPILOT_AUTH_SECRET")
        return secret


@dataclass(frozen=True)
class AgentSettings:
    """The central loops of ``gridpilot agents``; intervals in seconds."""

    #: The VO whose pilots the site director submits.
    vo: str = "lhcb"
    optimizer_interval: int = 10
    director_interval: int = 60
    pilot_status_interval: int = 60
    submit_pool_interval: int = 900
    watchdog_interval: int = 60
    priorities_interval: int = 300
    cleanup_interval: int = 300
    #: The dashboard's counters and job-count snapshots (taskqueue.pilots.activity).
    activity_interval: int = 60
    #: Seconds a loop's turn is held without a heartbeat: the process running a loop renews
    #: its turn every third of this, so a killed agent's turn is free this long after.
    turn_lease: int = 90
    #: A Running or Matched job without a heartbeat for this long becomes Stalled ...
    job_lease: int = 1800
    #: ... and one Stalled for this much longer is rescheduled (or failed at the maximum).
    stalled_limit: int = 1800
    #: A Matched job its pilot neither reported Running nor beat for since the match goes
    #: back to its queue after this long: a match counts once its pilot confirms it.
    matched_lease: int = 120
    #: A Waiting job no configured queue can run has a minor status that says so; 0 keeps it
    #: waiting, N > 0 fails it after N seconds so.
    unrunnable_timeout: int = 0
    #: Pilots one cycle submits to one queue at most, and the default caps per queue (a
    #: queue's MaxWaitingPilots / MaxTotalPilots parameters override them).
    pilots_per_cycle: int = 10
    max_waiting_pilots: int = 10
    max_total_pilots: int = 100
    #: After a failed submission a queue is skipped for this long (doubling per failure, up
    #: to 16 times).
    failure_backoff: int = 120
    #: Pilots of a queue that end in a row before they reach the matcher (failed starts: the
    #: pilot command dies at once, the node lacks what it needs) that stop the queue's
    #: submissions until an operator retries it or one of its pilots reaches the matcher;
    #: 0 never stops.
    failed_starts: int = 3
    #: Seconds a pilot token is valid, and the pilot's own idle timeout.
    pilot_token_lifetime: int = 86400
    pilot_idle_timeout: int = 120
    #: Where PSI/J's local executor runs pilots, and batch pilots write their output.
    pilot_workdir: str = "work/pilots"
    #: The command that starts a pilot on the worker node. Default: for PSI/J executors this
    #: Python with -m pilot.cli (right for the local executor and a shared software area);
    #: for ARC-CEs the pilot bundle shipped with each pilot, run by the node's python3.
    pilot_command: tuple[str, ...] = ()
    #: Give pilots their queue's SubmitPools (true), or let them ask the matcher themselves.
    pass_submit_pools: bool = True
    #: Seconds one request to a compute element (an ARC-CE's REST interface) may take.
    ce_timeout: int = 30
    #: Seconds one CE's requests may take in all in one turn of the director or the pilots
    #: loop; what is left waits for the next turn, so a slow CE cannot hold the others.
    ce_turn_budget: int = 60
    #: Seconds between two reads of a CE's own state (an ARC-CE's GLUE2 running and waiting
    #: jobs per queue), which the director's decision heeds; 0: never read.
    ce_info_period: int = 180
    #: Bytes kept of an ended pilot's standard output, and as many of its standard error
    #: (their ends, which say why it stopped).
    pilot_log_bytes: int = 1024 * 1024
    #: A pilot that said it ended is followed this long for its CE to confirm it (and give
    #: its output); then it is left alone without a log.
    pilot_log_patience: int = 86400
    #: Seconds a pilot may stay in one state of its CE before the pilots loop kills it
    #: through the CE, counts it and says where it hung (0: never). Stage: the CE's own
    #: steps before the batch system has the pilot (an ARC-CE's ACCEPTING, ACCEPTED,
    #: PREPARING, PREPARED, SUBMITTING), which take seconds when the CE works. Held: held in
    #: the batch system (ARC's HELD), which only a person ends. Queued: waiting in the batch
    #: system's queue (ARC's QUEUING, PSI/J's QUEUED), which is normal at a busy site: the
    #: default leaves it a day, half a pilot token's life.
    pilot_stage_timeout: int = 900
    pilot_held_timeout: int = 3600
    pilot_queued_timeout: int = 86400
    #: Where ``gridpilot agents`` answers Prometheus (host:port; empty: nowhere), for the
    #: scrapers the matcher admits to its /metrics ([matcher] metrics_token, metrics_allow).
    metrics_bind: str = ""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, int) and not isinstance(value, bool) and value < 0:
                raise ConfigurationError(f"agents.{f.name} must not be negative, got {value}")
        if self.ce_timeout < 1:
            raise ConfigurationError(
                f"agents.ce_timeout must be at least 1 second, got {self.ce_timeout}")
        if self.ce_turn_budget < 1:
            raise ConfigurationError(
                f"agents.ce_turn_budget must be at least 1 second, got {self.ce_turn_budget}")
        if self.turn_lease < 3:
            raise ConfigurationError(
                f"agents.turn_lease must be at least 3 seconds, got {self.turn_lease}")
        if self.metrics_bind:
            host_and_port(self.metrics_bind, "agents.metrics_bind")


def host_and_port(text: str, where: str) -> tuple[str, int]:
    """``text`` as (host, port): "127.0.0.1:9110", "[::1]:9110", "agents.example.org:9110";
    anything else is refused, naming ``where``."""
    host, sep, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]") if host.startswith("[") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or any(
            c.isspace() or c in "/@[]" for c in host):
        raise ConfigurationError(f"{where} must be host:port, such as 127.0.0.1:9110, got "
                                 f"{text!r}")
    return host, int(port)


@dataclass(frozen=True)
class DashboardSettings:
    """The operators' web pages under /ui/ and the history their charts show."""

    #: Seconds a sign-in lasts (never longer than the token it was made with).
    session_lifetime: int = 3600
    #: Rows per page of the lists.
    page_size: int = 50
    #: Seconds the per-minute counters and snapshots are kept, then the hourly and the daily
    #: ones (the activity loop prunes older rows).
    minute_retention: int = 172800
    hour_retention: int = 5184000
    day_retention: int = 69120000

    def __post_init__(self) -> None:
        for name in ("session_lifetime", "page_size"):
            if getattr(self, name) < 1:
                raise ConfigurationError(
                    f"dashboard.{name} must be at least 1, got {getattr(self, name)}")
        # An hour is summed from its minutes and a day from its hours while they last.
        for name, least in (("minute_retention", 7200), ("hour_retention", 172800),
                            ("day_retention", 172800)):
            if getattr(self, name) < least:
                raise ConfigurationError(
                    f"dashboard.{name} must be at least {least} seconds, got "
                    f"{getattr(self, name)}")


@dataclass(frozen=True)
class SandboxSettings:
    """Where the files jobs take in and bring back are kept (taskqueue.files.sandboxstore)."""

    #: "local": a folder on the service host, shared by its matcher processes; "s3": an
    #: S3-compatible object store (pilots and clients move the bytes through presigned URLs).
    backend: str = "local"
    #: The local folder; empty: "sandboxes" beside the SQLite database, or work/sandboxes.
    directory: str = ""
    #: The S3 bucket, the endpoint (empty: AWS itself) and region; credentials come from the
    #: usual AWS environment variables or files.
    bucket: str = "gridpilot-sandboxes"
    endpoint_url: str = ""
    region: str = "us-east-1"
    #: Seconds a presigned URL stays valid.
    url_lifetime: int = 3600
    #: Largest sandbox one upload may bring, in bytes (DIRAC's default: 10 MiB).
    max_upload_bytes: int = 10 * 1024 * 1024
    #: Bytes of sandboxes one user may own at once (0: no quota); output sandboxes that
    #: pilots upload for the user's jobs do not count.
    user_quota_bytes: int = 1024 * 1024 * 1024
    #: Seconds a sandbox is kept after the last job referencing it ended (or after its upload,
    #: when no job ever referenced it).
    retention: int = 7 * 86400
    #: Seconds between two sweeps of the whole store for objects no record names (each lists
    #: every stored object: on S3 one request per thousand); 0: at every cleanup turn.
    sweep_interval: int = 86400
    #: Limits when a sandbox is unpacked: bytes of files and number of members.
    max_unpacked_bytes: int = 1024 * 1024 * 1024
    max_members: int = 10000

    def __post_init__(self) -> None:
        if self.backend not in ("local", "s3"):
            raise ConfigurationError(
                f"sandboxes.backend must be local or s3, got {self.backend!r}")
        for name in ("url_lifetime", "max_upload_bytes", "max_unpacked_bytes", "max_members"):
            if getattr(self, name) < 1:
                raise ConfigurationError(
                    f"sandboxes.{name} must be at least 1, got {getattr(self, name)}")
        for name in ("user_quota_bytes", "retention", "sweep_interval"):
            if getattr(self, name) < 0:
                raise ConfigurationError(
                    f"sandboxes.{name} must not be negative, got {getattr(self, name)}")
        if self.backend == "s3" and not self.bucket:
            raise ConfigurationError("sandboxes.bucket must name a bucket for the s3 backend")


@dataclass(frozen=True)
class CatalogueSettings:
    """Where the optimizer chain looks up the replicas of jobs' input files
    (optimizers.datalocation)."""

    #: "database": gridpilot's own catalogue (``gridpilot replicas``); "rucio": a Rucio server.
    backend: str = "database"
    #: The Rucio server and its authentication server (empty: the same).
    rucio_url: str = ""
    rucio_auth_url: str = ""
    #: The Rucio account gridpilot acts as, and the user name and password it signs in with
    #: (the password from a file: GRIDPILOT_CATALOGUE_RUCIO_PASSWORD_FILE).
    rucio_account: str = ""
    rucio_username: str = ""
    rucio_password_file: str = ""
    #: Seconds a call to Rucio may take.
    rucio_timeout: int = 30

    def __post_init__(self) -> None:
        if self.backend not in ("database", "rucio"):
            raise ConfigurationError(
                f"catalogue.backend must be database or rucio, got {self.backend!r}")
        if self.backend == "rucio":
            for name in ("rucio_url", "rucio_account", "rucio_username", "rucio_password_file"):
                if not getattr(self, name):
                    raise ConfigurationError(f"catalogue.{name} must be set for the rucio "
                                             "backend")
        if self.rucio_timeout < 1:
            raise ConfigurationError(
                f"catalogue.rucio_timeout must be at least 1, got {self.rucio_timeout}")

    def rucio_password(self) -> str:
        """The password, read from ``rucio_password_file`` (first line)."""
        try:
            return Path(self.rucio_password_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigurationError(f"catalogue.rucio_password_file "
                                     f"{self.rucio_password_file} cannot be read: {exc}") from exc


@dataclass(frozen=True)
class PurgeSettings:
    """The purge loop (``gridpilot agents purge``): jobs that ended longer ago than their
    status's retention are removed with their history, queue rows and sandbox references
    (taskqueue.queues.purge). Retentions in days; 0 keeps the jobs of that status for ever."""

    done: int = 30
    killed: int = 30
    failed: int = 60
    deleted: int = 1
    #: Jobs removed per transaction (each batch is its own short transaction).
    batch: int = 500
    #: Seconds the loop waits between two batches (DIRAC's ThrottlingPeriod): on a small
    #: server, a pause leaves the claims their share of its CPU and disk.
    pause: float = 0.0
    #: Seconds between two turns of the loop.
    interval: int = 3600

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if getattr(self, f.name) < 0:
                raise ConfigurationError(
                    f"purge.{f.name} must not be negative, got {getattr(self, f.name)}")
        if self.batch < 1:
            raise ConfigurationError(f"purge.batch must be at least 1, got {self.batch}")

    def retentions(self) -> dict[str, int]:
        """Days of retention per final status, for the statuses that are purged at all."""
        days = {"Done": self.done, "Killed": self.killed, "Failed": self.failed,
                "Deleted": self.deleted}
        return {status: d for status, d in days.items() if d > 0}


#: The WLCG profile's audience that any service accepts.
ANY_AUDIENCE = "https://wlcg.cern.ch/jwt/v1/any"


@dataclass(frozen=True)
class TokenSettings:
    """Tokens the service issues to payloads for their jobs' owners (WLCG profile, ES256,
    verifiable by any service through ``/.well-known/openid-configuration``)."""

    #: Whether each payload gets a token in ``$BEARER_TOKEN_FILE``.
    payload_tokens: bool = True
    #: Seconds a payload's token is valid; the pilot replaces it before it expires.
    payload_lifetime: int = 1200
    #: The tokens' ``aud``.
    payload_audience: tuple[str, ...] = (ANY_AUDIENCE,)
    #: The scopes a payload's token grants, ``{vo}`` and ``{owner}`` filled in; a job may
    #: narrow them (``TokenScopes``), never widen them.
    storage_scopes: tuple[str, ...] = ("storage.read:/", "storage.create:/{vo}/user/{owner}")
    #: Per VO, scopes instead of ``storage_scopes``.
    vo_storage_scopes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: The tokens' ``iss``: a URL where ``/.well-known/openid-configuration`` is served.
    #: Empty: ``[matcher] url``.
    issuer: str = ""
    #: Seconds a signing key signs; then a new one does, and the old one stays published until
    #: the last token it signed has expired.
    key_rotation: int = 604800

    def __post_init__(self) -> None:
        for name in ("payload_lifetime", "key_rotation"):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"tokens.{name} must be at least 1 second, got "
                                         f"{getattr(self, name)}")
        if not self.payload_audience:
            raise ConfigurationError("tokens.payload_audience must name at least one audience")
        for where, scopes in (("storage_scopes", self.storage_scopes),
                              *((f"vo_storage_scopes.{vo}", v)
                                for vo, v in self.vo_storage_scopes.items())):
            for scope in scopes:
                if not scope.strip() or any(c.isspace() for c in scope):
                    raise ConfigurationError(f"tokens.{where}: {scope!r} is not a scope (one "
                                             "word, e.g. storage.read:/)")
        if self.issuer and not self.issuer.startswith(("https://", "http://")):
            raise ConfigurationError(f"tokens.issuer must be an http(s) URL, got "
                                     f"{self.issuer!r}")


@dataclass(frozen=True)
class Settings:
    database: DatabaseSettings = field(default_factory=DatabaseSettings)
    taskqueue: TaskQueueSettings = field(default_factory=TaskQueueSettings)
    resources: ResourcesSettings = field(default_factory=ResourcesSettings)
    submit: SubmitSettings = field(default_factory=SubmitSettings)
    matcher: MatcherSettings = field(default_factory=MatcherSettings)
    auth: AuthSettings = field(default_factory=AuthSettings)
    agents: AgentSettings = field(default_factory=AgentSettings)
    dashboard: DashboardSettings = field(default_factory=DashboardSettings)
    sandboxes: SandboxSettings = field(default_factory=SandboxSettings)
    catalogue: CatalogueSettings = field(default_factory=CatalogueSettings)
    purge: PurgeSettings = field(default_factory=PurgeSettings)
    tokens: TokenSettings = field(default_factory=TokenSettings)

    def group_shares_jobs(self, group: str) -> bool:
        return group in self.taskqueue.job_sharing_groups

    def share_of(self, group: str) -> float:
        return self.taskqueue.shares.get(group, self.taskqueue.default_share)


def load_settings(path: Path | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """Build the settings from an optional TOML file and an environment mapping. Relative
    paths in the file (the SQLite database, the resources file, the secret file, the metrics
    and pilot folders) count from the file's folder."""
    raw: dict[str, Any] = {}
    origin = "defaults"
    if path is not None:
        origin = str(path)
        try:
            raw = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise ConfigurationError(f"settings file {path} does not exist") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigurationError(f"settings file {path} is not valid TOML: {exc}") from exc
    if path is not None:
        _resolve_paths(raw, path.resolve().parent)
    sections: dict[str, Any] = {}
    for sec in dataclasses.fields(Settings):
        sec_cls = _section_class(sec)
        values = raw.pop(sec.name, {})
        if not isinstance(values, dict):
            raise ConfigurationError(f"{origin}: [{sec.name}] must be a table")
        sections[sec.name] = _build_section(sec_cls, sec.name, values, origin, environ or {})
    if raw:
        unknown = ", ".join(sorted(raw))
        raise ConfigurationError(f"{origin}: unknown section or key {unknown}")
    return Settings(**sections)


#: Settings that name a file or folder: a relative one in a settings file counts from that
#: file's folder (from the current directory when it comes from the environment or the
#: defaults).
PATH_SETTINGS = (("resources", "file"), ("auth", "secret_file"), ("matcher", "metrics_dir"),
                 ("matcher", "ca_bundle"),
                 ("agents", "pilot_workdir"), ("catalogue", "rucio_password_file"))
SQLITE_PREFIX = "sqlite:///"


def _resolve_paths(raw: dict[str, Any], folder: Path) -> None:
    for section, key in PATH_SETTINGS:
        values = raw.get(section)
        if isinstance(values, dict) and isinstance(values.get(key), str) and values[key]:
            values[key] = str(folder / Path(values[key]).expanduser())
    database = raw.get("database")
    if not isinstance(database, dict):
        return
    url = database.get("url")
    if isinstance(url, str) and url.startswith(SQLITE_PREFIX):
        # sqlite:///relative/file or sqlite:////absolute/file (and :memory:, left alone)
        file = url[len(SQLITE_PREFIX):]
        name, sep, query = file.partition("?")
        if name and name != ":memory:" and not name.startswith("/"):
            database["url"] = f"{SQLITE_PREFIX}{folder / name}{sep}{query}"


def _section_class(f: dataclasses.Field[Any]) -> type[Any]:
    hints = typing.get_type_hints(Settings)
    cls = hints[f.name]
    assert isinstance(cls, type)
    return cls


def _build_section(cls: type[Any], section: str, values: dict[str, Any], origin: str,
                   environ: Mapping[str, str]) -> Any:
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigurationError(f"{origin}: unknown key {section}.{unknown[0]}")
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        env_name = f"{ENV_PREFIX}{section}_{f.name}".upper()
        if env_name in environ:
            where, value = f"environment variable {env_name}", _parse_env(environ[env_name])
        elif f.name in values:
            where, value = f"{origin}: {section}.{f.name}", values[f.name]
        else:
            continue
        kwargs[f.name] = _coerce(hints[f.name], value, where)
    return cls(**kwargs)


def _parse_env(text: str) -> Any:
    """Environment values are JSON where they parse as JSON (numbers, lists, tables)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _coerce(hint: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in {"true", "false", "1", "0"}:
            return value.lower() in {"true", "1"}
        raise ConfigurationError(f"{where} must be true or false, got {value!r}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigurationError(f"{where} must be an integer, got {value!r}")
    if hint is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise ConfigurationError(f"{where} must be a number, got {value!r}")
    if hint is str:
        if isinstance(value, str):
            return value
        raise ConfigurationError(f"{where} must be a string, got {value!r}")
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise ConfigurationError(f"{where} must be a table, got {value!r}")
        hints = typing.get_type_hints(hint)
        known = {f.name for f in dataclasses.fields(hint)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ConfigurationError(f"{where}: unknown key {unknown[0]}")
        return hint(**{k: _coerce(hints[k], v, f"{where}.{k}") for k, v in value.items()})
    if origin is tuple:
        (item,) = {a for a in typing.get_args(hint) if a is not Ellipsis}
        if not isinstance(value, list):
            raise ConfigurationError(f"{where} must be a list, got {value!r}")
        return tuple(_coerce(item, v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin in (Mapping, dict, types.MappingProxyType) or origin is typing.get_origin(
        Mapping[str, float]
    ):
        _, item = typing.get_args(hint)
        if not isinstance(value, dict):
            raise ConfigurationError(f"{where} must be a table, got {value!r}")
        return types.MappingProxyType(
            {str(k): _coerce(item, v, f"{where}.{k}") for k, v in value.items()}
        )
    raise ConfigurationError(f"{where}: unsupported setting type {hint!r}")
