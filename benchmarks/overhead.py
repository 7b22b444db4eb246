"""1. Overhead on a healthy crawl: the add-on against stock Scrapy, same settings.

Crawls of pages that all answer 200 at once, served by nginx (see
benchmarks/static_site.py), so the crawler, not the site, is the bottleneck
("nginx ÷ crawler CPU"). Variants: stock Scrapy; ours as a project gets it
(the store writer on, with its default SQLite database, its schema made once
before the crawls as a project's is, in the process the crawl forks for it:
RETRYQUEUE_STORE_PROCESS = "auto"); ours with the store writer off; stock
Scrapy with its heap frozen while the engine runs, as the add-on freezes the
crawl's (RETRYQUEUE_FREEZE_HEAP: full collections then skip the modules and
start-up objects, a third of stock's collector CPU here), the baseline of the
add-on's own cost with that gain set aside ("÷ frozen"). Each
figure is given at two baselines (common.BASELINES): "lean" (32 concurrent
requests, LOG_LEVEL WARNING, as a production crawl runs) and "suite" (64
concurrent requests, the settings of earlier rounds).

Pages/s (spider opening to last response, a crawl of the larger size) come from
the variants crawling one after the other, the order alternating between rounds.
CPU comes from the variants crawling side by side, so that all meet the same
machine load, at two sizes (SIZES): "CPU ms/page" is the larger crawl's CPU
from the spider's opening to the process's exit, per page; "marginal ms/page"
the slope of the whole process's CPU between the two sizes (what one more page
costs); "start-up s" the CPU from the process's start to its first request, and
"start-up +" ours minus stock's; "fixed +" what ours costs once per crawl
more than stock (the whole process's CPU less its pages' marginal cost: its
start, what loads once mid-crawl, its close); "GC ms/page" the garbage
collector's CPU per page of the larger crawl, "GC +" ours minus stock's. Ratios
are ours ÷ stock of the same round ("÷ frozen": ÷ stock frozen). Where the crawl forks its store writer, "CPU"
and "marginal" count the crawl and its writer together (the crawl reaps it);
"crawl CPU" and "crawl marginal" the crawl alone, "writer CPU ms/page" and
"writer marginal ms" the writer alone (its resource usage, read by the crawl as
it exits).
"""

from __future__ import annotations

import uuid
from pathlib import Path

from . import common
from .common import (
    BASELINES,
    STOCK,
    STOCK_FROZEN,
    CrawlCost,
    alternate,
    crawl_marginal_ms,
    forget,
    forked_writer_marginal_ms,
    marginal_ms,
    measured_crawl,
    side_by_side,
)
from .static_site import static_site

#: The two crawl sizes of the slope; pages/s are the larger one's.
SIZES = (1000, 4000)


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

    from scrapy_retryqueue.queue.connection import embedded_dir
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


def growth_figures(
    prefix: str, label: str, small: CrawlCost, large: CrawlCost, stock: tuple[CrawlCost, CrawlCost]
) -> dict[str, float]:
    """A variant's CPU figures (per page, marginal, start-up) and their ratios to stock's."""
    figures = {
        f"{prefix}{label} CPU ms/page": large.cpu_ms_per_page,
        f"{prefix}{label} marginal ms/page": marginal_ms(small, large),
        f"{prefix}{label} start-up s": large.startup_cpu,
        f"{prefix}{label} GC ms/page": gc_ms_per_page(large),
    }
    if label != "stock":
        figures[f"{prefix}{label} CPU ratio"] = large.cpu_ms_per_page / stock[1].cpu_ms_per_page
        figures[f"{prefix}{label} marginal ratio"] = marginal_ms(small, large) / marginal_ms(*stock)
        figures[f"{prefix}{label} start-up + s"] = large.startup_cpu - stock[1].startup_cpu
        figures[f"{prefix}{label} fixed + s"] = fixed_cpu(small, large) - fixed_cpu(*stock)
        figures[f"{prefix}{label} GC + ms/page"] = gc_ms_per_page(large) - gc_ms_per_page(stock[1])
    if large.stats.get("bench/children_pss"):
        # A store writer forked by the crawl (alive as the spider closed): "CPU" above
        # is crawl + writer; the crawl's own and the writer's, side by side. (A crawl
        # that forks none may still have reaped a short-lived child of Scrapy's.)
        figures.update(
            {
                f"{prefix}{label} crawl CPU ms/page": large.crawl_cpu_ms_per_page,
                f"{prefix}{label} crawl CPU ratio": large.crawl_cpu_ms_per_page
                / stock[1].crawl_cpu_ms_per_page,
                f"{prefix}{label} crawl marginal ratio": crawl_marginal_ms(small, large)
                / crawl_marginal_ms(*stock),
                f"{prefix}{label} writer CPU ms/page": large.writer_cpu / large.pages * 1000,
                f"{prefix}{label} writer marginal ms": forked_writer_marginal_ms(small, large),
            }
        )
    return figures


