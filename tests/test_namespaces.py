"""One Redis, many projects: a namespace per project in the keys (RETRYQUEUE_NAMESPACE,
else BOT_NAME), and the queue of a spider from before namespaces adopted once."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from scrapy.settings import Settings

from scrapy_retryqueue.config import load_config
from scrapy_retryqueue.exceptions import ConfigError
from scrapy_retryqueue.queue.delayed import RedisDelayedQueue, Write
from scrapy_retryqueue.queue.envelope import Task
from scrapy_retryqueue.queue.frontier import Entry, RedisFrontier
from scrapy_retryqueue.queue.keys import all_keys, frontier_keys, keys_for

from .crawling import flaky_site, read_crawl, start_crawl

# -- the setting --------------------------------------------------------------------


def test_the_namespace_is_the_projects_bot_name() -> None:
    settings = Settings()
    settings.set("BOT_NAME", "books bot", priority="project")
    assert load_config(settings).namespace == "books_bot"


def test_scrapys_default_bot_name_gives_no_namespace() -> None:
    # Components built without a project (tests, scripts) keep the keys they had.
    assert load_config(Settings()).namespace == ""


def test_retryqueue_namespace_wins_and_empty_means_none() -> None:
    settings = Settings({"BOT_NAME": "books", "RETRYQUEUE_NAMESPACE": "shared"})
    assert load_config(settings).namespace == "shared"
    settings = Settings({"BOT_NAME": "books", "RETRYQUEUE_NAMESPACE": ""})
    assert load_config(settings).namespace == ""


@pytest.mark.parametrize("value", ["a:b", "{x}", "a b", 7])
def test_a_namespace_a_key_cannot_hold_is_one_error_naming_it(value: Any) -> None:
    with pytest.raises(ConfigError, match="RETRYQUEUE_NAMESPACE") as info:
        load_config(Settings({"RETRYQUEUE_NAMESPACE": value}))
    assert repr(value) in str(info.value)


# -- adopting a queue from before namespaces ---------------------------------------------


@pytest.fixture
def project_keys(redis_client: redis.Redis, spider_name: str) -> Iterator[str]:
    """A project namespace of the test's own; its keys are deleted afterwards."""
    project = f"p{spider_name}"
    yield project
    redis_client.delete(*all_keys(keys_for(spider_name, project)))


def _schedule(queue: RedisDelayedQueue, make_task: Callable[..., Task], task_id: str) -> None:
    now = int(time.time() * 1000)
    (done,) = queue.apply([Write.for_task("schedule", make_task(task_id, due=now), None, now)])
    assert done


def test_a_spiders_queue_without_namespace_is_adopted_once(
    redis_client: redis.Redis,
    spider_name: str,
    project_keys: str,
    make_task: Callable[..., Task],
) -> None:
    old = RedisDelayedQueue(redis_client, spider_name, node_id="old")
    _schedule(old, make_task, "t1")
    new = RedisDelayedQueue(redis_client, spider_name, node_id="new", project=project_keys)

    moved = new.adopt_unnamespaced()

    assert moved > 0
    assert redis_client.exists(*all_keys(keys_for(spider_name))) == 0
    assert redis_client.hexists(new.keys.tasks, "t1")
    assert redis_client.zscore(new.keys.due, "t1") is not None
    # Once: nothing is left to adopt.
    assert new.adopt_unnamespaced() == 0
    # An old queue that appears again (a node not upgraded) is left alone.
    _schedule(old, make_task, "t2")
    assert new.adopt_unnamespaced() == -1
    assert redis_client.hexists(old.keys.tasks, "t2")
    assert not redis_client.hexists(new.keys.tasks, "t2")
    # Without a namespace there is nothing to adopt from.
    assert old.adopt_unnamespaced() == 0


def test_adopting_moves_the_leased_frontier_too(
    redis_client: redis.Redis, spider_name: str, project_keys: str
) -> None:
    # A frontier left by a crawl from before namespaces: its requests and their
    # seen fingerprints go with the retries, none fetched twice.
    old = RedisFrontier(redis_client, spider_name)
    old.push([Entry("fp1", "fp1", 0, '{"url":"http://x/1"}')])
    new_queue = RedisDelayedQueue(redis_client, spider_name, node_id="new", project=project_keys)

    assert new_queue.adopt_unnamespaced() > 0

    new = RedisFrontier(redis_client, spider_name, project=project_keys)
    assert redis_client.exists(*frontier_keys(keys_for(spider_name))) == 0
    assert new.counts() == (1, 0)
    assert new.push([Entry("fp1", "fp1", 0, '{"url":"http://x/1"}')]) == [False]


