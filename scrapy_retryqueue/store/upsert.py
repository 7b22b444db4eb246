"""The store writer's SQL: rows of a batch upserted into the tasks table.

:func:`apply_batch` writes the rows :mod:`.writer` built, generation by
generation, with one INSERT ... ON CONFLICT DO UPDATE each that only a newer
event applies. On psycopg2 and SQLite's sqlite3 the statement, compiled once
by SQLAlchemy, goes through the driver itself with many rows per statement
(SQLAlchemy's executemany converted every row's parameters in Python);
elsewhere SQLAlchemy executes it. :func:`sweep_statement` is the upsert of a
dead letter whose event was trimmed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from datetime import datetime
from operator import itemgetter
from typing import Any

from sqlalchemy import (
    Column,
    DateTime,
    MetaData,
    Table,
    Text,
    case,
    cast,
    func,
    literal,
    tuple_,
)
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from .models import JsonColumn, UTCDateTime, tasks_table
from .writer import ALWAYS, COLUMNS, KNOWN, Batch


def _write_type(column: Any) -> Any:
    # Rows arrive ready for the wire: JSON as text (the envelope as Redis held
    # it, not decoded and encoded again), datetimes already in UTC.
    if isinstance(column.type, UTCDateTime):
        return DateTime(timezone=True)
    if isinstance(column.type, JsonColumn):
        return Text()
    return column.type


#: The tasks table as the writer sees it (same name and columns, wire types).
write_table = Table(
    tasks_table.name,
    MetaData(),
    *(Column(c.name, _write_type(c), primary_key=c.primary_key) for c in tasks_table.columns),
)


def _history_append(dialect: str, table: Any) -> Any:
    """``history`` with the stored life appended (for a dead task that lives again)."""
    c = table.c
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import JSONB

        entry = func.jsonb_build_object(
            "status", c.status,
            "kind", c.kind,
            "attempts", c.attempts,
            "finished_at", c.finished_at,
            "last_error_type", c.last_error_type,
            "last_error_message", c.last_error_message,
            "last_error_status", c.last_error_status,
        )  # fmt: skip
        base = func.coalesce(c.history, cast(literal("[]"), JSONB))
        return base.op("||")(func.jsonb_build_array(entry))
    entry = func.json_object(
        "status", c.status,
        "kind", c.kind,
        "attempts", func.json(func.coalesce(c.attempts, "null")),
        "finished_at", c.finished_at,
        "last_error_type", c.last_error_type,
        "last_error_message", c.last_error_message,
        "last_error_status", c.last_error_status,
    )  # fmt: skip
    return func.json_insert(func.coalesce(c.history, "[]"), "$[#]", entry)


def _insert_of(dialect: str) -> Any:
    """The dialect's INSERT with ON CONFLICT; PostgreSQL's imported only for it
    (models.JsonColumn says why)."""
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert

        return insert
    return sqlite.insert


def upsert_statement(dialect: str, *, returning: bool = True) -> Any:
    """INSERT ... ON CONFLICT (spider, task_id) DO UPDATE, applied only by a newer event."""
    table = write_table
    insert = _insert_of(dialect)
    stmt = insert(table)
    excluded = stmt.excluded
    c = table.c
    # The stored death ends: the task lives again, or died another death.
    revived = (c.status == "dead") & (
        (excluded.status != "dead") | (excluded.finished_at != c.finished_at)
    )
    values: dict[str, Any] = {name: excluded[name] for name in ALWAYS}
    for name in KNOWN:
        values[name] = func.coalesce(excluded[name], c[name])
    values["created_at"] = case(
        (excluded.created_at < c.created_at, excluded.created_at), else_=c.created_at
    )
    values["history"] = case((revived, _history_append(dialect, table)), else_=c.history)
    newer = tuple_(c.event_ms, c.event_seq) < tuple_(excluded.event_ms, excluded.event_seq)
    stmt = stmt.on_conflict_do_update(
        index_elements=[c.spider, c.task_id], set_=values, where=newer
    )
    if returning:
        stmt = stmt.returning(c.spider, c.task_id, c.status, c.event_ms, c.event_seq)
    return stmt


def apply_batch(conn: Connection, batch: Batch) -> set[tuple[str, str, int, int]]:
    """Write *batch* in the caller's transaction; returns what was applied
    as (spider, task id, event ms, event seq) of each row written."""
    applied: set[tuple[str, str, int, int]] = set()
    if not batch.generations:
        return applied
    driver = (conn.dialect.name, conn.dialect.driver)
    fast = _FAST_UPSERTS.get(driver)
    stmt = None if fast else upsert_statement(conn.dialect.name)
    for rows in batch.generations:
        if not rows:
            continue
        if fast:
            result: Iterable[Any] = fast(conn, rows)
        else:
            result = conn.execute(stmt, rows)
        for spider, task_id, _status, ms, seq in result:
            applied.add((spider, task_id, ms, seq))
    return applied


def _values_of(sql: str, driver: str) -> tuple[re.Match[str], list[str]]:
    """The compiled upsert's ``VALUES (...)`` (group 2) and its columns, where a
    driver's own upsert puts its rows."""
    match = re.search(
        rf"INSERT INTO {write_table.name} \((.*?)\) VALUES (\(.*?\)) ON CONFLICT", sql, re.S
    )
    if match is None:  # pragma: no cover - a SQLAlchemy that renders differently
        raise RuntimeError(f"cannot prepare the store's upsert for {driver}")
    return match, [c.strip() for c in match.group(1).split(",")]