def frozen_figures(
    prefix: str,
    label: str,
    pace: tuple[CrawlCost, CrawlCost],
    pair: tuple[CrawlCost, CrawlCost],
    frozen: tuple[CrawlCost, CrawlCost],
) -> dict[str, float]:
    """A variant's ratios to stock frozen as the add-on freezes the crawl: its own
    cost, without the collector's gain the freeze gives stock as much as it.

    *pace*: the variant's and stock frozen's crawls for pages/s; *pair* and
    *frozen*: the variant's and stock frozen's side-by-side crawls of the two sizes.
    Where the variant forked its store writer, also the crawl's own figures.
    """
    small, large = pair
    figures = {
        f"{prefix}{label} ÷ frozen pages/s ratio": pace[0].pages_per_s / pace[1].pages_per_s,
        f"{prefix}{label} ÷ frozen CPU ratio": large.cpu_ms_per_page / frozen[1].cpu_ms_per_page,
        f"{prefix}{label} ÷ frozen marginal ratio": marginal_ms(small, large)
        / marginal_ms(*frozen),
        f"{prefix}{label} ÷ frozen GC + ms/page": gc_ms_per_page(large) - gc_ms_per_page(frozen[1]),
    }
    if large.stats.get("bench/children_pss"):
        figures[f"{prefix}{label} ÷ frozen crawl CPU ratio"] = (
            large.crawl_cpu_ms_per_page / frozen[1].cpu_ms_per_page
        )
        figures[f"{prefix}{label} ÷ frozen crawl marginal ratio"] = crawl_marginal_ms(
            small, large
        ) / marginal_ms(*frozen)
    return figures


def gc_ms_per_page(cost: CrawlCost) -> float:
    """The garbage collector's CPU per page (benchmarks.probes.StatsDump times every
    collection): a quarter of a crawl's CPU here, and what a heap grown by the
    add-on's imports costs on every full collection."""
    total = sum(v for k, v in cost.stats.items() if k.startswith("bench/gc_s/"))
    return total / cost.pages * 1000


def fixed_cpu(small: CrawlCost, large: CrawlCost) -> float:
    """CPU seconds a crawl of no pages would cost on the slope between two sizes:
    the process's start, what loads once mid-crawl (the store, at its first dead
    letter), and its close; what is left of the whole process's CPU after the
    marginal cost of its pages."""
    return large.cpu_total - marginal_ms(small, large) / 1000 * large.pages


def measure(redis_url: str, workdir: Path) -> dict[str, float]:
    import redis

    client = redis.Redis.from_url(redis_url)
    store_on = ours_settings(redis_url, workdir)
    variants = {
        "stock": dict(STOCK),
        "ours": store_on,
        "store off": {"RETRYQUEUE_REDIS_URL": redis_url},
        "stock frozen": dict(STOCK_FROZEN),
    }
    small, large = SIZES
    figures: dict[str, float] = {}
    with static_site(large, SIZES) as site:
        for baseline in common.RUN_BASELINES:
            prefix = f"{baseline}: "
            base = BASELINES[baseline]
            costs: dict[str, CrawlCost] = {}
            for label in alternate(f"{__name__}.{baseline}", list(variants)):
                spider = f"seq{uuid.uuid4().hex[:6]}"
                costs[label] = measured_crawl(
                    site, "healthy", large, spider, {**base, **variants[label]}, workdir,
                    size=large,
                )  # fmt: skip
                forget(client, spider)
            paired = {
                size: dict(zip(variants, side_by_side(
                    site, [("healthy", {**base, **v}) for v in variants.values()], size,
                    workdir, client, size=size,
                ), strict=True))
                for size in SIZES
            }  # fmt: skip
            for cost in [*costs.values(), *paired[small].values(), *paired[large].values()]:
                assert cost.stats["response_received_count"] == cost.pages + 1, cost.stats
            stock = costs["stock"]
            figures[f"{prefix}stock pages/s"] = stock.pages_per_s
            for label in list(variants)[1:]:
                figures[f"{prefix}{label} pages/s"] = costs[label].pages_per_s
                figures[f"{prefix}{label} ratio"] = costs[label].pages_per_s / stock.pages_per_s
            stock_pair = (paired[small]["stock"], paired[large]["stock"])
            frozen_pair = (paired[small]["stock frozen"], paired[large]["stock frozen"])
            for label in variants:
                figures.update(
                    growth_figures(
                        prefix, label, paired[small][label], paired[large][label], stock_pair
                    )
                )
            for label in ("ours", "store off"):
                figures.update(
                    frozen_figures(
                        prefix,
                        label,
                        (costs[label], costs["stock frozen"]),
                        (paired[small][label], paired[large][label]),
                        frozen_pair,
                    )
                )
            figures[f"{prefix}nginx ÷ crawler CPU"] = stock.site_share
    client.close()
    return figures
