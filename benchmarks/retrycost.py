"""3. The retry path: the CPU one park + re-inject cycle costs, against stock Scrapy's
immediate in-memory retry and against a healthy page.

nginx serves pages that each answer 503 once and then 200 (the retried request
carries Scrapy's ``retry_times``, which benchmarks.probes.AttemptHeader sends as
a header). Ours parks each 503 in Redis and re-injects it when due (0.5 s later,
polls every 0.2 s), then acknowledges it: schedule, claim, ack, their events,
and the store writer's rows ("ours", the defaults: in the process the crawl
forks for it, RETRYQUEUE_STORE_PROCESS = "auto"; "ours thread": in a thread of
the crawl, RETRYQUEUE_STORE_PROCESS = False). For "ours", "CPU" and "marginal"
count the crawl and its forked writer together (crawl + writer: the crawl reaps
it), "crawl CPU" and "crawl ÷ stock" the crawl alone, "writer CPU ms/final page"
the forked writer alone, from the fork to its exit (its resource usage, which the
crawl reads as it exits). "writer proc" is ours with the store off in the crawl
and one ``scrapy retryqueue writer`` process serving its spider into a SQLite
database (the fleet set-up, as in deadletters): its figures are the crawl's, and
"writer CPU ms/retried request" that process's CPU from its start to its exit
per retried request. Stock Scrapy's RetryMiddleware retries each at once,
in memory. In the same round each variant also crawls as many healthy pages.
The crawls run side by side (the same machine load for all), at two sizes
(SIZES), at the "lean" and the "suite" baseline (see overhead). "CPU ms/final
page" is the retry crawl's CPU from the spider's opening to its exit per page
finally fetched, "marginal" the slope of the whole process's CPU between the
two sizes, "fixed +" what ours costs once per crawl more than stock (the whole
process's CPU less its pages' marginal cost: its start, the store's load with
the first failure, its close), "GC ms/final page" the garbage collector's
part of the retry crawl's CPU and "full collections" how many of its collections
were of every generation (both from the probe's gc callbacks); "ours ÷ stock"
compares the two retry crawls, "÷ frozen" ours against stock with its heap frozen
while the engine runs, as the add-on freezes the crawl's ("stock frozen",
RETRYQUEUE_FREEZE_HEAP): the add-on's own cost, the collector's gain set aside.
"CPU ms/retried request" is the retry crawl's CPU per page minus the healthy
crawl's: it holds the failed download too, which costs less than a healthy page
(no parsing, no item).
"""

from __future__ import annotations

from pathlib import Path

from . import common
from .common import (
    BASELINES,
    STOCK,
    STOCK_FROZEN,
    WRITER,
    crawl_marginal_ms,
    forked_writer_marginal_ms,
    marginal_ms,
    side_by_side,
    writer_marginal_ms,
)
from .overhead import fixed_cpu, gc_ms_per_page, ours_settings, prepare_store
from .static_site import static_site

SIZES = (500, 2000)
HEADER = {"DOWNLOADER_MIDDLEWARES": {"benchmarks.probes.AttemptHeader": 900}}
POLICY = {"server_error": {"base_delay": 0.5, "max_delay": 1, "jitter": "none"}}


