"""The store writer's CPU per event of the retry cycle, step by step, in-process.

The crawl's own components (as benchmarks/cycle.py drives them) park BATCH
retried 503s, claim them, re-inject and acknowledge them against the benchmark's
Redis; the store writer (:class:`~scrapy_retryqueue.store.sync.EventSync`, as a
crawl's forked writer runs it) writes their events into a fresh SQLite file as a
crawl's writer meets them: the ``scheduled`` events while the tasks are parked
(their envelopes still in Redis), then the ``claimed`` and ``succeeded`` ones.
Each figure is the thread's CPU (``time.thread_time``) per event of the steps
of :meth:`EventSync.fetch` (the stream read, the entries parsed, the rows built
with their envelopes read) and :meth:`EventSync.write` (the upsert, its commit,
the entries acknowledged). Run as ``python -m benchmarks.writersteps [--profile]``.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from scrapy_retryqueue.queue.delayed import RedisDelayedQueue
from scrapy_retryqueue.store.db import Store
from scrapy_retryqueue.store.sync import EventSync

from . import cycle
from .common import forget

ROUNDS = 5


class _TimedSync(EventSync):
    """EventSync whose fetch and write add their thread CPU to a clock."""

    clock: dict[str, float]

    def fetch(self, block_ms: int = 0) -> Any:
        start = time.thread_time()
        try:
            return super().fetch(block_ms)
        finally:
            self.clock["fetch"] = self.clock.get("fetch", 0.0) + time.thread_time() - start

    def build(self, events: Any) -> Any:
        start = time.thread_time()
        try:
            return super().build(events)
        finally:
            self.clock["build"] = self.clock.get("build", 0.0) + time.thread_time() - start

    def write(self, prepared: Any) -> Any:
        start = time.thread_time()
        try:
            return super().write(prepared)
        finally:
            self.clock["write"] = self.clock.get("write", 0.0) + time.thread_time() - start


def _drain(sync: _TimedSync, profile: cProfile.Profile | None) -> int:
    """Write every event there is; the events written."""
    events = 0
    if profile is not None:
        profile.enable()
    try:
        while True:
            result = sync.step()
            if not result.events:
                return events
            events += result.events
    finally:
        if profile is not None:
            profile.disable()


class _WriterBeforeClaim:
    """The queue, its claim made once the writer wrote the parks' events: as a
    crawl's writer meets them (the envelopes of parked tasks still in Redis)."""

    def __init__(self, queue: RedisDelayedQueue, sync: _TimedSync) -> None:
        self.queue, self.sync = queue, sync
        self.profile: cProfile.Profile | None = None
        self.events = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.queue, name)

    def claim(self, *args: Any, **kwargs: Any) -> Any:
        self.events += _drain(self.sync, self.profile)
        return self.queue.claim(*args, **kwargs)


def _rounds(
    redis_url: str, workdir: Path, rounds: int, profile: cProfile.Profile | None
) -> list[dict[str, float]]:
    spider, runtime, client, queue = cycle.driven_queue(redis_url, workdir, "wsteps")
    store = Store(f"sqlite:///{workdir / f'{spider}.db'}")
    store.ensure_schema()
    sync = _TimedSync(store, client, spider, consumer="bench", batch_size=500)
    sync.stream.ensure_group()
    driven = _WriterBeforeClaim(queue, sync)
    out = []
    try:
        for n in range(rounds + 1):
            # The first round warms (imports, compiled statements): not measured.
            driven.profile = profile if n else None
            sync.clock, driven.events = {}, 0
            cycle._one_round(runtime, driven, "http://127.0.0.1:8080")  # type: ignore[arg-type]
            events = driven.events + _drain(sync, driven.profile)
            if n:
                clock = sync.clock
                figures = {f"{k} µs/event": v / events * 1e6 for k, v in clock.items()}
                figures["read (fetch less build) µs/event"] = (
                    (clock["fetch"] - clock["build"]) / events * 1e6
                )
                figures["total µs/event"] = (clock["fetch"] + clock["write"]) / events * 1e6
                figures["events per retried request"] = events / cycle.BATCH
                out.append(figures)
    finally:
        forget(client, spider)
        client.close()
        store.close()
    return out


def measure(redis_url: str, workdir: Path, rounds: int = ROUNDS) -> dict[str, float]:
    results = _rounds(redis_url, workdir, rounds, None)
    return {k: statistics.median(r[k] for r in results) for k in results[0]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--sort", default="tottime")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.profile:
            profile = cProfile.Profile()
            _rounds(args.redis, Path(tmp), args.rounds, profile)
            pstats.Stats(profile).sort_stats(args.sort).print_stats(45)
            return
        for name, value in measure(args.redis, Path(tmp), args.rounds).items():
            print(f"{name:40s} {value:8.1f}")


if __name__ == "__main__":
    main()
