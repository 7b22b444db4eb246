"""1. Overhead on a healthy crawl: the add-on against stock Scrapy, same settings.

A crawl of 5,000 pages that all answer 200 at once, served by nginx (see
benchmarks/static_site.py), so the crawler, not the site, is the bottleneck
("nginx ÷ crawler CPU"). Variants: stock Scrapy; ours as a project gets it
(the store writer on, with its default SQLite database, its schema made once
before the crawls as a project's is); ours with the store writer off.

Pages/s (spider opening to last response) come from the variants crawling one
after the other, the order alternating between rounds. CPU per page (user +
system of the crawler process, every thread, from the spider's opening to the
process's exit) comes from the variants crawling side by side in the same
round, so that all meet the same machine load. Ratios are ours ÷ stock of the
same round.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from .common import STOCK, CrawlCost, alternate, forget, measured_crawl, side_by_side
from .static_site import static_site

PAGES = 5000


def prepare_store(url: str) -> None:
    """Create the store's schema before the crawls: a project creates it once, not in
    every crawl, and its creation (Alembic's migrations) is not a crawl's cost."""
    from scrapy_retryqueue.store.db import Store

    store = Store(url)
    try:
        store.ensure_schema(create=True)
    finally:
        store.close()


def ours_settings(redis_url: str, workdir: Path) -> dict[str, object]:
    """The add-on as a project gets it, on the benchmark's Redis: the store writer
    on, with its default SQLite database (in a directory of this run, kept from
    crawl to crawl as a project's .scrapy/retryqueue is)."""
    from scrapy.settings import Settings

    from scrapy_retryqueue.connection import embedded_dir
    from scrapy_retryqueue.store.config import load_store_config

    embedded = workdir / "embedded"
    if not embedded.exists():
        embedded.mkdir()
        prepare_store(load_store_config(Settings({})).url_for(embedded_dir(str(embedded))))
    return {
        "RETRYQUEUE_REDIS_URL": redis_url,
        "RETRYQUEUE_STORE_ENABLED": True,
        "RETRYQUEUE_EMBEDDED_DIR": str(embedded),
    }


def measure(redis_url: str, workdir: Path) -> dict[str, float]:
    import redis

    client = redis.Redis.from_url(redis_url)
    store_on = ours_settings(redis_url, workdir)
    variants = {
        "stock": dict(STOCK),
        "ours": store_on,
        "ours, store off": {"RETRYQUEUE_REDIS_URL": redis_url},
    }
    costs: dict[str, CrawlCost] = {}
    with static_site(PAGES) as site:
        for label in alternate(__name__, list(variants)):
            spider = f"seq{uuid.uuid4().hex[:6]}"
            costs[label] = measured_crawl(
                site, "healthy", PAGES, spider, dict(variants[label]), workdir
            )
            forget(client, spider)
        paired = side_by_side(
            site, [("healthy", v) for v in variants.values()], PAGES, workdir, client
        )
    client.close()
    for cost in [*costs.values(), *paired]:
        assert cost.stats["response_received_count"] == PAGES + 1, cost.stats
    cpu = dict(zip(variants, paired, strict=True))
    stock = costs["stock"]
    figures = {
        "stock pages/s": stock.pages_per_s,
        "ours pages/s": costs["ours"].pages_per_s,
        "stock CPU ms/page": cpu["stock"].cpu_ms_per_page,
        "ours CPU ms/page": cpu["ours"].cpu_ms_per_page,
        "nginx ÷ crawler CPU": stock.site_share,
        "ratio": costs["ours"].pages_per_s / stock.pages_per_s,
        "CPU ratio": cpu["ours"].cpu_ms_per_page / cpu["stock"].cpu_ms_per_page,
        "store off: ratio": costs["ours, store off"].pages_per_s / stock.pages_per_s,
        "store off: CPU ratio": (
            cpu["ours, store off"].cpu_ms_per_page / cpu["stock"].cpu_ms_per_page
        ),
    }
    return figures
