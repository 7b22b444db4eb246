"""2. Dead letters: crawls where every page answers 404, and where all answer 403 (a
dead letter logged at WARNING), the add-on against stock Scrapy.

Served by nginx (benchmarks/static_site.py). Stock Scrapy drops each answer in
HttpErrorMiddleware; the add-on dead-letters each one: an envelope written to
Redis, an event, a row in the store. Variants: stock; ours with its defaults
("default": the store writer on, its default SQLite database, in the process the
crawl forks for it, RETRYQUEUE_STORE_PROCESS = "auto"); ours with the writer in a
thread of the crawl ("thread", RETRYQUEUE_STORE_PROCESS = False); ours with the
store writer off ("store off"); ours with the store off in the crawl and one
``scrapy retryqueue writer`` process serving its spider into a SQLite database
("writer proc", the fleet set-up: "writer CPU ms/dead letter" is that process's
CPU from its start to its exit per dead letter, "writer marginal ms" its slope
between the two sizes). For "default", "CPU" and "marginal" count the crawl and
its forked writer together (crawl + writer: the crawl reaps it), "crawl CPU" and
"crawl marginal" the crawl alone, "writer CPU ms/page" and "writer marginal ms"
the forked writer alone, from the fork to its exit (its resource usage, which
the crawl reads as it exits). Each figure is given at the "lean" and the "suite"
baseline (see overhead). The schemas are made before the crawls (once, as a
project's are); the in-crawl writer's start (checking the schema) is in its
crawl's CPU (or its writer's).

Pages/s runs from the spider's opening to its last response, in crawls of the
larger size, the variants crawling one after the other (the order alternating
between rounds); "close s" is how long the crawl then took to close. CPU comes
from the variants crawling side by side (the same machine load for all), at
two sizes (SIZES): "CPU ms/page" covers the larger crawl from the spider's
opening to its exit, so the store's last writes are in it; "marginal ms/page"
is the slope of the whole process's CPU between the sizes; "start-up + s" the
CPU from the process's start to its first request, ours minus stock's; "fixed
+ s" what ours costs once per crawl more than stock (the whole process's CPU
less its pages' marginal cost: its start, the store's load with the first dead
letter, its close); "GC ms/page" the garbage collector's CPU per page of the
larger crawl, "GC +" ours minus stock's. Ratios are ours ÷ stock of the same
round; "÷ frozen" ones are ÷ stock Scrapy with its heap frozen while the engine
runs, as the add-on freezes the crawl's ("stock frozen", RETRYQUEUE_FREEZE_HEAP):
the add-on's own cost, without the collector's gain the freeze gives stock's
objects as much as the add-on's.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from . import common
from .common import (
    BASELINES,
    STOCK,
    STOCK_FROZEN,
    WRITER,
    CrawlCost,
    alternate,
    forget,
    measured_crawl,
    side_by_side,
    writer_marginal_ms,
)
from .overhead import frozen_figures, growth_figures, ours_settings, prepare_store
from .static_site import static_site

SIZES = (500, 2000)
SECTIONS = {"404": "notfound", "403": "forbidden"}


def measure(redis_url: str, workdir: Path) -> dict[str, float]:
    import redis

    client = redis.Redis.from_url(redis_url)
    figures: dict[str, float] = {}
    small, large = SIZES
    writer_database = f"sqlite:///{workdir / 'writer-store.sqlite3'}"
    if not (workdir / "writer-store.sqlite3").exists():
        prepare_store(writer_database)
    variants: dict[str, dict[str, object]] = {
        "stock": dict(STOCK),
        "default": ours_settings(redis_url, workdir),
        "thread": {**ours_settings(redis_url, workdir), "RETRYQUEUE_STORE_PROCESS": False},
        "store off": {"RETRYQUEUE_REDIS_URL": redis_url},
        "writer proc": {"RETRYQUEUE_REDIS_URL": redis_url, WRITER: writer_database},
        "stock frozen": dict(STOCK_FROZEN),
    }
    ours = [label for label in variants if not label.startswith("stock")]
    with static_site(large, SIZES) as site:
        for baseline in common.RUN_BASELINES:
            base = BASELINES[baseline]
            for status, section in SECTIONS.items():
                prefix = f"{baseline}: {status} "
                costs: dict[str, CrawlCost] = {}
                for label in alternate(f"{__name__}.{baseline}.{status}", list(variants)):
                    spider = f"{label.replace(' ', '')}{uuid.uuid4().hex[:6]}"
                    settings = {**base, **variants[label]}
                    costs[label] = measured_crawl(
                        site, section, large, spider, settings, workdir, size=large
                    )
                    forget(client, spider)
                paired = {
                    size: dict(zip(variants, side_by_side(
                        site, [(section, {**base, **v}) for v in variants.values()], size,
                        workdir, client, size=size,
                    ), strict=True))
                    for size in SIZES
                }  # fmt: skip
                for label, cost in [
                    *costs.items(),
                    *paired[small].items(),
                    *paired[large].items(),
                ]:
                    assert cost.stats["response_received_count"] == cost.pages + 1, cost.stats
                    if not label.startswith("stock"):
                        assert cost.stats["retryqueue/dead"] == cost.pages, cost.stats
                stock = costs["stock"]
                figures[f"{prefix}stock pages/s"] = stock.pages_per_s
                for label in ours:
                    figures[f"{prefix}{label} pages/s"] = costs[label].pages_per_s
                    figures[f"{prefix}{label} pages/s ratio"] = (
                        costs[label].pages_per_s / stock.pages_per_s
                    )
                    figures[f"{prefix}{label} close s"] = costs[label].close_s
                stock_pair = (paired[small]["stock"], paired[large]["stock"])
                for label in variants:
                    figures.update(
                        growth_figures(
                            prefix, label, paired[small][label], paired[large][label], stock_pair
                        )
                    )
                figures.update(
                    frozen_figures(
                        prefix,
                        "default",
                        (costs["default"], costs["stock frozen"]),
                        (paired[small]["default"], paired[large]["default"]),
                        (paired[small]["stock frozen"], paired[large]["stock frozen"]),
                    )
                )
                writer_small, writer_large = (
                    paired[small]["writer proc"],
                    paired[large]["writer proc"],
                )
                figures[f"{prefix}writer CPU ms/dead letter"] = (
                    writer_large.stats["bench/writer_cpu"] / large * 1000
                )
                figures[f"{prefix}writer marginal ms"] = writer_marginal_ms(
                    writer_small, writer_large
                )
                figures[f"{prefix}nginx ÷ crawler CPU"] = stock.site_share
                # Memory as the spider closes: the crawl's, and with the store in a
                # process of its own, the crawl's and that process's together.
                for label in ("stock", "thread", "default"):
                    stats = paired[large][label].stats
                    figures[f"{prefix}{label} PSS MB"] = (
                        stats.get("bench/pss", 0) + stats.get("bench/children_pss", 0)
                    ) / 2**20
                figures[f"{prefix}default writer PSS MB"] = (
                    paired[large]["default"].stats.get("bench/children_pss", 0) / 2**20
                )
                # The default forks its writer in every round: its CPU is the crawl's
                # no more.
                assert paired[large]["default"].writer_cpu > 0, paired[large]["default"].stats
    client.close()
    return figures
