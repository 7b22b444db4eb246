"""A writer service announces itself in Redis, and a crawl that sees it runs no store
writer: no process, no thread, no consumer of its own; when the announcement goes,
the crawl writes its spider's events itself."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import pytest
import scrapy
from scrapy.utils.test import get_crawler

from scrapy_retryqueue.crawl.storeext import RetryQueueStoreExtension
from scrapy_retryqueue.queue.delayed import RedisDelayedQueue
from scrapy_retryqueue.queue.keys import keys_for, writer_key
from scrapy_retryqueue.store.announce import WriterAnnouncement, announced_writer
from scrapy_retryqueue.store.forked import ForkedWriter

from . import crawling  # noqa: F401  (puts example_project on sys.path)
from .waiting import wait_for


class FleetSpider(scrapy.Spider):
    name = "fleet"


def test_writer_keys_are_per_spider_or_per_project() -> None:
    assert writer_key("quotes") == "retryqueue:{quotes}:writer"
    assert writer_key("quotes", "demo") == "retryqueue:demo:{quotes}:writer"
    assert writer_key(None) == "retryqueue:writer"
    assert writer_key(None, "demo") == "retryqueue:demo:writer"


def test_an_announcement_lives_while_it_runs_and_goes_when_it_stops(
    redis_client: Any, spider_name: str
) -> None:
    assert announced_writer(redis_client, spider_name) is None
    named = WriterAnnouncement(redis_client, consumer="w1", spiders=[spider_name], ttl=1.5)
    named.start()
    try:
        key = writer_key(spider_name)
        assert announced_writer(redis_client, spider_name) == ("w1", key)
        assert 0 < redis_client.pttl(key) <= 1500
        time.sleep(2.0)  # past one TTL: renewed meanwhile (every 0.5 s)
        assert announced_writer(redis_client, spider_name) == ("w1", key)
    finally:
        named.stop()
    assert redis_client.exists(writer_key(spider_name)) == 0
    # One for every spider of a project serves this one too, and no other project's.
    everyone = WriterAnnouncement(redis_client, consumer="w2", spiders=None, project="proj")
    everyone.start()
    try:
        assert announced_writer(redis_client, spider_name, "proj") == (
            "w2",
            "retryqueue:proj:writer",
        )
        assert announced_writer(redis_client, spider_name) is None
        # Another writer announced itself since: its key is not taken back.
        redis_client.set("retryqueue:proj:writer", "w3", px=5000)
    finally:
        everyone.stop()
    try:
        assert redis_client.get("retryqueue:proj:writer") == b"w3"
    finally:
        redis_client.delete("retryqueue:proj:writer")


def _crawl_store(redis_url: str, tmp_path: Path, *, forked: bool) -> tuple[Any, Any]:
    crawler = get_crawler(
        FleetSpider,
        {
            "RETRYQUEUE_REDIS_URL": redis_url,
            "RETRYQUEUE_DATABASE_URL": f"sqlite:///{tmp_path / 'store.sqlite3'}",
            "RETRYQUEUE_EMBEDDED_DIR": str(tmp_path),
            "RETRYQUEUE_STORE_INTERVAL": 0.05,
            "RETRYQUEUE_STORE_PROCESS": False,
        },
    )
    ext = RetryQueueStoreExtension.from_crawler(crawler)
    if forked:  # forked here, whatever threads the test process runs
        ext.writer = ForkedWriter.fork(ext._child_service)
    return crawler, ext


def _consumers(client: Any, spider: str) -> list[str]:
    events = keys_for(spider).events
    if not client.exists(events) or not client.xinfo_groups(events):
        return []
    return [c["name"].decode() for c in client.xinfo_consumers(events, "store")]


@pytest.mark.parametrize("forked", [False, True], ids=["thread", "process"])
def test_a_crawl_served_by_a_writer_service_runs_no_writer_until_the_service_goes(
    redis_client: Any,
    redis_url: str,
    spider_name: str,
    make_task: Any,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    forked: bool,
) -> None:
    caplog.set_level(logging.INFO)
    crawler, ext = _crawl_store(redis_url, tmp_path, forked=forked)
    child = ext.writer
    service = WriterAnnouncement(redis_client, consumer="fleet-writer", spiders=[spider_name])
    service.start()
    queue = RedisDelayedQueue(redis_client, spider_name, node_id="n1")
    try:
        ext.spider_opened(FleetSpider(name=spider_name))
        for n in range(3):
            queue.schedule(make_task(f"t{n}", due=10**13), now=1)
        wait_for(lambda: ext.served_by is not None, "the crawl to see the writer service")
        time.sleep(0.5)  # ten of its intervals: work waits, and it starts nothing
        assert ext.service is None and ext.writer is None
        assert _consumers(redis_client, spider_name) == []
        assert not (tmp_path / "store.sqlite3").exists()
        if child is not None:  # its forked process ended as the spider opened
            wait_for(lambda: child.exit_status is not None, "the writer process to end")
            assert child.exit_status == 0
            with pytest.raises(ProcessLookupError):
                os.kill(child.pid, 0)
        lines = [r for r in caplog.records if "runs no store writer of its own" in r.message]
        assert [(r.levelno, r.message) for r in lines] == [
            (
                logging.INFO,
                f"scrapy-retryqueue: the store writer service 'fleet-writer' serves spider "
                f"{spider_name!r} (retryqueue:{{{spider_name}}}:writer in Redis): this crawl "
                "runs no store writer of its own",
            )
        ]
        # The service stops (its key deleted): the crawl writes from now on.
        service.stop()
        wait_for(
            lambda: crawler.stats.get_value("retryqueue/store/events") == 3,
            "the crawl to write the events the service left",
        )
        assert _consumers(redis_client, spider_name) == [ext.config.node_id]
        gone = [r for r in caplog.records if "stopped announcing itself" in r.message]
        assert [r.levelno for r in gone] == [logging.WARNING]
    finally:
        service.stop()
        ext._stop_thread()
        ext._flush(time.monotonic() + 10, final=False)
        ext._flush(time.monotonic() + 10, final=True)


def test_a_crawl_served_to_its_close_leaves_what_is_left_to_the_service(
    redis_client: Any,
    redis_url: str,
    spider_name: str,
    make_task: Any,
    tmp_path: Path,
) -> None:
    crawler, ext = _crawl_store(redis_url, tmp_path, forked=False)
    service = WriterAnnouncement(redis_client, consumer="fleet-writer", spiders=None)
    service.start()
    try:
        ext.spider_opened(FleetSpider(name=spider_name))
        queue = RedisDelayedQueue(redis_client, spider_name, node_id="n1")
        queue.deadletter(make_task("d0", kind="not_found", dead_kind="not_found"), None, now=2)
        wait_for(lambda: ext.served_by is not None, "the crawl to see the writer service")
        ext._stop_thread()
        ext._flush(time.monotonic() + 10, final=False)
        ext._flush(time.monotonic() + 10, final=True)
    finally:
        service.stop()
    # Nothing written by the crawl, not at its close either: the dead letter waits
    # in Redis for the service.
    assert ext.service is None
    assert crawler.stats.get_value("retryqueue/store/events") is None
    assert not (tmp_path / "store.sqlite3").exists()
    assert redis_client.zcard(keys_for(spider_name).dead) == 1


@pytest.mark.e2e
def test_a_fleet_node_with_the_default_store_leaves_its_writes_to_the_writer_service(
    redis_client: Any, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    from run_fleet import Writer

    from scrapy_retryqueue.store.db import Store

    from .crawling import crawl, flaky_site, stat_of
    from .test_store_crawl import SETTINGS, expected, stored

    database = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    writer = Writer(
        redis_url=redis_url,
        database_url=database,
        spider=namespace,
        log=tmp_path / "writer.log",
        RETRYQUEUE_NAMESPACE="",
    )
    writer.start()
    try:
        key = writer_key(namespace)
        wait_for(lambda: redis_client.exists(key), "the writer service to announce itself", 60)
        # A node with the add-on's defaults: the store on, its writer "auto".
        settings = {
            **SETTINGS,
            "RETRYQUEUE_REDIS_URL": redis_url,
            "RETRYQUEUE_DATABASE_URL": database,
        }
        with flaky_site(pages=40, slow=1.5, retry_after=1) as site:
            result = crawl(site.url, namespace, tmp_path, settings)
            dead, _ = expected(site)
        assert result.returncode == 0, result.log[-3000:]
        assert "this crawl runs no store writer of its own" in result.log
        # No writer of the node's own ran: it counted no write, and the consumer
        # group knows only the service.
        assert stat_of(result.log, "retryqueue/store/events") is None
        events = keys_for(namespace).events
        consumers = {c["name"].decode() for c in redis_client.xinfo_consumers(events, "store")}
        assert len(consumers) == 1 and consumers.pop().endswith(":writer")

        def caught_up() -> bool:
            group = redis_client.xinfo_groups(events)[0]
            return (
                group["pending"] == 0
                and group["lag"] == 0
                and not redis_client.zcard(keys_for(namespace).dead)
            )

        wait_for(caught_up, "the writer service to write the crawl's events", 60)
    finally:
        writer.stop()
    assert redis_client.exists(writer_key(namespace)) == 0  # taken back as it stopped
    store = Store(database)
    try:
        rows = stored(store, namespace)
    finally:
        store.close()
    assert {url: kind for url, (status, kind) in rows.items() if status == "dead"} == dead


def _ring(*keys: str) -> Any:
    from scrapy_retryqueue.secure.signing import parse_keys, ring_for

    return ring_for(parse_keys(list(keys)))


def test_with_signing_keys_only_an_announcement_signed_with_them_counts(
    redis_client: Any, spider_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    from scrapy_retryqueue.secure.signing import generate_key
    from scrapy_retryqueue.store.announce import signed_value

    ours, theirs = generate_key(), generate_key()
    ring = _ring(ours)
    key, other = writer_key(spider_name), writer_key(f"{spider_name}x")
    signed = WriterAnnouncement(redis_client, consumer="w1", spiders=[spider_name], signing=ring)
    signed.start()
    try:
        assert announced_writer(redis_client, spider_name, signing=ring) == ("w1", key)
        # A node with the key of the next rotation too still reads it.
        assert announced_writer(redis_client, spider_name, signing=_ring(theirs, ours)) == (
            "w1",
            key,
        )
        # A node without keys reads the name.
        assert announced_writer(redis_client, spider_name) == ("w1", key)
        copied = redis_client.get(key)
    finally:
        signed.stop()
    assert redis_client.exists(key) == 0
    now_ms = int(time.time() * 1000)
    refused = {
        "evil": "it is not signed (RETRYQUEUE_SIGNING_KEYS is set)",
        signed_value(key, "w2", now_ms + 30_000, _ring(theirs)): "does not list",
        signed_value(key, "w3", now_ms - 61_000, ring): "its time has passed",
    }
    caplog.set_level(logging.WARNING)
    try:
        for value, why in refused.items():
            redis_client.set(key, value, px=5000)
            caplog.clear()
            for _ in range(2):  # said once, however often it is read
                assert announced_writer(redis_client, spider_name, signing=ring) is None
            assert [r.levelno for r in caplog.records] == [logging.WARNING]
            assert why in caplog.records[0].message
            assert f"ignored the store writer announcement at {key}" in caplog.records[0].message
        # A signed announcement copied to another spider's key serves no other spider.
        redis_client.delete(key)
        redis_client.set(other, copied, px=5000)
        assert announced_writer(redis_client, f"{spider_name}x", signing=ring) is None
    finally:
        redis_client.delete(key, other)


def test_a_crawl_with_signing_keys_writes_itself_beside_a_forged_announcement(
    redis_client: Any,
    redis_url: str,
    spider_name: str,
    make_task: Any,
    tmp_path: Path,
) -> None:
    from scrapy_retryqueue.secure.signing import generate_key

    crawler = get_crawler(
        FleetSpider,
        {
            "RETRYQUEUE_REDIS_URL": redis_url,
            "RETRYQUEUE_DATABASE_URL": f"sqlite:///{tmp_path / 'store.sqlite3'}",
            "RETRYQUEUE_EMBEDDED_DIR": str(tmp_path),
            "RETRYQUEUE_STORE_INTERVAL": 0.05,
            "RETRYQUEUE_STORE_PROCESS": False,
            "RETRYQUEUE_SIGNING_KEYS": [generate_key()],
        },
    )
    ext = RetryQueueStoreExtension.from_crawler(crawler)
    redis_client.set(writer_key(spider_name), "someone", px=60_000)
    queue = RedisDelayedQueue(redis_client, spider_name, node_id="n1")
    try:
        ext.spider_opened(FleetSpider(name=spider_name))
        queue.schedule(make_task("t0", due=10**13), now=1)
        wait_for(
            lambda: _consumers(redis_client, spider_name) == [ext.config.node_id],
            "the crawl to write its store itself",
        )
        assert ext.served_by is None
    finally:
        redis_client.delete(writer_key(spider_name))
        ext._stop_thread()
        ext._flush(time.monotonic() + 10, final=False)
        ext._flush(time.monotonic() + 10, final=True)
