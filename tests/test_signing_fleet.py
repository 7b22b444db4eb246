"""Three nodes of a fleet with the leased frontier, their signing keys rotated mid-crawl.

The nodes share the spider's frontier and retry queue on one Redis and start at the same
moment: one signs with the old key (its ring lists the new one second), two with the
new one (the old listed second), the rotation's middle step. Every page answers 503
twice before it answers, so each page's retries are signed by one node and claimed by
another. Once they crawl, a hostile writer adds a start page of its own to the frontier
and retries signed with a key the fleet does not hold. Every page is parsed once, whichever node
signed or claimed it; none of the writer's is fetched, each is reported once; every
node closes on its own. Then a node whose ring lists only the new key (the old one
removed) finds nothing left signed with the old one.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from scrapy_retryqueue.queue.keys import keys_for
from scrapy_retryqueue.queue.signature import sign_envelope
from scrapy_retryqueue.secure.signing import KeyRing, generate_key, parse_keys

from .crawling import track
from .sitecrawl import ROOT, Site, serving
from .test_hostile_writer import hand_written, hits, put

pytestmark = pytest.mark.e2e

OLD, NEW, EVIL = generate_key(), generate_key(), generate_key()
PAGES = 30
SETTINGS: dict[str, Any] = {
    "SCHEDULER": "scrapy_retryqueue.frontier.LeasedScheduler",
    "CONCURRENT_REQUESTS": 8,
    "DOWNLOAD_TIMEOUT": 5,
    "RETRYQUEUE_POLL_INTERVAL": 0.2,
    "RETRYQUEUE_IDLE_TIMEOUT": 20,
    "RETRYQUEUE_STORE_ENABLED": False,
    "RETRYQUEUE_POLICIES": {
        "server_error": {"base_delay": 0.3, "max_delay": 0.3, "jitter": "none", "max_retries": 5}
    },
}


def answer(path: str, query: dict[str, list[str]], times: list[float]) -> tuple[int, bytes]:
    if path == "/":
        links = "".join(f'<a href="/p/{i}">{i}</a>' for i in range(PAGES))
        return 200, f"<html><body>{links}</body></html>".encode()
    if path.startswith("/p/") and len(times) <= 2:
        return 503, b"<html>busy</html>"
    return 200, f"<html><h1>{path}</h1></html>".encode()


@pytest.fixture
def site() -> Iterator[Site]:
    with serving(Site(answer)) as running:
        yield running


def start(
    spider: str, site: Site, tmp_path: Path, keys: list[str], node: str, *, index: bool = True
) -> tuple[Any, Path]:
    out = tmp_path / f"{node}.json"
    settings = {**SETTINGS, "RETRYQUEUE_SIGNING_KEYS": keys, "RETRYQUEUE_NODE_ID": node}
    process = subprocess.Popen(
        [
            *(sys.executable, str(ROOT / "tests" / "hostile_crawl.py"), spider, site.url),
            *("true" if index else "false", json.dumps(settings), str(out)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    return track(process), out


def finish(process: Any, out: Path) -> dict[str, Any]:
    _, log = process.communicate(timeout=120)
    assert process.returncode == 0, log[-3000:]
    result = json.loads(out.read_text())
    result["log"] = log
    return result


def test_three_nodes_rotating_keys_parse_every_page_once_and_fetch_nothing_forged(
    site: Site, namespace: str, redis_url: str, tmp_path: Path
) -> None:
    client = redis.Redis.from_url(redis_url)
    keys = keys_for(namespace)
    SETTINGS["RETRYQUEUE_REDIS_URL"] = redis_url
    started = time.monotonic()
    nodes = [
        start(namespace, site, tmp_path, [OLD, NEW], "node-old"),
        start(namespace, site, tmp_path, [NEW, OLD], "node-new-1"),
        start(namespace, site, tmp_path, [NEW, OLD], "node-new-2"),
    ]
    # The hostile writer, once the three nodes crawl (each has written its heartbeat):
    # a start page of its own in the frontier, and retries signed with a key of its own,
    # due now. (Written before they start, they would keep them from starting: a node
    # whose ring shares no key with the signed entries it finds touches nothing.)
    deadline = time.monotonic() + 60
    while client.hlen(keys.nodes) < 3 and time.monotonic() < deadline:
        assert all(process.poll() is None for process, _ in nodes)
        time.sleep(0.05)
    evil_page = json.dumps({"url": f"{site.url}/evil/start", "callback": "steal"})
    client.hset(keys.frontier_requests, "evil-start", evil_page)
    client.zadd(keys.frontier, {"evil-start": -100})
    ring = KeyRing(parse_keys([EVIL]))
    for i in range(2):
        text = hand_written(namespace, f"rekeyed-{i}", f"{site.url}/evil/k{i}")
        put(client, keys, f"rekeyed-{i}", sign_envelope(text, ring, ""), int(time.time() * 1000))
    results = [finish(process, out) for process, out in nodes]
    took = time.monotonic() - started

    # Every page parsed once across the fleet (its two 503s each retried elsewhere or
    # here, under either key), none of the writer's fetched.
    parsed = [url for r in results for url in r["parsed"]]
    assert sorted(parsed) == sorted(f"{site.url}/p/{i}" for i in range(PAGES))
    assert hits(site, "/evil/") == 0 and all(r["stolen"] == [] for r in results)
    stats = [r["stats"] for r in results]
    # Each node claimed retries, so signatures of both keys were checked by both rings.
    assert all(s.get("retryqueue/reinjected", 0) > 0 for s in stats), stats
    assert sum(s.get("retryqueue/forged", 0) for s in stats) == 3
    assert sum(s.get("retryqueue/frontier/forged", 0) for s in stats) == 1
    assert sum(s.get("retryqueue/forged/unknown_key", 0) for s in stats) == 2
    lines = [
        line
        for r in results
        for line in r["log"].splitlines()
        if re.search(r"(task|frontier request) '[^']+' is forged", line)
    ]
    assert len(lines) == 3, lines
    assert all(s["finish_reason"] == "finished" for s in stats)
    assert took < 90, took
    assert client.zcard(keys.due) == client.zcard(keys.leased) == 0
    assert client.zcard(keys.frontier) == client.zcard(keys.frontier_leased) == 0

    # The rotation's last step: the old key removed. Nothing signed with it is left.
    done = finish(*start(namespace, site, tmp_path, [NEW], "node-after", index=False))
    # It starts (a node late to a finished fleet crawl then crawls nothing: fleet.md).
    assert done["stats"]["finish_reason"] in ("finished", "retryqueue_fleet_finished")
    assert "holds entries signed with" not in done["log"] and done["parsed"] == []
    assert "retryqueue/forged" not in done["stats"]
    client.close()
