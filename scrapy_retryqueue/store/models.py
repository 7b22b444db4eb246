"""The store's tables, as SQLAlchemy Core tables.

One row per task (a spider's request fingerprint): its current status, the
kind of its last failure, attempts by kind, its first and last error, the
request envelope, and the position in the events stream of the last event
applied to it (which makes replaying events a no-op).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    DateTime,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.types import TypeDecorator, TypeEngine

#: Table Alembic records the schema revision in (not ``alembic_version``, so a
#: project's own migrations can share the database).
VERSION_TABLE = "retryqueue_alembic_version"
#: The newest migration's revision (migrations/versions/): a database that records
#: it is current, which a crawl checks with one SELECT, without importing Alembic
#: (about 20,000 objects more on the crawl's heap). A new migration updates it;
#: tests/test_store_migrations.py holds it to Alembic's head.
SCHEMA_HEAD = "0001"

#: BIGINT on PostgreSQL; INTEGER on SQLite, where only that autoincrements.
BigId = BigInteger().with_variant(Integer(), "sqlite")


class JsonColumn(TypeDecorator[Any]):
    """JSON on SQLite, JSONB on PostgreSQL; SQL NULL for None (not the JSON value
    null), so COALESCE keeps stored values.

    Not ``JSON().with_variant(JSONB(), "postgresql")``: that needs JSONB, and so
    SQLAlchemy's whole PostgreSQL dialect (about 5,700 objects), imported with
    the table, which would put them on the heap of every crawl writing a SQLite
    store, for the collector to walk at every full collection. A PostgreSQL
    engine has imported the dialect already when it asks for the type. (Creating
    or upgrading the schema still loads it: Alembic's DDL package imports every
    dialect's.)
    """

    impl = JSON(none_as_null=True)
    cache_ok = True
    #: As JSON's: a JSON value (a dict) is no hashable Python object.
    hashable = False

    def load_dialect_impl(self, dialect: Any) -> TypeEngine[Any]:
        if dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import JSONB

            return dialect.type_descriptor(JSONB(none_as_null=True))
        return super().load_dialect_impl(dialect)


Json = JsonColumn()


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite keeps naive text)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: the store only takes aware datetimes")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


#: The store's schema: what Alembic's migrations build, and what they are checked against.
metadata = MetaData()

#: One retry task and what happened to it: the failure history and dead letters.
#: A Core table, not an ORM model: nothing maps rows to objects, and SQLAlchemy's
#: ORM would add about 9,000 objects to every crawl's heap for the collector to walk.
tasks_table = Table(
    "retryqueue_tasks",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("spider", String(255), nullable=False),
    #: The request fingerprint (hex), the task id in Redis.
    Column("task_id", String(128), nullable=False),
    Column("url", Text),
    Column("domain", String(255)),
    Column("method", String(16)),
    #: waiting, retrying, succeeded, dead or cancelled.
    Column("status", String(16), nullable=False),
    #: Kind of the last failure (for a dead letter: the kind it died of).
    Column("kind", String(32)),
    #: Retries so far by kind: {"timeout": 2, "server_error": 1}.
    Column("attempts", Json),
    Column("attempts_total", Integer),
    #: The retry budget of the last failure's kind (policy, domain and meta).
    Column("max_retries", Integer),
    #: Times its lease expired unacknowledged.
    Column("reclaims", Integer),
    Column("first_error_kind", String(32)),
    Column("first_error_type", String(255)),
    Column("first_error_message", Text),
    Column("first_error_status", Integer),
    Column("last_error_kind", String(32)),
    Column("last_error_type", String(255)),
    Column("last_error_message", Text),
    Column("last_error_status", Integer),
    Column("next_retry_at", UTCDateTime),
    #: The node that wrote the last event.
    Column("node", String(255)),
    #: The task envelope as Redis held it (request, attempts, errors).
    Column("envelope", Json),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    #: When it succeeded, died or was cancelled.
    Column("finished_at", UTCDateTime),
    #: Times a person put it back in the queue (scrapy deadletters requeue).
    Column("requeues", Integer, nullable=False, default=0, server_default="0"),
    Column("requeued_at", UTCDateTime),
    #: What it looked like before each requeue: [{status, kind, attempts, ...}].
    Column("history", Json),
    #: Stream id (ms-seq) of the last event applied; older or equal ones are ignored.
    Column("event_ms", BigInteger, nullable=False, default=0, server_default="0"),
    Column("event_seq", BigInteger, nullable=False, default=0, server_default="0"),
    UniqueConstraint("spider", "task_id", name="uq_retryqueue_tasks_spider_task"),
    Index("ix_retryqueue_tasks_status_finished", "status", "finished_at"),
    Index("ix_retryqueue_tasks_spider_status", "spider", "status"),
    Index("ix_retryqueue_tasks_status_kind", "status", "kind"),
    Index("ix_retryqueue_tasks_status_domain", "status", "domain"),
    Index("ix_retryqueue_tasks_status_http", "status", "last_error_status"),
    Index("ix_retryqueue_tasks_status_node", "status", "node"),
)
