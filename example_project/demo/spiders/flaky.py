"""Crawls the bundled flaky site: an index page, every page it links to, and each page's next page."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import scrapy


class FlakySpider(scrapy.Spider):
    name = "flaky"

    def __init__(
        self, site: str = "http://127.0.0.1:8765", index: str = "true", **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.site = site.rstrip("/")
        # index=false starts from nothing: the crawl then runs only the retries
        # that an earlier run left pending.
        self.follow_index = index.lower() not in ("0", "false", "no")

    async def start(self) -> AsyncIterator[scrapy.Request]:
        if self.follow_index:
            yield scrapy.Request(f"{self.site}/", callback=self.parse_index)

    def parse_index(self, response: scrapy.http.Response) -> Iterator[scrapy.Request]:
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, callback=self.parse_page)

    def parse_page(self, response: scrapy.http.Response) -> Iterator[dict[str, Any]]:
        title = response.css("h1.title::text").get()
        if title is None:
            # The site's layout "changed": retrying later is the right answer.
            raise ValueError(f"no h1.title on {response.url}")
        yield {"url": response.url, "title": title, "value": response.css("p.value::text").get()}
        # A chained site (flaky_site.py --chain): each page links the next one.
        following = response.css("a.next::attr(href)").get()
        if following is not None:
            yield response.follow(following, callback=self.parse_page)
