"""A real crawl and the commands with scrapy-redis's REDIS_PARAMS: both use the database it names.

The crawl's URL names no database (``redis://127.0.0.1:6379``) and
``REDIS_PARAMS = {"db": 9}`` chooses one, as scrapy-redis's scheduler would;
every key the crawl, its store writer and the commands write must land in
database 9 of the shared Redis, none in the tests' database 0. The crawl also
creates its store's schema: its log must hold no Alembic INFO line.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis

from scrapy_retryqueue.queue.keys import all_keys, keys_for

from .crawling import crawl, flaky_site
from .storecli import scrapy

pytestmark = pytest.mark.e2e

OTHER_DB = 9
FAST = {"base_delay": 0.5, "max_delay": 2}
SETTINGS: dict[str, Any] = {
    "DOWNLOAD_TIMEOUT": 1,
    "TELNETCONSOLE_ENABLED": False,
    "LOG_LEVEL": "INFO",
    "RETRYQUEUE_POLL_INTERVAL": 0.2,
    "RETRYQUEUE_IDLE_TIMEOUT": 30,
    "RETRYQUEUE_POLICIES": {
        kind: FAST for kind in ("timeout", "connection", "rate_limited", "server_error", "parse")
    },
    "RETRYQUEUE_STORE_INTERVAL": 0.2,
}


def without_db(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "", "", ""))


@pytest.fixture
def databases(redis_url: str) -> Iterator[dict[str, Any]]:
    """This test's namespace, and clients of database 0 and OTHER_DB; its keys deleted after."""
    namespace = f"rp{uuid.uuid4().hex[:8]}"
    base = without_db(redis_url)
    default = redis.Redis.from_url(base, db=0)
    other = redis.Redis.from_url(base, db=OTHER_DB)
    yield {"namespace": namespace, "url": base, "db0": default, "other": other}
    for client in (default, other):
        client.delete(*all_keys(keys_for(namespace)))
        client.close()


def test_the_crawl_and_the_commands_use_the_database_redis_params_names(
    databases: dict[str, Any], tmp_path: Path
) -> None:
    namespace = databases["namespace"]
    keys = keys_for(namespace)
    store = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    settings = {
        **SETTINGS,
        "REDIS_URL": databases["url"],
        "REDIS_PARAMS": {"db": OTHER_DB},
        "RETRYQUEUE_DATABASE_URL": store,
    }
    with flaky_site(pages=12, slow=1.5, retry_after=1) as site:
        result = crawl(site.url, namespace, tmp_path, settings)
    assert result.returncode == 0, result.log[-3000:]

    # The crawl's keys are in database 9, none in database 0.
    other, db0 = databases["other"], databases["db0"]
    assert other.exists(keys.events) == 1
    assert other.xlen(keys.events) > 0
    assert db0.exists(*all_keys(keys)) == 0

    # Its store writer read that stream too: every dead letter is in the store.
    dead = re.search(r"'retryqueue/store/dead_stored': (\d+)", result.log)
    assert dead is not None and int(dead.group(1)) > 0, result.log[-3000:]

    # No Alembic INFO line, though the crawl created the store's schema.
    assert re.search(r"\[alembic[^\]]*\] INFO", result.log) is None
    assert "[alembic" not in result.log

    # The commands read and write the same database.
    command_settings = {
        "REDIS_URL": databases["url"],
        "REDIS_PARAMS": json.dumps({"db": OTHER_DB}),
        "RETRYQUEUE_DATABASE_URL": store,
    }
    status = scrapy(
        "retryqueue", "status", "--spider", namespace, "--json", cwd=tmp_path,
        settings=command_settings,
    )  # fmt: skip
    assert status.code == 0, status.err
    entry = json.loads(status.out)["spiders"][namespace]
    assert entry["events_unwritten"] is not None  # database 9 has the stream; 0 has none
    assert entry["dead_in_store"] == int(dead.group(1))

    requeue = scrapy(
        "deadletters", "requeue", "--spider", namespace, cwd=tmp_path, settings=command_settings
    )
    assert requeue.code == 0, requeue.err
    moved = re.search(r"requeued (\d+) dead letter", requeue.err)
    assert moved is not None and int(moved.group(1)) > 0, requeue.err
    assert other.zcard(keys.due) == int(moved.group(1))
    assert db0.exists(*all_keys(keys)) == 0
