"""Shared fixtures: the real Redis the tests run against, and per-test namespaces.

Every test that touches Redis gets its own spider name, so its keys live in a
namespace of their own and are deleted when it ends: tests run in any order,
and in parallel, against one server.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any
from uuid import uuid4

import pytest
import redis

from scrapy_retryqueue.envelope import Task
from scrapy_retryqueue.keys import all_keys, keys_for
from scrapy_retryqueue.queue import RedisDelayedQueue

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture(scope="session")
def redis_url() -> str:
    """RETRYQUEUE_TEST_REDIS_URL, else the local server; fails (not skips) when it is down."""
    url = os.environ.get("RETRYQUEUE_TEST_REDIS_URL") or DEFAULT_REDIS_URL
    client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
    error: Exception | None = None
    try:
        client.ping()
    except (redis.RedisError, OSError) as exc:
        error = exc
    finally:
        client.close()
    if error is not None:
        pytest.fail(
            f"the tests need a Redis server at {url} (RETRYQUEUE_TEST_REDIS_URL) and it does "
            f"not answer ({error}); run `bash scripts/ensure-services` to start it",
            pytrace=False,
        )
    return url


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def spider_name(redis_client: redis.Redis) -> Iterator[str]:
    """A spider name unique to this test; its Redis namespace is deleted afterwards."""
    name = f"t{uuid4().hex[:10]}"
    yield name
    redis_client.delete(*all_keys(keys_for(name)))


@pytest.fixture
def queue(redis_client: redis.Redis, spider_name: str) -> RedisDelayedQueue:
    return RedisDelayedQueue(redis_client, spider_name, node_id="node-a")


@pytest.fixture
def make_task(spider_name: str) -> Callable[..., Task]:
    """``make_task(id, url=..., kind=..., due=..., **other Task fields)``."""

    def make(
        task_id: str,
        *,
        url: str | None = None,
        kind: str = "timeout",
        due: int = 0,
        **fields: Any,
    ) -> Task:
        fields.setdefault("spider", spider_name)
        fields.setdefault("attempts", {kind: 1})
        fields.setdefault("node", "node-a")
        return Task(
            id=task_id,
            request={"url": url or f"https://example.com/{task_id}"},
            kind=kind,
            due=due,
            **fields,
        )

    return make
