"""Reading the store never makes one: a SQLite file that is not there is an error."""

from __future__ import annotations

from pathlib import Path

import pytest
from scrapy.settings import Settings

from scrapy_retryqueue.view.sources import SourceError, Sources

pytestmark = pytest.mark.unit


def _settings(**values: object) -> Settings:
    return Settings({"RETRYQUEUE_REDIS_URL": "redis://127.0.0.1:1/0", **values})


def test_a_sqlite_url_naming_no_file_is_refused_and_nothing_is_made(tmp_path: Path) -> None:
    missing = tmp_path / "not" / "there" / "store.sqlite3"
    sources = Sources(_settings(RETRYQUEUE_DATABASE_URL=f"sqlite:///{missing}"))
    with pytest.raises(SourceError) as caught:
        sources.store()
    assert str(caught.value) == (
        f"no store database at {missing}: RETRYQUEUE_DATABASE_URL names a SQLite file "
        "that does not exist"
    )
    assert list(tmp_path.iterdir()) == []


def test_the_default_store_not_yet_made_is_refused_and_nothing_is_made(tmp_path: Path) -> None:
    embedded = tmp_path / "embedded"
    sources = Sources(_settings(RETRYQUEUE_EMBEDDED_DIR=str(embedded)))
    with pytest.raises(SourceError, match="no store database here"):
        sources.store()
    assert not embedded.exists() or list(embedded.rglob("*.sqlite3*")) == []


def test_an_existing_sqlite_store_is_opened(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    sources = Sources(_settings(RETRYQUEUE_DATABASE_URL=f"sqlite:///{path}"))
    sources.store(check_schema=False, create=True).close()
    sources.close()
    assert path.exists()
    again = Sources(_settings(RETRYQUEUE_DATABASE_URL=f"sqlite:///{path}"))
    try:
        assert again.store(check_schema=False).dialect == "sqlite"
    finally:
        again.close()
