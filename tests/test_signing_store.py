"""The store writer, requeue and the start of a crawl with RETRYQUEUE_SIGNING_KEYS, against
the real Redis and a SQLite store: what does not verify makes no row that looks like the
crawl's own, a forged dead letter is put back only when asked for by kind and forced, and
a node without the queue's key touches nothing."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy

from scrapy_retryqueue.queue.delayed import RedisDelayedQueue
from scrapy_retryqueue.queue.envelope import Task, forged_envelope
from scrapy_retryqueue.queue.keys import Keys, keys_for
from scrapy_retryqueue.queue.signature import sign_envelope, verify_envelope
from scrapy_retryqueue.secure.signing import KeyRing, generate_key, parse_keys
from scrapy_retryqueue.store.db import Store
from scrapy_retryqueue.store.sync import EventSync
from scrapy_retryqueue.values import as_text

from .crawling import crawl, flaky_site
from .storecli import scrapy

KEY, OTHER = generate_key(), generate_key()
RING = KeyRing(parse_keys([KEY]))


def _task(spider: str, task_id: str, url: str, **fields: Any) -> Task:
    now = int(time.time() * 1000)
    fields.setdefault("kind", "not_found")
    return Task(
        id=task_id,
        spider=spider,
        request={"url": url},
        attempts={"not_found": 1},
        created=now,
        updated=now,
        due=now,
        **fields,
    )


def _rows(store: Store) -> dict[str, dict[str, Any]]:
    with store.connect() as conn:
        rows = conn.execute(sqlalchemy.select(store.table)).mappings().all()
    return {row["task_id"]: dict(row) for row in rows}


@pytest.fixture
def store(tmp_path: Path) -> Store:
    opened = Store(f"sqlite:///{tmp_path / 'store.sqlite3'}")
    opened.upgrade()
    return opened


def test_the_writer_makes_no_row_of_what_does_not_verify(
    store: Store, redis_client: redis.Redis, spider_name: str
) -> None:
    keys = keys_for(spider_name)
    node = RedisDelayedQueue(redis_client, spider_name, node_id="n1", signing=RING)
    # The crawl's own: a dead letter and a task that succeeded.
    node.deadletter(_task(spider_name, "real", "https://site.test/gone", dead_kind="not_found"),
                    None, now=1_000)  # fmt: skip
    # A hostile writer's: a dead letter with a changed URL, and events of its own.
    text = as_text(redis_client.hget(keys.deadtasks, "real"))
    redis_client.hset(keys.deadtasks, "fake", text.replace("site.test/gone", "evil.test/x"))
    redis_client.zadd(keys.dead, {"fake": 2_000})
    redis_client.hset(keys.deadkinds, "fake", "not_found")
    for fields in (
        {"type": "dead", "id": "fake", "kind": "not_found", "node": "n1", "ts": "2000"},
        {
            "type": "succeeded",
            "id": "ghost",
            "kind": "timeout",
            "node": "n1",
            "ts": "2100",
            "url": "https://evil.test/ok",
        },
        {"type": "cancelled", "id": "real", "node": "n1", "ts": "2200", "url": "", "sig": "x"},
        {"type": "claimed", "ids": "real nobody", "node": "n1", "ts": "2300"},
    ):
        redis_client.xadd(keys.events, fields)
    stats: dict[str, int] = {}
    sync = EventSync(
        store,
        redis_client,
        spider_name,
        consumer="w",
        signing=RING,
        stats=lambda name, n: stats.__setitem__(name, stats.get(name, 0) + n),
    )
    sync.drain()
    # A death nobody signed (a forged event) makes no row of an id the store does not
    # have: the sweep stores such a dead letter, checked as any other.
    sync.sweep_dead(older_than_ms=10**13)
    rows = _rows(store)
    # The real dead letter is a row of its own kind; it was not cancelled by a forged
    # event, nor moved back to "retrying" by a claim nobody signs.
    assert rows["real"]["status"] == "dead" and rows["real"]["kind"] == "not_found"
    assert rows["real"]["url"] == "https://site.test/gone"
    # The forged dead letter: a forged row that keeps what was stored, no URL.
    fake = rows["fake"]
    assert (fake["status"], fake["kind"], fake["url"]) == ("dead", "forged", None)
    assert "evil.test" in json.dumps(fake["envelope"])
    # No row for an id the crawl never had.
    assert "ghost" not in rows and "nobody" not in rows
    assert stats["retryqueue/store/forged"] == 3  # two events, one dead letter
    # Both dead letters are stored: nothing is left in Redis for the sweep.
    assert redis_client.zcard(keys.dead) == 0


def _forged_row(store: Store, client: redis.Redis, spider: str, keys: Keys, entry: str) -> None:
    """A forged dead letter as the crawl keeps one, written to the store by the writer."""
    node = RedisDelayedQueue(client, spider, node_id="n1", signing=RING)
    client.hset(keys.tasks, "t1", entry)
    client.zadd(keys.due, {"t1": 0})
    claimed = node.claim(now=1_000, limit=1, lease_until=60_000, token="tok")
    assert [t for t, _ in claimed.tasks] == ["t1"]
    envelope = forged_envelope("t1", entry, "unsigned: it carries no signature", "n1")
    node.deadletter_raw(
        "t1", envelope, "tok", now=1_500, kind="forged", url="", dead_id="t1:forged:1500"
    )
    EventSync(store, client, spider, consumer="w", signing=RING).drain()


def test_requeue_leaves_forged_dead_letters_alone_unless_asked_by_kind_and_forced(
    store: Store, redis_client: redis.Redis, spider_name: str, redis_url: str, tmp_path: Path
) -> None:
    keys = keys_for(spider_name)
    entry = _task(spider_name, "t1", "https://site.test/vouched", kind="timeout").to_json()
    _forged_row(store, redis_client, spider_name, keys, entry)
    assert _rows(store)["t1:forged:1500"]["kind"] == "forged"
    settings = {
        "RETRYQUEUE_DATABASE_URL": store.url,
        "RETRYQUEUE_REDIS_URL": redis_url,
        "RETRYQUEUE_NAMESPACE": "",
        "RETRYQUEUE_SIGNING_KEYS": KEY,
    }

    def run(*args: str) -> Any:
        return scrapy("deadletters", "requeue", "--spider", spider_name, *args,
                      cwd=tmp_path, settings=settings)  # fmt: skip

    done = run()
    assert done.code == 0, done.err
    assert "1 skipped (forged: never fetched; put back only with --kind forged --force)" in done.err
    assert redis_client.zcard(keys.due) == 0
    done = run("--force")
    assert done.code != 0 and "--force requeues forged dead letters only" in done.err
    done = run("--kind", "forged")
    assert "1 skipped (forged" in done.err and redis_client.zcard(keys.due) == 0

    done = run("--kind", "forged", "--force")
    assert done.code == 0, done.err
    assert "requeued 1 dead letter(s)" in done.err
    # Back as the task it claimed to be, signed now: a crawl takes it.
    stored = as_text(redis_client.hget(keys.tasks, "t1"))
    verify_envelope(stored, RING, "")
    assert json.loads(stored)["request"]["url"] == "https://site.test/vouched"
    assert redis_client.hget(keys.versions, "t1") is not None


def test_a_node_without_the_queues_key_stops_at_start_and_touches_nothing(
    namespace: str, redis_url: str, tmp_path: Path
) -> None:
    client = redis.Redis.from_url(redis_url)
    keys = keys_for(namespace)
    text = _task(namespace, "t1", "http://127.0.0.1:1/p", kind="timeout").to_json()
    client.hset(keys.tasks, "t1", sign_envelope(text, RING, ""))
    client.zadd(keys.due, {"t1": 0})
    before = {key: client.dump(key) for key in (keys.tasks, keys.due)}
    with flaky_site(pages=3) as site:
        for keys_setting, why in (
            (None, "RETRYQUEUE_SIGNING_KEYS is not set on this node"),
            ([OTHER], "none of which RETRYQUEUE_SIGNING_KEYS lists on this node"),
        ):
            settings: dict[str, Any] = {"RETRYQUEUE_REDIS_URL": redis_url}
            if keys_setting is not None:
                settings["RETRYQUEUE_SIGNING_KEYS"] = keys_setting
            done = crawl(site.url, namespace, tmp_path, settings)
            assert done.returncode == 1, done.log[-2000:]
            [line] = [x for x in done.log.splitlines() if "holds entries signed with" in x]
            assert f"ERROR: scrapy-retryqueue: the queue of spider {namespace!r}" in line
            assert why in line and RING.signing_id in line and "touched nothing" in line
            assert "Traceback" not in done.log and done.items == []
    # Nothing read but one page of two hashes: the queue is as it was, no node joined.
    assert {key: client.dump(key) for key in (keys.tasks, keys.due)} == before
    assert not client.exists(keys.nodes, keys.events)
    client.close()
