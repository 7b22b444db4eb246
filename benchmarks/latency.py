"""6. Latency from a task's due time to its request entering Scrapy's scheduler.

10,000 tasks come due evenly over 20 s while a crawler (start requests: none)
polls every RETRYQUEUE_POLL_INTERVAL (1 s, the default); a probe extension
records, per re-injected request, the time it was scheduled minus its due
time. Target: p99 within the poll interval plus 100 ms.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import redis

from .common import flaky_site, forget, percentile, preload, run_crawl

TASKS = 10_000
SPREAD_S = 20.0
LEAD_S = 4.0  # the crawler's start-up time, so no task is due before it polls
POLL = 1.0


def measure(redis_url: str, workdir: Path) -> dict[str, float]:
    client = redis.Redis.from_url(redis_url)
    spider = f"lat{uuid.uuid4().hex[:6]}"
    probe_file = workdir / f"{spider}-latency.json"
    with flaky_site(pages=TASKS, mix="healthy") as site:
        start = time.time() + LEAD_S
        dues = [int((start + SPREAD_S * i / TASKS) * 1000) for i in range(TASKS)]
        preload(client, spider, [f"{site.url}/page/{i}" for i in range(TASKS)], due_ms=dues)
        settings = {
            "RETRYQUEUE_REDIS_URL": redis_url,
            "RETRYQUEUE_POLL_INTERVAL": POLL,
            # Room for every task that comes due within a poll: the figure is
            # the queue's latency, not a full crawler's backlog.
            "RETRYQUEUE_MAX_IN_FLIGHT": 5000,
            "EXTENSIONS": {"benchmarks.probes.SchedulingProbe": 0},
            "BENCH_LATENCY_FILE": str(probe_file),
        }
        run_crawl(site.url, spider, settings, workdir, "-a", "index=false")
    forget(client, spider)
    client.close()
    delays = json.loads(probe_file.read_text())
    assert len(delays) == TASKS, len(delays)
    return {
        "p50 ms": percentile(delays, 50) * 1000,
        "p99 ms": percentile(delays, 99) * 1000,
        "max ms": max(delays) * 1000,
    }
