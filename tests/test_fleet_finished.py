"""A node that starts after its fleet's crawl finished crawls nothing, and says so;
RETRYQUEUE_FRONTIER_RESTART starts a new crawl of the spider deliberately.

Two `scrapy crawl flaky_fleet` nodes (example_project/run_fleet.py's set-up:
scrapy-redis's scheduler over the leased frontier) crawl the site to its end;
then a third node starts, as one that waited out a failover would: it must not
seed the start page again and crawl the whole site twice. Then a node started
with RETRYQUEUE_FRONTIER_RESTART = True crawls the site again, from its start
page, and so does one with scrapy-redis's SCHEDULER_FLUSH_ON_START. The frontier
is on the single Redis, then on the local Redis Cluster.
"""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from scrapy_retryqueue.queue.keys import all_keys, keys_for

from .crawling import PROJECT, flaky_site, stat_of, track
from .waiting import wait_for

run_fleet = importlib.import_module("run_fleet")

pytestmark = pytest.mark.e2e

SITE = {"pages": 20, "mix": "healthy", "latency": 0.05}


@pytest.fixture(params=["single", "cluster"])
def frontier_redis(request: pytest.FixtureRequest, redis_url: str) -> Iterator[dict[str, Any]]:
    """The settings that put the retry queue and its frontier on the single Redis or
    on the local cluster (scrapy-redis's scheduler keeps REDIS_URL, the single one)."""
    if request.param == "single":
        yield {"RETRYQUEUE_REDIS_URL": redis_url}
    else:
        cluster = request.getfixturevalue("redis_cluster_url")
        yield {"RETRYQUEUE_REDIS_URL": cluster, "RETRYQUEUE_REDIS_CLUSTER": True}


def _node(
    site_url: str, spider: str, name: str, workdir: Path, settings: dict[str, Any]
) -> tuple[subprocess.Popen[bytes], Path]:
    out = workdir / f"{name}.jsonl"
    command = [sys.executable, "-m", "scrapy.cmdline", "crawl", "flaky_fleet"]
    command += ["-a", f"site={site_url}", "-a", f"name={spider}", "-O", str(out)]
    settings = {
        **run_fleet.NODE_SETTINGS,
        **settings,
        "RETRYQUEUE_NODE_ID": name,
        "LOG_FILE": str(out.with_suffix(".log")),
    }
    for key, value in settings.items():
        command += ["-s", f"{key}={json.dumps(value) if isinstance(value, dict) else value}"]
    return track(subprocess.Popen(command, cwd=PROJECT)), out


def _run(process: subprocess.Popen[bytes], out: Path) -> tuple[str, list[str]]:
    assert process.wait(300) == 0
    log = out.with_suffix(".log").read_text()
    lines = out.read_text().splitlines() if out.exists() else []
    return log, [json.loads(line)["url"] for line in lines]


def _seconds(log: str, line: str) -> int:
    """The time of day (s) of the first log line that says *line*."""
    found = re.search(rf"(\d\d):(\d\d):(\d\d) \S+ \w+: {line}", log)
    assert found is not None, line
    hours, minutes, seconds = (int(x) for x in found.groups())
    return hours * 3600 + minutes * 60 + seconds


def test_a_node_started_after_the_fleet_finished_crawls_nothing_until_told_to_restart(
    redis_url: str, frontier_redis: dict[str, Any], tmp_path: Path
) -> None:
    spider = f"fin{uuid.uuid4().hex[:8]}"
    keys = keys_for(spider, run_fleet.NAMESPACE)
    settings = {"REDIS_URL": redis_url, **frontier_redis}
    cluster = bool(frontier_redis.get("RETRYQUEUE_REDIS_CLUSTER"))
    url = frontier_redis["RETRYQUEUE_REDIS_URL"]
    queue = RedisCluster.from_url(url) if cluster else redis.Redis.from_url(url)
    try:
        with flaky_site(**SITE) as site:
            parseable = {site.url + path for path in site.get_json("/__scenarios")}
            fleet = [_node(site.url, spider, f"node-{n}", tmp_path, settings) for n in range(2)]
            crawled = [_run(process, out) for process, out in fleet]
            assert {url for _, items in crawled for url in items} == parseable
            assert any("is marked finished" in log for log, _ in crawled)
            wait_for(lambda: queue.exists(keys.frontier_finished), "the mark of the end")
            mark = queue.get(keys.frontier_finished)
            fetched = len(site.get_json("/__log"))

            late_log, late_items = _run(*_node(site.url, spider, "late", tmp_path, settings))
            assert late_items == []
            assert len(site.get_json("/__log")) == fetched  # not one page asked for
            assert stat_of(late_log, "downloader/request_count") is None
            assert "'finish_reason': 'retryqueue_fleet_finished'" in late_log
            said = re.findall(r"(?:WARNING|INFO): scrapy-retryqueue: .*finished at .*", late_log)
            assert len(said) == 1, late_log[-3000:]
            assert f"the crawl of spider {spider!r} on the leased frontier finished at " in said[0]
            assert "this node crawls nothing" in said[0]
            assert "-s RETRYQUEUE_FRONTIER_RESTART=True" in said[0]
            # At once: neither RETRYQUEUE_FLEET_WAIT nor RETRYQUEUE_IDLE_TIMEOUT waited.
            assert _seconds(late_log, "Closing spider") - _seconds(late_log, "Spider opened") <= 5
            assert queue.get(keys.frontier_finished) == mark  # it changed nothing

            restart = {**settings, "RETRYQUEUE_FRONTIER_RESTART": True}
            again_log, again_items = _run(*_node(site.url, spider, "again", tmp_path, restart))
            assert set(again_items) == parseable, again_log[-3000:]
            assert "this node starts a new crawl of it (RETRYQUEUE_FRONTIER_RESTART)" in again_log
            assert "'finish_reason': 'finished'" in again_log
            assert "is marked finished" in again_log
            mark = queue.get(keys.frontier_finished)
            assert mark is not None

            # scrapy-redis's own way to start over deletes the mark with the frontier.
            flush = {**settings, "SCHEDULER_FLUSH_ON_START": True}
            flushed_log, flushed_items = _run(*_node(site.url, spider, "flush", tmp_path, flush))
            assert set(flushed_items) == parseable, flushed_log[-3000:]
            assert "finished at" not in flushed_log
            assert queue.get(keys.frontier_finished) not in (None, mark)
    finally:
        queue.delete(*all_keys(keys))
        queue.close()
        client = redis.Redis.from_url(redis_url)
        client.delete(f"{spider}:requests", f"{spider}:dupefilter")
        client.close()
