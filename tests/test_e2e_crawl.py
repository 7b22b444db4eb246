"""End to end: real crawls of the flaky site (a subprocess) against real Redis.

One crawl with scrapy-retryqueue and one with Scrapy's stock RetryMiddleware
run against the same fault mix, and their outcomes are compared page by page.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from scrapy.settings import Settings

from scrapy_retryqueue.config import load_config
from scrapy_retryqueue.decision.backoff import min_backoff
from scrapy_retryqueue.queue import embedded
from scrapy_retryqueue.queue.delayed import RedisDelayedQueue
from scrapy_retryqueue.queue.envelope import task_from_json

from .crawling import Crawl, Site, flaky_site
from .crawling import crawl as run_crawl

pytestmark = pytest.mark.e2e

PAGES = 500
RETRY_AFTER = 2
SLOW = 3.0
# Short delays keep the crawl near 15 s; what is tested is that each retry
# waits at least what its policy says, whatever the numbers.
FAST_POLICIES = {
    "timeout": {"base_delay": 0.5, "max_delay": 4},
    "connection": {"base_delay": 0.5, "max_delay": 4},
    "rate_limited": {"base_delay": 0.5, "max_delay": 4},
    "server_error": {"base_delay": 0.5, "max_delay": 4},
    "parse": {"base_delay": 1.0, "max_delay": 4},
}
COMMON_SETTINGS: dict[str, Any] = {
    "DOWNLOAD_TIMEOUT": 1,
    "CONCURRENT_REQUESTS": 32,
    "CONCURRENT_REQUESTS_PER_DOMAIN": 32,
    "LOG_LEVEL": "INFO",
    "TELNETCONSOLE_ENABLED": False,
}
OURS: dict[str, Any] = {
    # Dead letters stay in Redis, where these tests read them.
    "RETRYQUEUE_STORE_ENABLED": False,
    "RETRYQUEUE_POLICIES": FAST_POLICIES,
    "RETRYQUEUE_POLL_INTERVAL": 0.2,
    "RETRYQUEUE_IDLE_TIMEOUT": 30,
}
STOCK: dict[str, Any] = {"ADDONS": {}}


@pytest.fixture
def site() -> Iterator[Site]:
    with flaky_site(pages=PAGES, slow=SLOW, retry_after=RETRY_AFTER) as running:
        yield running


def crawl(
    site_url: str, spider: str, tmp_path: Path, settings: dict[str, Any], *args: str
) -> Crawl:
    return run_crawl(site_url, spider, tmp_path, {**COMMON_SETTINGS, **settings}, *args)


def expected_outcomes(site: Site) -> dict[str, str]:
    return {
        site.url + path: info["expected"] for path, info in site.get_json("/__scenarios").items()
    }


def failure_kind(scenario: str, entry: dict[str, Any]) -> str | None:
    """The kind of failure the crawler saw for one logged request, None if it succeeded."""
    status, attempt = entry["status"], entry["attempt"]
    if status in (503, 500):
        return "server_error"
    if status == 429:
        return "rate_limited"
    if scenario == "timeout_once" and attempt == 1:
        return "timeout"
    if scenario == "drop_once" and attempt == 1:
        return "connection"
    if scenario == "parse_once" and attempt == 1:
        return "parse"
    return None


def test_retry_queue_recovers_every_transient_failure_and_stock_scrapy_does_not(
    site: Site, namespace: str, redis_url: str, tmp_path: Path
) -> None:
    expected = expected_outcomes(site)
    assert len(expected) == PAGES
    started = time.monotonic()
    ours = crawl(site.url, namespace, tmp_path, {**OURS, "RETRYQUEUE_REDIS_URL": redis_url})
    elapsed = time.monotonic() - started
    assert ours.returncode == 0, ours.log[-3000:]
    # It closed on its own, because nothing was pending, not by the idle bound.
    assert "'finish_reason': 'finished'" in ours.log
    assert "closing with work left" not in ours.log
    assert elapsed < 120, f"the crawl took {elapsed:.0f}s"

    # Every healthy or transient page parsed exactly once.
    parsed = [item["url"] for item in ours.items]
    assert len(parsed) == len(set(parsed)), "a page was parsed twice"
    should_parse = {url for url, outcome in expected.items() if outcome == "parsed"}
    assert set(parsed) == should_parse

    # Every 404/410/403 dead-lettered with its kind; nothing left pending.
    client = redis.Redis.from_url(redis_url)
    queue = RedisDelayedQueue(client, namespace, node_id="test")
    dead = {}
    for _task_id, raw in queue.dead_letters(limit=10_000):
        task = task_from_json(raw)
        dead[task.url] = f"dead:{task.dead_kind}"
    assert dead == {url: out for url, out in expected.items() if out.startswith("dead:")}
    counts = queue.counts(now=int(time.time() * 1000))
    assert (counts.due, counts.leased) == (0, 0)
    # Zero lost: every page is parsed or dead, and none is both.
    assert set(parsed) | set(dead) == set(expected)
    assert not set(parsed) & set(dead)

    # Each retry waited at least its policy's minimum delay, by the server's clock.
    table = load_config(Settings({"RETRYQUEUE_POLICIES": FAST_POLICIES})).policy_table
    scenarios = site.get_json("/__scenarios")
    by_path: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for entry in site.get_json("/__log"):
        by_path[entry["path"]].append(entry)
    checked = defaultdict(int)
    for path, entries in by_path.items():
        entries.sort(key=lambda e: e["t"])
        scenario = scenarios[path]["scenario"]
        failures_so_far: dict[str, int] = defaultdict(int)
        for previous, current in itertools.pairwise(entries):
            kind = failure_kind(scenario, previous)
            assert kind is not None, f"{path} was fetched again after a success"
            policy = table.policy_for(kind)
            minimum = min_backoff(
                failures_so_far[kind],
                base_delay=policy.base_delay,
                multiplier=policy.multiplier,
                max_delay=policy.max_delay,
                jitter=policy.jitter,
            )
            if kind == "rate_limited":
                minimum = RETRY_AFTER  # every 429 says when: the server's word sets the wait
            waited = current["t"] - previous["t"]
            # 5 ms: due times are stored in whole milliseconds.
            assert waited >= minimum - 0.005, (
                f"{path}: {kind} retry after {waited:.3f}s < {minimum}s"
            )
            failures_so_far[kind] += 1
            checked[kind] += 1
    # Every kind of the mix was actually exercised (25 pages of each slot).
    assert checked["rate_limited"] == 50
    assert checked["server_error"] == 3 * 25 + 25 * 2
    assert checked["timeout"] == checked["connection"] == checked["parse"] == 25

    # The same fault mix with Scrapy's stock RetryMiddleware, in the same test.
    site.reset()
    stock = crawl(site.url, namespace + "stock", tmp_path, STOCK)
    assert stock.returncode == 0, stock.log[-3000:]
    stock_parsed = {item["url"] for item in stock.items}
    lost = should_parse - stock_parsed
    # Stock Scrapy never retries a parse failure: those pages are simply gone,
    # and nothing records them.
    assert len(lost) >= 25, f"stock Scrapy lost only {len(lost)} pages"
    assert {scenarios[url.removeprefix(site.url)]["scenario"] for url in lost} >= {"parse_once"}
    # And it ignored Retry-After: some 429 was retried sooner than asked.
    stock_log: dict[str, list[float]] = defaultdict(list)
    for entry in site.get_json("/__log"):
        if scenarios[entry["path"]]["scenario"] == "rate_limited":
            stock_log[entry["path"]].append(entry["t"])
    gaps = [ts[1] - ts[0] for ts in map(sorted, stock_log.values()) if len(ts) > 1]
    assert gaps and min(gaps) < RETRY_AFTER
    client.close()


def test_a_second_run_resumes_retries_left_pending_by_the_first(site: Site, tmp_path: Path) -> None:
    """The embedded server persists: a crawl that stops with retries pending
    leaves them for the next crawl of the same spider, which finishes them."""
    spider = f"resume{uuid.uuid4().hex[:6]}"
    server_dir = tmp_path / "embedded"
    settings = {
        **OURS,
        "RETRYQUEUE_EMBEDDED_DIR": str(server_dir),
        # Parse retries come back 12 s later; the first run does not wait for
        # them, as they are due beyond its idle bound.
        "RETRYQUEUE_POLICIES": {
            **FAST_POLICIES,
            "parse": {"base_delay": 12, "max_delay": 12, "jitter": "none"},
        },
        "RETRYQUEUE_IDLE_TIMEOUT": 1,
    }
    try:
        first = crawl(site.url, spider, tmp_path, settings)
        assert first.returncode == 0, first.log[-3000:]
        # It says what it left, where, and how to resume it; so do its stats.
        assert "'finish_reason': 'retryqueue_work_left'" in first.log
        assert "pending retries in Redis" in first.log
        assert f"run the same crawl of spider '{spider}' again to resume them" in first.log
        assert "'retryqueue/left/pending': " in first.log
        scenarios = site.get_json("/__scenarios")
        parse_pages = {
            site.url + path for path, info in scenarios.items() if info["scenario"] == "parse_once"
        }
        should_parse = {
            site.url + path for path, info in scenarios.items() if info["expected"] == "parsed"
        }
        first_parsed = {item["url"] for item in first.items}
        assert not parse_pages & first_parsed
        # The server stopped with its last crawl: the second run resumes from the disk.
        assert not embedded.is_running(server_dir)

        second = crawl(
            site.url,
            spider,
            tmp_path,
            {**settings, "RETRYQUEUE_IDLE_TIMEOUT": 30},
            "-a",
            "index=false",
        )
        assert second.returncode == 0, second.log[-3000:]
        second_parsed = [item["url"] for item in second.items]
        assert parse_pages <= set(second_parsed)
        # Nothing was lost between the runs, and nothing parsed twice.
        assert first_parsed | set(second_parsed) == should_parse
        assert len(first_parsed) + len(second_parsed) == len(should_parse)
        # Stopped with the crawl again; started here to read what it kept.
        assert not embedded.is_running(server_dir)
        client = redis.Redis.from_url(embedded.ensure_server(server_dir))
        queue = RedisDelayedQueue(client, spider, node_id="test")
        counts = queue.counts(now=int(time.time() * 1000))
        assert (counts.due, counts.leased) == (0, 0)
        client.close()
    finally:
        embedded.stop_server(server_dir)
