"""2. Dead letters: a crawl of 3,000 pages that all answer 404, and one where all answer
403 (a dead letter logged at WARNING), the add-on against stock Scrapy.

Served by nginx (benchmarks/static_site.py). Stock Scrapy drops each answer in
HttpErrorMiddleware; the add-on dead-letters each one: an envelope written to
Redis, an event, a row in the store. Variants: stock; ours with the store
writer on its default SQLite database; ours writing to PostgreSQL (a database
of the benchmark's own on the local server). Both schemas are made before the
crawls (once, as a project's are); the store writer's start (importing
SQLAlchemy and Alembic, checking the schema) is in each crawl's CPU. Pages/s runs from the spider's
opening to its last response; "close s" is how long the crawl then took to
close. CPU per page covers the crawler process from the spider's opening to
its exit, so the store's last writes are in it. The variants' order alternates
between rounds; ratios are ours ÷ stock of the same round.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from .common import STOCK, CrawlCost, alternate, forget, measured_crawl, own_database
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
        for status, section in SECTIONS.items():
            variants = ["stock", "sqlite"] + (["pg"] if database_url else [])
            costs: dict[str, CrawlCost] = {}
            for label in alternate(f"{__name__}.{status}", variants):
                spider = f"{label}{uuid.uuid4().hex[:6]}"
                settings = dict(STOCK) if label == "stock" else ours_settings(redis_url, workdir)
                if label == "pg":
                    settings["RETRYQUEUE_DATABASE_URL"] = database_url
                costs[label] = measured_crawl(site, section, PAGES, spider, settings, workdir)
                forget(client, spider)
            for label, cost in costs.items():
                assert cost.stats["response_received_count"] == PAGES + 1, cost.stats
                if label != "stock":
                    assert cost.stats["retryqueue/dead"] == PAGES, cost.stats
            stock = costs["stock"]
            figures[f"{status} stock pages/s"] = stock.pages_per_s
            figures[f"{status} stock CPU ms/page"] = stock.cpu_ms_per_page
            for label in variants[1:]:
                ours = costs[label]
                figures[f"{status} ours ({label}) pages/s"] = ours.pages_per_s
                figures[f"{status} ours ({label}) CPU ms/page"] = ours.cpu_ms_per_page
                figures[f"{status} ours ({label}) close s"] = ours.close_s
            for label in variants[1:]:
                ours = costs[label]
                figures[f"{status} ({label}) pages/s ratio"] = ours.pages_per_s / stock.pages_per_s
                figures[f"{status} ({label}) CPU ratio"] = (
                    ours.cpu_ms_per_page / stock.cpu_ms_per_page
                )
            figures[f"{status} nginx ÷ crawler CPU"] = stock.site_share
    client.close()
    return figures
