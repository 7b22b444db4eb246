"""Real crawls with the store writer: every final failure ends in the database.

One crawl writes to PostgreSQL while the PostgreSQL server is stopped and
started again in the middle of it: nothing may be lost. That server is a
private one the test starts (tests/servers.py), never the shared one other
test runs use. Another crawl uses the zero-setup default, SQLite under the
embedded dir. A crawl stopped by force while its closing writes wait for a
database that is down stops at once.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import select

from scrapy_retryqueue.queue.keys import keys_for
from scrapy_retryqueue.store.db import Store
from scrapy_retryqueue.store.redisops import EventStream

from .crawling import Site, crawl, flaky_site, read_crawl, start_crawl
from .servers import PostgresServer
from .waiting import wait_for

pytestmark = pytest.mark.e2e

FAST = {"base_delay": 0.5, "max_delay": 2}
SETTINGS: dict[str, Any] = {
    "DOWNLOAD_TIMEOUT": 1,
    "CONCURRENT_REQUESTS": 16,
    "TELNETCONSOLE_ENABLED": False,
    "LOG_LEVEL": "INFO",
    "RETRYQUEUE_POLL_INTERVAL": 0.2,
    "RETRYQUEUE_IDLE_TIMEOUT": 30,
    "RETRYQUEUE_POLICIES": {
        kind: FAST for kind in ("timeout", "connection", "rate_limited", "server_error", "parse")
    },
    "RETRYQUEUE_STORE_INTERVAL": 0.2,
    "RETRYQUEUE_STORE_RETRY_MAX": 1,
}
RECOVERED = {
    "server_error_twice",
    "rate_limited",
    "timeout_once",
    "drop_once",
    "server_error_once",
    "parse_once",
}


@pytest.fixture
def private_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL of this test's own, which the test stops and starts; removed after."""
    server = PostgresServer()
    try:
        server.start()
        yield server
    finally:
        server.remove()


def expected(site: Site) -> tuple[dict[str, str], set[str]]:
    """URL → dead kind of the pages that must die, and the URLs that must recover."""
    table = site.get_json("/__scenarios")
    dead = {
        site.url + path: info["expected"].removeprefix("dead:")
        for path, info in table.items()
        if info["expected"].startswith("dead:")
    }
    recovered = {site.url + path for path, info in table.items() if info["scenario"] in RECOVERED}
    return dead, recovered


def stored(store: Store, spider: str) -> dict[str, tuple[str, str]]:
    table = store.table
    with store.connect() as conn:
        result = conn.execute(
            select(table.c.url, table.c.status, table.c.kind).where(table.c.spider == spider)
        )
        return {url: (status, kind) for url, status, kind in result}


def check_rows(
    rows: dict[str, tuple[str, str]],
    dead: dict[str, str],
    recovered: set[str],
    items: list[dict[str, Any]],
) -> None:
    """Every page that died is a dead letter with its kind, nothing else is; every
    page that failed and then recovered (the flaky ones, and a healthy page that
    timed out under load) is recorded as succeeded; no task is left open."""
    assert {url: kind for url, (status, kind) in rows.items() if status == "dead"} == dead
    succeeded = {url for url, (status, _) in rows.items() if status == "succeeded"}
    assert recovered <= succeeded
    assert succeeded <= {item["url"] for item in items}
    assert {status for status, _ in rows.values()} == {"dead", "succeeded"}


