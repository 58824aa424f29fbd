"""gridpilot's replica catalogue: which storage elements (SEs) hold a replica of each file of
a VO, by its logical file name (LFN). Operators register and remove replicas (``gridpilot
replicas``, ``/api/v1/replicas``); the optimizer chain's data step looks them up through
optimizers.datalocation.

An LFN is an absolute path in the VO's namespace (``/lhcb/data/run1.dst``), written with or
without DIRAC's ``LFN:`` prefix; it is stored without it. An SE is named as in the resources
configuration's ``SE`` and ``CloseSE`` lists.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.orm import Session
from sqlalchemy.sql.dml import ReturningInsert

from taskqueue.core.errors import InvalidInputError
from taskqueue.db.models import FileReplica, file_replicas_table

#: Longest LFN accepted (the column), and most files or replicas one call may name.
MAX_LFN = 1024
MAX_PER_CALL = 10_000
_SE = re.compile(r"[A-Za-z0-9_.:+-]{1,64}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f\s]")
#: Keys looked up per statement (far below every database's limit on bound parameters).
_CHUNK = 500


@dataclass(frozen=True)
class Replica:
    lfn: str
    se: str
    registered_at: datetime


def normal_lfn(text: str) -> str:
    """An LFN as stored: without ``LFN:``, absolute, without spaces or control characters."""
    if not isinstance(text, str):
        raise InvalidInputError(f"an LFN must be text, got {type(text).__name__}")
    lfn = text[4:] if text[:4].upper() == "LFN:" else text
    shown = lfn if len(lfn) <= 80 else lfn[:77] + "..."
    if not lfn.startswith("/"):
        raise InvalidInputError(
            f"the LFN {shown!r} must be an absolute path in the VO's namespace, such as "
            "/lhcb/data/run1.dst (with or without LFN:)")
    if len(lfn) > MAX_LFN:
        raise InvalidInputError(f"the LFN {shown!r} is {len(lfn)} characters long; at most "
                                f"{MAX_LFN} are accepted")
    if _CONTROL.search(lfn) or "//" in lfn:
        raise InvalidInputError(f"the LFN {shown!r} must not hold spaces, control characters "
                                "or an empty path component (//)")
    return lfn


def normal_se(text: str) -> str:
    """A storage element's name: letters, digits and ._:+- (at most 64)."""
    if not isinstance(text, str) or not _SE.fullmatch(text):
        raise InvalidInputError(f"a storage element is named with letters, digits and ._:+- "
                                f"(at most 64), got {text!r}")
    return text


def lfn_key(lfn: str) -> str:
    return hashlib.sha256(lfn.encode("utf-8")).hexdigest()


def _pairs(pairs: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    out = list(dict.fromkeys((normal_lfn(lfn), normal_se(se)) for lfn, se in pairs))
    if len(out) > MAX_PER_CALL:
        raise InvalidInputError(f"{len(out)} replicas given; at most {MAX_PER_CALL} at once")
    return out


def add_replicas(session: Session, vo: str, pairs: Iterable[tuple[str, str]], *,
                 now: datetime) -> int:
    """Register replicas (LFN, SE) of ``vo``'s files; those already known are kept as they
    are. Returns how many this call inserted: the rows each statement added, never a count of
    the table, which concurrent calls change too."""
    wanted = _pairs(pairs)
    if not wanted:
        return 0
    rows = [{"vo": vo, "lfn_key": lfn_key(lfn), "se": se, "lfn": lfn, "registered_at": now}
            for lfn, se in wanted]
    dialect = session.get_bind().dialect.name
    added = 0
    for start in range(0, len(rows), _CHUNK):
        result = session.execute(_insert_if_absent(dialect, rows[start:start + _CHUNK]))
        if dialect == "mysql":  # INSERT IGNORE: the rows affected are the rows inserted
            added += result.rowcount  # type: ignore[attr-defined]
        else:  # ON CONFLICT DO NOTHING returns the rows inserted only
            added += len(result.all())
    return added


def _insert_if_absent(dialect: str, rows: list[dict[str, object]]
                      ) -> ReturningInsert[tuple[str]] | mysql.Insert:
    keys = ["vo", "lfn_key", "se"]
    key = file_replicas_table.c.lfn_key
    if dialect == "postgresql":
        return postgresql.insert(file_replicas_table).values(rows).on_conflict_do_nothing(
            index_elements=keys).returning(key)
    if dialect == "sqlite":
        return sqlite.insert(file_replicas_table).values(rows).on_conflict_do_nothing(
            index_elements=keys).returning(key)
    return mysql.insert(file_replicas_table).values(rows).prefix_with("IGNORE")


def remove_replicas(session: Session, vo: str, lfns: Iterable[str], *,
                    se: str | None = None) -> int:
    """Forget the replicas of ``lfns`` (at ``se`` only, when given); returns how many."""
    keys = list(dict.fromkeys(lfn_key(normal_lfn(lfn)) for lfn in lfns))
    if len(keys) > MAX_PER_CALL:
        raise InvalidInputError(f"{len(keys)} files given; at most {MAX_PER_CALL} at once")
    where_se = [] if se is None else [FileReplica.se == normal_se(se)]
    removed = 0
    for start in range(0, len(keys), _CHUNK):
        result = session.execute(delete(FileReplica).where(
            FileReplica.vo == vo, FileReplica.lfn_key.in_(keys[start:start + _CHUNK]),
            *where_se))
        removed += result.rowcount or 0  # type: ignore[attr-defined]
    return removed


def replica_sites(session: Session, vo: str, lfns: Sequence[str]
                  ) -> Mapping[str, frozenset[str]]:
    """The SEs holding a replica of each of ``lfns`` (stored form); a file with none is
    absent from the answer."""
    by_key = {lfn_key(lfn): lfn for lfn in lfns}
    keys = list(by_key)
    found: dict[str, set[str]] = {}
    for start in range(0, len(keys), _CHUNK):
        rows = session.execute(select(FileReplica.lfn_key, FileReplica.se).where(
            FileReplica.vo == vo, FileReplica.lfn_key.in_(keys[start:start + _CHUNK])))
        for key, se in rows:
            found.setdefault(by_key[key], set()).add(se)
    return {lfn: frozenset(ses) for lfn, ses in found.items()}


def list_replicas(session: Session, vo: str, *, lfns: Sequence[str] = (),
                  se: str | None = None, prefix: str | None = None, limit: int = 1000
                  ) -> list[Replica]:
    """Replicas of ``vo``, by LFN then SE: of the files named, at an SE, or under a path."""
    query = select(FileReplica).where(FileReplica.vo == vo)
    if lfns:
        query = query.where(FileReplica.lfn_key.in_(
            [lfn_key(normal_lfn(lfn)) for lfn in lfns][:MAX_PER_CALL]))
    if se is not None:
        query = query.where(FileReplica.se == normal_se(se))
    if prefix is not None:
        escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        query = query.where(FileReplica.lfn.like(escaped + "%", escape="\\"))
    rows = session.scalars(query.order_by(FileReplica.lfn, FileReplica.se).limit(limit))
    return [Replica(r.lfn, r.se, r.registered_at) for r in rows]
