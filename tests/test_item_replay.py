"""RETRYQUEUE_ITEM_REPLAY in a real crawl: a refused item write is replayed
through the item pipelines without downloading the page again; an item that
is not JSON falls back to downloading the page again."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections import Counter
from typing import Any

import pytest
import redis

from scrapy_retryqueue.queue.keys import all_keys, keys_for

from .crawling import ROOT, flaky_site

FAST = {"base_delay": 0.2, "max_delay": 1}


def _run(redis_url: str, tmp: Any, replay: bool) -> dict[str, Any]:
    spider = f"replay{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(redis_url)
    settings = {
        "RETRYQUEUE_REDIS_URL": redis_url,
        "RETRYQUEUE_POLL_INTERVAL": 0.1,
        "RETRYQUEUE_POLICIES": {"storage": FAST},
        "RETRYQUEUE_STORE_ENABLED": False,
        "RETRYQUEUE_ITEM_REPLAY": replay,
    }
    out = tmp / f"out-{replay}.json"
    try:
        with flaky_site() as site:
            done = subprocess.run(
                [
                    *(sys.executable, str(ROOT / "tests" / "replay_crawl.py")),
                    *(site.url, spider, json.dumps(settings), str(out)),
                ],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, done.stderr[-3000:]
            result = json.loads(out.read_text())
            result["downloads"] = Counter(e["path"] for e in site.get_json("/__log"))
            result["log"] = done.stderr
            return result
    finally:
        client.delete(*all_keys(keys_for(spider)))
        client.close()


@pytest.fixture(scope="module")
def replayed(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _run(redis_url, tmp_path_factory.mktemp("replay"), True)


@pytest.fixture(scope="module")
def redownloaded(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _run(redis_url, tmp_path_factory.mktemp("redownload"), False)


def test_a_json_item_is_replayed_without_downloading_again(replayed: dict[str, Any]) -> None:
    stored = {(s["case"], s.get("part", 0)): s for s in replayed["stored"]}
    assert set(stored) == {("dict", 0), ("item", 0), ("two", 1), ("two", 2), ("opaque", 0)}
    for path in ("/page/0", "/page/2", "/page/5"):
        assert replayed["downloads"][path] == 1, path
    stats = replayed["stats"]
    assert stats["retryqueue/item_replay/scheduled"] == 4
    assert stats["retryqueue/item_replay/replayed"] == 4
    assert stats["retryqueue/item_replay/stored"] == 4


def test_a_scrapy_item_comes_back_as_its_class(replayed: dict[str, Any]) -> None:
    [item] = [s for s in replayed["stored"] if s["case"] == "item"]
    assert item["type"] == "Product"
    [plain] = [s for s in replayed["stored"] if s["case"] == "dict"]
    assert plain["type"] == "dict"


def test_an_item_that_is_not_json_falls_back_to_downloading_again(
    replayed: dict[str, Any],
) -> None:
    assert replayed["downloads"]["/page/7"] == 2
    assert replayed["stats"]["retryqueue/item_replay/unserializable"] == 1


def test_every_task_is_done_and_items_reach_the_feed(replayed: dict[str, Any]) -> None:
    stats = replayed["stats"]
    assert stats["retryqueue/scheduled/storage"] == 5
    assert stats["retryqueue/recovered"] == 5
    assert stats.get("retryqueue/dead", 0) == 0
    assert stats["item_scraped_count"] == 5


def test_without_replay_the_pages_are_downloaded_again(redownloaded: dict[str, Any]) -> None:
    for path in ("/page/0", "/page/2", "/page/5", "/page/7"):
        assert redownloaded["downloads"][path] == 2, path
    assert "retryqueue/item_replay/scheduled" not in redownloaded["stats"]
