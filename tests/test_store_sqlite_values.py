"""Values the store writer's own SQLite upsert binds: the same text SQLAlchemy would bind."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone

from sqlalchemy.dialects import sqlite

from scrapy_retryqueue.store.upsert import _sqlite_processor, write_table
from scrapy_retryqueue.store.writer import ms_to_datetime


class _Later(datetime):
    pass


def test_datetime_text_is_sqlalchemys() -> None:
    dialect = sqlite.dialect(paramstyle="qmark")
    values: list[object] = [
        datetime(1, 1, 1, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
        datetime(2026, 12, 7, 1, 2, 3),
        datetime(2026, 12, 7, 1, 2, 3, 4, tzinfo=timezone(timedelta(hours=5))),
        _Later(2020, 2, 29, 12, 0, 0, 500),
        date(2024, 1, 2),
        ms_to_datetime(1_700_000_000_123),
        ms_to_datetime(1),
    ]
    for name in ("created_at", "updated_at", "next_retry_at", "finished_at"):
        column_type = write_table.c[name].type
        ours = _sqlite_processor(column_type, dialect)
        theirs = column_type.dialect_impl(dialect).bind_processor(dialect)
        assert ours is not None and theirs is not None
        assert ours.__name__ == "datetime_text"  # the faster one is in use
        for value in values:
            assert ours(value) == theirs(value), value


def test_other_columns_keep_sqlalchemys_processor() -> None:
    dialect = sqlite.dialect(paramstyle="qmark")
    for name in ("task_id", "event_ms", "envelope", "attempts"):
        column_type = write_table.c[name].type
        theirs = column_type.dialect_impl(dialect).bind_processor(dialect)
        ours = _sqlite_processor(column_type, dialect)
        assert (ours is None) == (theirs is None)
