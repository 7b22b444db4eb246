"""Per-domain cooldowns in a real fleet: two crawl processes, three sites.

The sites are the bundled flaky site on distinct loopback addresses
(127.0.0.2, 127.0.0.3, 127.0.0.4). One of them starts throttling after a
burst of requests (every page answers 429 with Retry-After for 10 s); the
others stay healthy. Two nodes share one Redis and split the URLs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from typing import Any

import pytest
import redis

from scrapy_retryqueue.queue.delayed import RedisDelayedQueue
from scrapy_retryqueue.queue.envelope import task_from_json
from scrapy_retryqueue.queue.keys import all_keys, keys_for

from .crawling import ROOT, flaky_site

pytestmark = pytest.mark.e2e

PAGES = 40
THROTTLE_AFTER = 12
THROTTLE_FOR = 10.0
#: Requests already sent when the first 429 came back may arrive a moment later.
GRACE = 1.0


def _settings(redis_url: str, node: str) -> dict[str, Any]:
    return {
        "RETRYQUEUE_REDIS_URL": redis_url,
        "RETRYQUEUE_NODE_ID": node,
        "RETRYQUEUE_STORE_ENABLED": False,
        "RETRYQUEUE_DOMAIN_COOLDOWN": True,
        "RETRYQUEUE_COOLDOWN_BASE": 5.0,
        "RETRYQUEUE_POLL_INTERVAL": 0.2,
        "RETRYQUEUE_LEASE_TIME": 5,
        "RETRYQUEUE_IDLE_TIMEOUT": 60,
        "RETRYQUEUE_POLICIES": {"rate_limited": {"base_delay": 0.5, "max_delay": 2}},
        "CONCURRENT_REQUESTS": 8,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 4,
        "DOWNLOAD_TIMEOUT": 5,
    }


def _throttled_site() -> Any:
    """The site that throttles (every page 429 with Retry-After) after a burst."""
    return flaky_site(
        host="127.0.0.2",
        mix="healthy",
        pages=PAGES,
        latency=0.02,
        throttle_after=THROTTLE_AFTER,
        throttle_for=THROTTLE_FOR,
    )


def _start_node(
    urls: list[str], spider: str, settings: dict[str, Any], out: Any
) -> subprocess.Popen[str]:
    """One fleet node (tests/domains_crawl.py) in a subprocess; its results in *out*."""
    return subprocess.Popen(
        [
            *(sys.executable, str(ROOT / "tests" / "domains_crawl.py")),
            json.dumps(urls),
            spider,
            json.dumps(settings),
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture(scope="module")
def fleet_run(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("domains")
    spider = f"domains{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(redis_url)
    with (
        _throttled_site() as throttled,
        flaky_site(host="127.0.0.3", mix="healthy", pages=PAGES, latency=0.02) as healthy_a,
        flaky_site(host="127.0.0.4", mix="healthy", pages=PAGES, latency=0.02) as healthy_b,
    ):
        sites = {"throttled": throttled, "healthy_a": healthy_a, "healthy_b": healthy_b}
        urls = [f"{site.url}/page/{n}" for n in range(PAGES) for site in sites.values()]
        nodes = []
        try:
            for i in range(2):
                out = tmp / f"node{i}.json"
                settings = _settings(redis_url, f"node-{i}")
                nodes.append((_start_node(urls[i::2], spider, settings, out), out))
            results = []
            for process, out in nodes:
                _, stderr = process.communicate(timeout=150)
                assert process.returncode == 0, stderr[-3000:]
                results.append(json.loads(out.read_text()) | {"log": stderr})
            queue = RedisDelayedQueue(client, spider, node_id="test")
            yield {
                "sites": {name: site.url for name, site in sites.items()},
                "logs": {name: site.get_json("/__log") for name, site in sites.items()},
                "nodes": results,
                "dead": [task_from_json(raw) for _, raw in queue.dead_letters()],
                "counts": queue.counts(now=int(time.time() * 1000)),
                "events": [
                    {k.decode(): v.decode() for k, v in fields.items()}
                    for _, fields in client.xrange(keys_for(spider).events)
                ],
            }
        finally:
            for process, _ in nodes:
                if process.poll() is None:
                    process.kill()
                    process.wait(10)
            client.delete(*all_keys(keys_for(spider)))
            client.close()


def test_every_url_is_finally_fetched(fleet_run: dict[str, Any]) -> None:
    parsed = [p["url"] for node in fleet_run["nodes"] for p in node["parsed"]]
    expected = {f"{url}/page/{n}" for url in fleet_run["sites"].values() for n in range(PAGES)}
    assert set(parsed) == expected
    assert fleet_run["counts"].due == fleet_run["counts"].leased == 0


def test_no_url_is_dead_lettered(fleet_run: dict[str, Any]) -> None:
    assert fleet_run["dead"] == []


def test_the_throttled_domain_gets_at_most_one_probe_per_cooldown(
    fleet_run: dict[str, Any],
) -> None:
    log = fleet_run["logs"]["throttled"]
    first_429 = min(e["t"] for e in log if e["status"] == 429)
    reopened = min(e["t"] for e in log if e["status"] == 200 and e["t"] > first_429)
    # Requests that reached the site after the in-flight ones came back and
    # before the first success after the throttling: only probes.
    during = [e for e in log if first_429 + GRACE < e["t"] < reopened]
    windows = [e for e in fleet_run["events"] if e["type"] == "domain" and e["state"] == "cooling"]
    assert len(during) <= len(windows), (during, windows)
    assert len(windows) <= 3
    # The throttled domain was asked for far fewer pages than a blind retry
    # would have: the cooldown held back both retries and fresh requests.
    assert sum(1 for e in log if e["status"] == 429) < PAGES


def test_healthy_domains_keep_going_during_the_cooldown(fleet_run: dict[str, Any]) -> None:
    log = fleet_run["logs"]["throttled"]
    first_429 = min(e["t"] for e in log if e["status"] == 429)
    for name in ("healthy_a", "healthy_b"):
        done = max(e["t"] for e in fleet_run["logs"][name])
        # Every page of the healthy sites was fetched well before the throttled
        # site's cooldown ended.
        assert done < first_429 + THROTTLE_FOR / 2, name
        assert len(fleet_run["logs"][name]) == PAGES, name


def test_cooldowns_are_visible_in_stats_events_and_signals(fleet_run: dict[str, Any]) -> None:
    throttled_host = "127.0.0.2"
    domain_events = [e for e in fleet_run["events"] if e["type"] == "domain"]
    assert domain_events[0]["state"] == "cooling"
    assert domain_events[-1]["state"] == "open"
    assert {e["domain"] for e in domain_events} == {throttled_host}
    stats = [node["stats"] for node in fleet_run["nodes"]]
    assert sum(s.get("retryqueue/domain/cooldowns", 0) for s in stats) == 1
    assert sum(s.get("retryqueue/domain/reopened", 0) for s in stats) == 1
    assert sum(s.get("retryqueue/domain/deferred", 0) for s in stats) > 0
    states = [s for node in fleet_run["nodes"] for s in node["domain_states"]]
    assert states[0]["state"] == "cooling" or any(s["state"] == "cooling" for s in states)
    assert any(s["state"] == "open" and s["previous"] == "cooling" for s in states)
    assert all(s["domain"] == throttled_host for s in states)


@pytest.fixture(scope="module")
def delayed_run(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One node with Scrapy's politeness settings: requests wait in the download
    queue of their domain, some of them when the domain starts to cool."""
    tmp = tmp_path_factory.mktemp("delayed")
    spider = f"delayed{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(redis_url)
    with _throttled_site() as site:
        out = tmp / "node.json"
        settings = {
            **_settings(redis_url, "delayed-node"),
            "DOWNLOAD_DELAY": 0.25,
            "RANDOMIZE_DOWNLOAD_DELAY": True,
            "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
        }
        try:
            process = _start_node(
                [f"{site.url}/page/{n}" for n in range(PAGES)], spider, settings, out
            )
            _, stderr = process.communicate(timeout=150)
            assert process.returncode == 0, stderr[-3000:]
            yield {
                "log": site.get_json("/__log"),
                "node": json.loads(out.read_text()) | {"log": stderr},
                "events": [
                    {k.decode(): v.decode() for k, v in fields.items()}
                    for _, fields in client.xrange(keys_for(spider).events)
                ],
            }
        finally:
            client.delete(*all_keys(keys_for(spider)))
            client.close()


def test_requests_waiting_in_scrapys_download_queue_are_not_sent_to_a_cooling_domain(
    delayed_run: dict[str, Any],
) -> None:
    log = delayed_run["log"]
    first_429 = min(e["t"] for e in log if e["status"] == 429)
    reopened = min(e["t"] for e in log if e["status"] == 200 and e["t"] > first_429)
    windows = [
        e for e in delayed_run["events"] if e["type"] == "domain" and e["state"] == "cooling"
    ]
    # After the node knew (the first 429 came back), only probes reach the site
    # until it reopens, although requests were queued behind DOWNLOAD_DELAY.
    during = [e for e in log if first_429 + GRACE < e["t"] < reopened]
    assert len(during) <= len(windows), (during, windows)
    stats = delayed_run["node"]["stats"]
    # Some of the deferred requests were taken back out of Scrapy's queue.
    assert stats.get("retryqueue/domain/deferred", 0) > 0
    parsed = {p["url"] for p in delayed_run["node"]["parsed"]}
    assert len(parsed) == PAGES
