"""Scrapy extensions the benchmarks add to a crawl: to read what happened in it, and to set up its baselines.

Enabled through EXTENSIONS by benchmarks.common; never part of the package.
"""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path
from typing import Any

from scrapy import signals

from scrapy_retryqueue.settings.defaults import META_TASK


def cpu_seconds() -> float:
    """User + system CPU seconds of this whole process (every thread) so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class StatsDump:
    """Writes the crawl's final stats to BENCH_STATS_FILE as JSON, with when the
    spider opened, the last response came, and the spider closed, and the CPU
    the process had used when the spider opened (the parent subtracts it from
    the child's total resource usage: start-up and imports are not the crawl's)
    and when its first request reached the downloader (the start-up cost)."""

    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        self.path = Path(crawler.settings["BENCH_STATS_FILE"])
        self.cpu_at_open = 0.0
        self.threads_at_open: dict[str, float] = {}
        self.opened = 0.0
        self.first_response = 0.0
        self.last_response = 0.0
        #: CPU of the process (from its start) when its first request reached the
        #: downloader: the crawl's start-up cost (imports, components, connections).
        self.cpu_at_first_request = 0.0
        #: CPU seconds the garbage collector took, per generation, since the spider opened.
        self.gc_seconds: dict[str, float] = {}
        #: Collections per generation since the spider opened.
        self.gc_counts = [0, 0, 0]
        self._gc_started = 0.0

    @classmethod
    def from_crawler(cls, crawler: Any) -> StatsDump:
        probe = cls(crawler)
        crawler.signals.connect(probe.opened_, signal=signals.spider_opened)
        crawler.signals.connect(probe.response, signal=signals.response_received)
        crawler.signals.connect(probe.first_request, signal=signals.request_reached_downloader)
        crawler.signals.connect(probe.closed, signal=signals.spider_closed)
        return probe

    def _gc_timer(self, phase: str, info: dict[str, Any]) -> None:
        # The collecting thread's CPU, not the process's: while it collects, the
        # store writer's sqlite3 or socket calls (which release the GIL) go on in
        # other threads, and process time would count them as the collector's.
        if phase == "start":
            self._gc_started = time.thread_time()
        else:
            generation = info["generation"]
            key = f"bench/gc_s/gen{generation}"
            self.gc_seconds[key] = self.gc_seconds.get(key, 0.0) + (
                time.thread_time() - self._gc_started
            )
            self.gc_counts[generation] += 1

    def first_request(self, request: Any, spider: Any) -> None:
        self.cpu_at_first_request = cpu_seconds()
        # Once: the probe must not cost the crawl's other requests anything.
        self.crawler.signals.disconnect(
            self.first_request, signal=signals.request_reached_downloader
        )

    def opened_(self, spider: Any) -> None:
        import gc

        gc.callbacks.append(self._gc_timer)
        self.cpu_at_open = cpu_seconds()
        self.threads_at_open = _thread_cpu()
        self.opened = time.monotonic()

    def response(self, response: Any, request: Any, spider: Any) -> None:
        self.last_response = time.monotonic()
        if not self.first_response:
            self.first_response = self.last_response

    def closed(self, spider: Any, reason: str) -> None:
        now = time.monotonic()
        stats = {
            k: v
            for k, v in self.crawler.stats.get_stats().items()
            if isinstance(v, (int, float, str))
        }
        stats.update(_peak_rss())
        stats.update(_unique_memory())
        stats["bench/cpu_at_open"] = self.cpu_at_open
        stats["bench/cpu_at_close"] = cpu_seconds()
        stats["bench/cpu_at_first_request"] = self.cpu_at_first_request
        stats.update(self.gc_seconds)
        stats.update({f"bench/gc_n/gen{g}": n for g, n in enumerate(self.gc_counts)})
        stats["bench/open_to_close"] = now - self.opened
        stats["bench/last_response_to_close"] = now - (self.last_response or now)
        stats["bench/open_to_first_response"] = (self.first_response or now) - self.opened
        # Per thread, from the spider's opening on (start-up is the main thread's).
        at_open = getattr(self, "threads_at_open", {})
        stats.update({k: v - at_open.get(k, 0.0) for k, v in _thread_cpu().items()})
        self.path.write_text(json.dumps(stats))
        import atexit

        atexit.register(_add_children_cpu, self.path)


def _add_children_cpu(path: Path) -> None:
    """At the crawl's exit: the CPU of the processes it started and reaped (the
    store writer it forks), part of what the parent's wait4 of the crawl counts."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    stats = json.loads(path.read_text())
    stats["bench/children_cpu"] = usage.ru_utime + usage.ru_stime
    path.write_text(json.dumps(stats))


