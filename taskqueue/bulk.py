"""Inserting and selecting many rows with few round trips and short statements."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import (
    BindParameter,
    ColumnElement,
    Connection,
    Insert,
    Table,
    TypeDecorator,
    any_,
    bindparam,
    func,
    insert,
    select,
)
from sqlalchemy import types as sqltypes
from sqlalchemy.dialects.postgresql import ARRAY

#: Up to this many rows, a plain INSERT (executemany) is cheaper than building an unnest.
_FEW = 4


def insert_rows(conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert ``rows`` (dicts with the same keys) in as few statements as the database allows.

    PostgreSQL gets one ``INSERT … SELECT FROM unnest(array, …)`` with one array per column: a
    short statement whatever the number of rows. PyMySQL's executemany rewrites an INSERT into
    multi-row VALUES statements of up to a megabyte itself. Elsewhere an executemany with
    RETURNING takes SQLAlchemy's "insertmanyvalues" path (one multi-row VALUES statement per
    thousand rows); without RETURNING, such drivers send one statement per row.
    """
    if not rows:
        return
    if len(rows) <= _FEW:  # a plain INSERT: cached once compiled, cheaper to build
        conn.execute(insert(table), list(rows))
        return
    if conn.dialect.name == "postgresql":
        conn.execute(_unnest_insert(table, rows))
        return
    if conn.dialect.driver == "pymysql":
        conn.execute(insert(table), list(rows))
        return
    key = next(iter(table.primary_key.columns))
    conn.execute(insert(table).returning(key), list(rows))


def insert_rows_returning_ids(conn: Connection, table: Table,
                              rows: Sequence[Mapping[str, Any]]) -> list[int]:
    """Insert ``rows`` into a table with an autoincrement ``id``; return the ids in row order."""
    if not rows:
        return []
    if len(rows) == 1:
        return [conn.execute(insert(table).returning(table.c.id), rows[0]).scalar_one()]
    if conn.dialect.name == "postgresql":
        # Rows are inserted in array order, so the sequence hands out ascending ids in that
        # order (other inserters' ids may interleave, never reorder ours).
        return sorted(conn.execute(_unnest_insert(table, rows).returning(table.c.id)).scalars())
    if conn.dialect.name == "sqlite":
        # SQLAlchemy cannot promise SQLite's RETURNING order, so asked for it, it inserts a row
        # per statement. The transaction holds the database's only write lock and rowids are
        # handed out in VALUES order, so ascending ids are the rows' order (as on PostgreSQL).
        return sorted(conn.execute(insert(table).returning(table.c.id), list(rows)).scalars())
    result = conn.execute(
        insert(table).returning(table.c.id, sort_by_parameter_order=True), list(rows))
    return list(result.scalars())


def _unnest_insert(table: Table, rows: Sequence[Mapping[str, Any]]) -> Insert:
    names = list(rows[0])
    arrays = [_array_param(table.c[name], [row[name] for row in rows]) for name in names]
    source = (func.unnest(*arrays).table_valued(*names, with_ordinality="ord")
              .render_derived())
    return insert(table).from_select(
        names, select(*(source.c[n] for n in names)).order_by(source.c.ord))


def in_ids(column: ColumnElement[Any], ids: Sequence[int], dialect: str
           ) -> ColumnElement[bool]:
    """``column IN ids``, as ``= ANY(array)`` on PostgreSQL (one parameter, not thousands)."""
    if dialect == "postgresql":
        return column == any_(_array_param(column, list(ids)))
    return column.in_(ids)


def _array_param(column: ColumnElement[Any], values: list[Any]) -> BindParameter[Any]:
    col_type = column.type
    if isinstance(col_type, TypeDecorator):
        # Arrays do not run a decorator's conversion per element: do it here.
        values = [col_type.process_bind_param(v, None) for v in values]  # type: ignore[arg-type]
        col_type = col_type.impl_instance
    if isinstance(col_type, sqltypes.String):
        col_type = sqltypes.Text()
    return bindparam(None, values, type_=ARRAY(col_type))
