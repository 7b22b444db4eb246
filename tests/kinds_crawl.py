"""A crawl with a kind of the project's own and RetryLater, or with a backoff class of its own.

    python tests/kinds_crawl.py SPIDER_NAME URLS_JSON SETTINGS_JSON OUT_JSON

Its callback raises ``RetryLater("captcha")`` on a page that is a captcha (on a
``/midway/`` page, a generator callback does after its first item); OUT_JSON gets
the pages it parsed, its errbacks, the items scraped, the exceptions Scrapy's
``spider_error`` signal reported and the crawl's stats, for tests/test_kinds_crawl.py. A subprocess, because a Twisted reactor cannot be
restarted inside the test process.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import scrapy
from scrapy import signals
from scrapy.crawler import CrawlerProcess

from scrapy_retryqueue import RetryLater
from scrapy_retryqueue.decision.backoff import BackoffContext

#: What a captcha page holds (tests/test_kinds_crawl.py's site serves it).
CAPTCHA_MARK = b"Prove you are human"


class ConstantBackoff:
    """RETRYQUEUE_BACKOFF of the backoff crawl: the same gap before every retry."""

    def delay(self, ctx: BackoffContext) -> float:
        return 0.7


class KindsSpider(scrapy.Spider):
    name = "kinds"

    def __init__(self, urls: list[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.urls = urls
        self.parsed: list[str] = []
        self.errbacks: list[dict[str, str]] = []
        self.items: list[dict[str, str]] = []
        self.spider_errors: list[str] = []

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> KindsSpider:
        spider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(spider.scraped, signal=signals.item_scraped)
        crawler.signals.connect(spider.spider_error, signal=signals.spider_error)
        return spider

    async def start(self) -> AsyncIterator[scrapy.Request]:
        for url in self.urls:
            callback = self.parse_midway if "/midway/" in url else self.parse_page
            yield scrapy.Request(url, callback=callback, errback=self.failed)

    def parse_page(self, response: scrapy.http.Response) -> None:
        if CAPTCHA_MARK in response.body:
            raise RetryLater("captcha", "the site served a captcha")
        self.parsed.append(response.url)

    def parse_midway(self, response: scrapy.http.Response) -> Iterator[dict[str, str]]:
        yield {"url": response.url, "part": "before"}
        if CAPTCHA_MARK in response.body:
            raise RetryLater("captcha", "a captcha after the first item")
        yield {"url": response.url, "part": "after"}
        self.parsed.append(response.url)

    def scraped(self, item: dict[str, str]) -> None:
        self.items.append(dict(item))

    def spider_error(self, failure: Any) -> None:
        self.spider_errors.append(type(failure.value).__name__)

    def failed(self, failure: Any) -> None:
        self.errbacks.append({"url": failure.request.url, "error": type(failure.value).__name__})


def main() -> None:
    spider_name, urls, settings_json, out = sys.argv[1:5]
    settings = {
        "ADDONS": {"scrapy_retryqueue.Addon": 0},
        "TELNETCONSOLE_ENABLED": False,
        "LOG_LEVEL": "INFO",
        **json.loads(settings_json),
    }
    process = CrawlerProcess(settings)
    crawler = process.create_crawler(KindsSpider)
    process.crawl(crawler, urls=json.loads(urls), name=spider_name)
    process.start()
    stats = {k: v for k, v in crawler.stats.get_stats().items() if isinstance(v, (int, str))}
    spider = crawler.spider
    result = {"parsed": spider.parsed, "errbacks": spider.errbacks, "stats": stats}
    result.update(items=spider.items, spider_errors=spider.spider_errors)
    Path(out).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
