"""One retry cycle in-process, step by step: the CPU each step of park, claim, re-inject
and ack costs a retried request, and the envelope's JSON against orjson and msgspec.

The crawl's own components (the runtime facade's planner, reporter and claim reader,
the queue's write calls) run against the benchmark's Redis in one process, with no
crawl around them, on batches of BATCH retried 503s of a realistic request (Scrapy's
default headers, a spider callback, a few meta keys). Each figure is the thread's CPU
per request (``time.thread_time``), so the machine's load moves it little; the Redis
server's own CPU is not in it. "Redis call" steps are the client's side of one script
call per batch (its arguments packed, the reply parsed): schedule.lua for the parks,
claim.lua for the poll that claims them all, ack.lua for their acks. The re-injection
is ``runtime.claimed``: the envelope read and checked, the request rebuilt (Scrapy's
``request_from_dict``), its task marked; the offsite check it also makes needs an
engine and is left out here. The write replies are the reporter's stats and signals
(no handler is connected, as in a crawl that connects none). The codecs encode and
decode the same envelope's document; orjson and msgspec are measured when installed
(they are no dependency of the package). Each step's figure holds the garbage
collections it met (the batch's rebuilt requests stay alive until their acks, so the
re-injection meets most); "garbage collection" gives their part apart (gc.callbacks).
"""

from __future__ import annotations

import gc
import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
import scrapy
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.test import get_crawler

from scrapy_retryqueue.decision.classify import classify_status
from scrapy_retryqueue.queue.delayed import RedisDelayedQueue, Write
from scrapy_retryqueue.queue.document import dumps, read_document
from scrapy_retryqueue.runtime import RetryQueueRuntime
from scrapy_retryqueue.runtime.outcome import Outcome
from scrapy_retryqueue.settings.defaults import META_TASK
from scrapy_retryqueue.values import now_ms

from .common import forget

#: Retried requests per batch (one script call of each kind), and batches per run.
BATCH = 200
ROUNDS = 5
HEADERS = {
    "Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
    "Accept-Language": "en",
    "User-Agent": "Scrapy/2.19.0 (+https://scrapy.org)",
    "Accept-Encoding": "gzip, deflate, br, zstd",
}


class CycleSpider(scrapy.Spider):
    name = "cycle"

    def parse(self, response: Any) -> None:
        pass


def driven_queue(
    redis_url: str, workdir: Path, prefix: str
) -> tuple[str, RetryQueueRuntime, redis.Redis, RedisDelayedQueue]:
    """A new spider name, its runtime (never opened) and a queue of its own on *redis_url*,
    for the in-process benchmarks that drive the queue themselves."""
    spider = f"{prefix}{uuid.uuid4().hex[:6]}"
    runtime = _runtime(redis_url, workdir, spider)
    client = redis.Redis.from_url(redis_url)
    return (
        spider,
        runtime,
        client,
        RedisDelayedQueue(client, spider, node_id=runtime.config.node_id),
    )


def _runtime(redis_url: str, workdir: Path, spider: str) -> RetryQueueRuntime:
    """A crawler's runtime, its spider created, never opened (the queue is driven here)."""
    crawler = get_crawler(
        CycleSpider,
        {
            "RETRYQUEUE_REDIS_URL": redis_url,
            "RETRYQUEUE_STORE_ENABLED": False,
            "RETRYQUEUE_EMBEDDED_DIR": str(workdir / "cycle-embedded"),
        },
    )
    crawler.spider = crawler._create_spider(name=spider)
    runtime = RetryQueueRuntime(crawler)
    runtime.spider = runtime.planner.spider = runtime.reporter.spider = crawler.spider
    return runtime


