"""The store's settings: defaults, and a clear error naming a bad setting and its value."""

from __future__ import annotations

from pathlib import Path

import pytest
from scrapy.settings import Settings

from scrapy_retryqueue.exceptions import ConfigError
from scrapy_retryqueue.store.config import load_store_config


def test_defaults_use_sqlite_under_the_embedded_dir_and_keep_everything() -> None:
    config = load_store_config(Settings())
    assert config.enabled and config.create_schema
    assert config.database_url is None
    assert config.url_for(Path("/p/.scrapy/retryqueue")) == (
        "sqlite:////p/.scrapy/retryqueue/retryqueue.sqlite3"
    )
    assert (config.batch_size, config.interval) == (500, 1.0)
    assert config.dead_retention is None and config.history_retention is None
    # The writer in a process of its own where the crawl can fork one.
    assert config.process is None


@pytest.mark.parametrize(
    ("value", "process"),
    [("auto", None), (" AUTO ", None), (None, None), (True, True), ("1", True),
     ("true", True), (False, False), ("False", False), (0, False)],
)  # fmt: skip
def test_store_process_is_auto_or_a_boolean(value: object, process: bool | None) -> None:
    assert load_store_config(Settings({"RETRYQUEUE_STORE_PROCESS": value})).process is process


def test_command_line_strings_are_read() -> None:
    config = load_store_config(
        Settings(
            {
                "RETRYQUEUE_STORE_ENABLED": "false",
                "RETRYQUEUE_STORE_BATCH_SIZE": "1000",
                "RETRYQUEUE_DEAD_RETENTION": "30",
                "RETRYQUEUE_HISTORY_RETENTION": "off",
                "RETRYQUEUE_DATABASE_URL": "postgresql://u:secret@db/crawls",
            }
        )
    )
    assert not config.enabled
    assert config.batch_size == 1000
    assert (config.dead_retention, config.history_retention) == (30.0, None)
    assert config.url_for(Path("/x")) == "postgresql://u:secret@db/crawls"


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("RETRYQUEUE_STORE_BATCH_SIZE", 0, "RETRYQUEUE_STORE_BATCH_SIZE must be >= 1, got 0"),
        ("RETRYQUEUE_STORE_BATCH_SIZE", "lots", "must be a whole number, got 'lots'"),
        ("RETRYQUEUE_STORE_INTERVAL", "0", "RETRYQUEUE_STORE_INTERVAL must be > 0, got 0.0"),
        ("RETRYQUEUE_STORE_RETRY_MAX", "nan", "RETRYQUEUE_STORE_RETRY_MAX must be a number"),
        ("RETRYQUEUE_DEAD_RETENTION", -1, "RETRYQUEUE_DEAD_RETENTION must be >= 0, got -1"),
        ("RETRYQUEUE_STORE_ENABLED", "maybe", "RETRYQUEUE_STORE_ENABLED must be True or False"),
        (
            "RETRYQUEUE_STORE_PROCESS",
            "sometimes",
            "RETRYQUEUE_STORE_PROCESS must be 'auto', True or False, got 'sometimes'",
        ),
        (
            "RETRYQUEUE_DATABASE_URL",
            "mysql://u:hunter2@db/x",
            "must be a postgresql:// or sqlite:/// URL, got 'mysql://u:***@db/x'",
        ),
        ("RETRYQUEUE_DATABASE_URL", "not a url", "must be a URL like postgresql://user@host/db"),
    ],
)
def test_a_bad_value_names_the_setting_and_the_value(
    name: str, value: object, message: str
) -> None:
    with pytest.raises(ConfigError) as error:
        load_store_config(Settings({name: value}))
    assert message in str(error.value)
    assert "hunter2" not in str(error.value)


@pytest.mark.parametrize(("interval", "block_ms"), [(0.2, 200), (1, 1000), (30, 5000)])
def test_the_writers_blocking_read_stays_below_the_socket_timeout(
    tmp_path: Path, interval: float, block_ms: int
) -> None:
    from scrapy.utils.test import get_crawler

    from scrapy_retryqueue.crawl.storeext import RetryQueueStoreExtension
    from scrapy_retryqueue.settings.defaults import REDIS_SOCKET_TIMEOUT

    crawler = get_crawler(
        settings_dict={
            "RETRYQUEUE_EMBEDDED_DIR": str(tmp_path),
            "RETRYQUEUE_STORE_INTERVAL": interval,
            "RETRYQUEUE_STORE_PROCESS": False,
        }
    )
    ext = RetryQueueStoreExtension.from_crawler(crawler)
    # A read longer than the socket timeout would fail as if Redis were down.
    assert ext.make_service("x").block_ms == block_ms < REDIS_SOCKET_TIMEOUT * 1000


def test_a_store_turned_off_is_one_info_line_and_no_scrapy_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    from scrapy.extension import ExtensionManager
    from scrapy.utils.test import get_crawler

    crawler = get_crawler(
        settings_dict={
            "RETRYQUEUE_EMBEDDED_DIR": str(tmp_path),
            "RETRYQUEUE_STORE_ENABLED": False,
            "EXTENSIONS": {"scrapy_retryqueue.crawl.storeext.RetryQueueStoreExtension": 0},
        }
    )
    caplog.set_level(logging.INFO)
    manager = ExtensionManager.from_crawler(crawler)
    assert not any(type(m).__name__ == "RetryQueueStoreExtension" for m in manager.middlewares)
    store_lines = [r for r in caplog.records if "RetryQueueStoreExtension" in r.getMessage()]
    assert [r for r in store_lines if r.levelno >= logging.WARNING] == []
    ours = [r for r in caplog.records if r.name == "scrapy_retryqueue.crawl.storeext"]
    assert [(r.levelno, "RETRYQUEUE_STORE_ENABLED = False" in r.getMessage()) for r in ours] == [
        (logging.INFO, True)
    ]
