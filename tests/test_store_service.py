"""The store's writer service in-process: it writes and acknowledges, stops after the batch
in hand, waits out a database or Redis that stops answering (one line each way), bounds its
final flush, serves many spiders (also ones that start later) and shares a spider with
another writer without writing an event twice.

Outages use what the other store tests use: an SQLite database whose directory is a file
(every try fails at once), and a private Redis server the test stops and starts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from scrapy.settings import Settings
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError

from scrapy_retryqueue.queue.delayed import RedisDelayedQueue
from scrapy_retryqueue.queue.envelope import Task
from scrapy_retryqueue.settings.defaults import STORE_WRITER_RESCAN
from scrapy_retryqueue.store.config import StoreConfig, load_store_config
from scrapy_retryqueue.store.db import Store, StoreError
from scrapy_retryqueue.store.service import Counters, WriterService

from .servers import RedisServer
from .waiting import wait_for

MakeTask = Callable[..., Task]
SERVICE_LOGGER = "scrapy_retryqueue.store.service"


def store_config(**settings: Any) -> StoreConfig:
    return load_store_config(
        Settings({"RETRYQUEUE_STORE_INTERVAL": 0.1, "RETRYQUEUE_STORE_RETRY_MAX": 1, **settings})
    )


def writer(
    client: Any,
    url: str,
    *,
    consumer: str = "w1",
    spiders: list[str] | None = None,
    rescan: float = STORE_WRITER_RESCAN,
    **settings: Any,
) -> WriterService:
    """A writer service (consumer *consumer*) from *client*'s events to the store at
    *url*, for *spiders* (None: every spider it finds), with :func:`store_config`."""
    return WriterService(
        store_config(**settings),
        database_url=url,
        open_redis=lambda: client,
        consumer=consumer,
        spiders=spiders,
        rescan=rescan,
    )


def sqlite_url(directory: Path) -> str:
    """A store in *directory*; one whose directory is a file is down (every try fails)."""
    return f"sqlite:///{directory / 'store.sqlite3'}"


def kill(queue: RedisDelayedQueue, make_task: MakeTask, *ids: str) -> None:
    """Dead-letter one task per id, as a crawl does (a dead event and the dead letter)."""
    now = int(time.time() * 1000)
    for task_id in ids:
        queue.deadletter(make_task(task_id, kind="not_found", dead_kind="not_found"), None, now=now)


def stored(url: str, spider: str) -> dict[str, str]:
    store = Store(url)
    try:
        with store.connect() as conn:
            table = store.table
            result = conn.execute(
                select(table.c.task_id, table.c.status).where(table.c.spider == spider)
            )
            return {task_id: status for task_id, status in result}
    except (OSError, SQLAlchemyError, StoreError):  # not there yet: nothing stored
        return {}
    finally:
        store.close()


@pytest.fixture
def running() -> Iterator[Callable[[WriterService], threading.Thread]]:
    """Runs a service in a thread; every one started is forced to stop and closed after."""
    started: list[tuple[WriterService, threading.Thread]] = []

    def start(service: WriterService) -> threading.Thread:
        thread = threading.Thread(target=service.run, daemon=True)
        thread.start()
        started.append((service, thread))
        return thread

    yield start
    for service, thread in started:
        service.force()
        thread.join(30)
        service.close()


def messages(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == SERVICE_LOGGER and r.levelno == level
    ]


def test_counters_keep_totals_and_forward_each_increment() -> None:
    forwarded: list[tuple[str, int]] = []
    counters = Counters(forward=lambda name, value: forwarded.append((name, value)))
    counters.inc("retryqueue/store/events", 3)
    counters.inc("retryqueue/store/events", 2)
    counters.inc("retryqueue/store/rows", 0)  # nothing counted, nothing forwarded
    assert counters.as_dict() == {"retryqueue/store/events": 5}
    assert forwarded == [("retryqueue/store/events", 3), ("retryqueue/store/events", 2)]


def test_it_writes_acknowledges_and_stops_after_the_batch_in_hand(
    redis_client: Any,
    queue: RedisDelayedQueue,
    spider_name: str,
    make_task: MakeTask,
    tmp_path: Path,
    running: Callable[[WriterService], threading.Thread],
) -> None:
    url = sqlite_url(tmp_path)
    kill(queue, make_task, *(f"d{n}" for n in range(5)))
    service = writer(redis_client, url, spiders=[spider_name])
    thread = running(service)
    wait_for(lambda: len(stored(url, spider_name)) == 5, "the five dead letters in the store")
    started = time.monotonic()
    service.stop()
    thread.join(10)
    assert not thread.is_alive()
    # A read waits at most one interval (0.1 s) for events: the stop is prompt.
    assert time.monotonic() - started < 5
    assert set(stored(url, spider_name).values()) == {"dead"}
    # Acknowledged after the commit, and the stored dead letters left Redis.
    assert service.unwritten() == {spider_name: 0}
    assert redis_client.zcard(queue.keys.dead) == 0
    assert service.counters.get("retryqueue/store/events") == 5
    assert service.counters.get("retryqueue/store/dead_stored") == 5


def test_a_database_that_does_not_answer_is_said_once_and_waited_out(
    redis_client: Any,
    queue: RedisDelayedQueue,
    spider_name: str,
    make_task: MakeTask,
    tmp_path: Path,
    running: Callable[[WriterService], threading.Thread],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=SERVICE_LOGGER)
    blocker = tmp_path / "not-a-directory"  # the database's directory is a file: down
    blocker.write_text("")
    url = sqlite_url(blocker)
    kill(queue, make_task, "a", "b")
    service = writer(redis_client, url, spiders=[spider_name])
    running(service)
    counters = service.counters
    wait_for(lambda: counters.get("retryqueue/store/write_errors") >= 3, "three failed tries")
    # One outage, one line, however many tries; the events wait in Redis.
    assert counters.get("retryqueue/store/outages") == 1
    errors = messages(caplog, logging.ERROR)
    assert len(errors) == 1 and "cannot be written" in errors[0], errors
    assert str(blocker) in errors[0]
    assert redis_client.zcard(queue.keys.dead) == 2
    blocker.unlink()  # the database is back
    wait_for(lambda: len(stored(url, spider_name)) == 2, "the waiting events in the store")
    wait_for(lambda: messages(caplog, logging.WARNING), "the line that says it is back")
    assert len(messages(caplog, logging.WARNING)) == 1
    assert "the store is back after" in messages(caplog, logging.WARNING)[0]
    assert counters.get("retryqueue/store/outages") == 1
    assert len(messages(caplog, logging.ERROR)) == 1


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis of this test's own: it stops and starts it, and no other test's
    events are on it (a writer that serves every spider would take theirs)."""
    server = RedisServer(tmp_path / "redis", "--save", "", "--appendonly", "no")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_a_redis_that_stops_answering_is_named_and_waited_out(
    private_redis: RedisServer,
    make_task: MakeTask,
    spider_name: str,
    tmp_path: Path,
    running: Callable[[WriterService], threading.Thread],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=SERVICE_LOGGER)
    url = sqlite_url(tmp_path)
    client = redis.Redis.from_url(private_redis.url, socket_timeout=5)
    queue = RedisDelayedQueue(client, spider_name, node_id="n1")
    kill(queue, make_task, "before")
    service = writer(client, url, spiders=[spider_name])
    running(service)
    wait_for(lambda: "before" in stored(url, spider_name), "the first dead letter stored")
    private_redis.stop()
    wait_for(lambda: messages(caplog, logging.ERROR), "the writer to notice")
    assert "cannot read the events in Redis" in messages(caplog, logging.ERROR)[0]
    # A server that restarts empty (no persistence here): its stream and consumer
    # group are gone, and the writer makes them again rather than give up.
    private_redis.start()
    kill(queue, make_task, "after")
    wait_for(lambda: "after" in stored(url, spider_name), "a dead letter after the restart")
    wait_for(lambda: messages(caplog, logging.WARNING), "the line that says it is back")
    assert len(messages(caplog, logging.ERROR)) == 1
    assert service.counters.get("retryqueue/store/outages") == 1
    client.close()


