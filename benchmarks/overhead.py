"""1. Overhead on a healthy crawl: the add-on against stock Scrapy, same settings.

A crawl of 5,000 pages that all answer at once; pages/s of each variant, run
back to back (stock, ours) so both see the same machine load.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from .common import STOCK, flaky_site, forget, run_crawl

PAGES = 5000


def measure(redis_url: str, workdir: Path) -> dict[str, float]:
    import redis

    client = redis.Redis.from_url(redis_url)
    with flaky_site(pages=PAGES, mix="healthy") as site:
        stock = run_crawl(site.url, f"stock{uuid.uuid4().hex[:6]}", dict(STOCK), workdir)
        spider = f"ours{uuid.uuid4().hex[:6]}"
        ours = run_crawl(site.url, spider, {"RETRYQUEUE_REDIS_URL": redis_url}, workdir)
        forget(client, spider)
    client.close()
    for stats in (stock, ours):
        assert stats["response_received_count"] == PAGES + 1, stats
    stock_pps = PAGES / stock["elapsed_time_seconds"]
    ours_pps = PAGES / ours["elapsed_time_seconds"]
    return {"stock pages/s": stock_pps, "ours pages/s": ours_pps, "ratio": ours_pps / stock_pps}
