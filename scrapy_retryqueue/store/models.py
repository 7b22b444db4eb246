"""The store's tables, as typed SQLAlchemy 2.x models.

One row per task (a spider's request fingerprint): its current status, the
kind of its last failure, attempts by kind, its first and last error, the
request envelope, and the position in the events stream of the last event
applied to it (which makes replaying events a no-op).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, DateTime, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

#: Table Alembic records the schema revision in (not ``alembic_version``, so a
#: project's own migrations can share the database).
VERSION_TABLE = "retryqueue_alembic_version"

#: BIGINT on PostgreSQL; INTEGER on SQLite, where only that autoincrements.
BigId = BigInteger().with_variant(Integer(), "sqlite")
#: SQL NULL for None (not the JSON value null), so COALESCE keeps stored values.
Json = JSON(none_as_null=True).with_variant(JSONB(none_as_null=True), "postgresql")


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


class Base(DeclarativeBase):
    pass


class TaskRecord(Base):
    """One retry task and what happened to it: the failure history and dead letters."""

    __tablename__ = "retryqueue_tasks"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    spider: Mapped[str] = mapped_column(String(255))
    #: The request fingerprint (hex), the task id in Redis.
    task_id: Mapped[str] = mapped_column(String(128))
    url: Mapped[str | None] = mapped_column(Text)
    domain: Mapped[str | None] = mapped_column(String(255))
    method: Mapped[str | None] = mapped_column(String(16))
    #: waiting, retrying, succeeded, dead or cancelled.
    status: Mapped[str] = mapped_column(String(16))
    #: Kind of the last failure (for a dead letter: the kind it died of).
    kind: Mapped[str | None] = mapped_column(String(32))
    #: Retries so far by kind: {"timeout": 2, "server_error": 1}.
    attempts: Mapped[dict[str, int] | None] = mapped_column(Json)
    attempts_total: Mapped[int | None] = mapped_column(Integer)
    #: The retry budget of the last failure's kind (policy, domain and meta).
    max_retries: Mapped[int | None] = mapped_column(Integer)
    #: Times its lease expired unacknowledged.
    reclaims: Mapped[int | None] = mapped_column(Integer)
    first_error_kind: Mapped[str | None] = mapped_column(String(32))
    first_error_type: Mapped[str | None] = mapped_column(String(255))
    first_error_message: Mapped[str | None] = mapped_column(Text)
    first_error_status: Mapped[int | None] = mapped_column(Integer)
    last_error_kind: Mapped[str | None] = mapped_column(String(32))
    last_error_type: Mapped[str | None] = mapped_column(String(255))
    last_error_message: Mapped[str | None] = mapped_column(Text)
    last_error_status: Mapped[int | None] = mapped_column(Integer)
    next_retry_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    #: The node that wrote the last event.
    node: Mapped[str | None] = mapped_column(String(255))
    #: The task envelope as Redis held it (request, attempts, errors).
    envelope: Mapped[dict[str, Any] | None] = mapped_column(Json)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    #: When it succeeded, died or was cancelled.
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    #: Times a person put it back in the queue (scrapy deadletters requeue).
    requeues: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    requeued_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    #: What it looked like before each requeue: [{status, kind, attempts, ...}].
    history: Mapped[list[dict[str, Any]] | None] = mapped_column(Json)
    #: Stream id (ms-seq) of the last event applied; older or equal ones are ignored.
    event_ms: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    event_seq: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")

    __table_args__ = (
        UniqueConstraint("spider", "task_id", name="uq_retryqueue_tasks_spider_task"),
        Index("ix_retryqueue_tasks_status_finished", "status", "finished_at"),
        Index("ix_retryqueue_tasks_spider_status", "spider", "status"),
        Index("ix_retryqueue_tasks_status_kind", "status", "kind"),
        Index("ix_retryqueue_tasks_status_domain", "status", "domain"),
        Index("ix_retryqueue_tasks_status_http", "status", "last_error_status"),
        Index("ix_retryqueue_tasks_status_node", "status", "node"),
    )


tasks_table = TaskRecord.__table__