def test_the_final_flush_ends_by_its_deadline_and_a_forced_stop_ends_it_at_once(
    redis_client: Any,
    queue: RedisDelayedQueue,
    spider_name: str,
    make_task: MakeTask,
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    kill(queue, make_task, "a", "b", "c")
    service = writer(
        redis_client, sqlite_url(blocker), spiders=[spider_name], RETRYQUEUE_STORE_RETRY_MAX=0.5
    )
    try:
        started = time.monotonic()
        assert service.flush(started + 1.5) == 0
        took = time.monotonic() - started
        # Tried until the deadline (the last try at it), not a moment longer than a try.
        assert 1.5 <= took < 4, took
        assert service.counters.get("retryqueue/store/write_errors") >= 3

        # A flush that would wait a minute ends as soon as the service is forced.
        flush = threading.Thread(target=service.flush, args=(time.monotonic() + 60,))
        errors = service.counters.get("retryqueue/store/write_errors")
        flush.start()
        wait_for(
            lambda: service.counters.get("retryqueue/store/write_errors") > errors,
            "a failed try of the second flush",
        )
        forced = time.monotonic()
        service.force()
        flush.join(10)
        assert not flush.is_alive()
        assert time.monotonic() - forced < 2
        # Nothing was lost: the events still wait in Redis for the next writer.
        assert redis_client.zcard(queue.keys.dead) == 3
    finally:
        service.close()


def test_serving_every_spider_finds_one_that_starts_later(
    private_redis: RedisServer,
    make_task: MakeTask,
    tmp_path: Path,
    running: Callable[[WriterService], threading.Thread],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=SERVICE_LOGGER)
    url = sqlite_url(tmp_path)
    client = redis.Redis.from_url(private_redis.url)
    first = RedisDelayedQueue(client, "first", node_id="n1")
    kill(first, make_task, "f1", "f2")
    service = writer(client, url, rescan=0.2)
    running(service)
    wait_for(lambda: len(stored(url, "first")) == 2, "the first spider's dead letters")
    later = RedisDelayedQueue(client, "later", node_id="n2")
    kill(later, make_task, "l1")
    wait_for(lambda: len(stored(url, "later")) == 1, "the later spider's dead letter")
    assert service.spiders == ["first", "later"]
    info = messages(caplog, logging.INFO)
    assert any("serves spider 'later'" in line for line in info), info
    client.close()


def test_two_writers_share_a_spider_and_write_each_event_once(
    redis_client: Any,
    queue: RedisDelayedQueue,
    spider_name: str,
    make_task: MakeTask,
    tmp_path: Path,
    running: Callable[[WriterService], threading.Thread],
) -> None:
    url = sqlite_url(tmp_path)
    Store(url).ensure_schema()  # before two writers race to make it
    services = [
        writer(
            redis_client, url, consumer=name, spiders=[spider_name], RETRYQUEUE_STORE_BATCH_SIZE=10
        )
        for name in ("w1", "w2")
    ]
    for service in services:
        running(service)
    kill(queue, make_task, *(f"d{n}" for n in range(200)))
    wait_for(lambda: len(stored(url, spider_name)) == 200, "every dead letter stored", timeout=60)
    wait_for(lambda: redis_client.zcard(queue.keys.dead) == 0, "every dead letter out of Redis")
    # Each event was written and acknowledged by one writer: none twice.
    wait_for(
        lambda: sum(s.counters.get("retryqueue/store/events") for s in services) == 200,
        "every event acknowledged",
    )
    store = Store(url)
    with store.connect() as conn:
        assert conn.execute(select(func.count()).select_from(store.table)).scalar() == 200
    store.close()


def test_a_cluster_out_of_reach_is_an_outage_for_the_writer_and_a_bug_is_not() -> None:
    from redis.exceptions import ClusterDownError, RedisClusterException

    from scrapy_retryqueue.store.service import transient

    cannot_connect = RedisClusterException(
        "Redis Cluster cannot be connected. Please provide at least one reachable node: "
    )
    assert transient(cannot_connect)
    assert transient(ClusterDownError("The cluster is down"))
    assert transient(redis.ConnectionError("refused"))
    assert not transient(RedisClusterException("Invalid args in command: ('GET',)"))
    assert not transient(ValueError("a bug"))
