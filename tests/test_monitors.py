"""The Spidermon monitors (scrapy_retryqueue/monitors.py) in real crawls, run by
Spidermon's own extension and runner: a ban burst fails the suite, a healthy crawl
passes it; and each monitor's threshold on the stats it reads."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from scrapy import Spider
from scrapy.utils.test import get_crawler
from spidermon.contrib.scrapy.runners import SpiderMonitorRunner

from scrapy_retryqueue.crawl.monitors import RetryQueueMonitorSuite

from .crawling import crawl
from .sitecrawl import Answer, Site, serving

PAGES = 12


def _answer(banned: int) -> Answer:
    """An index of PAGES pages; the first *banned* of them answer 403."""

    def answer(path: str, query: dict[str, list[str]], times: list[float]) -> tuple[int, bytes]:
        if path == "/":
            return 200, "".join(f'<a href="/page/{i}">{i}</a>' for i in range(PAGES)).encode()
        if path.startswith("/page/") and int(path[6:]) < banned:
            return 403, b"banned"
        return 200, f'<h1 class="title">{path}</h1>'.encode()

    return answer


@pytest.fixture
def serve() -> Iterator[Any]:
    with contextlib.ExitStack() as sites:
        yield lambda banned: sites.enter_context(serving(Site(_answer(banned))))


def _settings(tmp_path: Path, redis_url: str) -> dict[str, Any]:
    return {
        "RETRYQUEUE_REDIS_URL": redis_url,
        "RETRYQUEUE_EMBEDDED_DIR": str(tmp_path / "state"),
        "RETRYQUEUE_STORE_ENABLED": False,
        "SPIDERMON_ENABLED": True,
        "EXTENSIONS": {"spidermon.contrib.scrapy.extensions.Spidermon": 500},
        # A string: -s passes text, which getlist() splits at commas.
        "SPIDERMON_ENGINE_STOP_MONITORS": "scrapy_retryqueue.crawl.monitors.RetryQueueMonitorSuite",
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