_PSYCOPG2_UPSERT: tuple[str, list[str]] | None = None


def _psycopg2_upsert_sql(cursor: Any) -> tuple[str, list[str]]:
    """The upsert as SQL for psycopg2's execute_values: ``VALUES %s`` and its columns.

    Compiled from :func:`upsert_statement` (one source of truth), with its
    constants inlined; SQLAlchemy's executemany costs about half the writer's
    time on a batch, execute_values a fraction of it.
    """
    global _PSYCOPG2_UPSERT
    if _PSYCOPG2_UPSERT is None:
        from sqlalchemy.dialects.postgresql import psycopg2 as pg_driver

        compiled = upsert_statement("postgresql").compile(
            dialect=pg_driver.dialect(), column_keys=list(COLUMNS)
        )
        match, columns = _values_of(compiled.string, "psycopg2")
        constants = {k: v for k, v in compiled.params.items() if k not in columns}
        marker = "__retryqueue_values__"
        sql = compiled.string.replace(match.group(2), marker, 1)
        sql = cursor.mogrify(sql, constants).decode()
        _PSYCOPG2_UPSERT = (sql.replace("%", "%%").replace(marker, "%s"), columns)
    return _PSYCOPG2_UPSERT


def _upsert_psycopg2(conn: Connection, rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    import psycopg2
    from psycopg2.extras import execute_values

    cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
    try:
        sql, columns = _psycopg2_upsert_sql(cursor)
        args = [tuple(row[c] for c in columns) for row in rows]
        return execute_values(cursor, sql, args, page_size=len(args), fetch=True)
    except psycopg2.Error as exc:
        # As SQLAlchemy reports driver errors (OperationalError, DataError, ...).
        raise DBAPIError.instance(
            "INSERT INTO retryqueue_tasks ... ON CONFLICT", None, exc, psycopg2.Error
        ) from exc
    finally:
        cursor.close()


_SQLITE_UPSERT: tuple[str, str, str, list[str], list[Any], list[Any]] | None = None


def _sqlite_upsert_sql(conn: Connection) -> tuple[str, str, str, list[str], list[Any], list[Any]]:
    """The upsert as SQL for sqlite3: (head, one row's ``(?, ...)``, tail, its
    columns, their bind processors, the statement's constants).

    Compiled from :func:`upsert_statement` (one source of truth) with SQLAlchemy's
    own bind processors, so the stored values are the ones its executemany
    stores; one statement carries many rows' VALUES. SQLAlchemy builds and
    processes each row's parameters in Python, which cost about as much as the
    database's own work on a batch of dead letters.
    """
    global _SQLITE_UPSERT
    if _SQLITE_UPSERT is None:
        dialect = sqlite.dialect(paramstyle="qmark")
        compiled = upsert_statement("sqlite").compile(dialect=dialect, column_keys=list(COLUMNS))
        match, columns = _values_of(compiled.string, "sqlite3")
        positions = compiled.positiontup or []
        if positions[: len(columns)] != columns:  # pragma: no cover - as above
            raise RuntimeError("cannot prepare the store's upsert for sqlite3")
        processors = [_sqlite_processor(write_table.c[name].type, conn.dialect) for name in columns]
        constants = [compiled.params[name] for name in positions[len(columns) :]]
        head = compiled.string[: match.start(2)]
        tail = compiled.string[match.end(2) :]
        _SQLITE_UPSERT = (head, match.group(2), tail, columns, processors, constants)
    return _SQLITE_UPSERT


#: SQLAlchemy's storage format of a SQLite DATETIME (its default), and the same
#: as a format of a tuple: one %-format, not a dict made for every value.
_SQLITE_DATETIME = (
    "%(year)04d-%(month)02d-%(day)02d %(hour)02d:%(minute)02d:%(second)02d.%(microsecond)06d"
)
_SQLITE_DATETIME_TUPLE = "%04d-%02d-%02d %02d:%02d:%02d.%06d"


def _sqlite_processor(column_type: Any, dialect: Any) -> Callable[[Any], Any] | None:
    """The column's bind processor on SQLite; a datetime's text made as SQLAlchemy's
    makes it (same format), about twice as fast: a batch's rows hold several each."""
    impl = column_type.dialect_impl(dialect)
    process = impl.bind_processor(dialect)
    if process is None or getattr(impl, "_storage_format", None) != _SQLITE_DATETIME:
        return process
    fmt = _SQLITE_DATETIME_TUPLE

    def datetime_text(value: Any) -> Any:
        if type(value) is datetime:
            return fmt % (
                value.year, value.month, value.day,
                value.hour, value.minute, value.second, value.microsecond,
            )  # fmt: skip
        return process(value)  # a subclass, a date, or what it refuses

    return datetime_text


#: Parameters one statement may carry (SQLite 3.32 on; before it, 999): the
#: statement's constants count, and the rest is split into whole rows.
_SQLITE_MAX_PARAMS = 32_766


def _upsert_sqlite(conn: Connection, rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    import sqlite3

    head, group, tail, columns, processors, constants = _sqlite_upsert_sql(conn)
    limit = _SQLITE_MAX_PARAMS if sqlite3.sqlite_version_info >= (3, 32) else 999
    per = max(1, (limit - len(constants)) // len(columns))
    # A row's values in one C call; only the few processed columns looked at again.
    values_of = itemgetter(*columns)
    processed = [(i, process) for i, process in enumerate(processors) if process is not None]
    out: list[tuple[Any, ...]] = []
    cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
    try:
        for start in range(0, len(rows), per):
            chunk = rows[start : start + per]
            params: list[Any] = []
            for row in chunk:
                values = list(values_of(row))
                for i, process in processed:
                    value = values[i]
                    if value is not None:
                        values[i] = process(value)
                params += values
            params.extend(constants)
            cursor.execute(head + ", ".join([group] * len(chunk)) + tail, params)
            out.extend(cursor.fetchall())
    except sqlite3.Error as exc:
        # As SQLAlchemy reports driver errors (OperationalError, IntegrityError, ...).
        raise DBAPIError.instance(
            "INSERT INTO retryqueue_tasks ... ON CONFLICT", None, exc, sqlite3.Error
        ) from exc
    finally:
        cursor.close()
    return out


#: (dialect, driver) → the upsert written through the driver itself.
_FAST_UPSERTS: dict[tuple[str, str], Callable[[Connection, list[dict[str, Any]]], Any]] = {
    ("postgresql", "psycopg2"): _upsert_psycopg2,
    ("sqlite", "pysqlite"): _upsert_sqlite,
}


def sweep_statement(dialect: str) -> Any:
    """Upsert of a dead letter found in Redis without its event (the stream was
    trimmed before the writer read it): written unless the store already knows
    this death, a later one, or anything that happened after it."""
    table = write_table
    insert = _insert_of(dialect)
    stmt = insert(table)
    excluded = stmt.excluded
    c = table.c
    values: dict[str, Any] = {
        name: excluded[name] for name in ALWAYS if name not in ("event_ms", "event_seq")
    }
    for name in KNOWN:
        values[name] = func.coalesce(excluded[name], c[name])
    known_death = (c.status == "dead") & (c.finished_at >= excluded.finished_at)
    return stmt.on_conflict_do_update(
        index_elements=[c.spider, c.task_id],
        set_=values,
        where=(c.updated_at <= excluded.updated_at) & ~known_death,
    )
