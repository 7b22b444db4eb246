"""A fleet of crawl processes sharing one Redis, and the faults a fleet meets.

Each test runs real ``scrapy crawl`` processes against the flaky site and a
real Redis; each fails if the guarantee it names breaks.
"""

from __future__ import annotations

import hashlib
import os
import signal
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from scrapy_retryqueue.queue.delayed import RedisDelayedQueue
from scrapy_retryqueue.queue.envelope import Task
from scrapy_retryqueue.queue.keys import all_keys, keys_for

from .crawling import Site, flaky_site, read_crawl, start_crawl
from .servers import RedisServer
from .waiting import wait_for

pytestmark = pytest.mark.e2e

FLEET_SETTINGS: dict[str, Any] = {
    # Dead letters stay in Redis, where these tests read them.
    "RETRYQUEUE_STORE_ENABLED": False,
    "RETRYQUEUE_POLL_INTERVAL": 0.2,
    "RETRYQUEUE_LEASE_TIME": 3,
    "RETRYQUEUE_IDLE_TIMEOUT": 30,
    "CONCURRENT_REQUESTS": 8,
    "CONCURRENT_REQUESTS_PER_DOMAIN": 8,
    "RETRYQUEUE_MAX_IN_FLIGHT": 8,
    "DOWNLOAD_TIMEOUT": 1,
    "TELNETCONSOLE_ENABLED": False,
    "LOG_LEVEL": "INFO",
}
FAST_POLICIES = {
    kind: {"base_delay": 0.3, "max_delay": 2}
    for kind in ("timeout", "connection", "rate_limited", "server_error", "parse")
}


def events_of(client: redis.Redis, spider: str, kind: str) -> list[dict[str, str]]:
    out = []
    for _, fields in client.xrange(keys_for(spider).events):
        event = {k.decode(): v.decode() for k, v in fields.items()}
        if event["type"] == kind:
            out.append(event)
    return out


def preload(client: redis.Redis, spider: str, urls: list[str]) -> dict[str, str]:
    """Park one due task per URL, as a failed first attempt would; returns id -> url."""
    queue = RedisDelayedQueue(client, spider, node_id="seed")
    now = int(time.time() * 1000)
    tasks = {}
    for url in urls:
        task_id = hashlib.sha1(url.encode()).hexdigest()
        task = Task(
            id=task_id,
            spider=spider,
            request={"url": url, "callback": "parse_page"},
            attempts={"server_error": 1},
            kind="server_error",
            node="seed",
            created=now,
            updated=now,
            due=now,
        )
        assert queue.schedule(task, now=now)
        tasks[task_id] = url
    return tasks


def fetches(site: Site) -> Counter[str]:
    return Counter(site.url + entry["path"] for entry in site.get_json("/__log"))