class _Collections:
    """The thread's CPU in the garbage collector (gc.callbacks), added up while on."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.thread_time()
        else:
            self.seconds += time.thread_time() - self._start


_COLLECTIONS = _Collections()
#: The step whose collections are also given apart: the largest, and the one that
#: keeps the batch's rebuilt requests alive (it meets most of the collections).
_REINJECT = "re-inject: envelope read, request rebuilt"
_GC_ALL = "of the steps: garbage collection"
_GC_REINJECT = "re-inject: of which garbage collection"


def _timed(clock: dict[str, float], name: str, fn: Callable[[], Any]) -> Any:
    collected = _COLLECTIONS.seconds
    start = time.thread_time()
    result = fn()
    clock[name] = clock.get(name, 0.0) + time.thread_time() - start
    gc_seconds = _COLLECTIONS.seconds - collected
    clock[_GC_ALL] = clock.get(_GC_ALL, 0.0) + gc_seconds
    if name == _REINJECT:
        clock[_GC_REINJECT] = clock.get(_GC_REINJECT, 0.0) + gc_seconds
    return result


def _one_round(runtime: RetryQueueRuntime, queue: RedisDelayedQueue, site: str) -> dict[str, float]:
    """One batch through the whole cycle; CPU seconds per step for the batch."""
    clock: dict[str, float] = {}
    spider = runtime.spider
    requests = [
        scrapy.Request(
            f"{site}/retry/page-{uuid.uuid4().hex[:8]}.html",
            callback=spider.parse,
            headers=HEADERS,
            meta={"depth": 1, "download_slot": "127.0.0.1", "category": "books"},
        )
        for _ in range(BATCH)
    ]
    # Made before the retry path in a crawl: the dupefilter's fingerprint, the
    # downloader's parse of the URL (both cached per request).
    for request in requests:
        runtime.crawler.request_fingerprinter.fingerprint(request)
        urlparse_cached(request)
    config = runtime.config
    failures = _timed(
        clock,
        "park: classify the 503",
        lambda: [
            classify_status(503, None, status_kinds=config.status_kinds, now=time.time())
            for _ in requests
        ],
    )
    plans = _timed(
        clock,
        "park: plan (policy, request as JSON)",
        lambda: [runtime.planner.plan(r, f) for r, f in zip(requests, failures, strict=True)],
    )
    writes = _timed(
        clock,
        "park: envelope JSON, its write",
        lambda: [Write.for_task(p.op, p.task, p.token, p.now, host=p.host) for p in plans],
    )
    # Due at once, so the claim below finds them all.
    writes = [Write(**{**_fields(w), "due": w.now}) for w in writes]
    assert all(_timed(clock, "schedule.lua: Redis call", lambda: queue.apply(writes)))
    reporter = runtime.reporter
    _timed(
        clock,
        "park: write's reply (stats, signal)",
        lambda: [reporter.planned(p, Outcome.PARKED) for p in plans],
    )
    token = uuid.uuid4().hex
    now = now_ms()
    claimed = _timed(
        clock,
        "claim.lua: Redis call",
        lambda: queue.claim(now=now + 1, limit=BATCH, lease_until=now + 60_000, token=token),
    )
    assert len(claimed.tasks) == BATCH, len(claimed.tasks)
    rebuilt = _timed(
        clock,
        _REINJECT,
        lambda: [runtime.claimed(task_id, raw, token) for task_id, raw in claimed.tasks],
    )
    assert all(r is not None for r in rebuilt)
    refs = [r.meta[META_TASK] for r in rebuilt]
    acks = _timed(
        clock, "ack: its write", lambda: [runtime.ack_write(ref, now_ms()) for ref in refs]
    )
    assert all(_timed(clock, "ack.lua: Redis call", lambda: queue.apply(acks)))
    _timed(
        clock,
        "ack: write's reply (stats, signal)",
        lambda: [
            reporter.acked(r, ref, "recovered", Outcome.ACKED, now)
            for r, ref in zip(rebuilt, refs, strict=True)
        ],
    )
    return clock


def _fields(write: Write) -> dict[str, Any]:
    return {name: getattr(write, name) for name in write.__slots__}


def _codecs(envelope: str) -> dict[str, float]:
    """µs per encode + decode of *envelope*'s document, for each codec installed."""
    doc = json.loads(envelope)
    codecs: dict[str, tuple[Callable[[], Any], Callable[[Any], Any]]] = {
        "json (the package's)": (lambda: dumps(doc), read_document),
    }
    try:
        import orjson

        codecs["orjson"] = (lambda: orjson.dumps(doc), orjson.loads)
    except ImportError:
        pass
    try:
        import msgspec

        encoder, decoder = msgspec.json.Encoder(), msgspec.json.Decoder()
        codecs["msgspec"] = (lambda: encoder.encode(doc), decoder.decode)
    except ImportError:
        pass
    figures = {}
    n = 5000
    for name, (encode, decode) in codecs.items():
        best = float("inf")
        for _ in range(5):
            start = time.thread_time()
            for _ in range(n):
                decode(encode())
            best = min(best, (time.thread_time() - start) / n)
        figures[f"envelope {name} encode + decode µs"] = best * 1e6
    figures["envelope bytes"] = len(envelope.encode())
    return figures


def measure(redis_url: str, workdir: Path) -> dict[str, float]:
    spider, runtime, client, queue = driven_queue(redis_url, workdir, "cycle")
    totals: dict[str, float] = {}
    envelope = ""
    gc.callbacks.append(_COLLECTIONS)
    try:
        _one_round(runtime, queue, "http://127.0.0.1:8080")  # warm: scripts loaded, imports
        for _ in range(ROUNDS):
            for step, seconds in _one_round(runtime, queue, "http://127.0.0.1:8080").items():
                totals[step] = totals.get(step, 0.0) + seconds
        request = scrapy.Request("http://127.0.0.1:8080/retry/page-1.html", headers=HEADERS)
        failure = classify_status(
            503, None, status_kinds=runtime.config.status_kinds, now=time.time()
        )
        plan = runtime.planner.plan(request, failure)
        envelope = plan.task.to_json()
    finally:
        gc.callbacks.remove(_COLLECTIONS)
        forget(client, spider)
        client.close()
    per_request = ROUNDS * BATCH
    parts = [_GC_ALL, _GC_REINJECT]
    steps = {step: seconds for step, seconds in totals.items() if step not in parts}
    figures = {f"{step} µs": seconds / per_request * 1e6 for step, seconds in steps.items()}
    figures["cycle total µs"] = sum(steps.values()) / per_request * 1e6
    for part in parts:
        figures[f"{part} µs"] = totals.get(part, 0.0) / per_request * 1e6
    figures.update(_codecs(envelope))
    return figures
