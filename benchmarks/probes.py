"""Scrapy extensions the benchmarks add to a crawl to read what happened in it.

Enabled through EXTENSIONS by benchmarks.common; never part of the package.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from scrapy import signals

from scrapy_retryqueue.defaults import META_TASK


class StatsDump:
    """Writes the crawl's final stats to BENCH_STATS_FILE as JSON."""

    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        self.path = Path(crawler.settings["BENCH_STATS_FILE"])

    @classmethod
    def from_crawler(cls, crawler: Any) -> StatsDump:
        probe = cls(crawler)
        crawler.signals.connect(probe.closed, signal=signals.spider_closed)
        return probe

    def closed(self, spider: Any, reason: str) -> None:
        stats = {
            k: v
            for k, v in self.crawler.stats.get_stats().items()
            if isinstance(v, (int, float, str))
        }
        stats.update(_peak_rss())
        self.path.write_text(json.dumps(stats))


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
