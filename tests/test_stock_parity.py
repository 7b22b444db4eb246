"""Never worse than stock, in real crawls: Scrapy's HTTP cache and a robots.txt that fails.

The example project's spider crawls a small site of this test's own: its
robots.txt answers 503 twice before it disallows a page, and every page answers
503 once before it serves its title. Stock Scrapy retries robots.txt and obeys
it; so must a crawl with the add-on, whose retries must also not come back
from the HTTP cache, nor leave a cached failure for the next crawl.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from .crawling import crawl, stat_of
from .sitecrawl import serving

pytestmark = pytest.mark.e2e

PAGES = 8


class Site:
    """robots.txt: 503 twice, then ``Disallow: /private``; each page: 503 once, then 200."""

    def __init__(self) -> None:
        self.hits: Counter[str] = Counter()
        #: Pages fail once each while True; a healthy site serves them at once.
        self.flaky = True
        self.lock = threading.Lock()
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with site.lock:
                    site.hits[self.path] += 1
                    n = site.hits[self.path]
                status, body = site.answer(self.path, n)
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def answer(self, path: str, n: int) -> tuple[int, str]:
        if path == "/robots.txt":
            return (503, "busy") if n <= 2 else (200, "User-agent: *\nDisallow: /private\n")
        if path == "/":
            links = [f"/page/{i}" for i in range(PAGES)] + ["/private"]
            return 200, "".join(f'<a href="{link}">{link}</a>' for link in links)
        if self.flaky and path.startswith("/page/") and n == 1:
            return 503, "busy"
        return 200, f'<h1 class="title">{path}</h1><p class="value">1</p>'

    def pages_asked(self) -> int:
        return sum(n for path, n in self.hits.items() if path.startswith("/page/"))


@pytest.fixture
def site() -> Iterator[Site]:
    with serving(Site()) as served:
        yield served


def _settings(tmp_path: Path, redis_url: str, **more: Any) -> dict[str, Any]:
    return {
        "RETRYQUEUE_REDIS_URL": redis_url,
        "RETRYQUEUE_EMBEDDED_DIR": str(tmp_path / "state"),
        "RETRYQUEUE_STORE_ENABLED": False,
        "RETRYQUEUE_POLICIES": {"server_error": {"base_delay": 0.2, "max_delay": 0.5}},
        "ROBOTSTXT_OBEY": True,
        **more,
    }


def test_robots_txt_that_answers_503_twice_is_retried_and_obeyed(
    site: Site, tmp_path: Path, redis_url: str, spider_name: str
) -> None:
    done = crawl(site.url, spider_name, tmp_path, _settings(tmp_path, redis_url))
    assert done.returncode == 0, done.log[-3000:]
    # Stock's result: robots.txt retried until it answered, and obeyed.
    assert site.hits["/robots.txt"] == 3
    assert site.hits["/private"] == 0
    assert stat_of(done.log, "robotstxt/response_status_count/200") == 1
    assert {item["title"] for item in done.items} == {f"/page/{i}" for i in range(PAGES)}
    # Scrapy's RetryMiddleware retried robots.txt twice; the queue parked the pages
    # (and counts their retries in Scrapy's stat too).
    assert stat_of(done.log, "retry/count") == 2 + PAGES
    assert stat_of(done.log, "retryqueue/recovered") == PAGES


def test_with_the_http_cache_retries_reach_the_site_and_no_failure_is_cached(
    site: Site, tmp_path: Path, redis_url: str, spider_name: str
) -> None:
    settings = _settings(
        tmp_path,
        redis_url,
        ROBOTSTXT_OBEY=False,
        HTTPCACHE_ENABLED=True,
        HTTPCACHE_DIR=str(tmp_path / "httpcache"),
    )
    # robots.txt is not obeyed here: /private is a page like the others.
    titles = {f"/page/{i}" for i in range(PAGES)} | {"/private"}
    first = crawl(site.url, spider_name, tmp_path, settings)
    assert first.returncode == 0, first.log[-3000:]
    # Every page's retry reached the site (a cached 503 would never have recovered).
    assert {item["title"] for item in first.items} == titles
    assert site.pages_asked() == 2 * PAGES
    assert stat_of(first.log, "retryqueue/recovered") == PAGES

    # A fresh crawl with the same cache, the site healthy now: no 503 comes back
    # from the cache (none was stored), every page parsed at the first attempt.
    site.flaky = False
    site.hits.clear()
    second = crawl(site.url, spider_name, tmp_path, settings)
    assert second.returncode == 0, second.log[-3000:]
    assert {item["title"] for item in second.items} == titles
    assert stat_of(second.log, "retryqueue/scheduled") is None
    # Not even a cached failure asked again: none was stored (HTTPCACHE_IGNORE_HTTP_CODES).
    assert stat_of(first.log, "retryqueue/cache_bypassed") is None
    assert stat_of(second.log, "retryqueue/cache_bypassed") is None
    assert site.pages_asked() == PAGES  # the site asked, not the cached failure
    assert site.hits["/"] == 0  # the index came from the cache: the cache is on