def test_postgres_stopped_and_started_during_a_crawl_loses_nothing(
    private_postgres: PostgresServer, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    database = private_postgres.url
    store = Store(database)
    store.upgrade()
    settings = {**SETTINGS, "RETRYQUEUE_REDIS_URL": redis_url, "RETRYQUEUE_DATABASE_URL": database}
    # Every page answers 0.3 s late, so the crawl still has pages to fetch (and
    # events to write) for several seconds after the writer's first batch.
    with flaky_site(pages=300, slow=1.5, retry_after=1, latency=0.3) as site:
        process, out = start_crawl(site.url, namespace, tmp_path, settings)
        log = out.with_suffix(".log")
        try:
            # Wait until the writer has written something, then take the database away.
            wait_for(lambda: stored(store, namespace), "the writer to write", timeout=30)
            store.engine.dispose()
            private_postgres.stop()
            events = redis.Redis.from_url(redis_url)
            length = events.xlen(keys_for(namespace).events)
            # The writer notices, and the crawl goes on: its events wait in Redis.
            wait_for(
                lambda: "cannot be written" in log.read_text(), "the writer to notice the outage"
            )
            wait_for(
                lambda: events.xlen(keys_for(namespace).events) > length,
                "the crawl to write events while the database is down",
            )
            assert process.poll() is None, "the crawl stopped with the database"
            events.close()
            private_postgres.start()
            _, stderr = process.communicate(timeout=120)
        finally:
            if process.poll() is None:
                process.kill()
        result = read_crawl(out, process.returncode, stderr)
        assert result.returncode == 0, result.log[-3000:]
        dead, recovered = expected(site)

    assert "cannot be written" in result.log
    assert "the store is back after" in result.log
    check_rows(stored(store, namespace), dead, recovered, result.items)
    # Nothing is left behind in Redis: no dead letter, no unwritten event.
    client = redis.Redis.from_url(redis_url)
    assert client.zcard(keys_for(namespace).dead) == 0
    stream = EventStream(client, namespace, consumer="check")
    assert stream.pending_count() == 0
    assert stream.lag() == 0
    client.close()
    store.close()


#: RETRYQUEUE_STORE_PROCESS: the thread, or the default ("auto": the process).
WRITERS = pytest.mark.parametrize("forked", [False, True], ids=["thread", "default-process"])


def _writer(forked: bool) -> dict[str, Any]:
    return {} if forked else {"RETRYQUEUE_STORE_PROCESS": False}


@WRITERS
def test_the_default_store_is_sqlite_under_the_embedded_dir(
    redis_url: str, namespace: str, tmp_path: Path, forked: bool
) -> None:
    embedded = tmp_path / "embedded"
    settings = {
        **SETTINGS,
        "RETRYQUEUE_REDIS_URL": redis_url,
        "RETRYQUEUE_EMBEDDED_DIR": embedded,
        **_writer(forked),
    }
    with flaky_site(pages=40, slow=1.5, retry_after=1) as site:
        result = crawl(site.url, namespace, tmp_path, settings)
        dead, recovered = expected(site)
    assert result.returncode == 0, result.log[-3000:]
    path = embedded / "retryqueue.sqlite3"
    assert f"writing failure history and dead letters to sqlite:///{path}" in result.log
    store = Store(f"sqlite:///{path}")
    rows = stored(store, namespace)
    store.close()
    check_rows(rows, dead, recovered, result.items)
    assert f"'retryqueue/store/dead_stored': {len(dead)}" in result.log
    # A crawl forks its writer while it is single-threaded: never the fallback.
    assert "runs in a thread of the crawl" not in result.log
    assert ("the store writer runs in process" in result.log) is forked
    if forked:  # the default, which says it is
        assert "forked from the crawl (RETRYQUEUE_STORE_PROCESS = 'auto')" in result.log


@WRITERS
def test_a_forced_shutdown_ends_the_closing_writes_to_a_database_that_is_down(
    redis_url: str, namespace: str, tmp_path: Path, forked: bool
) -> None:
    # A database on a closed port: every try fails at once. (A SQLite file that
    # cannot be written at start stops the crawl before it fetches anything.)
    settings = {
        **SETTINGS,
        "RETRYQUEUE_REDIS_URL": redis_url,
        "RETRYQUEUE_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/none",
        "CONCURRENT_REQUESTS": 2,
        # A close that would wait minutes for the database, with long backoffs.
        "RETRYQUEUE_STORE_CLOSE_TIMEOUT": 300,
        "RETRYQUEUE_STORE_RETRY_MAX": 120,
        **_writer(forked),
    }
    with flaky_site(pages=200, latency=0.5) as site:
        process, out = start_crawl(site.url, namespace, tmp_path, settings)
        log = out.with_suffix(".log")
        try:
            wait_for(
                lambda: "cannot be written" in log.read_text() and site.get_json("/__log"),
                "the crawl to fetch pages and the writer to meet the outage",
            )
            process.send_signal(signal.SIGINT)  # Ctrl-C: a graceful stop, which waits ...
            wait_for(
                lambda: "the closing spider tries it for up to" in log.read_text(),
                "the closing writes to start",
            )
            process.send_signal(signal.SIGINT)  # ... and again: stop now
            started = time.monotonic()
            _, stderr = process.communicate(timeout=120)
            took = time.monotonic() - started
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
    result = read_crawl(out, process.returncode, stderr)
    assert "forcing unclean shutdown" in result.log, result.log[-3000:]
    # Not held by a wait for the database: before, the tries went on for about
    # half the close timeout (here a minute and more) after the second Ctrl-C.
    assert took < 30, f"the process took {took:.0f}s to stop"
