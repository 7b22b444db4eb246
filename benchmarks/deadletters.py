"""2. Dead letters: a crawl of 3,000 pages that all answer 404, and one where all answer
403 (a dead letter logged at WARNING), the add-on against stock Scrapy.

Served by nginx (benchmarks/static_site.py). Stock Scrapy drops each answer in
HttpErrorMiddleware; the add-on dead-letters each one: an envelope written to
Redis, an event, a row in the store. Variants: stock; ours with the store
writer on its default SQLite database; ours writing to PostgreSQL (a database
of the benchmark's own on the local server); ours with the store writer off.
Both schemas are made before the crawls (once, as a project's are); the store
writer's start (checking the schema) is in each crawl's CPU. Pages/s runs from the spider's
opening to its last response, the variants crawling one after the other (the
order alternating between rounds); "close s" is how long the crawl then took
to close. CPU per page covers the crawler process from the spider's opening to
its exit, so the store's last writes are in it; it comes from the variants
crawling side by side, so that all meet the same machine load. Ratios are
ours ÷ stock of the same round.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from .common import (
    STOCK,
    CrawlCost,
    alternate,
    forget,
    measured_crawl,
    own_database,
    side_by_side,
)
from .overhead import ours_settings, prepare_store
from .static_site import static_site

PAGES = 3000
SECTIONS = {"404": "notfound", "403": "forbidden"}


def measure(redis_url: str, workdir: Path) -> dict[str, float]:
    import redis

    client = redis.Redis.from_url(redis_url)
    figures: dict[str, float] = {}
    with static_site(PAGES) as site, own_database() as database_url:
        if database_url:
            prepare_store(database_url)
        variants: dict[str, dict[str, object]] = {
            "stock": dict(STOCK),
            "sqlite": ours_settings(redis_url, workdir),
            "store off": {"RETRYQUEUE_REDIS_URL": redis_url},
        }
        if database_url:
            variants["pg"] = {**variants["sqlite"], "RETRYQUEUE_DATABASE_URL": database_url}
        for status, section in SECTIONS.items():
            costs: dict[str, CrawlCost] = {}
            for label in alternate(f"{__name__}.{status}", list(variants)):
                spider = f"{label.replace(' ', '')}{uuid.uuid4().hex[:6]}"
                settings = dict(variants[label])
                costs[label] = measured_crawl(site, section, PAGES, spider, settings, workdir)
                forget(client, spider)
            paired = side_by_side(
                site, [(section, v) for v in variants.values()], PAGES, workdir, client
            )
            cpu = dict(zip(variants, paired, strict=True))
            for label, cost in [*costs.items(), *cpu.items()]:
                assert cost.stats["response_received_count"] == PAGES + 1, cost.stats
                if label != "stock":
                    assert cost.stats["retryqueue/dead"] == PAGES, cost.stats
            stock = costs["stock"]
            figures[f"{status} stock pages/s"] = stock.pages_per_s
            figures[f"{status} stock CPU ms/page"] = cpu["stock"].cpu_ms_per_page
            for label in list(variants)[1:]:
                figures[f"{status} ours ({label}) pages/s"] = costs[label].pages_per_s
                figures[f"{status} ours ({label}) CPU ms/page"] = cpu[label].cpu_ms_per_page
                figures[f"{status} ours ({label}) close s"] = costs[label].close_s
            for label in list(variants)[1:]:
                figures[f"{status} ({label}) pages/s ratio"] = (
                    costs[label].pages_per_s / stock.pages_per_s
                )
                figures[f"{status} ({label}) CPU ratio"] = (
                    cpu[label].cpu_ms_per_page / cpu["stock"].cpu_ms_per_page
                )
            figures[f"{status} nginx ÷ crawler CPU"] = stock.site_share
    client.close()
    return figures
