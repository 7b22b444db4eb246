"""9. hiredis against redis-py's pure-Python reply parser, on the failure paths.

Client CPU (this thread's user + system time) per task of each path, with the
same Redis and the same data, parser by parser, alternating: dead-letter
writes (the deadletter script, batches of 50 as a busy crawler sends them),
claims (batches of 100 envelopes back), acks, and the store writer's reads of
500 events and their envelopes (XREADGROUP + HMGET, parsed into events). A
ratio below 1 means hiredis costs less. The parsers' order alternates between rounds.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from redis._parsers import _HiredisParser, _RESP2Parser

from scrapy_retryqueue.queue.delayed import RedisDelayedQueue, Write
from scrapy_retryqueue.queue.envelope import Task
from scrapy_retryqueue.queue.keys import all_keys
from scrapy_retryqueue.store.redisops import EventStream
from scrapy_retryqueue.store.writer import ENVELOPE_FROM_DEAD, parse_entries

from .common import alternate

TASKS = 4000
T0 = 1_700_000_000_000


def _task(spider: str, i: int) -> Task:
    error = {"kind": "not_found", "type": "HttpStatus", "message": "HTTP 404", "status": 404}
    return Task(
        id=uuid.uuid4().hex + uuid.uuid4().hex[:8],
        spider=spider,
        request={
            "url": f"https://shop{i % 50}.example.com/category/{i % 977}/item/{i}?ref=list",
            "headers": [["Accept", "text/html,application/xhtml+xml"]],
            "meta": {"depth": 3, "category": f"c{i % 977}"},
            "callback": "parse_item",
        },
        attempts={"server_error": 1},
        kind="server_error",
        first_error=error,
        last_error=error,
        node="bench-node",
        created=T0,
        updated=T0,
        due=T0,
    )


def _cpu(fn: Callable[[], Any]) -> float:
    started = time.thread_time()
    fn()
    return time.thread_time() - started


def _paths(client: redis.Redis) -> dict[str, float]:
    """CPU µs per task of each path, with this client's parser."""
    spider = f"parse{uuid.uuid4().hex[:6]}"
    queue = RedisDelayedQueue(client, spider, node_id="bench")
    tasks = [_task(spider, i) for i in range(TASKS)]
    out: dict[str, float] = {}
    schedules = [Write.for_task("schedule", t, None, T0) for t in tasks]

    def schedule() -> None:
        for start in range(0, TASKS, 50):
            queue.apply(schedules[start : start + 50])

    out["schedule"] = _cpu(schedule)
    claimed: list[tuple[str, str]] = []

    def claim() -> None:
        while True:
            got = queue.claim(now=T0 + 1, limit=100, lease_until=T0 + 10**9, token="t")
            if not got.tasks:
                return
            claimed.extend(got.tasks)

    out["claim"] = _cpu(claim)
    half = len(claimed) // 2
    acks = [
        Write("ack", task_id, T0 + 2, "t", kind="server_error") for task_id, _ in claimed[:half]
    ]
    dead = [Write.for_task("deadletter", t, "t", T0 + 2) for t in tasks[half:]]

    def ack() -> None:
        for start in range(0, len(acks), 50):
            queue.apply(acks[start : start + 50])

    def deadletter() -> None:
        for start in range(0, len(dead), 50):
            queue.apply(dead[start : start + 50])

    out["ack"] = _cpu(ack) * TASKS / max(1, half)
    out["deadletter"] = _cpu(deadletter) * TASKS / max(1, len(dead))
    stream = EventStream(client, spider, consumer="bench")

    def store_read() -> None:
        # What the store writer reads per batch: events, then the envelopes they need.
        while entries := stream.read_new(500, 0):
            events = parse_entries(spider, entries)
            ids = [e.task_id for e in events if e.type in ENVELOPE_FROM_DEAD]
            stream.envelopes([], ids)
            stream.ack([e[0] for e in entries])

    events = client.xlen(queue.keys.events)
    out["store read"] = _cpu(store_read) * TASKS / max(1, events)
    client.delete(*all_keys(queue.keys))
    return {name: seconds / TASKS * 1e6 for name, seconds in out.items()}


def measure(redis_url: str, workdir: Path) -> dict[str, float]:
    figures: dict[str, float] = {}
    results: dict[str, dict[str, float]] = {}
    parsers = alternate(__name__, [("python", _RESP2Parser), ("hiredis", _HiredisParser)])
    for name, parser in parsers:
        pool = redis.ConnectionPool.from_url(redis_url, parser_class=parser)
        client = redis.Redis(connection_pool=pool)
        _paths(client)  # warm: scripts loaded, connection open
        results[name] = _paths(client)
        client.close()
        pool.disconnect()
    for path in results["python"]:
        figures[f"{path} µs/task python"] = results["python"][path]
        figures[f"{path} µs/task hiredis"] = results["hiredis"][path]
        figures[f"{path} hiredis ÷ python"] = results["hiredis"][path] / results["python"][path]
    return figures
