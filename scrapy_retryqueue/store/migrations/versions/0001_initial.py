"""The failure history and dead letters: one row per task.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TABLE = "retryqueue_tasks"


def _json() -> sa.types.TypeEngine:
    return sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def _time() -> sa.types.TypeEngine:
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("spider", sa.String(255), nullable=False),
        sa.Column("task_id", sa.String(128), nullable=False),
        sa.Column("url", sa.Text(), nullable=True),
        sa.Column("domain", sa.String(255), nullable=True),
        sa.Column("method", sa.String(16), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("kind", sa.String(32), nullable=True),
        sa.Column("attempts", _json(), nullable=True),
        sa.Column("attempts_total", sa.Integer(), nullable=True),
        sa.Column("max_retries", sa.Integer(), nullable=True),
        sa.Column("reclaims", sa.Integer(), nullable=True),
        sa.Column("first_error_kind", sa.String(32), nullable=True),
        sa.Column("first_error_type", sa.String(255), nullable=True),
        sa.Column("first_error_message", sa.Text(), nullable=True),
        sa.Column("first_error_status", sa.Integer(), nullable=True),
        sa.Column("last_error_kind", sa.String(32), nullable=True),
        sa.Column("last_error_type", sa.String(255), nullable=True),
        sa.Column("last_error_message", sa.Text(), nullable=True),
        sa.Column("last_error_status", sa.Integer(), nullable=True),
        sa.Column("next_retry_at", _time(), nullable=True),
        sa.Column("node", sa.String(255), nullable=True),
        sa.Column("envelope", _json(), nullable=True),
        sa.Column("created_at", _time(), nullable=False),
        sa.Column("updated_at", _time(), nullable=False),
        sa.Column("finished_at", _time(), nullable=True),
        sa.Column("requeues", sa.Integer(), server_default="0", nullable=False),
        sa.Column("requeued_at", _time(), nullable=True),
        sa.Column("history", _json(), nullable=True),
        sa.Column("event_ms", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("event_seq", sa.BigInteger(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("spider", "task_id", name="uq_retryqueue_tasks_spider_task"),
    )
    for name, columns in (
        ("ix_retryqueue_tasks_status_finished", ["status", "finished_at"]),
        ("ix_retryqueue_tasks_spider_status", ["spider", "status"]),
        ("ix_retryqueue_tasks_status_kind", ["status", "kind"]),
        ("ix_retryqueue_tasks_status_domain", ["status", "domain"]),
        ("ix_retryqueue_tasks_status_http", ["status", "last_error_status"]),
        ("ix_retryqueue_tasks_status_node", ["status", "node"]),
    ):
        op.create_index(name, TABLE, columns)


def downgrade() -> None:
    op.drop_table(TABLE)