def test_a_crawl_on_the_leased_frontier_keeps_it_in_the_projects_namespace(
    redis_url: str, redis_client: redis.Redis, spider_name: str, tmp_path: Path
) -> None:
    project = f"fr{spider_name}"
    keys, bare = keys_for(spider_name, project), keys_for(spider_name)
    settings = {
        "RETRYQUEUE_REDIS_URL": redis_url,
        "RETRYQUEUE_STORE_ENABLED": False,
        "RETRYQUEUE_POLL_INTERVAL": 0.2,
        "DOWNLOAD_TIMEOUT": 1,
        "SCHEDULER": "scrapy_retryqueue.crawl.frontier.LeasedScheduler",
        "BOT_NAME": project,
        "RETRYQUEUE_NAMESPACE": None,
        "RETRYQUEUE_EMBEDDED_DIR": str(tmp_path / "embedded"),
        "RETRYQUEUE_POLICIES": {
            kind: {"base_delay": 0.3, "max_delay": 1}
            for kind in ("timeout", "connection", "rate_limited", "server_error", "parse")
        },
    }
    seen_in_namespace = False
    try:
        with flaky_site(pages=30, slow=2) as site:
            process, out = start_crawl(site.url, spider_name, tmp_path, settings)
            while process.poll() is None:
                seen_in_namespace = seen_in_namespace or bool(
                    redis_client.exists(keys.frontier_seen)
                )
                assert redis_client.exists(*frontier_keys(bare)) == 0
                time.sleep(0.05)
            _, stderr = process.communicate(timeout=240)
            done = read_crawl(out, process.returncode, stderr)
            assert done.returncode == 0, done.log[-3000:]
            table = site.get_json("/__scenarios")
            parseable = {site.url + p for p, i in table.items() if i["expected"] == "parsed"}
            assert {item["url"] for item in done.items} == parseable
        # The frontier was in the project's namespace while the crawl ran, never
        # in the layout without one.
        assert seen_in_namespace
        assert redis_client.exists(*all_keys(bare)) == 0
        assert redis_client.exists(keys.events)
    finally:
        redis_client.delete(*all_keys(keys))


# -- two projects, one spider name, one Redis -----------------------------------------


def test_two_projects_with_one_spider_name_on_one_redis_keep_their_retries(
    redis_url: str, redis_client: redis.Redis, spider_name: str, tmp_path: Path
) -> None:
    policies = {
        kind: {"base_delay": 0.3, "max_delay": 1}
        for kind in ("timeout", "connection", "rate_limited", "server_error", "parse")
    }
    common = {
        "RETRYQUEUE_REDIS_URL": redis_url,
        "RETRYQUEUE_STORE_ENABLED": False,
        "RETRYQUEUE_POLICIES": policies,
        "RETRYQUEUE_POLL_INTERVAL": 0.2,
        "DOWNLOAD_TIMEOUT": 1,
        # The default: the namespace comes from each project's BOT_NAME.
        "RETRYQUEUE_NAMESPACE": None,
    }
    projects = ("alpha" + spider_name, "beta" + spider_name)
    try:
        with flaky_site(pages=30, slow=2) as site_a, flaky_site(pages=30, slow=2) as site_b:
            runs = []
            for project, site in zip(projects, (site_a, site_b), strict=True):
                settings = {
                    **common,
                    "BOT_NAME": project,
                    "RETRYQUEUE_EMBEDDED_DIR": str(tmp_path / project),
                }
                work = tmp_path / project
                work.mkdir()
                runs.append((start_crawl(site.url, spider_name, work, settings), site))
            for (process, out), site in runs:
                _, stderr = process.communicate(timeout=240)
                done = read_crawl(out, process.returncode, stderr)
                assert done.returncode == 0, done.log[-3000:]
                table = site.get_json("/__scenarios")
                parseable = {site.url + p for p, i in table.items() if i["expected"] == "parsed"}
                # Each project parsed every page of its own site, and none of the other's.
                assert {item["url"] for item in done.items} == parseable
                assert "Method" not in done.log and "malformed" not in done.log
        for project in projects:
            # Each project's retries were in its own namespace.
            assert redis_client.exists(keys_for(spider_name, project).events)
        assert redis_client.exists(*all_keys(keys_for(spider_name))) == 0
    finally:
        for project in projects:
            redis_client.delete(*all_keys(keys_for(spider_name, project)))
