"""One dead letter in-process, step by step: the crawl's CPU and container allocations
per 404 the add-on dead-letters at once (issue 38: an all-404 crawl against stock).

The crawl's own components (the middleware, the runtime facade's planner, write path
and reporter) run against the benchmark's Redis in one process, with no crawl around
them, on batches of BATCH 404s of a realistic request (cycle.py's headers, callback and
meta). The write path is held as if a batch were on the worker (its writes gather in
its buffer); the batch is then applied as the worker applies it and its replies fired
as the reactor fires them. Each figure is the thread's CPU per dead letter
(``time.thread_time``), the median of ROUNDS batches:

- "reactor: process_response" is the middleware's whole call for one 404 (the
  coroutine Scrapy awaits, driven here to its end): classify, breaker, plan, write,
  submit. Its parts are measured alone on another batch: "classify", "plan"
  (policy, request as JSON, envelope fields), "write build" (envelope JSON, the
  Write); "submit and the rest" is what the whole call costs beyond them.
- "reactor: write's reply" fires each write's Deferred with its outcome (DEAD): the
  reporter's stats and dead line, the write's tracking let go.
- "worker: apply" is the worker thread's share: the script call's ARGV packed, the
  call made, its reply read (the Redis server's own CPU is not in it).

"gen0 count" figures are what each step adds to the collector's generation-0 count per
dead letter (the collector off meanwhile): gc-tracked containers allocated, less those
freed (one freed to a free list is not taken off), the count that starts a collection
every 700. "whole dead letter" is the process_response, apply and reply steps'
together, once their batch is let go: a dead letter's pressure on the collector.
"""

from __future__ import annotations

import gc
import statistics
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import scrapy
from scrapy.http import HtmlResponse
from scrapy.utils.httpobj import urlparse_cached
from twisted.internet.defer import Deferred

from scrapy_retryqueue.crawl.middleware import RetryQueueMiddleware
from scrapy_retryqueue.decision.classify import classify_status
from scrapy_retryqueue.queue.delayed import Write

from .common import forget
from .cycle import HEADERS, driven_queue

BATCH = 200
ROUNDS = 7
SITE = "http://127.0.0.1:8080"


def _requests(runtime: Any, n: int) -> list[tuple[scrapy.Request, HtmlResponse]]:
    """Fresh 404s, with what a crawl has cached on them before the middleware sees them."""
    spider = runtime.spider
    pairs = []
    for _ in range(n):
        request = scrapy.Request(
            f"{SITE}/gone/page-{uuid.uuid4().hex[:8]}.html",
            callback=spider.parse,
            headers=HEADERS,
            meta={"depth": 1, "download_slot": "127.0.0.1", "category": "books"},
        )
        runtime.crawler.request_fingerprinter.fingerprint(request)
        urlparse_cached(request)
        response = HtmlResponse(
            request.url,
            status=404,
            headers={"Content-Type": "text/html", "Server": "nginx"},
            body=b"<html><body>404 Not Found</body></html>",
            request=request,
        )
        pairs.append((request, response))
    return pairs


