"""Inserting and selecting many rows with few round trips and short statements."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BindParameter,
    ColumnElement,
    Connection,
    Insert,
    Table,
    TextClause,
    TypeDecorator,
    any_,
    bindparam,
    func,
    insert,
    select,
    text,
)
from sqlalchemy import types as sqltypes
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Dialect

#: Up to this many rows, a plain INSERT (executemany) is cheaper than building an unnest.
_FEW = 4


def insert_rows(conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert ``rows`` (dicts with the same keys) in as few statements as the database allows.

    PostgreSQL gets one ``INSERT … SELECT FROM unnest(array, …)`` with one array per column: a
    short statement whatever the number of rows; MariaDB one ``INSERT … SELECT FROM
    JSON_TABLE(document)``. Elsewhere an executemany with
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
    if conn.dialect.name == "mysql":
        conn.execute(_json_table_insert(conn.dialect, table, tuple(rows[0]), returning=False),
                     _document(table, rows))
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
    if conn.dialect.name == "mysql":
        # One statement, the rows in document order: MariaDB hands an INSERT ... SELECT
        # consecutive ascending ids (it holds the table's AUTO-INC lock for the statement).
        return sorted(conn.execute(
            _json_table_insert(conn.dialect, table, tuple(rows[0]), returning=True),
            _document(table, rows)).scalars())
    result = conn.execute(
        insert(table).returning(table.c.id, sort_by_parameter_order=True), list(rows))
    return list(result.scalars())


@functools.lru_cache(maxsize=64)
def _json_table_insert(dialect: Dialect, table: Table, names: tuple[str, ...], *,
                       returning: bool) -> TextClause:
    """MariaDB: the rows as one JSON document (an array of row arrays, :func:`_document`)
    read back with JSON_TABLE. PyMySQL escapes every value of a multi-row VALUES statement
    in Python, half of a 1,000-job bulk's time in the service; the json module writes the
    document in C, and the statement's text depends only on the table and the columns."""
    quote = dialect.identifier_preparer.quote
    columns = ", ".join(f"c{i} {_json_table_type(table.c[name].type, dialect)} PATH '$[{i}]'"
                        " ERROR ON ERROR" for i, name in enumerate(names))
    sql = (f"INSERT INTO {quote(table.name)} ({', '.join(quote(n) for n in names)}) "
           f"SELECT {', '.join(f'c{i}' for i in range(len(names)))} "
           f"FROM JSON_TABLE(:doc, '$[*]' COLUMNS (ord FOR ORDINALITY, {columns})) AS j "
           "ORDER BY ord")
    if returning:
        sql += f" RETURNING {quote(next(iter(table.primary_key.columns)).name)}"
    return text(sql)


def _json_table_type(column_type: sqltypes.TypeEngine[Any], dialect: Dialect) -> str:
    """A column's type as JSON_TABLE reads it: text as LONGTEXT and integers as DECIMAL(65,
    0), so that a value too long or too large for its column reaches the INSERT whole and is
    refused there, as in a one-row INSERT (JSON_TABLE itself cuts it to fit with a warning);
    any other value it cannot convert is an error (ERROR ON ERROR), not a NULL."""
    impl = column_type.impl_instance if isinstance(column_type, TypeDecorator) else column_type
    if isinstance(impl, sqltypes.String):
        return "LONGTEXT"
    if isinstance(impl, sqltypes.Integer):
        return "DECIMAL(65, 0)"
    return str(column_type.compile(dialect=dialect))  # a decorator's own (DATETIME(6))


def _document(table: Table, rows: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """The rows as the JSON document of :func:`_json_table_insert`: each value as its column
    binds it (a decorator's conversion applied), times as text MariaDB reads."""
    names = list(rows[0])
    decorators = [(i, t) for i, t in enumerate(table.c[n].type for n in names)
                  if isinstance(t, TypeDecorator)]
    values = [[row[n] for n in names] for row in rows]
    for i, col_type in decorators:
        for row_values in values:
            row_values[i] = col_type.process_bind_param(row_values[i], None)  # type: ignore[arg-type]
    return {"doc": json.dumps(values, default=_json_default, ensure_ascii=False,
                              separators=(",", ":"))}


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat(sep=" ", timespec="microseconds")
    raise TypeError(f"cannot store a {type(value).__name__} through JSON_TABLE")


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
