"""3. The retry path: the CPU one park + re-inject cycle costs, per retried request,
against the CPU of a healthy page.

nginx serves 3,000 pages that each answer 503 once and then 200 (the retried
request carries Scrapy's ``retry_times``, which benchmarks.probes.AttemptHeader
sends as a header). Ours parks each 503 in Redis and re-injects it when due
(0.5 s later, polls every 0.2 s), then acknowledges it: schedule, claim, ack,
their events, and the store writer's rows. In the same round the same variant
crawls 3,000 healthy pages; the cost of a retried request is the difference of
the two crawls' CPU per page. That difference holds the failed download too,
which costs less than a healthy page (no parsing, no item). Stock Scrapy's
RetryMiddleware (an in-memory retry at once) is measured the same way, for
comparison. The four crawls run side by side, so that all meet the same
machine load.
"""

from __future__ import annotations

from pathlib import Path

from .common import STOCK, side_by_side
from .overhead import ours_settings
from .static_site import static_site

PAGES = 3000
HEADER = {"DOWNLOADER_MIDDLEWARES": {"benchmarks.probes.AttemptHeader": 900}}
POLICY = {"server_error": {"base_delay": 0.5, "max_delay": 1, "jitter": "none"}}


def measure(redis_url: str, workdir: Path) -> dict[str, float]:
    import redis

    client = redis.Redis.from_url(redis_url)
    runs = [(v, s) for v in ("stock", "ours") for s in ("healthy", "retry")]

    def settings(variant: str) -> dict[str, object]:
        chosen = dict(STOCK) if variant == "stock" else ours_settings(redis_url, workdir)
        chosen.update(HEADER)
        if variant == "ours":
            chosen.update(RETRYQUEUE_POLICIES=POLICY, RETRYQUEUE_POLL_INTERVAL=0.2)
        return chosen

    with static_site(PAGES) as site:
        # All four side by side: the differences of CPU per page are what matter.
        paired = side_by_side(site, [(s, settings(v)) for v, s in runs], PAGES, workdir, client)
    client.close()
    costs = dict(zip(runs, paired, strict=True))
    for (variant, section), cost in costs.items():
        assert cost.stats.get("item_scraped_count") == PAGES, cost.stats
        if section == "retry":
            retried = cost.stats.get("retryqueue/recovered" if variant == "ours" else "retry/count")
            assert retried == PAGES, cost.stats
    figures: dict[str, float] = {}
    for variant in ("stock", "ours"):
        healthy = costs[(variant, "healthy")].cpu_ms_per_page
        retry = costs[(variant, "retry")].cpu_ms_per_page
        figures[f"{variant} healthy CPU ms/page"] = healthy
        figures[f"{variant} CPU ms/retried request"] = retry - healthy
    for variant in ("stock", "ours"):
        figures[f"{variant} retry ÷ healthy page"] = (
            figures[f"{variant} CPU ms/retried request"] / figures[f"{variant} healthy CPU ms/page"]
        )
    return figures