def measure(redis_url: str, workdir: Path) -> dict[str, float]:
    import redis

    client = redis.Redis.from_url(redis_url)
    runs = [(v, s) for v in ("stock", "ours") for s in ("healthy", "retry")]
    runs += [("ours thread", "retry"), ("writer proc", "retry"), ("stock frozen", "retry")]
    small, large = SIZES
    writer_database = f"sqlite:///{workdir / 'retry-writer-store.sqlite3'}"
    if not (workdir / "retry-writer-store.sqlite3").exists():
        prepare_store(writer_database)

    def settings(variant: str, baseline: str) -> dict[str, object]:
        if variant.startswith("stock"):
            chosen = dict(STOCK_FROZEN if variant == "stock frozen" else STOCK)
        else:
            chosen = ours_settings(redis_url, workdir)
        chosen.update(BASELINES[baseline])
        chosen.update(HEADER)
        if not variant.startswith("stock"):
            chosen.update(RETRYQUEUE_POLICIES=POLICY, RETRYQUEUE_POLL_INTERVAL=0.2)
        if variant == "writer proc":
            chosen.update(RETRYQUEUE_STORE_ENABLED=False, **{WRITER: writer_database})
        if variant == "ours thread":
            chosen.update(RETRYQUEUE_STORE_PROCESS=False)
        return chosen

    figures: dict[str, float] = {}
    with static_site(large, SIZES) as site:
        for baseline in common.RUN_BASELINES:
            prefix = f"{baseline}: "
            # All six side by side: their ratios and differences are what matter.
            paired = {
                size: dict(zip(runs, side_by_side(
                    site, [(s, settings(v, baseline)) for v, s in runs], size, workdir,
                    client, size=size,
                ), strict=True))
                for size in SIZES
            }  # fmt: skip
            for size in SIZES:
                for (variant, section), cost in paired[size].items():
                    assert cost.stats.get("item_scraped_count") == size, cost.stats
                    if section == "retry":
                        key = (
                            "retry/count" if variant.startswith("stock") else "retryqueue/recovered"
                        )
                        assert cost.stats.get(key) == size, cost.stats
            big = paired[large]
            for variant in ("stock", "stock frozen", "ours", "ours thread", "writer proc"):
                small_retry, retry = paired[small][(variant, "retry")], big[(variant, "retry")]
                figures[f"{prefix}{variant} CPU ms/final page"] = retry.cpu_ms_per_page
                figures[f"{prefix}{variant} marginal ms/final page"] = marginal_ms(
                    small_retry, retry
                )
                figures[f"{prefix}{variant} GC ms/final page"] = gc_ms_per_page(retry)
                figures[f"{prefix}{variant} full collections"] = retry.stats.get(
                    "bench/gc_n/gen2", 0
                )
                if variant == "stock":
                    continue
                for ratio, figure in (
                    ("CPU/final page", "CPU ms/final page"),
                    ("marginal", "marginal ms/final page"),
                ):
                    figures[f"{prefix}{variant} ÷ stock {ratio}"] = (
                        figures[f"{prefix}{variant} {figure}"] / figures[f"{prefix}stock {figure}"]
                    )
                    if variant != "stock frozen":
                        figures[f"{prefix}{variant} ÷ frozen {ratio}"] = (
                            figures[f"{prefix}{variant} {figure}"]
                            / figures[f"{prefix}stock frozen {figure}"]
                        )
            # The default's crawl and its forked writer, side by side.
            small_ours, ours = paired[small][("ours", "retry")], big[("ours", "retry")]
            assert ours.writer_cpu > 0, ours.stats
            stock_small, stock = paired[small][("stock", "retry")], big[("stock", "retry")]
            figures[f"{prefix}ours crawl CPU ms/final page"] = ours.crawl_cpu_ms_per_page
            figures[f"{prefix}ours writer CPU ms/final page"] = ours.writer_cpu / large * 1000
            figures[f"{prefix}ours crawl ÷ stock CPU/final page"] = (
                ours.crawl_cpu_ms_per_page / stock.cpu_ms_per_page
            )
            figures[f"{prefix}ours crawl ÷ stock marginal"] = crawl_marginal_ms(
                small_ours, ours
            ) / marginal_ms(stock_small, stock)
            frozen = big[("stock frozen", "retry")]
            figures[f"{prefix}ours crawl ÷ frozen CPU/final page"] = (
                ours.crawl_cpu_ms_per_page / frozen.cpu_ms_per_page
            )
            figures[f"{prefix}ours writer marginal ms"] = forked_writer_marginal_ms(
                small_ours, ours
            )
            for variant in ("stock", "ours"):
                healthy = big[(variant, "healthy")].cpu_ms_per_page
                retry_ms = figures[f"{prefix}{variant} CPU ms/final page"]
                figures[f"{prefix}{variant} healthy CPU ms/page"] = healthy
                figures[f"{prefix}{variant} CPU ms/retried request"] = retry_ms - healthy
                figures[f"{prefix}{variant} retry ÷ healthy page"] = (retry_ms - healthy) / healthy
            apart_small, apart = (
                paired[small][("writer proc", "retry")],
                big[("writer proc", "retry")],
            )
            figures[f"{prefix}writer CPU ms/retried request"] = (
                apart.stats["bench/writer_cpu"] / large * 1000
            )
            figures[f"{prefix}writer marginal ms"] = writer_marginal_ms(apart_small, apart)
            figures[f"{prefix}start-up + s"] = (
                big[("ours", "retry")].startup_cpu - big[("stock", "retry")].startup_cpu
            )
            figures[f"{prefix}fixed + s"] = fixed_cpu(
                paired[small][("ours", "retry")], big[("ours", "retry")]
            ) - fixed_cpu(paired[small][("stock", "retry")], big[("stock", "retry")])
    client.close()
    return figures
