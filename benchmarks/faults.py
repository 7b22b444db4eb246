"""4. Completion under faults: 20% of pages answer 429 (Retry-After: 1) three
times, 10% answer 503 twice, then 200. Fraction of pages finally fetched, ours
against stock Scrapy, and how long ours needs beyond its backoff chains.
Served by the Python flaky site, which scripts each page's failures.

"beyond last due s": from the moment the crawl's last retry fell due (when it
was parked plus the delay the queue gave it: the end of the longest backoff
chain, jitter included) to the spider's close: the time the queue adds to the
backoff it was asked for (poll lag, the last download, the close). "close s":
seconds from the crawl's last response to the spider's close.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from scrapy.settings import Settings

from scrapy_retryqueue.config import load_config

from .common import STOCK, flaky_site, forget, run_crawl

PAGES = 2000
POLICIES = {
    "rate_limited": {"base_delay": 1, "max_delay": 8},
    "server_error": {"base_delay": 1, "max_delay": 8},
}


def longest_chain() -> float:
    """The longest wait a page of the mix can need: three 429s, at the policy's
    largest delay each (the Retry-After of 1 s is never larger)."""
    policy = load_config(Settings({"RETRYQUEUE_POLICIES": POLICIES})).policy_table
    rate = policy.policy_for("rate_limited")
    return sum(min(rate.base_delay * rate.multiplier**n, rate.max_delay) for n in range(3))


def measure(redis_url: str, workdir: Path) -> dict[str, float]:
    import redis

    client = redis.Redis.from_url(redis_url)
    settings = {"RETRYQUEUE_REDIS_URL": redis_url, "RETRYQUEUE_POLICIES": POLICIES}
    due_file = workdir / f"due-{uuid.uuid4().hex[:6]}.json"
    probe = {"EXTENSIONS": {"benchmarks.probes.DueProbe": 0}, "BENCH_DUE_FILE": str(due_file)}
    results = {}
    for label, variant in (("stock", dict(STOCK)), ("ours", {**settings, **probe})):
        with flaky_site(pages=PAGES, mix="bench", retry_after=1) as site:
            spider = f"{label}{uuid.uuid4().hex[:6]}"
            stats = run_crawl(site.url, spider, variant, workdir)
            results[label] = stats
            forget(client, spider)
    client.close()
    due = json.loads(due_file.read_text())
    fetched = {k: v.get("item_scraped_count", 0) / PAGES for k, v in results.items()}
    return {
        "stock fetched": fetched["stock"],
        "ours fetched": fetched["ours"],
        "ours wall s": results["ours"]["elapsed_time_seconds"],
        "ours longest chain s": longest_chain(),
        "ours beyond last due s": due["closed"] - due["last_due"],
        "ours close s": results["ours"]["bench/last_response_to_close"],
    }
