"""The store's schema: migrations from empty, and a clear refusal of a schema
that is older, newer or unversioned, on PostgreSQL and SQLite."""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text

from scrapy_retryqueue.store.db import SchemaError, Store
from scrapy_retryqueue.store.models import SCHEMA_HEAD, VERSION_TABLE, metadata

from .storecli import scrapy


def test_an_empty_database_is_upgraded_to_the_models(database_url: str) -> None:
    store = Store(database_url)
    assert store.schema_state().state == "empty"
    before, after = store.upgrade()
    assert (before, after) == (None, store.head)
    state = store.schema_state()
    assert (state.state, state.current) == ("ok", store.head)
    with store.connect() as conn:
        # The migrations build exactly what the models describe.
        diff = compare_metadata(
            MigrationContext.configure(conn, opts={"compare_type": True}), metadata
        )
        assert [
            d for d in diff if not (d[0] == "remove_table" and d[1].name == VERSION_TABLE)
        ] == []
        indexes = {ix["name"] for ix in inspect(conn).get_indexes("retryqueue_tasks")}
    assert "ix_retryqueue_tasks_status_finished" in indexes
    # Upgrading again is a no-op.
    assert store.upgrade() == (store.head, store.head)
    store.close()


def test_the_schema_head_a_crawl_checks_without_alembic_is_alembics_head(
    database_url: str,
) -> None:
    # A new migration must move SCHEMA_HEAD too, or every crawl would refuse the
    # database it just upgraded (or accept one that is not current).
    store = Store(database_url)
    assert store.head == SCHEMA_HEAD
    store.close()


def test_a_current_schema_is_checked_without_importing_alembic(database_url: str) -> None:
    import subprocess
    import sys

    Store(database_url).ensure_schema(create=True)
    # A fresh interpreter: this one imported Alembic long ago.
    code = (
        "import sys; from scrapy_retryqueue.store.db import Store; "
        f"s = Store({database_url!r}); print(s.ensure_schema().state); "
        "print(any(m == 'alembic' or m.startswith('alembic.') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["ok", "False"]


def test_ensure_schema_creates_an_empty_database_only_when_allowed(database_url: str) -> None:
    store = Store(database_url)
    with pytest.raises(
        SchemaError, match=r"no scrapy-retryqueue schema.*scrapy deadletters migrate"
    ):
        store.ensure_schema(create=False)
    assert store.ensure_schema(create=True).state == "ok"
    store.close()


def test_a_schema_newer_than_the_code_is_refused_with_a_clear_message(database_url: str) -> None:
    store = Store(database_url)
    store.upgrade()
    with store.begin() as conn:
        conn.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = '0099_from_the_future'"))
    with pytest.raises(SchemaError) as refused:
        store.ensure_schema()
    message = str(refused.value)
    assert "0099_from_the_future" in message
    assert "newer version" in message and "upgrade scrapy-retryqueue" in message
    # And migrate does not touch it.
    with pytest.raises(SchemaError):
        store.upgrade()
    store.close()


def test_tables_made_without_migrations_are_refused(database_url: str) -> None:
    store = Store(database_url)
    metadata.create_all(store.engine)
    with pytest.raises(SchemaError, match="no schema version"):
        store.ensure_schema()
    with pytest.raises(SchemaError, match="no schema version"):
        store.upgrade()
    store.close()


@pytest.fixture
def next_release(tmp_path: Path) -> str:
    """The shipped migrations plus a revision 0002, as a later release would ship them."""
    shipped = Path(str(resources.files("scrapy_retryqueue.store").joinpath("migrations")))
    scripts = tmp_path / "migrations"
    shutil.copytree(shipped, scripts, ignore=shutil.ignore_patterns("__pycache__"))
    (scripts / "versions" / "0002_note.py").write_text(
        '"""Add a note column."""\n'
        "import sqlalchemy as sa\nfrom alembic import op\n\n"
        'revision = "0002"\ndown_revision = "0001"\nbranch_labels = None\ndepends_on = None\n\n\n'
        "def upgrade():\n"
        '    op.add_column("retryqueue_tasks", sa.Column("note", sa.Text(), nullable=True))\n\n\n'
        "def downgrade():\n"
        '    op.drop_column("retryqueue_tasks", "note")\n'
    )
    return str(scripts)


def test_a_schema_older_than_the_code_is_refused_until_migrated(
    database_url: str, next_release: str
) -> None:
    Store(database_url).upgrade()  # the database as this release leaves it: 0001
    newer_code = Store(database_url, script_location=next_release)
    with pytest.raises(SchemaError) as refused:
        newer_code.ensure_schema()
    assert "revision 0001, older than the 0002" in str(refused.value)
    assert "scrapy deadletters migrate" in str(refused.value)
    assert newer_code.upgrade() == ("0001", "0002")
    assert newer_code.ensure_schema().state == "ok"
    with newer_code.connect() as conn:
        assert "note" in {c["name"] for c in inspect(conn).get_columns("retryqueue_tasks")}
    newer_code.close()


def test_the_migrate_command_upgrades_checks_and_refuses(
    new_pg_database: object, tmp_path: Path
) -> None:
    url = new_pg_database()  # type: ignore[operator]
    settings = {"RETRYQUEUE_DATABASE_URL": url}
    check = scrapy("deadletters", "migrate", "--check", cwd=tmp_path, settings=settings)
    assert check.code == 1
    assert "empty" in check.out
    done = scrapy("deadletters", "migrate", cwd=tmp_path, settings=settings)
    assert done.code == 0, done.err
    assert "schema upgraded from empty to 0001" in done.err
    again = scrapy("deadletters", "migrate", cwd=tmp_path, settings=settings)
    assert "up to date (0001)" in again.err
    assert scrapy("deadletters", "migrate", "--check", cwd=tmp_path, settings=settings).code == 0
    sql = scrapy("deadletters", "migrate", "--sql", cwd=tmp_path, settings=settings)
    assert "CREATE TABLE retryqueue_tasks" in sql.out

    store = Store(url)
    with store.begin() as conn:
        conn.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = '0099'"))
    store.close()
    refused = scrapy("deadletters", "export", cwd=tmp_path, settings=settings)
    assert refused.code == 2
    assert refused.err.startswith("error: ") and refused.err.count("\n") == 1
    assert "schema revision 0099" in refused.err
    assert "Traceback" not in refused.err