def test_kill_9_of_one_node_loses_no_task_and_only_its_held_tasks_run_twice(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    client = redis.Redis.from_url(redis_url)
    keys = keys_for(namespace)
    with flaky_site(pages=600, latency=0.3) as site:
        tasks = preload(client, namespace, site.pages("ok"))
        assert len(tasks) == 270
        settings = {**FLEET_SETTINGS, "RETRYQUEUE_REDIS_URL": redis_url}
        nodes = [
            start_crawl(
                site.url,
                namespace,
                tmp_path,
                {**settings, "RETRYQUEUE_NODE_ID": f"node-{n}"},
                "-a",
                "index=false",
            )
            for n in range(3)
        ]

        def held_by(node: str) -> set[str]:
            return {
                k.decode()
                for k, v in client.hgetall(keys.owners).items()
                if v.decode().startswith(node + ":")
            }

        # Kill node-1 while it holds leases and after the fleet got going.
        wait_for(
            lambda: len(events_of(client, namespace, "succeeded")) >= 30, "progress", timeout=30
        )
        wait_for(lambda: bool(held_by("node-1")), "node-1 to hold leases", timeout=30)
        victim, _ = nodes[1]
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        held = held_by("node-1")
        assert held, "node-1 held nothing when it died"

        survivors = [nodes[0], nodes[2]]
        for process, _ in survivors:
            process.wait(120)
        for process, out in survivors:
            crawl = read_crawl(
                out, process.returncode, process.stderr.read() if process.stderr else ""
            )
            assert crawl.returncode == 0, crawl.log[-2000:]
        fetched = fetches(site)

    # Zero tasks lost: every task was acknowledged by some node, none is left.
    succeeded = {e["id"] for e in events_of(client, namespace, "succeeded")}
    assert succeeded == set(tasks)
    assert client.zcard(keys.due) == client.zcard(keys.leased) == client.hlen(keys.tasks) == 0
    # The dead node's leases came back through the reaper, not through luck.
    reclaimed = {e["id"] for e in events_of(client, namespace, "reclaimed")}
    assert held <= reclaimed
    # The only pages fetched twice are those whose task the dead node held.
    twice = {url for url, n in fetched.items() if n > 1}
    assert twice <= {tasks[task_id] for task_id in held}
    assert all(n <= 2 for n in fetched.values())
    assert set(fetched) == set(tasks.values())
    print(f"held by the killed node: {len(held)}; fetched twice: {len(twice)}")
    client.close()


def test_graceful_shutdown_releases_claimed_tasks_at_once(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    client = redis.Redis.from_url(redis_url)
    keys = keys_for(namespace)
    with flaky_site(pages=200, latency=0.5) as site:
        tasks = preload(client, namespace, site.pages("ok")[:40])
        settings = {
            **FLEET_SETTINGS,
            "DOWNLOAD_TIMEOUT": 10,
            "RETRYQUEUE_REDIS_URL": redis_url,
            "RETRYQUEUE_LEASE_TIME": 600,
            "CONCURRENT_REQUESTS": 2,
            "RETRYQUEUE_NODE_ID": "leaving",
        }
        process, _ = start_crawl(site.url, namespace, tmp_path, settings, "-a", "index=false")
        wait_for(
            lambda: client.hlen(keys.owners) == 8, "the node to claim a full batch", timeout=30
        )
        process.send_signal(signal.SIGINT)  # Ctrl-C
        process.wait(60)
        assert process.returncode == 0
    released = {e["id"] for e in events_of(client, namespace, "released")}
    succeeded = {e["id"] for e in events_of(client, namespace, "succeeded")}
    # What it claimed but did not finish is due again now, not after the
    # 600 s lease: another node can take it at once.
    assert released
    assert not released & succeeded
    assert client.hlen(keys.owners) == client.zcard(keys.leased) == 0
    now_ms = int(time.time() * 1000)
    due = dict(client.zrange(keys.due, 0, -1, withscores=True))
    assert {k.decode() for k in due} == set(tasks) - succeeded
    late = {k: client.hget(keys.tasks, k) for k, score in due.items() if score > now_ms}
    assert not late, late
    client.close()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[tuple[str, Callable[[], None], Callable[[], None]]]:
    """A Redis of this test's own, with appendonly, that the test can stop and start:
    its URL, stop() and start() (on the same port)."""
    server = RedisServer(
        tmp_path / "redis-data",
        *("--appendonly", "yes", "--appendfsync", "always", "--save", ""),
    )
    server.start()
    try:
        yield server.url, server.stop, server.start
    finally:
        server.stop()


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


def test_a_redis_restart_mid_crawl_loses_nothing(
    own_redis: tuple[str, Callable[[], None], Callable[[], None]], tmp_path: Path
) -> None:
    url, stop_redis, start_redis = own_redis
    spider = f"restart{uuid.uuid4().hex[:6]}"
    client = redis.Redis.from_url(url)
    settings = {
        **FLEET_SETTINGS,
        "RETRYQUEUE_REDIS_URL": url,
        "RETRYQUEUE_POLICIES": FAST_POLICIES,
        "RETRYQUEUE_EMBEDDED_DIR": str(tmp_path / "local"),
        "RETRYQUEUE_IDLE_TIMEOUT": 60,
    }
    with flaky_site(pages=400, latency=0.05, slow=2, retry_after=1) as site:
        expected = {
            site.url + p: info["expected"] for p, info in site.get_json("/__scenarios").items()
        }
        process, out = start_crawl(site.url, spider, tmp_path, settings)
        events = keys_for(spider).events
        wait_for(
            lambda: _pings(client) and client.xlen(events) >= 40, "retries to start", timeout=30
        )
        stop_redis()
        # The crawl notices, and goes on without Redis: the site serves more pages.
        log = out.with_suffix(".log")
        wait_for(lambda: "Redis is unreachable" in log.read_text(), "the crawl to notice")
        served = len(site.get_json("/__log"))
        wait_for(
            lambda: len(site.get_json("/__log")) >= served + 20, "the crawl to go on without Redis"
        )
        start_redis()
        process.wait(180)
        crawl = read_crawl(out, process.returncode, process.stderr.read() if process.stderr else "")

    assert crawl.returncode == 0, crawl.log[-3000:]
    # It noticed once, spooled, and came back once; no error per request.
    assert crawl.log.count("Redis is unreachable") == 1
    assert crawl.log.count("Redis answers again") == 1
    assert "'retryqueue/spooled'" in crawl.log
    # Spooled writes are counted once written: the stats add up.
    dead_stat = int(crawl.log.split("'retryqueue/dead': ")[1].split(",")[0])
    assert dead_stat == sum(1 for e in expected.values() if e.startswith("dead:"))
    parsed = [item["url"] for item in crawl.items]
    assert len(parsed) == len(set(parsed))
    assert set(parsed) == {u for u, e in expected.items() if e == "parsed"}
    queue = RedisDelayedQueue(client, spider, node_id="test")
    dead = {task_id for task_id, _ in queue.dead_letters(limit=10_000)}
    assert len(dead) == sum(1 for e in expected.values() if e.startswith("dead:"))
    counts = queue.counts(now=int(time.time() * 1000))
    assert (counts.due, counts.leased) == (0, 0)
    assert not list((tmp_path / "local" / "spool").rglob("*.jsonl"))
    client.delete(*all_keys(keys_for(spider)))
    client.close()


def test_a_crawl_that_ends_during_an_outage_leaves_its_spool_to_the_next(
    own_redis: tuple[str, Callable[[], None], Callable[[], None]], tmp_path: Path
) -> None:
    url, stop_redis, start_redis = own_redis
    spider = f"spool{uuid.uuid4().hex[:6]}"
    local = tmp_path / "local"
    settings = {
        **FLEET_SETTINGS,
        "RETRYQUEUE_REDIS_URL": url,
        "RETRYQUEUE_POLICIES": FAST_POLICIES,
        "RETRYQUEUE_EMBEDDED_DIR": str(local),
        "RETRYQUEUE_IDLE_TIMEOUT": 2,
        # Redis is down from the start: without this the crawl would stop at once.
        "RETRYQUEUE_START_WITHOUT_REDIS": True,
    }
    with flaky_site(pages=40) as site:
        stop_redis()
        process, out = start_crawl(site.url, spider, tmp_path, settings)
        process.wait(120)
        first = read_crawl(out, process.returncode, process.stderr.read() if process.stderr else "")
        assert first.returncode == 0, first.log[-3000:]
        spooled = list((local / "spool").rglob("*.jsonl"))
        assert len(spooled) == 1 and spooled[0].read_text().count("\n") > 0
        assert "wait in" in first.log
        assert "'finish_reason': 'retryqueue_work_left'" in first.log
        assert "Redis did not take, kept in" in first.log

        start_redis()
        process, out = start_crawl(site.url, spider, tmp_path, settings, "-a", "index=false")
        process.wait(120)
        second = read_crawl(
            out, process.returncode, process.stderr.read() if process.stderr else ""
        )
    assert second.returncode == 0, second.log[-3000:]
    assert "spooled by an earlier crawl" in second.log
    parse_and_transient = {i["url"] for i in second.items}
    # The retries the first crawl could not park were parked and run by the second.
    assert parse_and_transient
    assert not parse_and_transient & {i["url"] for i in first.items}
    assert not list((local / "spool").rglob("*.jsonl"))
    client = redis.Redis.from_url(url)
    client.delete(*all_keys(keys_for(spider)))
    client.close()
    assert os.path.isdir(local)
