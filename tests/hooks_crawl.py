"""A crawl with RETRYQUEUE_RETRY_HOOK and handlers of every retryqueue_* signal.

    python tests/hooks_crawl.py SITE_URL SPIDER_NAME SETTINGS_JSON OUT_JSON

Records what the callbacks, errbacks and signal handlers saw into OUT_JSON for
tests/test_hooks_crawl.py. A subprocess, because a Twisted reactor cannot be
restarted inside the test process.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import scrapy
from scrapy.crawler import CrawlerProcess

sys.path.insert(0, str(Path(__file__).resolve().parent))
from glue_crawl import pages_of

from scrapy_retryqueue import signals as rq_signals
from scrapy_retryqueue.decision.policy import Decision


def retry_hook(request: scrapy.Request, decision: Decision) -> scrapy.Request | bool | None:
    """Veto the 'veto' case; send the 'replace' case back with another header."""
    case = request.meta.get("case")
    if case == "veto":
        return False
    if case == "replace":
        return request.replace(headers={"X-Hooked": f"attempt-{decision.attempt}"})
    return None


class HooksSpider(scrapy.Spider):
    name = "hooks"

    def __init__(self, site: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.site = site
        self.observed: list[dict[str, Any]] = []

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> HooksSpider:
        spider = super().from_crawler(crawler, *args, **kwargs)
        for name in ("scheduled", "recovered", "dead"):
            signal = getattr(rq_signals, f"retryqueue_{name}")
            crawler.signals.connect(getattr(spider, f"on_{name}"), signal=signal)
        return spider

    def page(self, scenario: str, case: str) -> scrapy.Request:
        if not hasattr(self, "_pages"):
            self._pages: dict[str, Any] = {}
        pages = self._pages.setdefault(scenario, pages_of(scenario))
        return scrapy.Request(
            f"{self.site}/page/{next(pages)}",
            callback=self.parse_page,
            errback=self.failed,
            meta={"case": case},
        )

    async def start(self) -> AsyncIterator[scrapy.Request]:
        yield self.page("server_error_once", "keep")
        yield self.page("server_error_once", "replace")
        yield self.page("server_error_once", "veto")
        yield self.page("not_found", "dead_404")

    def record(self, event: str, request: Any, **extra: Any) -> None:
        case = request.meta.get("case") if request is not None else None
        self.observed.append({"event": event, "case": case, **extra})

    def parse_page(self, response: scrapy.http.Response) -> None:
        hooked = response.request.headers.get("X-Hooked")
        self.record("parsed", response.request, hooked=hooked.decode() if hooked else None)

    def failed(self, failure: Any) -> None:
        self.record("errback", failure.request, error=type(failure.value).__name__)

    def on_scheduled(self, request: Any, task_id: str, decision: Decision, outcome: str) -> None:
        self.record(
            "signal_scheduled",
            request,
            kind=decision.kind,
            attempt=decision.attempt,
            outcome=outcome,
            task_id=task_id,
        )

    def on_recovered(self, request: Any, task_id: str, kind: str, attempts: dict) -> None:
        self.record("signal_recovered", request, kind=kind, attempts=attempts, task_id=task_id)

    def on_dead(self, request: Any, task_id: str, kind: str, reason: str) -> None:
        self.record("signal_dead", request, kind=kind, reason=reason, task_id=task_id)


def main() -> None:
    site, spider_name, settings_json, out = sys.argv[1:5]
    settings = {
        "ADDONS": {"scrapy_retryqueue.Addon": 0},
        "TELNETCONSOLE_ENABLED": False,
        "LOG_LEVEL": "INFO",
        "RETRYQUEUE_RETRY_HOOK": f"{__name__}.retry_hook",
        **json.loads(settings_json),
    }
    process = CrawlerProcess(settings)
    crawler = process.create_crawler(HooksSpider)
    process.crawl(crawler, site=site, name=spider_name)
    process.start()
    stats = {k: v for k, v in crawler.stats.get_stats().items() if isinstance(v, (int, str))}
    Path(out).write_text(json.dumps({"observed": crawler.spider.observed, "stats": stats}))


if __name__ == "__main__":
    main()
