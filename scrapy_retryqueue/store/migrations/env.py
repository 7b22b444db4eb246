"""Alembic environment of the store's migrations.

The store runs them itself (``scrapy deadletters migrate``), passing a
connection in ``config.attributes["connection"]``; the plain ``alembic`` CLI
works too with ``sqlalchemy.url`` set in its config.

It never configures logging (no ``fileConfig``): the crawl or command that runs
it owns the log, and the store logs Alembic's INFO lines at DEBUG
(``store.db.alembic_at_debug``).
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from scrapy_retryqueue.store.models import VERSION_TABLE, metadata

config = context.config
target_metadata = metadata


def _configure(**kwargs: object) -> None:
    context.configure(
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        compare_type=True,
        **kwargs,
    )


def run_offline() -> None:
    _configure(url=config.get_main_option("sqlalchemy.url"), literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection=connection, render_as_batch=connection.dialect.name == "sqlite")
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = create_engine(config.get_main_option("sqlalchemy.url") or "")
    with engine.connect() as conn:
        _configure(connection=conn, render_as_batch=conn.dialect.name == "sqlite")
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
