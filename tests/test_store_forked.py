"""The crawl's store writer in a forked process (RETRYQUEUE_STORE_PROCESS, "auto" by
default): it writes
and counts as the thread did, its log lines are the crawl's, it survives Ctrl-C,
ends with the crawl, and a writer process that dies is replaced by a thread."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import scrapy
from scrapy.utils.test import get_crawler

from scrapy_retryqueue.crawl.storeext import RetryQueueStoreExtension
from scrapy_retryqueue.queue.delayed import RedisDelayedQueue
from scrapy_retryqueue.store.forked import ForkedWriter, WriterGone

from .waiting import wait_for


class ForkSpider(scrapy.Spider):
    name = "forked"


def _store(
    redis_url: str, tmp_path: Path, *, url: str | None = None
) -> tuple[Any, RetryQueueStoreExtension]:
    crawler = get_crawler(
        ForkSpider,
        {
            "RETRYQUEUE_REDIS_URL": redis_url,
            "RETRYQUEUE_DATABASE_URL": url or f"sqlite:///{tmp_path / 'store.sqlite3'}",
            "RETRYQUEUE_EMBEDDED_DIR": str(tmp_path),
            "RETRYQUEUE_STORE_INTERVAL": 0.05,
            # Forked below, whatever threads the test process runs (from_crawler
            # forks only a single-threaded crawl: tested apart, and in real crawls
            # in test_store_crawl.py).
            "RETRYQUEUE_STORE_PROCESS": False,
        },
    )
    ext = RetryQueueStoreExtension.from_crawler(crawler)
    ext.writer = ForkedWriter.fork(ext._child_service)
    return crawler, ext


def _stored(tmp_path: Path, spider_name: str) -> set[str]:
    from scrapy_retryqueue.store.db import Store

    store = Store(f"sqlite:///{tmp_path / 'store.sqlite3'}")
    try:
        with store.connect() as conn:
            table = store.table
            rows = conn.execute(table.select().where(table.c.spider == spider_name)).all()
    finally:
        store.close()
    return {row.task_id for row in rows}


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_the_writer_process_writes_counts_and_logs_as_the_crawls_own(
    redis_client: Any,
    redis_url: str,
    spider_name: str,
    make_task: Any,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Before the fork: the child logs at the levels the crawl had then.
    caplog.set_level(logging.INFO)
    crawler, ext = _store(redis_url, tmp_path)
    writer = ext.writer
    assert writer is not None
    # Ctrl-C reaches the whole process group: the writer waits for the crawl's word.
    os.kill(writer.pid, signal.SIGINT)
    queue = RedisDelayedQueue(redis_client, spider_name, node_id="n1")
    ext.spider_opened(ForkSpider(name=spider_name))
    try:
        for n in range(3):
            queue.schedule(make_task(f"t{n}", due=10**13), now=1)
        wait_for(
            lambda: crawler.stats.get_value("retryqueue/store/events") == 3,
            "the writer process to write the events and count them in the crawl's stats",
        )
        assert ext.service is writer
    finally:
        ext._stop_thread()
        ext._flush(time.monotonic() + 10, final=False)
        ext._flush(time.monotonic() + 10, final=True)
    assert _stored(tmp_path, spider_name) == {"t0", "t1", "t2"}
    # Its line, through the crawl's logger of the same name.
    lines = [
        r for r in caplog.records if "writing failure history and dead letters to" in r.message
    ]
    assert [(r.name, r.levelno) for r in lines] == [
        ("scrapy_retryqueue.store.service", logging.INFO)
    ]
    assert ext.writer is None
    assert writer.exit_status == 0  # it ended by itself when closed, not killed
    assert writer.cpu_seconds is not None and writer.cpu_seconds > 0
    assert _gone(writer.pid)


def test_a_writer_process_that_dies_is_replaced_by_a_thread_and_nothing_is_lost(
    redis_client: Any,
    redis_url: str,
    spider_name: str,
    make_task: Any,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    crawler, ext = _store(redis_url, tmp_path)
    writer = ext.writer
    assert writer is not None
    queue = RedisDelayedQueue(redis_client, spider_name, node_id="n1")
    queue.schedule(make_task("t0", due=10**13), now=1)
    ext.spider_opened(ForkSpider(name=spider_name))
    try:
        wait_for(lambda: crawler.stats.get_value("retryqueue/store/events") == 1, "one event")
        os.kill(writer.pid, signal.SIGKILL)
        for n in (1, 2):
            queue.schedule(make_task(f"t{n}", due=10**13), now=1)
        wait_for(
            lambda: crawler.stats.get_value("retryqueue/store/events") == 3,
            "the crawl's thread to write the events the dead process left",
        )
    finally:
        ext._stop_thread()
        ext._flush(time.monotonic() + 10, final=False)
        ext._flush(time.monotonic() + 10, final=True)
    assert _stored(tmp_path, spider_name) == {"t0", "t1", "t2"}
    errors = [r for r in caplog.records if "writer process ended unexpectedly" in r.message]
    assert len(errors) == 1 and errors[0].levelno == logging.ERROR
    assert writer.exit_status == -signal.SIGKILL
    assert ext.writer is None


def test_the_writer_process_ends_when_the_crawl_goes_even_mid_wait(
    redis_client: Any,
    redis_url: str,
    spider_name: str,
    make_task: Any,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A database that is down: the writer's flush waits and retries it.
    blocker = tmp_path / "not-a-directory"
    blocker.mkdir()
    _, ext = _store(redis_url, tmp_path, url=f"sqlite:///{blocker / 's.sqlite3'}")
    # Down once the crawl started (a path that cannot be written at start stops it).
    blocker.rmdir()
    blocker.write_text("")
    writer = ext.writer
    assert writer is not None
    RedisDelayedQueue(redis_client, spider_name, node_id="n1").schedule(
        make_task("t0", due=10**13), now=1
    )
    writer.start(spider_name, lambda name, value: None)
    ended: list[object] = []

    def flush() -> None:
        try:
            ended.append(writer.flush(time.monotonic() + 600))
        except WriterGone as exc:
            ended.append(exc)

    flushing = threading.Thread(target=flush)
    flushing.start()
    wait_for(lambda: "cannot be written" in caplog.text, "the flush to meet the outage")
    assert flushing.is_alive()  # in its retries
    # The crawl's end of the pipe closes, as when the crawl is killed.
    started = time.monotonic()
    writer.end(timeout=20)
    flushing.join(10)
    assert writer.exit_status == 0  # ended by itself, not killed at the timeout
    assert time.monotonic() - started < 10
    # The flush's retries were cut short: nothing written, no wait of 600 s.
    assert len(ended) == 1 and (ended[0] == 0 or isinstance(ended[0], WriterGone)), ended
    ext.writer = None
    ext._close()


@pytest.mark.parametrize(
    ("setting", "level", "line"),
    [
        (
            "auto",
            logging.INFO,
            "scrapy-retryqueue: the store writer runs in a thread of the crawl "
            "(RETRYQUEUE_STORE_PROCESS = 'auto'): other threads are running in the crawl's "
            "process",
        ),
        (
            True,
            logging.WARNING,
            "scrapy-retryqueue: the store writer runs in a thread of the crawl, not in the "
            "process of its own that RETRYQUEUE_STORE_PROCESS = True asks for: other threads "
            "are running in the crawl's process",
        ),
    ],
    ids=["auto", "true"],
)
def test_a_crawl_that_cannot_fork_says_so_and_writes_from_a_thread(
    redis_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    setting: object,
    level: int,
    line: str,
) -> None:
    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:
        crawler = get_crawler(
            ForkSpider,
            {
                "RETRYQUEUE_REDIS_URL": redis_url,
                "RETRYQUEUE_DATABASE_URL": f"sqlite:///{tmp_path / 'store.sqlite3'}",
                "RETRYQUEUE_EMBEDDED_DIR": str(tmp_path),
                "RETRYQUEUE_STORE_PROCESS": setting,
            },
        )
        with caplog.at_level(logging.INFO):
            ext = RetryQueueStoreExtension.from_crawler(crawler)
    finally:
        release.set()
        other.join()
    assert ext.writer is None
    lines = [
        (r.levelno, r.message) for r in caplog.records if "RETRYQUEUE_STORE_PROCESS" in r.message
    ]
    assert lines == [(level, line)]
    from scrapy_retryqueue.store.service import WriterService

    assert isinstance(ext.make_service("x"), WriterService)
    ext._close()


def test_a_crawl_told_to_use_the_thread_forks_nothing_and_says_nothing(
    redis_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    crawler = get_crawler(
        ForkSpider,
        {
            "RETRYQUEUE_REDIS_URL": redis_url,
            "RETRYQUEUE_DATABASE_URL": f"sqlite:///{tmp_path / 'store.sqlite3'}",
            "RETRYQUEUE_EMBEDDED_DIR": str(tmp_path),
            "RETRYQUEUE_STORE_PROCESS": "false",
        },
    )
    with caplog.at_level(logging.INFO):
        ext = RetryQueueStoreExtension.from_crawler(crawler)
    assert ext.writer is None
    assert "RETRYQUEUE_STORE_PROCESS" not in caplog.text
    ext._close()


def test_a_stop_or_force_sent_before_the_service_is_made_holds_for_it(
    redis_client: Any, redis_url: str, spider_name: str, make_task: Any, tmp_path: Path
) -> None:
    # The spider may close just as its first work appears: the crawl's stop can
    # reach the process before the run that makes its service.
    _, ext = _store(redis_url, tmp_path)
    writer = ext.writer
    assert writer is not None
    writer.start(spider_name, lambda name, value: None)
    writer.stop()
    ran = threading.Thread(target=writer.run)
    ran.start()
    ran.join(30)
    assert not ran.is_alive()  # it ran, saw the stop, and returned
    # A force before the first flush (a forced shutdown as the spider closes) ends
    # that flush's retries of a database that is down.
    blocker = tmp_path / "down"
    blocker.mkdir()
    _, forced = _store(redis_url, tmp_path, url=f"sqlite:///{blocker / 's.sqlite3'}")
    blocker.rmdir()
    blocker.write_text("")
    RedisDelayedQueue(redis_client, spider_name, node_id="n1").schedule(
        make_task("t0", due=10**13), now=1
    )
    other = forced.writer
    assert other is not None
    other.start(spider_name, lambda name, value: None)
    other.force()
    started = time.monotonic()
    assert other.flush(time.monotonic() + 600) == 0
    assert time.monotonic() - started < 30
    for one in (ext, forced):
        one._close()


def test_where_there_is_no_fork_the_default_writes_from_a_thread(
    redis_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Windows has no os.fork: the default ("auto") is the thread there, said at INFO.
    monkeypatch.delattr(os, "fork")
    crawler = get_crawler(
        ForkSpider,
        {
            "RETRYQUEUE_REDIS_URL": redis_url,
            "RETRYQUEUE_DATABASE_URL": f"sqlite:///{tmp_path / 'store.sqlite3'}",
            "RETRYQUEUE_EMBEDDED_DIR": str(tmp_path),
        },
    )
    with caplog.at_level(logging.INFO):
        ext = RetryQueueStoreExtension.from_crawler(crawler)
    assert ext.writer is None
    assert [
        (r.levelno, r.message) for r in caplog.records if "RETRYQUEUE_STORE_PROCESS" in r.message
    ] == [
        (
            logging.INFO,
            "scrapy-retryqueue: the store writer runs in a thread of the crawl "
            "(RETRYQUEUE_STORE_PROCESS = 'auto'): this platform has no fork()",
        )
    ]
    ext._close()