class FreezeHeap:
    """Freezes the crawl's heap while its engine runs, as the add-on does
    (RETRYQUEUE_FREEZE_HEAP, scrapy_retryqueue/heap.py): stock Scrapy with it is
    the baseline of the add-on's own cost, the collector's gain set aside."""

    def __init__(self, crawler: Any) -> None:
        crawler.signals.connect(self.started, signal=signals.engine_started)
        crawler.signals.connect(self.stopped, signal=signals.engine_stopped)

    @classmethod
    def from_crawler(cls, crawler: Any) -> FreezeHeap:
        return cls(crawler)

    def started(self) -> None:
        import gc

        gc.freeze()

    def stopped(self) -> None:
        import gc

        gc.unfreeze()


class AttemptHeader:
    """Downloader middleware: sends ``X-Bench-Attempt: <n>`` on a retried request
    (Scrapy's ``retry_times`` meta, which stock Scrapy's RetryMiddleware and the
    retry queue both set), so the static site's ``retry`` pages fail only once."""

    def process_request(self, request: Any, spider: Any = None) -> None:
        attempt = request.meta.get("retry_times")
        if attempt:
            request.headers[b"X-Bench-Attempt"] = str(attempt)


def _thread_cpu() -> dict[str, float]:
    """CPU seconds so far of each thread of this process, by thread name (Linux):
    where a crawl's CPU went (the reactor, the retry queue's Redis worker, the
    store writer, Twisted's pool), summed over threads of one name."""
    import os
    import re
    import threading

    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for thread in threading.enumerate():
        try:
            stat = Path(f"/proc/self/task/{thread.native_id}/stat").read_text()
        except (OSError, TypeError):
            continue
        fields = stat.rsplit(")", 1)[1].split()
        name = re.sub(r"-\d+$", "", thread.name)
        key = f"bench/thread_cpu/{name}"
        out[key] = out.get(key, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def _unique_memory() -> dict[str, int]:
    """As the spider closes, the proportional memory (PSS: a page shared by n
    processes counts 1/n in each, so the figures add up) of this process and of
    the processes it forked (the store writer, RETRYQUEUE_STORE_PROCESS), in bytes
    (Linux)."""
    import os

    def pss(pid: int | str) -> int:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    children = []
    for task in Path("/proc/self/task").iterdir():
        try:
            children += (task / "children").read_text().split()
        except OSError:
            continue
    return {
        "bench/pss": pss(os.getpid()),
        "bench/children_pss": sum(pss(pid) for pid in children),
    }


def _peak_rss() -> dict[str, int]:
    """This process's peak RSS in bytes, from /proc (Linux).

    Not ru_maxrss, which Scrapy's memusage/max uses: on Linux it survives
    execve, so a crawler started by a large parent reports the parent's peak.
    """
    try:
        lines = Path("/proc/self/status").read_text().splitlines()
    except OSError:
        return {}
    for line in lines:
        if line.startswith("VmHWM:"):
            return {"bench/peak_rss": int(line.split()[1]) * 1024}
    return {}


class SchedulingProbe:
    """Records, for each re-injected request, when it entered Scrapy's scheduler
    relative to its task's due time; written to BENCH_LATENCY_FILE as JSON."""

    def __init__(self, crawler: Any) -> None:
        self.path = Path(crawler.settings["BENCH_LATENCY_FILE"])
        self.delays: list[float] = []

    @classmethod
    def from_crawler(cls, crawler: Any) -> SchedulingProbe:
        probe = cls(crawler)
        crawler.signals.connect(probe.scheduled, signal=signals.request_scheduled)
        crawler.signals.connect(probe.closed, signal=signals.spider_closed)
        return probe

    def scheduled(self, request: Any, spider: Any) -> None:
        ref = request.meta.get(META_TASK)
        if isinstance(ref, dict) and "due" in ref:
            self.delays.append(time.time() - ref["due"] / 1000)

    def closed(self, spider: Any, reason: str) -> None:
        self.path.write_text(json.dumps(self.delays))


class DueProbe:
    """Records when the crawl's last retry fell due (its parking time plus the delay
    the queue gave it) and when the spider closed, in seconds since the spider
    opened; written to BENCH_DUE_FILE as JSON: how long the crawl ran beyond the
    backoff it was asked for."""

    def __init__(self, crawler: Any) -> None:
        self.path = Path(crawler.settings["BENCH_DUE_FILE"])
        self.opened = 0.0
        self.last_due = 0.0

    @classmethod
    def from_crawler(cls, crawler: Any) -> DueProbe:
        from scrapy_retryqueue import signals as rq_signals

        probe = cls(crawler)
        crawler.signals.connect(probe.opened_, signal=signals.spider_opened)
        crawler.signals.connect(probe.scheduled, signal=rq_signals.retryqueue_scheduled)
        crawler.signals.connect(probe.closed, signal=signals.spider_closed)
        return probe

    def opened_(self, spider: Any) -> None:
        self.opened = time.monotonic()

    def scheduled(self, decision: Any, **kwargs: Any) -> None:
        due = time.monotonic() - self.opened + decision.delay
        self.last_due = max(self.last_due, due)

    def closed(self, spider: Any, reason: str) -> None:
        closed = time.monotonic() - self.opened
        self.path.write_text(json.dumps({"closed": closed, "last_due": self.last_due}))