def _drive(coro: Any) -> Any:
    """Run a coroutine that never waits (a dead letter's process_response) to its end."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    raise AssertionError("process_response waited")


class _Clock:
    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}
        self.gen0: dict[str, float] = {}
        self.start = 0

    def timed(self, name: str, fn: Callable[[], Any]) -> Any:
        count = gc.get_count()[0]
        start = time.thread_time()
        result = fn()
        self.cpu[name] = time.thread_time() - start
        self.gen0[f"gen0 count: {name}"] = gc.get_count()[0] - count
        return result


def _one_round(runtime: Any, mw: RetryQueueMiddleware, held: list[Any]) -> _Clock:
    clock = _Clock()
    config = runtime.config
    writes = runtime.writes
    # The parts alone, on a batch of their own (nothing of it is submitted).
    parts = _requests(runtime, BATCH)
    failures = clock.timed(
        "reactor: classify",
        lambda: [
            classify_status(404, None, status_kinds=config.status_kinds, now=time.time())
            for _ in parts
        ],
    )
    plans = clock.timed(
        "reactor: plan",
        lambda: [runtime.planner.plan(r, f) for (r, _), f in zip(parts, failures, strict=True)],
    )
    clock.timed(
        "reactor: write build",
        lambda: [Write.for_task(p.op, p.task, p.token, p.now, host=p.host) for p in plans],
    )
    parts = failures = plans = None  # freed before the counted batch
    # The whole call, on another batch, its writes gathering as behind a batch on the worker.
    pairs = _requests(runtime, BATCH)
    gc.collect()
    gc.disable()
    # The count only falls while above 0: ballast keeps it there, so frees count.
    ballast = [[] for _ in range(50_000)]
    clock.gen0.clear()  # only the counted batch's, the collector off
    clock.start = gc.get_count()[0]
    try:
        results = clock.timed(
            "reactor: process_response",
            lambda: [_drive(mw.process_response(r, resp)) for r, resp in pairs],
        )
        assert all(a is b for a, b in zip(results, (resp for _, resp in pairs), strict=True))
        results = None
        assert len(writes._buffer) == BATCH
        # The batch goes to the "worker" as _flush sends it (call_untracked is held).
        writes._flushing = False
        writes._flush()
        ((apply, args, done),) = held
        held.clear()
        outcomes = clock.timed("worker: apply", lambda: apply(*args))
        clock.timed("reactor: write's reply", lambda: done.callback(outcomes))
        assert not writes._flushing and not writes._pending
        writes._flushing = True
        done = outcomes = None  # the replies handled: what is left is kept
        clock.gen0["gen0 count: whole dead letter"] = gc.get_count()[0] - clock.start
    finally:
        del ballast
        gc.enable()
    cpu = clock.cpu
    cpu["reactor: submit and the rest"] = cpu["reactor: process_response"] - sum(
        cpu[name] for name in ("reactor: classify", "reactor: plan", "reactor: write build")
    )
    return clock


def measure(redis_url: str, workdir: Path) -> dict[str, float]:
    spider, runtime, client, queue = driven_queue(redis_url, workdir, "dead")
    writes = runtime.writes
    writes.queue = queue
    writes._flushing = True  # as if a batch were on the worker: submit only gathers
    held: list[Any] = []

    def call_untracked(fn: Callable[..., Any], *args: Any) -> Deferred[Any]:
        """The worker's call, held: the round applies it and fires its Deferred."""
        d: Deferred[Any] = Deferred()
        held.append((fn, args, d))
        return d

    writes.call_untracked = call_untracked
    mw = RetryQueueMiddleware(runtime, None)
    cpu: dict[str, list[float]] = {}
    gen0: dict[str, list[float]] = {}
    try:
        _one_round(runtime, mw, held)  # warm: scripts loaded, the dead lines' limit passed
        for _ in range(ROUNDS):
            clock = _one_round(runtime, mw, held)
            for name, seconds in clock.cpu.items():
                cpu.setdefault(name, []).append(seconds)
            for name, count in clock.gen0.items():
                gen0.setdefault(name, []).append(count)
    finally:
        writes.queue = None
        forget(client, spider)
        client.close()
    figures = {f"{name} µs": statistics.median(v) / BATCH * 1e6 for name, v in cpu.items()}
    figures["reactor total µs"] = (
        figures["reactor: process_response µs"] + figures["reactor: write's reply µs"]
    )
    figures.update({name: statistics.median(v) / BATCH for name, v in gen0.items()})
    return figures


if __name__ == "__main__":
    import sys
    import tempfile

    url = sys.argv[1] if len(sys.argv) > 1 else "redis://127.0.0.1:6379/0"
    with tempfile.TemporaryDirectory() as tmp:
        for name, value in measure(url, Path(tmp)).items():
            print(f"{name:<40} {value:8.2f}")
