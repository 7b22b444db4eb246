"""Encryption at rest and secret headers in real crawls of the bundled flaky site.

A crawl whose requests carry a secret header leaves no trace of its value in
Redis, the SQL store, its log or its audit log, and still recovers its retries;
a task written under an old key runs after a rotation; a missing key stops the
crawl with one error line naming the setting and loses nothing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy
from cryptography.fernet import Fernet

from scrapy_retryqueue.queue.envelope import Task, task_from_json
from scrapy_retryqueue.queue.keys import all_keys, keys_for
from scrapy_retryqueue.secure.encryption import FIELD, RequestCipher

from .crawling import Site, crawl, flaky_site, stat_of

pytestmark = pytest.mark.e2e

SECRET = "Bearer CRAWL-S3CRET-VALUE"
API_KEY = "APIKEY-S3CRET-VALUE"
FAST = {"base_delay": 0.3, "max_delay": 1}
SETTINGS: dict[str, Any] = {
    "CONCURRENT_REQUESTS": 16,
    "DOWNLOAD_TIMEOUT": 1,
    "LOG_LEVEL": "DEBUG",
    "TELNETCONSOLE_ENABLED": False,
    "RETRYQUEUE_POLL_INTERVAL": 0.2,
    "RETRYQUEUE_IDLE_TIMEOUT": 10,
}


@pytest.fixture
def site() -> Iterator[Site]:
    with flaky_site(pages=40, slow=2.0, retry_after=1) as running:
        yield running


def test_no_secret_header_value_at_rest_or_in_logs_and_retries_still_recover(
    site: Site, spider_name: str, redis_url: str, tmp_path: Path
) -> None:
    key = Fernet.generate_key().decode()
    store = tmp_path / "store.sqlite3"
    audit = tmp_path / "audit.jsonl"
    done = crawl(
        site.url,
        spider_name,
        tmp_path,
        {
            **SETTINGS,
            "DEFAULT_REQUEST_HEADERS": {"Authorization": SECRET, "X-Api-Key": API_KEY},
            "RETRYQUEUE_REDIS_URL": redis_url,
            "RETRYQUEUE_DATABASE_URL": f"sqlite:///{store}",
            "RETRYQUEUE_AUDIT_LOG": str(audit),
            "RETRYQUEUE_ENCRYPTION_KEYS": [key],
            "RETRYQUEUE_SECRET_HEADERS": ["Authorization", "X-Api-Key"],
            # Parse retries come back after the crawl: they stay in Redis, to be read.
            "RETRYQUEUE_POLICIES": {
                **{kind: FAST for kind in ("server_error", "rate_limited", "timeout")},
                "connection": FAST,
                "parse": {"base_delay": 600, "max_delay": 600, "jitter": "none"},
            },
        },
    )
    assert done.returncode == 0, done.log[-3000:]
    # Re-injected retries were opened with the key and recovered.
    assert (stat_of(done.log, "retryqueue/recovered") or 0) >= 5
    assert stat_of(done.log, "retryqueue/encryption/key_missing") is None
    assert stat_of(done.log, "retryqueue/dead/malformed") is None

    client = redis.Redis.from_url(redis_url)
    keys = keys_for(spider_name)
    # Parse retries wait in Redis, their requests encrypted.
    waiting = [task_from_json(raw) for raw in client.hvals(keys.tasks)]
    assert waiting, "no task left in Redis to look at"
    assert all(FIELD in task.request and "headers" not in task.request for task in waiting)
    assert RequestCipher([key]).open(waiting[0].request)["headers"]
    dump = b"".join(client.dump(k) or b"" for k in all_keys(keys))
    client.close()
    engine = sqlalchemy.create_engine(f"sqlite:///{store}")
    with engine.connect() as conn:
        rows = conn.execute(sqlalchemy.text("SELECT * FROM retryqueue_tasks")).all()
    engine.dispose()
    assert any(row.status == "dead" for row in rows)

    for secret in (SECRET, API_KEY):
        value = secret.encode()
        assert value not in dump
        assert secret not in repr(rows)
        assert secret not in done.log
        assert secret not in audit.read_text()
    assert audit.read_text().count('"event":') > 10


def seed(client: redis.Redis, spider_name: str, urls: list[str], key: bytes) -> list[str]:
    """Tasks due now whose requests were encrypted under *key*, as a crawl writes them."""
    keys = keys_for(spider_name)
    cipher = RequestCipher([key])
    now = int(time.time() * 1000)
    ids = []
    for n, url in enumerate(urls):
        request = {"url": url, "callback": "parse_page", "headers": [["Authorization", SECRET]]}
        task = Task(
            id=f"sealed-{n:02d}",
            spider=spider_name,
            request=cipher.seal(request),
            attempts={"timeout": 1},
            kind="timeout",
            created=now,
            updated=now,
            due=now - 1000,
        )
        client.hset(keys.tasks, task.id, task.to_json())
        client.zadd(keys.due, {task.id: task.due})
        ids.append(task.id)
    return ids


def test_a_missing_key_stops_the_crawl_losing_nothing_and_a_rotation_reads_old_tasks(
    site: Site, spider_name: str, redis_url: str, tmp_path: Path
) -> None:
    client = redis.Redis.from_url(redis_url)
    keys = keys_for(spider_name)
    old, new = Fernet.generate_key(), Fernet.generate_key()
    urls = site.pages("ok")[:8]
    seed(client, spider_name, urls, old)
    common = {**SETTINGS, "RETRYQUEUE_REDIS_URL": redis_url, "RETRYQUEUE_STORE_ENABLED": False}

    for keys_listed, fragment in (
        ([], "request is encrypted (fernet) and RETRYQUEUE_ENCRYPTION_KEYS is empty"),
        ([new.decode()], "none of the 1 key(s) in RETRYQUEUE_ENCRYPTION_KEYS opens"),
    ):
        stopped = crawl(
            site.url,
            spider_name,
            tmp_path,
            {**common, "RETRYQUEUE_ENCRYPTION_KEYS": keys_listed},
            "-a",
            "index=false",
        )
        assert stopped.returncode == 0, stopped.log[-3000:]
        errors = [line for line in stopped.log.splitlines() if "ERROR: scrapy-retryqueue" in line]
        assert len(errors) == 1, errors
        assert fragment in errors[0] and "the crawl stops" in errors[0]
        assert "'finish_reason': 'retryqueue_encryption_key_missing'" in stopped.log
        assert stat_of(stopped.log, "retryqueue/encryption/key_missing") == 1
        assert stopped.items == []
        # Nothing lost, nothing dead: every task is due again, for a node with the key.
        assert client.zcard(keys.due) == len(urls)
        assert client.zcard(keys.leased) == client.zcard(keys.dead) == 0

    rotated = crawl(
        site.url,
        spider_name,
        tmp_path,
        {**common, "RETRYQUEUE_ENCRYPTION_KEYS": [new.decode(), old.decode()]},
        "-a",
        "index=false",
    )
    assert rotated.returncode == 0, rotated.log[-3000:]
    assert sorted(item["url"] for item in rotated.items) == sorted(urls)
    assert stat_of(rotated.log, "retryqueue/recovered") == len(urls)
    assert client.zcard(keys.due) == client.zcard(keys.leased) == 0
    client.close()
