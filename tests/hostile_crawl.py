"""A crawl of a small local site for the hostile-writer suite (tests/test_hostile_writer.py).

    python tests/hostile_crawl.py SPIDER_NAME SITE_URL INDEX SETTINGS_JSON OUT_JSON

The spider keeps to ``allowed_domains = ["127.0.0.1"]``; with INDEX "true" it
starts from the site's index and follows its links to ``parse_page``, else it
runs only the retries the queue holds. OUT_JSON gets every page each callback
parsed (``parse_page``, and ``steal``: a callback only a forged envelope names)
and the crawl's stats, its finish reason among them. A subprocess, because a
Twisted reactor cannot be restarted inside the test process.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import scrapy
from scrapy.crawler import CrawlerProcess


class HostileSpider(scrapy.Spider):
    name = "hostile"
    allowed_domains = ["127.0.0.1"]

    def __init__(self, site: str, index: str = "true", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.site = site.rstrip("/")
        self.index = index == "true"
        self.parsed: list[str] = []
        self.stolen: list[str] = []

    async def start(self) -> AsyncIterator[scrapy.Request]:
        if self.index:
            yield scrapy.Request(f"{self.site}/", callback=self.parse_index)

    def parse_index(self, response: scrapy.http.Response) -> Iterator[scrapy.Request]:
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, callback=self.parse_page)

    def parse_page(self, response: scrapy.http.Response) -> Iterator[dict[str, Any]]:
        self.parsed.append(response.url)
        yield {"url": response.url}

    def steal(self, response: scrapy.http.Response) -> None:
        """What a forged envelope would have run: no legitimate request names it."""
        self.stolen.append(response.url)


def main() -> None:
    spider_name, site, index, settings_json, out = sys.argv[1:6]
    settings = {
        "ADDONS": {"scrapy_retryqueue.Addon": 0},
        "TELNETCONSOLE_ENABLED": False,
        "LOG_LEVEL": "INFO",
        "RETRYQUEUE_NAMESPACE": "",
        "CONCURRENT_ITEMS": 10,
        **json.loads(settings_json),
    }
    process = CrawlerProcess(settings)
    crawler = process.create_crawler(HostileSpider)
    process.crawl(crawler, site=site, index=index, name=spider_name)
    process.start()
    stats = {
        k: v for k, v in (crawler.stats.get_stats() or {}).items() if isinstance(v, (int, str))
    }
    spider = crawler.spider
    Path(out).write_text(
        json.dumps(
            {
                "parsed": getattr(spider, "parsed", []),
                "stolen": getattr(spider, "stolen", []),
                "stats": stats,
            }
        )
    )


if __name__ == "__main__":
    main()
