"""A crawl whose item pipeline refuses the first write of each item; run as a script.

    python tests/replay_crawl.py SITE_URL SPIDER_NAME SETTINGS_JSON OUT_JSON

With RETRYQUEUE_ITEM_REPLAY, a refused JSON item is sent through the
pipelines again without downloading its page again; an item that is not JSON
falls back to downloading the page again. Records the items stored and the
stats into OUT_JSON for tests/test_item_replay.py.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import scrapy
from scrapy.crawler import CrawlerProcess

STORED: list[dict[str, Any]] = []


class Product(scrapy.Item):
    url = scrapy.Field()
    n = scrapy.Field()
    case = scrapy.Field()


class Opaque:
    """A value JSON cannot hold: such an item cannot be replayed."""

    def __repr__(self) -> str:
        return "Opaque()"


class ReplaySpider(scrapy.Spider):
    name = "replay"

    def __init__(self, site: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.site = site

    async def start(self) -> AsyncIterator[scrapy.Request]:
        # Pages 0, 2, 5 and 7 of the flaky site answer at once.
        yield scrapy.Request(f"{self.site}/page/0", callback=self.parse_dict)
        yield scrapy.Request(f"{self.site}/page/2", callback=self.parse_item)
        yield scrapy.Request(f"{self.site}/page/5", callback=self.parse_two)
        yield scrapy.Request(f"{self.site}/page/7", callback=self.parse_opaque)

    def parse_dict(self, response: scrapy.http.Response) -> Iterator[dict[str, Any]]:
        yield {"url": response.url, "case": "dict"}

    def parse_item(self, response: scrapy.http.Response) -> Iterator[Product]:
        yield Product(url=response.url, n=2, case="item")

    def parse_two(self, response: scrapy.http.Response) -> Iterator[dict[str, Any]]:
        # Two items of one page: each is replayed on its own.
        yield {"url": response.url, "case": "two", "part": 1}
        yield {"url": response.url, "case": "two", "part": 2}

    def parse_opaque(self, response: scrapy.http.Response) -> Iterator[dict[str, Any]]:
        yield {"url": response.url, "case": "opaque", "value": Opaque()}


class FlakyDatabase:
    """Refuses the first write of each item, like a database that hiccups."""

    seen: set[str] = set()

    def process_item(self, item: Any, spider: Any = None) -> Any:
        key = f"{item['case']}:{dict(item).get('part', 0)}"
        if key not in self.seen:
            self.seen.add(key)
            raise ConnectionError("database refused the write")
        STORED.append(
            {
                "case": item["case"],
                "type": type(item).__name__,
                **{k: v for k, v in dict(item).items() if k in ("url", "part")},
            }
        )
        return item


def main() -> None:
    site, spider_name, settings_json, out = sys.argv[1:5]
    settings = {
        "ADDONS": {"scrapy_retryqueue.Addon": 0},
        "ITEM_PIPELINES": {f"{__name__}.FlakyDatabase": 100},
        "TELNETCONSOLE_ENABLED": False,
        "LOG_LEVEL": "INFO",
        **json.loads(settings_json),
    }
    process = CrawlerProcess(settings)
    crawler = process.create_crawler(ReplaySpider)
    process.crawl(crawler, site=site, name=spider_name)
    process.start()
    stats = {k: v for k, v in crawler.stats.get_stats().items() if isinstance(v, (int, str))}
    Path(out).write_text(json.dumps({"stored": STORED, "stats": stats}))


if __name__ == "__main__":
    main()
