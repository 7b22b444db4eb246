"""The queue operations the dashboard adds: retry_now.lua and cancel.lua."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis

from scrapy_retryqueue.queue.delayed import RedisDelayedQueue
from scrapy_retryqueue.queue.envelope import Task
from scrapy_retryqueue.store.writer import parse_entries


@pytest.fixture(params=["single", "cluster"])
def redis_kind(request: pytest.FixtureRequest) -> str:
    return request.param


def events(client: Any, queue: RedisDelayedQueue) -> list[dict[str, str]]:
    entries = client.xrange(queue.keys.events)
    return [dict(e.fields) for e in parse_entries(queue.keys.spider, entries)]


def test_retry_now_moves_only_waiting_tasks(
    queue: RedisDelayedQueue, redis_client: redis.Redis, make_task: Callable[..., Task]
) -> None:
    queue.schedule(make_task("w", due=50_000), now=1000)
    queue.schedule(make_task("l", due=500), now=1000)
    queue.claim(now=1000, limit=1, lease_until=9000, token="tok")
    envelope = queue.get_task("w")
    assert queue.retry_now(["w", "l", "nope"], now=2000) == [True, False, False]
    assert redis_client.zscore(queue.keys.due, "w") == 2000
    assert redis_client.zscore(queue.keys.leased, "l") == 9000  # untouched
    assert queue.get_task("w") == envelope
    last = events(redis_client, queue)[-1]
    assert last == {
        "type": "scheduled",
        "id": "w",
        "due": "2000",
        "node": "node-a",
        "ts": "2000",
        "manual": "retry_now",
    }
    # Due now, so the next claim takes it.
    claimed = queue.claim(now=2000, limit=5, lease_until=9000, token="tok2")
    assert [i for i, _ in claimed.tasks] == ["w"]


def test_cancel_removes_waiting_and_leased_tasks_for_good(
    queue: RedisDelayedQueue, redis_client: redis.Redis, make_task: Callable[..., Task]
) -> None:
    queue.schedule(make_task("w", url="https://a.example/w", due=50_000), now=1000)
    queue.schedule(make_task("l", due=500), now=1000)
    queue.claim(now=1000, limit=1, lease_until=9000, token="tok")
    dead = make_task("d", dead_kind="rule")
    queue.deadletter(dead, None, now=1000)
    assert queue.cancel(["w", "l", "d", "nope"], now=3000) == [True, True, False, False]
    k = queue.keys
    for key in (k.due, k.leased):
        assert redis_client.zcard(key) == 0
    assert redis_client.hlen(k.tasks) == 0 and redis_client.hlen(k.owners) == 0
    assert redis_client.zscore(k.dead, "d") is not None  # a dead letter is not live
    cancelled = [e for e in events(redis_client, queue) if e["type"] == "cancelled"]
    assert [(e["id"], e["url"], e["ts"]) for e in cancelled] == [
        ("w", "https://a.example/w", "3000"),
        ("l", "https://example.com/l", "3000"),
    ]
    # The node that held "l" has lost it: its ack and reschedule change nothing.
    assert not queue.ack("l", "tok", now=4000)
    assert not queue.reschedule(make_task("l", due=9000), "tok", now=4000)
    assert redis_client.zcard(k.due) == 0
    # The same request can fail again later and be a new task.
    assert queue.schedule(make_task("w", due=60_000), now=5000)


def test_a_malformed_envelope_does_not_stop_cancel(
    queue: RedisDelayedQueue, redis_client: redis.Redis
) -> None:
    k = queue.keys
    redis_client.zadd(k.due, {"x": 10})
    redis_client.hset(k.tasks, "x", "{not json")
    assert queue.cancel(["x"], now=20) == [True]
    assert events(redis_client, queue)[-1]["url"] == ""
