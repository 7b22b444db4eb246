"""One fleet node of the per-domain cooldown crawl; run as a script.

    python tests/domains_crawl.py URLS_JSON SPIDER_NAME SETTINGS_JSON OUT_JSON

Fetches the given URLs (of several sites), and records what it parsed, what
its retryqueue_domain_state handlers saw, and its stats into OUT_JSON, for
tests/test_domains_crawl.py. A subprocess, because a Twisted reactor cannot
be restarted inside the test process.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import scrapy
from scrapy.crawler import CrawlerProcess

from scrapy_retryqueue import signals as rq_signals


class DomainsSpider(scrapy.Spider):
    name = "domains"

    def __init__(self, urls: list[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.urls = urls
        self.parsed: list[dict[str, Any]] = []
        self.domain_states: list[dict[str, Any]] = []

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> DomainsSpider:
        spider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(spider.on_domain_state, signal=rq_signals.retryqueue_domain_state)
        return spider

    async def start(self) -> AsyncIterator[scrapy.Request]:
        for url in self.urls:
            yield scrapy.Request(url, callback=self.parse_page)

    def parse_page(self, response: scrapy.http.Response) -> None:
        self.parsed.append({"url": response.url, "t": time.time()})

    def on_domain_state(self, domain: str, state: str, previous: str, until: int) -> None:
        self.domain_states.append(
            {"domain": domain, "state": state, "previous": previous, "until": until}
        )


def main() -> None:
    urls_json, spider_name, settings_json, out = sys.argv[1:5]
    settings = {
        "ADDONS": {"scrapy_retryqueue.Addon": 0},
        "TELNETCONSOLE_ENABLED": False,
        "LOG_LEVEL": "INFO",
        **json.loads(settings_json),
    }
    process = CrawlerProcess(settings)
    crawler = process.create_crawler(DomainsSpider)
    process.crawl(crawler, urls=json.loads(urls_json), name=spider_name)
    process.start()
    stats = {k: v for k, v in crawler.stats.get_stats().items() if isinstance(v, (int, str))}
    spider = crawler.spider
    Path(out).write_text(
        json.dumps({"parsed": spider.parsed, "domain_states": spider.domain_states, "stats": stats})
    )


if __name__ == "__main__":
    main()
