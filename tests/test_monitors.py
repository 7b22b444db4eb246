"""The Spidermon monitors (scrapy_retryqueue/monitors.py) in real crawls, run by
Spidermon's own extension and runner: a ban burst fails the suite, a healthy crawl
passes it; and each monitor's threshold on the stats it reads."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from scrapy import Spider
from scrapy.utils.test import get_crawler
from spidermon.contrib.scrapy.runners import SpiderMonitorRunner

from scrapy_retryqueue.monitors import RetryQueueMonitorSuite

from .crawling import crawl

PAGES = 12


class Site:
    """An index of PAGES pages; the first *banned* of them answer 403."""

    def __init__(self, banned: int) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, body = 200, f'<h1 class="title">{self.path}</h1>'
                if self.path == "/":
                    body = "".join(f'<a href="/page/{i}">{i}</a>' for i in range(PAGES))
                elif self.path.startswith("/page/") and int(self.path[6:]) < banned:
                    status, body = 403, "banned"
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def serve() -> Iterator[Any]:
    sites: list[tuple[Site, threading.Thread]] = []

    def start(banned: int) -> Site:
        site = Site(banned)
        thread = threading.Thread(target=site.server.serve_forever, daemon=True)
        thread.start()
        sites.append((site, thread))
        return site

    yield start
    for site, thread in sites:
        site.server.shutdown()
        site.server.server_close()
        thread.join(10)


def _settings(tmp_path: Path, redis_url: str) -> dict[str, Any]:
    return {
        "RETRYQUEUE_REDIS_URL": redis_url,
        "RETRYQUEUE_EMBEDDED_DIR": str(tmp_path / "state"),
        "RETRYQUEUE_STORE_ENABLED": False,
        "SPIDERMON_ENABLED": True,
        "EXTENSIONS": {"spidermon.contrib.scrapy.extensions.Spidermon": 500},
        # A string: -s passes text, which getlist() splits at commas.
        "SPIDERMON_ENGINE_STOP_MONITORS": "scrapy_retryqueue.monitors.RetryQueueMonitorSuite",
    }


@pytest.mark.e2e
def test_a_ban_burst_fails_the_suite_and_a_healthy_crawl_passes_it(
    serve: Any, tmp_path: Path, redis_url: str, spider_name: str
) -> None:
    banned = crawl(serve(banned=5).url, spider_name, tmp_path, _settings(tmp_path, redis_url))
    assert banned.returncode == 0, banned.log[-3000:]
    assert "[Spidermon] FAILED" in banned.log, banned.log[-3000:]
    assert "5 request(s) answered 401/403 and were given up" in banned.log

    healthy = crawl(serve(banned=0).url, spider_name, tmp_path, _settings(tmp_path, redis_url))
    assert healthy.returncode == 0, healthy.log[-3000:]
    assert "[Spidermon] OK" in healthy.log, healthy.log[-3000:]
    assert "[Spidermon] FAILED" not in healthy.log


# -- each monitor on the stats it reads (Spidermon's runner, in-process) ---------------------


class _Spider(Spider):
    name = "monitored"


def _run(stats: dict[str, Any], **settings: Any) -> dict[str, list[str]]:
    """Run the suite on *stats*: the failure messages of each failed monitor."""
    crawler = get_crawler(_Spider, settings)
    spider = _Spider.from_crawler(crawler)
    runner = SpiderMonitorRunner(spider=spider)
    runner.run(RetryQueueMonitorSuite(), stats=stats, crawler=crawler, spider=spider, job=None)
    failed: dict[str, list[str]] = {}
    for result in runner.result.monitor_results:
        if result.status != "OK":
            failed.setdefault(result.monitor.monitor_name, []).append(str(result.error))
    return failed


def test_a_healthy_crawls_stats_pass_every_monitor() -> None:
    stats = {"retryqueue/recovered": 40, "retryqueue/dead/not_found": 30}
    # 30 never-retried 404s are no failure to recover: 40 of 40 retried recovered.
    assert _run(stats) == {}


@pytest.mark.parametrize(
    ("stats", "settings", "monitor", "message"),
    [
        ({"retryqueue/dead/forbidden": 3}, {}, "bans", "3 request(s) answered 401/403"),
        (
            {"retryqueue/dead/forbidden": 3},
            {"RETRYQUEUE_MONITOR_MAX_BANS": 3},
            None,
            "",
        ),
        ({"retryqueue/dead/malformed": 1}, {}, "dead letters", "malformed 1 (max 0)"),
        (
            {"retryqueue/dead/timeout": 9, "retryqueue/recovered": 90},
            {"RETRYQUEUE_MONITOR_MAX_DEAD": {"*": 5}},
            "dead letters",
            "timeout 9 (max 5)",
        ),
        ({"retryqueue/left/pending": 2}, {}, "pending", "2 retries were left pending"),
        (
            {"retryqueue/recovered": 1, "retryqueue/dead/server_error": 3},
            {},
            "recovery rate",
            "25% of retried failures recovered",
        ),
    ],
)
def test_each_monitor_fails_over_its_threshold(
    stats: dict[str, Any], settings: dict[str, Any], monitor: str | None, message: str
) -> None:
    failed = _run(stats, **settings)
    if monitor is None:
        assert failed == {}
        return
    [(name, errors)] = failed.items()
    assert monitor in name.lower()
    assert message in json.dumps(errors)
