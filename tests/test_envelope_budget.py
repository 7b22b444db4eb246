"""The planner writes the resolved budget (max_retries) of the kind that failed into the
envelope: the settings', a domain's, a request's own; none for a kind no policy covers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import scrapy

from scrapy_retryqueue.decision.classify import FailureInfo

from .runtimes import plan_of, unopened_runtime

TIMEOUT = FailureInfo("timeout", "TimeoutError", "took too long")
NOT_FOUND = FailureInfo("not_found", "HttpStatus", "HTTP 404", status=404)


class BudgetSpider(scrapy.Spider):
    name = "budget"


def _budget(tmp_path: Path, request: scrapy.Request, failure: FailureInfo, **settings: Any) -> Any:
    runtime = unopened_runtime(BudgetSpider, tmp_path, **settings)
    return plan_of(runtime, request, failure).task.max_retries


def test_the_envelope_keeps_the_resolved_budget(tmp_path: Path) -> None:
    page = "http://www.shop.example/p"
    assert _budget(tmp_path, scrapy.Request(page), TIMEOUT) == 5  # the default
    policies = {"RETRYQUEUE_DOMAIN_POLICIES": {"shop.example": {"timeout": {"max_retries": 9}}}}
    assert _budget(tmp_path, scrapy.Request(page), TIMEOUT, **policies) == 9
    own = scrapy.Request(page, meta={"retryqueue_max_retries": 1})
    assert _budget(tmp_path, own, TIMEOUT, **policies) == 1
    # A bad override: the settings' budget, as the decision used.
    bad = scrapy.Request(page, meta={"retryqueue_max_retries": "lots"})
    assert _budget(tmp_path, bad, TIMEOUT, **policies) == 9
    # A kind its policy never retries still has one (0 retries); the dead letter keeps it.
    assert _budget(tmp_path, scrapy.Request(page), NOT_FOUND) == 0
