"""A crawler's runtime without a crawl: for tests of the planner and the reporter (no I/O)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import scrapy
from scrapy.utils.test import get_crawler

from scrapy_retryqueue.decision.classify import FailureInfo
from scrapy_retryqueue.runtime import RetryQueueRuntime
from scrapy_retryqueue.runtime.planner import Plan


def unopened_runtime(
    spidercls: type[scrapy.Spider], tmp_path: Path, **settings: Any
) -> RetryQueueRuntime:
    """The runtime of a new crawler of *spidercls*, its spider created, never opened:
    its planner and reporter work, nothing talks to Redis."""
    crawler = get_crawler(spidercls, {"RETRYQUEUE_EMBEDDED_DIR": str(tmp_path), **settings})
    crawler.spider = crawler._create_spider()
    runtime = RetryQueueRuntime(crawler)
    runtime.spider = runtime.planner.spider = runtime.reporter.spider = crawler.spider
    return runtime


def plan_of(runtime: RetryQueueRuntime, request: scrapy.Request, failure: FailureInfo) -> Plan:
    """The planner's plan, its notes counted and logged as the runtime does."""
    plan = runtime.planner.plan(request, failure)
    runtime.reporter.notes(plan.notes)
    return plan
