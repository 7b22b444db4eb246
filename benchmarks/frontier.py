"""10. The leased frontier on a healthy crawl, against scrapy-redis's own priority queue.

The 5,000-page healthy crawl of `overhead` (nginx, every page 200 at once), with
scrapy-redis's scheduler over its default PriorityQueue and RFPDupeFilter (each
push a ZADD, each pop a MULTI, each dupefilter check an SADD, all on the reactor
thread), and over the leased frontier (`LeasedPriorityQueue`, `FrontierDupeFilter`:
pushes, leases and acknowledgements batched per round trip on the add-on's Redis
thread). Both have the add-on (store off) and one Redis of the benchmark's own.
Pages/s from the variants crawling one after the other (order alternating by
round); CPU per page from the two crawling side by side; ratios are leased ÷
scrapy-redis of the same round.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from .common import CrawlCost, alternate, forget, measured_crawl, side_by_side
from .static_site import static_site

PAGES = 5000


def variants(redis_url: str) -> dict[str, dict[str, object]]:
    shared = {
        "SCHEDULER": "scrapy_redis.scheduler.Scheduler",
        "SCHEDULER_PERSIST": False,
        "REDIS_URL": redis_url,
        "RETRYQUEUE_REDIS_URL": redis_url,
    }
    return {
        "scrapy-redis": {
            **shared,
            "SCHEDULER_QUEUE_CLASS": "scrapy_redis.queue.PriorityQueue",
            "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter",
        },
        "leased": {
            **shared,
            "SCHEDULER_QUEUE_CLASS": "scrapy_retryqueue.crawl.frontier.LeasedPriorityQueue",
            "DUPEFILTER_CLASS": "scrapy_retryqueue.crawl.frontier.FrontierDupeFilter",
        },
    }


def _forget(client: object, spider: str) -> None:
    # The example project's crawls keep their keys (the frontier's too) in its namespace.
    forget(client, spider)  # type: ignore[arg-type]
    client.delete(f"{spider}:requests", f"{spider}:dupefilter")  # type: ignore[attr-defined]


def measure(redis_url: str, workdir: Path) -> dict[str, float]:
    import redis

    client = redis.Redis.from_url(redis_url)
    runs = variants(redis_url)
    costs: dict[str, CrawlCost] = {}
    with static_site(PAGES) as site:
        for label in alternate(__name__, list(runs)):
            spider = f"fr{uuid.uuid4().hex[:6]}"
            costs[label] = measured_crawl(
                site, "healthy", PAGES, spider, dict(runs[label]), workdir
            )
            _forget(client, spider)
        paired = side_by_side(site, [("healthy", v) for v in runs.values()], PAGES, workdir, client)
    client.close()
    for cost in [*costs.values(), *paired]:
        assert cost.stats["response_received_count"] == PAGES + 1, cost.stats
    cpu = dict(zip(runs, paired, strict=True))
    return {
        "scrapy-redis pages/s": costs["scrapy-redis"].pages_per_s,
        "leased pages/s": costs["leased"].pages_per_s,
        "scrapy-redis CPU ms/page": cpu["scrapy-redis"].cpu_ms_per_page,
        "leased CPU ms/page": cpu["leased"].cpu_ms_per_page,
        "ratio": costs["leased"].pages_per_s / costs["scrapy-redis"].pages_per_s,
        "CPU ratio": cpu["leased"].cpu_ms_per_page / cpu["scrapy-redis"].cpu_ms_per_page,
    }
