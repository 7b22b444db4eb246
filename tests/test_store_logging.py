"""The store's migrations log at DEBUG: a crawl or a command that checks, creates or upgrades
the schema shows no Alembic INFO lines (they are there at DEBUG)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from scrapy_retryqueue.store.db import Store

from .storecli import scrapy


def alembic_records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("alembic") and r.levelno == level]


def test_creating_and_checking_the_schema_logs_alembic_at_debug_only(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    store = Store(database_url)
    try:
        store.ensure_schema()  # creates it
        store.ensure_schema()  # checks it
        store.upgrade_sql()
        assert alembic_records(caplog, logging.INFO) == []
        assert [r for r in caplog.records if r.name.startswith("alembic")] == []

        caplog.clear()
        caplog.set_level(logging.DEBUG)
        store.schema_state()
        assert alembic_records(caplog, logging.INFO) == []
        debug = [r.getMessage() for r in alembic_records(caplog, logging.DEBUG)]
        assert any(message.startswith("Context impl") for message in debug), debug
    finally:
        store.close()


def test_the_demotion_is_limited_to_the_stores_own_runs(caplog: pytest.LogCaptureFixture) -> None:
    """A project's own Alembic in the same process keeps its INFO lines."""
    caplog.set_level(logging.INFO)
    logging.getLogger("alembic.runtime.migration").info("a project's own migration")
    assert [r.levelname for r in alembic_records(caplog, logging.INFO)] == ["INFO"]


def test_scrapy_deadletters_migrate_logs_no_alembic_info_lines(tmp_path: Path) -> None:
    database = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    info = scrapy(
        "deadletters", "migrate", "-L", "INFO", cwd=tmp_path,
        settings={"RETRYQUEUE_DATABASE_URL": database},
    )  # fmt: skip
    assert info.code == 0, info.err
    assert "schema upgraded from empty to" in info.err
    assert "[scrapy.utils.log] INFO" in info.err  # the log is on
    assert "[alembic" not in info.err, info.err

    debug = scrapy(
        "deadletters", "migrate", "--check", "-L", "DEBUG", cwd=tmp_path,
        settings={"RETRYQUEUE_DATABASE_URL": database},
    )  # fmt: skip
    assert debug.code == 0, debug.err
    assert "[alembic.runtime.migration] DEBUG: Context impl SQLiteImpl." in debug.err
    assert "[alembic.runtime.migration] INFO" not in debug.err
