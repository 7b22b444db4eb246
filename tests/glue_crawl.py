"""A crawl that exercises each piece of Scrapy glue once; run as a script.

    python tests/glue_crawl.py SITE_URL SPIDER_NAME SETTINGS_JSON OUT_JSON

It records what the spider's callbacks and errbacks saw, and the final stats,
into OUT_JSON for tests/test_glue.py to check. A subprocess, because a Twisted
reactor cannot be restarted inside the test process.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import scrapy
from scrapy.crawler import CrawlerProcess

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "example_project"))
from flaky_site import SCENARIOS

from scrapy_retryqueue import PermanentFailure


def pages_of(scenario: str) -> Iterator[int]:
    n = 0
    while True:
        if SCENARIOS[n % len(SCENARIOS)] == scenario:
            yield n
        n += 1


class Unserializable:
    """A meta value JSON cannot hold."""


class GlueSpider(scrapy.Spider):
    name = "glue"

    def __init__(self, site: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.site = site
        self.observed: list[dict[str, Any]] = []

    def page(self, scenario: str, case: str, **kwargs: Any) -> scrapy.Request:
        if not hasattr(self, "_pages"):
            self._pages = {s: pages_of(s) for s in set(SCENARIOS)}
        n = next(self._pages[scenario])
        meta = {"case": case, **kwargs.pop("meta", {})}
        return scrapy.Request(
            f"{self.site}/page/{n}",
            callback=kwargs.pop("callback", self.parse_page),
            errback=self.failed,
            meta=meta,
            **kwargs,
        )

    async def start(self) -> AsyncIterator[scrapy.Request]:
        yield self.page("server_error_once", "parked_then_ok")
        yield self.page("not_found", "dead_404")
        yield self.page("server_error_once", "max_retries_0", meta={"retryqueue_max_retries": 0})
        yield self.page(
            "server_error_once",
            "policy_no_retry",
            meta={"retryqueue_policy": {"server_error": {"retry": False}}},
        )
        yield self.page("server_error_once", "bad_meta", meta={"retryqueue_max_retries": "lots"})
        yield self.page("server_error_once", "dont_retry", meta={"dont_retry": True})
        yield self.page("server_error_once", "unserializable", meta={"obj": Unserializable()})
        yield self.page("ok", "rule", callback=self.parse_rule)
        yield self.page("parse_once", "parse")
        yield self.page("ok", "storage", callback=self.parse_item)

    def record(self, event: str, response_or_failure: Any, **extra: Any) -> None:
        request = getattr(response_or_failure, "request", None)
        meta = request.meta if request is not None else {}
        self.observed.append({"event": event, "case": meta.get("case"), **extra})

    def parse_page(self, response: scrapy.http.Response) -> None:
        if response.css("h1.title").get() is None:
            self.record("parse_error", response)
            raise ValueError("no title")
        self.record("parsed", response, url=response.url)

    def parse_rule(self, response: scrapy.http.Response) -> None:
        self.record("rule", response)
        raise PermanentFailure("this page is out of scope")

    def parse_item(self, response: scrapy.http.Response) -> Iterator[dict[str, Any]]:
        self.record("item_page", response)
        yield {"url": response.url, "case": response.meta["case"]}

    def failed(self, failure: Any) -> None:
        self.observed.append(
            {
                "event": "errback",
                "case": failure.request.meta.get("case"),
                "error": type(failure.value).__name__,
            }
        )


class FlakyPipeline:
    """Refuses the first write of each item, like a database that hiccups."""

    seen: set[str] = set()

    def process_item(self, item: dict[str, Any], spider: Any = None) -> dict[str, Any]:
        if item["url"] not in self.seen:
            self.seen.add(item["url"])
            raise ConnectionError("database refused the write")
        return item


def main() -> None:
    site, spider_name, settings_json, out = sys.argv[1:5]
    settings = {
        "ADDONS": {"scrapy_retryqueue.Addon": 0},
        "ITEM_PIPELINES": {f"{__name__}.FlakyPipeline": 100},
        "TELNETCONSOLE_ENABLED": False,
        # The site answers 404 for robots.txt: a request the queue must leave alone.
        "ROBOTSTXT_OBEY": True,
        "LOG_LEVEL": "INFO",
        **json.loads(settings_json),
    }
    process = CrawlerProcess(settings)
    crawler = process.create_crawler(GlueSpider)
    process.crawl(crawler, site=site, name=spider_name)
    process.start()
    stats = {k: v for k, v in crawler.stats.get_stats().items() if isinstance(v, (int, str))}
    Path(out).write_text(json.dumps({"observed": crawler.spider.observed, "stats": stats}))


if __name__ == "__main__":
    main()
