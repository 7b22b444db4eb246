"""5. Queue throughput against the raw Redis operations on the same server.

20,000 tasks of a realistic envelope. Ours: the queue's own calls as the
crawler makes them under load (batches of 500). Raw: a pipelined ZADD + HSET
of the same payloads (schedule), a bare batched Lua move from one ZSET to
another (claim), and a pipelined ZREM + HDEL (ack), in batches of 500.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import redis
from scrapy import Request
from scrapy.http import Headers

from scrapy_retryqueue.queue.delayed import RedisDelayedQueue, Write
from scrapy_retryqueue.queue.envelope import Task, request_to_json

from .common import forget

N = 20_000
BATCH = 500

RAW_MOVE = """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
local out = {}
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[1], id)
  redis.call('ZADD', KEYS[2], ARGV[3], id)
  out[#out + 1] = id
  out[#out + 1] = redis.call('HGET', KEYS[3], id)
end
return out
"""


def sample_tasks(spider: str) -> list[Task]:
    """Tasks whose requests look like a crawler's: Scrapy's default headers, a callback."""
    headers = Headers(
        {
            "Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
            "Accept-Language": "en",
            "User-Agent": "Scrapy/2.19.0 (+https://scrapy.org)",
            "Accept-Encoding": "gzip, deflate, br, zstd",
        }
    )
    tasks = []
    for i in range(N):
        request = Request(f"https://shop.example.com/catalog/item/{i}?page=2", headers=headers)
        body = request_to_json(request, None)
        body["callback"] = "parse_item"
        tasks.append(
            Task(
                id=f"{i:040x}",
                spider=spider,
                request=body,
                attempts={"server_error": 1},
                kind="server_error",
                first_error={
                    "kind": "server_error",
                    "type": "HttpStatus",
                    "message": "HTTP 503",
                    "status": 503,
                },
                last_error={
                    "kind": "server_error",
                    "type": "HttpStatus",
                    "message": "HTTP 503",
                    "status": 503,
                    "delay": 7.5,
                },
                node="bench-node:1234",
                created=1_700_000_000_000,
                updated=1_700_000_000_000,
                due=1000 + i,
            )
        )
    return tasks


def _rate(seconds: float) -> float:
    return N / seconds


def measure(redis_url: str, workdir: Path) -> dict[str, float]:
    client = redis.Redis.from_url(redis_url)
    spider = f"q{uuid.uuid4().hex[:6]}"
    queue = RedisDelayedQueue(client, spider, node_id="bench")
    tasks = sample_tasks(spider)
    writes = [Write.for_task("schedule", t, None, 1) for t in tasks]
    envelopes = [w.envelope for w in writes]
    raw = f"raw:{{{spider}}}"
    move = client.register_script(RAW_MOVE)
    move(keys=[f"{raw}:a", f"{raw}:b", f"{raw}:h"], args=[0, 0, 0])  # load it
    out: dict[str, float] = {}
    try:
        # schedule
        start = time.perf_counter()
        for i in range(0, N, BATCH):
            queue.apply(writes[i : i + BATCH])
        out["ours schedule/s"] = _rate(time.perf_counter() - start)
        start = time.perf_counter()
        pipe = client.pipeline(transaction=False)
        for i, (task, envelope) in enumerate(zip(tasks, envelopes, strict=True)):
            pipe.zadd(f"{raw}:a", {task.id: task.due})
            pipe.hset(f"{raw}:h", task.id, envelope)
            if i % BATCH == BATCH - 1:
                pipe.execute()
        pipe.execute()
        out["raw schedule/s"] = _rate(time.perf_counter() - start)

        # claim
        start = time.perf_counter()
        tokens = {}
        while claimed := queue.claim(now=10**13, limit=BATCH, lease_until=10**13, token="t").tasks:
            tokens.update((task_id, "t") for task_id, _ in claimed)
        out["ours claim/s"] = _rate(time.perf_counter() - start)
        assert len(tokens) == N
        start = time.perf_counter()
        while move(keys=[f"{raw}:a", f"{raw}:b", f"{raw}:h"], args=[10**13, BATCH, 10**13]):
            pass
        out["raw claim/s"] = _rate(time.perf_counter() - start)

        # ack
        acks = [Write("ack", t.id, 2, "t", kind=t.kind, url=t.url) for t in tasks]
        start = time.perf_counter()
        for i in range(0, N, BATCH):
            assert all(queue.apply(acks[i : i + BATCH]))
        out["ours ack/s"] = _rate(time.perf_counter() - start)
        start = time.perf_counter()
        pipe = client.pipeline(transaction=False)
        for i, task in enumerate(tasks):
            pipe.zrem(f"{raw}:b", task.id)
            pipe.hdel(f"{raw}:h", task.id)
            if i % BATCH == BATCH - 1:
                pipe.execute()
        pipe.execute()
        out["raw ack/s"] = _rate(time.perf_counter() - start)
    finally:
        forget(client, spider)
        client.delete(f"{raw}:a", f"{raw}:b", f"{raw}:h")
        client.close()
    for op in ("schedule", "claim", "ack"):
        out[f"{op} ratio"] = out[f"ours {op}/s"] / out[f"raw {op}/s"]
    return out
