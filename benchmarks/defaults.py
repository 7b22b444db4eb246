"""12. The default policies against measured crawls: what each choice of per-kind
delays and retries costs in wall time and gets in items, against stock Scrapy.

Four crawls of the Python flaky site, each run by every variant side by side
(one site per crawl, so that each sees its own scripted failures):

- **chain**: 40 pages, each linking the next ("next page"), one in four failing
  once or twice (mix ``transient``: a 503 twice, a download timeout, a 429 with
  ``Retry-After: 2``, a callback error, a dropped connection). Every second a
  retry waits delays every later page: this is where long delays hurt.
- **flat**: 400 pages linked from one index, the same mix: the waits overlap,
  and the crawl ends with its slowest retry chain.
- **callback bug**: 40 pages, one in ten of which no retry can parse (its
  callback always fails): stock Scrapy drops them at once; the add-on retries
  them and then dead-letters them, which is what the parse policy's delays add.
- **outage**: 40 pages, one in ten answering 503 for 30 s from its first
  request, whatever the number of tries (the 30-second outage that stock
  Scrapy's immediate retries lose): what the retry window must cover.

Variants: ``stock`` (no add-on: RetryMiddleware, 2 immediate retries),
``before`` (the add-on with the policies it had before issue 24's measurement),
``defaults`` (the add-on with today's defaults), ``few retries`` (today's short
first delays with the old retry counts: what the added retries buy). The add-on
runs with its own defaults otherwise (poll interval 1 s), not the demo
project's short policies. "added s" is a crawl's wall time less that of the
same crawl by stock Scrapy on a healthy site (no failures).
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

from scrapy_retryqueue.settings import defaults

from .common import STOCK, flaky_site, forget, run_crawl

#: The policies of the built-in kinds before they were measured (issue 24).
BEFORE: dict[str, dict[str, Any]] = {
    "timeout": {"base_delay": 3.0, "max_delay": 120.0, "max_retries": 5},
    "connection": {"base_delay": 5.0, "max_delay": 120.0, "max_retries": 5},
    "rate_limited": {"base_delay": 30.0, "max_delay": 240.0, "max_retries": 6},
    "server_error": {"base_delay": 10.0, "max_delay": 240.0, "max_retries": 5},
    "parse": {"base_delay": 30.0, "max_delay": 240.0, "max_retries": 3},
}
#: Today's first delays with the retry counts of BEFORE.
FEW_RETRIES: dict[str, dict[str, Any]] = {
    kind: {"max_retries": BEFORE[kind]["max_retries"]} for kind in BEFORE
}
VARIANTS: dict[str, dict[str, Any] | None] = {
    "stock": None,
    "before": BEFORE,
    "defaults": {},
    "few retries": FEW_RETRIES,
}
#: crawl -> flaky site options.
CRAWLS: dict[str, dict[str, Any]] = {
    "chain": {"pages": 40, "mix": "transient", "chain": True},
    "flat": {"pages": 400, "mix": "transient"},
    "callback bug": {"pages": 40, "mix": "callback_bug"},
    "outage": {"pages": 40, "mix": "outage", "outage": 30},
}
#: The healthy sites "added s" is measured from: crawl -> flaky site options.
HEALTHY: dict[str, dict[str, Any]] = {
    "chain": {"pages": 40, "mix": "healthy", "chain": True},
    "flat": {"pages": 400, "mix": "healthy"},
    "small": {"pages": 40, "mix": "healthy"},
}
#: Which healthy site each crawl is held against.
BASELINE = {"chain": "chain", "flat": "flat", "callback bug": "small", "outage": "small"}
#: Longer than DOWNLOAD_TIMEOUT: a stalled page times out.
SLOW = 5
SITE: dict[str, Any] = {"slow": SLOW, "retry_after": 2}
#: The same for every variant, stock included.
CRAWL: dict[str, Any] = {"DOWNLOAD_TIMEOUT": 3}


def settings(variant: str, redis_url: str) -> dict[str, Any]:
    policies = VARIANTS[variant]
    if policies is None:
        return {**STOCK, **CRAWL}
    return {
        **CRAWL,
        "RETRYQUEUE_REDIS_URL": redis_url,
        # The library's own, not the demo project's short ones (demo/settings.py).
        "RETRYQUEUE_POLICIES": policies,
        "RETRYQUEUE_POLL_INTERVAL": defaults.SETTINGS["RETRYQUEUE_POLL_INTERVAL"],
        "RETRYQUEUE_IDLE_TIMEOUT": defaults.SETTINGS["RETRYQUEUE_IDLE_TIMEOUT"],
    }


def _crawl(
    options: dict[str, Any], chosen: dict[str, Any], workdir: Path, client: Any
) -> dict[str, Any]:
    with flaky_site(**SITE, **options) as site:
        spider = f"defaults{uuid.uuid4().hex[:6]}"
        try:
            return run_crawl(site.url, spider, dict(chosen), workdir)
        finally:
            forget(client, spider)


def measure(redis_url: str, workdir: Path) -> dict[str, float]:
    import redis

    client = redis.Redis.from_url(redis_url)
    # Every crawl by every variant, and the healthy baselines, side by side: they
    # wait on delays, not on the CPU, and so meet the same machine load.
    runs: dict[tuple[str, str], tuple[dict[str, Any], dict[str, Any]]] = {
        (crawl, variant): (options, settings(variant, redis_url))
        for crawl, options in CRAWLS.items()
        for variant in VARIANTS
    }
    for shape, options in HEALTHY.items():
        runs[("healthy", shape)] = (options, settings("stock", redis_url))
    results: dict[tuple[str, str], dict[str, Any]] = {}
    errors: list[BaseException] = []

    def one(name: tuple[str, str], site: dict[str, Any], chosen: dict[str, Any]) -> None:
        try:
            results[name] = _crawl(site, chosen, workdir, client)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(name, *run)) for name, run in runs.items()]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        client.close()
    if errors:
        raise errors[0]
    figures: dict[str, float] = {}
    for crawl in CRAWLS:
        healthy = results[("healthy", BASELINE[crawl])]["elapsed_time_seconds"]
        figures[f"{crawl}: healthy wall s"] = healthy
        for variant in VARIANTS:
            stats = results[(crawl, variant)]
            wall = stats["elapsed_time_seconds"]
            figures[f"{crawl}: {variant} items"] = stats.get("item_scraped_count", 0)
            figures[f"{crawl}: {variant} added s"] = wall - healthy
        figures[f"{crawl}: defaults minus stock items"] = (
            figures[f"{crawl}: defaults items"] - figures[f"{crawl}: stock items"]
        )
    return figures
