"""The store writer: events → rows, against the real Redis and PostgreSQL / SQLite.

Pure tests of the event → row mapping first; then EventSync against a real
queue: batching, idempotence, ack only after commit, the removal of stored
dead letters from Redis, taking over a dead consumer's entries, the sweep of
dead letters whose events were trimmed, and retention.
"""

from __future__ import annotations

import base64
import json
import logging
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import select

import scrapy_retryqueue.store.sync as sync_module
import scrapy_retryqueue.store.upsert as upsert_module
from scrapy_retryqueue.queue.delayed import RedisDelayedQueue
from scrapy_retryqueue.queue.envelope import Task
from scrapy_retryqueue.queue.keys import all_keys, keys_for
from scrapy_retryqueue.store.db import Store
from scrapy_retryqueue.store.redisops import EventStream
from scrapy_retryqueue.store.retention import apply_retention
from scrapy_retryqueue.store.sync import EventSync, Prepared
from scrapy_retryqueue.store.writer import (
    Event,
    build_batch,
    envelope_columns,
    parse_entries,
    row_for_event,
)

MakeTask = Callable[..., Task]
T0 = 1_700_000_000_000  # a fixed "now" (ms) for every queue call
LEASE = 60_000


def event(type_: str, task_id: str = "a", stream_id: str = "1-0", **fields: str) -> Event:
    return Event(stream_id, "sp", {"type": type_, "id": task_id, **fields})


def at(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


# -- pure: events → rows -------------------------------------------------------


@pytest.mark.parametrize(
    ("type_", "status", "finished", "next_retry"),
    [
        ("scheduled", "waiting", False, "due"),
        ("claimed", "retrying", False, None),
        ("reclaimed", "waiting", False, "ts"),
        ("released", "waiting", False, "ts"),
        ("succeeded", "succeeded", True, None),
        ("dead", "dead", True, None),
        ("cancelled", "cancelled", True, None),
    ],
)
def test_each_event_type_sets_its_status_and_times(
    type_: str, status: str, finished: bool, next_retry: str | None
) -> None:
    row = row_for_event(
        event(type_, ts=str(T0), due=str(T0 + 5000), url="https://a.example/x"), None
    )
    assert row is not None
    assert row["status"] == status
    assert row["updated_at"] == at(T0)
    assert row["finished_at"] == (at(T0) if finished else None)
    expected = {"due": at(T0 + 5000), "ts": at(T0), None: None}[next_retry]
    assert row["next_retry_at"] == expected
    assert (row["event_ms"], row["event_seq"]) == (1, 0)
    assert row["domain"] == "a.example"


def test_one_entry_for_a_batch_of_claims_is_a_row_per_task() -> None:
    entries = [(b"7-1", {b"type": b"claimed", b"ids": b"a b c", b"node": b"n1", b"ts": b"5"})]
    events = parse_entries("sp", entries)
    assert [(e.task_id, e.type, e.position) for e in events] == [
        ("a", "claimed", (7, 1)),
        ("b", "claimed", (7, 1)),
        ("c", "claimed", (7, 1)),
    ]
    batch = build_batch(events, {})
    assert {r["task_id"]: r["status"] for r in batch.generations[0]} == dict.fromkeys(
        "abc", "retrying"
    )


def test_an_unknown_event_type_is_not_a_row() -> None:
    assert row_for_event(event("rebalanced", ts=str(T0)), None) is None
    assert build_batch([event("rebalanced", ts=str(T0))], {}).ignored == 1


def test_the_envelope_gives_request_errors_attempts_and_the_retry_budget() -> None:
    doc: dict[str, Any] = {
        "request": {"url": "https://www.Shop.example/p?q=1", "method": "POST", "meta": {}},
        "attempts": {"timeout": 2, "server_error": 1},
        "first_error": {
            "kind": "server_error",
            "type": "HttpError",
            "message": "503",
            "status": 503,
        },
        "last_error": {"kind": "timeout", "type": "TimeoutError", "message": "took 3s"},
        "node": "n1",
        "max_retries": 9,  # as the node resolved it (a domain's policy, say)
    }
    row = envelope_columns(doc, kind="timeout")
    assert row["url"] == "https://www.Shop.example/p?q=1"
    assert row["domain"] == "www.shop.example"
    assert row["method"] == "POST"
    assert json.loads(row["attempts"]) == {"timeout": 2, "server_error": 1}
    assert row["attempts_total"] == 3
    assert (row["first_error_type"], row["first_error_status"]) == ("HttpError", 503)
    assert (row["last_error_kind"], row["last_error_status"]) == ("timeout", None)
    assert row["max_retries"] == 9  # the envelope's, not the store's settings
    # The envelope's budget wins over the request's meta.
    doc["request"]["meta"] = {"retryqueue_max_retries": 1}
    assert envelope_columns(doc, kind="timeout")["max_retries"] == 9


def test_an_envelope_without_a_budget_falls_back_to_the_requests_own_or_none() -> None:
    doc: dict[str, Any] = {"request": {"url": "https://a.example/", "meta": {}}}
    assert envelope_columns(doc, kind="timeout")["max_retries"] is None
    doc["request"]["meta"] = {"retryqueue_max_retries": 1}
    assert envelope_columns(doc, kind="timeout")["max_retries"] == 1
    # Internal kinds have no budget of their own.
    assert envelope_columns(doc, kind="malformed")["max_retries"] is None
    # Input, not trusted: what is not a whole number the column holds is unknown.
    for value in ("3", True, -1, 2**40, 1.5):
        bad = {"request": {"url": "https://a.example/"}, "max_retries": value}
        assert envelope_columns(bad, kind="timeout")["max_retries"] is None, value


def test_a_malformed_dead_letter_keeps_its_raw_text() -> None:
    wrapper = {"v": 1, "id": "m", "dead_kind": "malformed", "raw": "{broken", "last_error": {}}
    row = row_for_event(event("dead", "m", ts=str(T0), kind="malformed"), wrapper)
    assert row is not None
    assert row["kind"] == "malformed"
    assert json.loads(row["envelope"])["raw"] == "{broken"
    assert row["url"] is None


def test_a_batch_collapses_each_task_into_one_row_and_later_events_win() -> None:
    envelope = {"request": {"url": "https://x.example/1"}, "attempts": {"timeout": 1}}
    events = [
        event("scheduled", "a", "5-0", ts="100", due="200", kind="timeout", node="n1"),
        event("claimed", "a", "6-0", ts="200", node="n2"),
        event("scheduled", "b", "6-1", ts="210", due="300", kind="parse"),
    ]
    batch = build_batch(events, {("sp", "tasks", "a"): envelope})
    assert len(batch.generations) == 1
    rows = {r["task_id"]: r for r in batch.generations[0]}
    assert rows["a"]["status"] == "retrying"
    assert rows["a"]["next_retry_at"] is None
    assert rows["a"]["node"] == "n2"
    # What the claim did not know stays from the scheduled event.
    assert json.loads(rows["a"]["attempts"]) == {"timeout": 1}
    assert rows["a"]["url"] == "https://x.example/1"
    assert (rows["a"]["event_ms"], rows["a"]["event_seq"]) == (6, 0)
    assert rows["b"]["kind"] == "parse"


def test_a_death_followed_by_a_new_life_in_one_batch_is_written_first() -> None:
    events = [
        event("dead", "a", "5-0", ts="100", kind="not_found"),
        event("scheduled", "a", "6-0", ts="200", due="300", kind="timeout"),
    ]
    batch = build_batch(events, {})
    assert [[r["status"] for r in g] for g in batch.generations] == [["dead"], ["waiting"]]


# -- against the real servers ------------------------------------------------------


@pytest.fixture
def store(database_url: str) -> Iterator[Store]:
    store = Store(database_url)
    store.ensure_schema()
    yield store
    store.close()


@pytest.fixture
def make_sync(
    store: Store, redis_client: redis.Redis, spider_name: str
) -> Callable[..., EventSync]:
    def make(**kwargs: Any) -> EventSync:
        kwargs.setdefault("consumer", "writer-1")
        return EventSync(store, redis_client, spider_name, **kwargs)

    return make


def rows(store: Store, spider: str) -> dict[str, dict[str, Any]]:
    with store.connect() as conn:
        result = conn.execute(select(store.table).where(store.table.c.spider == spider))
        return {r["task_id"]: dict(r) for r in result.mappings()}


def lifecycle(queue: RedisDelayedQueue, make_task: MakeTask) -> None:
    """a: fails, retried, succeeds. b: fails, retried, dies. c: waits. d: poison."""
    error = {"kind": "server_error", "type": "HttpError", "message": "503", "status": 503}
    for task_id in "abcd":
        queue.schedule(
            make_task(task_id, kind="server_error", due=T0, first_error=error, last_error=error),
            now=T0,
        )
    claimed = queue.claim(now=T0 + 1, limit=2, lease_until=T0 + LEASE, token="t1")
    assert sorted(i for i, _ in claimed.tasks) == ["a", "b"]
    queue.ack("a", "t1", now=T0 + 2, kind="server_error", url="https://example.com/a")
    dead = make_task("b", kind="server_error", dead_kind="server_error", last_error=error)
    queue.deadletter(dead, "t1", now=T0 + 3)
    queue.client.zadd(queue.keys.due, {"c": T0 + 10**9})  # far in the future
    queue.claim(now=T0 + 4, limit=1, lease_until=T0 + 5, token="t2")  # d
    queue.reap(now=T0 + 6, limit=10, max_reclaims=0)  # d's lease expired: poison


def test_the_lifecycle_of_tasks_becomes_rows_and_stored_dead_letters_leave_redis(
    store: Store, queue: RedisDelayedQueue, make_task: MakeTask, make_sync: Callable[..., EventSync]
) -> None:
    lifecycle(queue, make_task)
    assert queue.client.zcard(queue.keys.dead) == 2
    result = make_sync().drain()
    assert result.events == queue.client.xlen(queue.keys.events)
    got = rows(store, queue.keys.spider)
    assert {k: r["status"] for k, r in got.items()} == {
        "a": "succeeded",
        "b": "dead",
        "c": "waiting",
        "d": "dead",
    }
    assert got["b"]["kind"] == "server_error"
    assert got["b"]["last_error_status"] == 503
    assert got["b"]["envelope"]["dead_kind"] == "server_error"
    assert got["b"]["finished_at"] == at(T0 + 3)
    assert got["d"]["kind"] == "poison"
    assert got["d"]["reclaims"] == 1
    assert got["a"]["finished_at"] == at(T0 + 2)
    assert got["c"]["next_retry_at"] == at(T0)
    # Stored dead letters left Redis; every event is acknowledged.
    assert queue.client.zcard(queue.keys.dead) == 0
    assert queue.client.hlen(queue.keys.deadtasks) == 0
    assert EventStream(queue.client, queue.keys.spider, consumer="x").pending_count() == 0


def test_batches_hold_at_most_the_batch_size(
    store: Store, queue: RedisDelayedQueue, make_task: MakeTask, make_sync: Callable[..., EventSync]
) -> None:
    for i in range(10):
        queue.schedule(make_task(f"t{i}", due=T0), now=T0)
    counted: dict[str, int] = {}
    sync = make_sync(batch_size=3, stats=lambda k, v: counted.__setitem__(k, counted.get(k, 0) + v))
    sizes = []
    while (n := sync.step().events) > 0:
        sizes.append(n)
    assert sizes == [3, 3, 3, 1]
    assert counted["retryqueue/store/batches"] == 4
    assert counted["retryqueue/store/events"] == 10
    assert len(rows(store, queue.keys.spider)) == 10


def test_replaying_every_event_changes_nothing(
    store: Store, queue: RedisDelayedQueue, make_task: MakeTask, make_sync: Callable[..., EventSync]
) -> None:
    lifecycle(queue, make_task)
    written = make_sync().drain().events
    before = rows(store, queue.keys.spider)
    # Deliver the whole stream again, to another consumer.
    queue.client.xgroup_setid(queue.keys.events, "store", "0")
    replayed = make_sync(consumer="writer-2").drain()
    assert replayed.events == written > 0
    assert rows(store, queue.keys.spider) == before


def write_entries(sync: EventSync, entries: list[Any]) -> None:
    """Write stream entries read elsewhere as one batch."""
    sync.write(Prepared(entries, sync.build(parse_entries(sync.spider, entries)), 0))


def test_an_older_event_does_not_undo_a_newer_one(
    store: Store, queue: RedisDelayedQueue, make_task: MakeTask, make_sync: Callable[..., EventSync]
) -> None:
    queue.schedule(make_task("a", due=T0), now=T0)
    queue.claim(now=T0, limit=1, lease_until=T0 + LEASE, token="t")
    queue.ack("a", "t", now=T0 + 1, kind="timeout", url="u")
    stream = EventStream(queue.client, queue.keys.spider, consumer="slow")
    entries = stream.read_new(10, 0)
    scheduled = [e for e in entries if e[1][b"type"] == b"scheduled"]
    newer = [e for e in entries if e[1][b"type"] != b"scheduled"]
    sync = make_sync()
    write_entries(sync, newer)  # another node wrote the claim and the success first
    write_entries(sync, scheduled)
    assert rows(store, queue.keys.spider)["a"]["status"] == "succeeded"


def test_a_failed_commit_leaves_the_events_pending_and_the_next_step_writes_them(
    store: Store,
    queue: RedisDelayedQueue,
    make_task: MakeTask,
    make_sync: Callable[..., EventSync],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lifecycle(queue, make_task)
    length = queue.client.xlen(queue.keys.events)
    real_apply = sync_module.apply_batch

    def apply_then_fail(conn: Any, batch: Any) -> Any:
        real_apply(conn, batch)  # the rows are written in the transaction...
        raise OSError("the database went away")  # ...which then fails

    monkeypatch.setattr(sync_module, "apply_batch", apply_then_fail)
    sync = make_sync()
    with pytest.raises(OSError):
        sync.step()
    stream = sync.stream
    assert stream.pending_count() == length  # read, not acknowledged
    assert rows(store, queue.keys.spider) == {}  # rolled back
    assert queue.client.zcard(queue.keys.dead) == 2  # not removed from Redis

    monkeypatch.setattr(sync_module, "apply_batch", real_apply)
    assert sync.step().events == length  # this consumer's pending entries first
    assert stream.pending_count() == 0
    assert len(rows(store, queue.keys.spider)) == 4
    assert queue.client.zcard(queue.keys.dead) == 0


def test_a_task_that_dies_again_keeps_its_first_death_in_history(
    store: Store, queue: RedisDelayedQueue, make_task: MakeTask, make_sync: Callable[..., EventSync]
) -> None:
    first = make_task("a", kind="not_found", dead_kind="not_found")
    queue.deadletter(first, None, now=T0)
    # The same request fails again later (a new crawl), is retried and dies again.
    queue.schedule(make_task("a", kind="timeout", due=T0 + 10), now=T0 + 10)
    queue.claim(now=T0 + 10, limit=1, lease_until=T0 + LEASE, token="t")
    queue.deadletter(make_task("a", kind="timeout", dead_kind="timeout"), "t", now=T0 + 20)
    make_sync().drain()  # one batch holds both deaths
    row = rows(store, queue.keys.spider)["a"]
    assert (row["status"], row["kind"], row["finished_at"]) == ("dead", "timeout", at(T0 + 20))
    assert [h["kind"] for h in row["history"]] == ["not_found"]
    assert row["history"][0]["status"] == "dead"
    assert queue.client.zcard(queue.keys.dead) == 0


def _fast_and_sqlalchemy_rows(
    store: Store,
    queue: RedisDelayedQueue,
    make_task: MakeTask,
    make_sync: Callable[..., EventSync],
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """The rows one batch leaves written through the driver's own upsert, then
    through SQLAlchemy's executemany (deaths that lived again included)."""
    lifecycle(queue, make_task)
    queue.deadletter(make_task("e", kind="not_found", dead_kind="not_found"), None, now=T0)
    queue.schedule(make_task("e", kind="timeout", due=T0 + 10), now=T0 + 10)
    entries = queue.client.xrange(queue.keys.events)

    def written(spider: str) -> dict[str, dict[str, Any]]:
        sync = make_sync()
        sync.spider = spider
        batch = sync.build(parse_entries(spider, entries))
        with store.begin() as conn:
            applied = upsert_module.apply_batch(conn, batch)
        assert len(applied) == batch.rows == 6  # e: its death, then its new life
        return {k: {**r, "id": None, "spider": None} for k, r in rows(store, spider).items()}

    fast = written("fast-path")
    monkeypatch.setattr(upsert_module, "_FAST_UPSERTS", {})
    return fast, written("sqlalchemy")


def test_the_drivers_own_upsert_stores_what_sqlalchemys_executemany_stores(
    store: Store,
    queue: RedisDelayedQueue,
    make_task: MakeTask,
    make_sync: Callable[..., EventSync],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """psycopg2's execute_values and sqlite3's many-row statement leave what
    SQLAlchemy's executemany leaves."""
    fast, plain = _fast_and_sqlalchemy_rows(store, queue, make_task, make_sync, monkeypatch)
    assert fast == plain
    assert fast["e"]["status"] == "waiting"
    assert [h["kind"] for h in fast["e"]["history"]] == ["not_found"]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_sqlite_store_is_written_without_loading_the_postgresql_dialect(
    store: Store,
    queue: RedisDelayedQueue,
    make_task: MakeTask,
    redis_url: str,
    spider_name: str,
    database_url: str,
) -> None:
    """Every write of a crawl's writer (rows, a death that lives again, the sweep,
    retention) to SQLite leaves SQLAlchemy's PostgreSQL dialect unimported: it
    would be on the crawl's heap for every full collection (models.JsonColumn)."""
    lifecycle(queue, make_task)
    queue.deadletter(make_task("e", kind="not_found", dead_kind="not_found"), None, now=T0)
    queue.schedule(make_task("e", kind="timeout", due=T0 + 10), now=T0 + 10)
    # A fresh interpreter: this one imported the dialect long ago.
    code = (
        "import json, sys, redis\n"
        "from scrapy_retryqueue.store.db import Store\n"
        "from scrapy_retryqueue.store.retention import apply_retention\n"
        "from scrapy_retryqueue.store.sync import EventSync\n"
        f"store = Store({database_url!r})\n"
        "store.ensure_schema()\n"
        f"client = redis.Redis.from_url({redis_url!r})\n"
        f"sync = EventSync(store, client, {spider_name!r}, consumer='probe')\n"
        "written = sync.step().events\n"
        "sync.sweep_dead()\n"
        f"apply_retention(store, spider={spider_name!r}, dead_days=1, history_days=1)\n"
        "print(json.dumps([written, sorted(m for m in sys.modules if 'postgresql' in m)]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    written, loaded = json.loads(done.stdout.splitlines()[-1])
    assert written > 0
    assert loaded == []
    assert [h["kind"] for h in rows(store, spider_name)["e"]["history"]] == ["not_found"]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_sqlite_batch_over_its_parameter_limit_spans_statements(
    store: Store,
    queue: RedisDelayedQueue,
    make_task: MakeTask,
    make_sync: Callable[..., EventSync],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Two rows' parameters (27 columns each) and the statement's 12 constants.
    monkeypatch.setattr(upsert_module, "_SQLITE_MAX_PARAMS", 27 * 2 + 12)
    statements: list[str] = []
    real = upsert_module._upsert_sqlite

    def traced(conn: Any, rows: list[dict[str, Any]]) -> Any:
        conn.connection.driver_connection.set_trace_callback(statements.append)
        try:
            return real(conn, rows)
        finally:
            conn.connection.driver_connection.set_trace_callback(None)

    monkeypatch.setitem(upsert_module._FAST_UPSERTS, ("sqlite", "pysqlite"), traced)
    fast, plain = _fast_and_sqlalchemy_rows(store, queue, make_task, make_sync, monkeypatch)
    assert fast == plain
    upserts = [sql for sql in statements if sql.startswith("INSERT INTO retryqueue_tasks")]
    # 5 rows, then e's new life: statements of 2, 2, 1 and 1 rows.
    assert [sql.count("), (") + 1 for sql in upserts] == [2, 2, 1, 1]


def test_a_dead_letter_is_removed_from_redis_only_for_the_death_that_was_stored(
    queue: RedisDelayedQueue, make_task: MakeTask
) -> None:
    queue.deadletter(make_task("a", dead_kind="timeout"), None, now=T0 + 500)
    stream = EventStream(queue.client, queue.keys.spider, consumer="w")
    assert stream.forget_dead([("a", T0)]) == 0  # an earlier death of "a" was stored
    assert queue.client.zscore(queue.keys.dead, "a") == T0 + 500
    assert queue.client.hexists(queue.keys.deadtasks, "a")
    assert stream.forget_dead([("a", T0 + 500), ("missing", T0)]) == 1
    assert queue.client.zcard(queue.keys.dead) == 0
    assert not queue.client.hexists(queue.keys.deadtasks, "a")


def test_forgetting_stored_dead_letters_acknowledges_their_batch_in_the_same_call(
    queue: RedisDelayedQueue, make_task: MakeTask
) -> None:
    queue.deadletter(make_task("a", dead_kind="timeout"), None, now=T0 + 500)
    queue.deadletter(make_task("b", dead_kind="timeout"), None, now=T0 + 600)
    stream = EventStream(queue.client, queue.keys.spider, consumer="w")
    entries = stream.read_new(10, 0)
    assert stream.pending_count() == len(entries) == 2
    # Only "a" was stored: "b" stays in Redis, but the whole batch is acknowledged.
    assert stream.forget_dead([("a", T0 + 500)], acks=[e[0] for e in entries]) == 1
    assert stream.pending_count() == 0
    assert queue.client.zrange(queue.keys.dead, 0, -1) == [b"b"]
    # Entries to acknowledge and no death stored: still acknowledged.
    queue.deadletter(make_task("c", dead_kind="timeout"), None, now=T0 + 700)
    assert stream.forget_dead([], acks=[e[0] for e in stream.read_new(10, 0)]) == 0
    assert stream.pending_count() == 0
    assert queue.client.zcard(queue.keys.dead) == 2


def test_the_writer_reads_a_cluster_stream_without_asking_where_its_keys_are(
    redis_cluster_url: str,
) -> None:
    from redis.cluster import RedisCluster

    client = RedisCluster.from_url(redis_cluster_url)
    spider = f"t{uuid.uuid4().hex[:10]}"
    queue = RedisDelayedQueue(client, spider, node_id="node-a")

    def getkeys() -> int:
        stats = [n.redis_connection.info("commandstats") for n in client.get_primaries()]
        return sum(s.get("cmdstat_command|getkeys", {}).get("calls", 0) for s in stats)

    try:
        for n in range(3):
            task = Task(id=f"d{n}", spider=spider, request={"url": f"http://x/{n}"}, kind="timeout")
            queue.deadletter(task, None, now=T0 + n)
        stream = EventStream(client, spider, consumer="w")
        stream.ensure_group()
        before = getkeys()
        first = stream.read_new(2, 0)
        rest = stream.read_new(10, 50)
        assert [e[1][b"id"] for e in first + rest] == [b"d0", b"d1", b"d2"]
        assert [e[0] for e in stream.read_own_pending(10)] == [e[0] for e in first + rest]
        # Routed to the stream's node: no COMMAND GETKEYS round trip per read.
        assert getkeys() == before
    finally:
        client.delete(*all_keys(keys_for(spider)))
        client.close()


def test_entries_a_dead_consumer_read_are_taken_over(
    store: Store, queue: RedisDelayedQueue, make_task: MakeTask, make_sync: Callable[..., EventSync]
) -> None:
    lifecycle(queue, make_task)
    crashed = EventStream(queue.client, queue.keys.spider, consumer="crashed-node")
    length = queue.client.xlen(queue.keys.events)
    assert len(crashed.read_new(100, 0)) == length  # read, then the node died
    time.sleep(0.02)  # the scenario: the entries stay idle longer than claim_idle
    sync = make_sync(consumer="survivor", claim_idle=0.01)
    result = sync.drain()
    assert result.claimed == result.events == length
    assert sync.stream.pending_count() == 0
    assert len(rows(store, queue.keys.spider)) == 4


def test_dead_letters_whose_events_were_trimmed_are_swept_into_the_store(
    store: Store, queue: RedisDelayedQueue, make_task: MakeTask, make_sync: Callable[..., EventSync]
) -> None:
    queue.deadletter(make_task("a", kind="forbidden", dead_kind="forbidden"), None, now=T0)
    queue.deadletter(make_task("b", kind="rule", dead_kind="rule"), None, now=T0 + 1)
    sync = make_sync()
    sync.stream.ensure_group()
    queue.client.xtrim(queue.keys.events, maxlen=0)  # the events are gone
    assert sync.drain().events == 0
    assert sync.sweep_dead(older_than_ms=T0 + 10) == 2
    got = rows(store, queue.keys.spider)
    assert {k: (r["status"], r["kind"]) for k, r in got.items()} == {
        "a": ("dead", "forbidden"),
        "b": ("dead", "rule"),
    }
    assert queue.client.zcard(queue.keys.dead) == 0
    # A second sweep finds nothing, and leaves a dead letter it cannot place.
    assert sync.sweep_dead(older_than_ms=T0 + 10) == 0


def test_a_sweep_with_a_deadline_stops_between_batches(
    store: Store, queue: RedisDelayedQueue, make_task: MakeTask, make_sync: Callable[..., EventSync]
) -> None:
    # A closing crawl's sweep is bounded like the rest of its flush: a batch in
    # hand is written, then a passed deadline stops it; the rest waits in Redis.
    for n in range(5):
        queue.deadletter(make_task(f"d{n}", kind="forbidden"), None, now=T0 + n)
    queue.client.xtrim(queue.keys.events, maxlen=0)
    sync = make_sync(batch_size=2)
    assert sync.sweep_dead(older_than_ms=T0 + 10, deadline=time.monotonic() - 1) == 2
    assert queue.client.zcard(queue.keys.dead) == 3
    assert sync.sweep_dead(older_than_ms=T0 + 10) == 3
    assert queue.client.zcard(queue.keys.dead) == 0


def test_the_sweep_finds_the_dead_kind_beside_the_envelope_or_in_an_older_one(
    store: Store, queue: RedisDelayedQueue, make_task: MakeTask, make_sync: Callable[..., EventSync]
) -> None:
    k = queue.keys
    # Poisoned by reap.lua: the envelope as it was, the kind in deadkinds only.
    poisoned = make_task("p", kind="timeout")
    assert queue.schedule(poisoned, now=T0)
    queue.claim(now=T0, limit=1, lease_until=T0 + 1, token="t")
    assert queue.reap(now=T0 + 1, limit=10, max_reclaims=0) == ([], ["p"])
    assert "dead_kind" not in json.loads(queue.client.hget(k.deadtasks, "p"))
    # Written by an older version: dead_kind inside the envelope, no deadkinds entry.
    older = make_task("o", kind="timeout", dead_kind="rate_limited")
    queue.client.zadd(k.dead, {"o": T0 + 2})
    queue.client.hset(k.deadtasks, "o", older.to_json())
    sync = make_sync()
    sync.stream.ensure_group()
    queue.client.xtrim(k.events, maxlen=0)  # no event carries them
    assert sync.sweep_dead(older_than_ms=T0 + 10) == 2
    got = rows(store, k.spider)
    assert {t: (r["status"], r["kind"]) for t, r in got.items()} == {
        "p": ("dead", "poison"),
        "o": ("dead", "rate_limited"),
    }
    # Stored: gone from Redis, side entry too.
    assert queue.client.hlen(k.deadkinds) == queue.client.hlen(k.deadtasks) == 0


#: Dead letters the store cannot hold as they are: left in Redis, reported once each.
#: (raw id, time of death, what the log line says)
UNSTORABLE: list[tuple[bytes, float, str]] = [
    (b"\xff\xfe", T0 + 2, "its id is not UTF-8 text"),
    (b"nul\x00id", T0 + 2, "its id holds a NUL character"),
    (b"L" * 129, T0 + 2, "its id is longer than 128 characters"),
    (b"", T0 + 2, "its id is empty"),
    (b"no-time", float("-inf"), "its time of death is not a time in ms (-inf)"),
    (b"year-0", -1e15, "its time of death is not a time in ms (-1000000000000000.0)"),
    (b"half-ms", T0 + 2.5, "its time of death is not a time in ms (1700000000002.5)"),
]


def test_the_sweep_stores_every_dead_letter_it_can_and_reports_each_other_one_once(
    store: Store,
    queue: RedisDelayedQueue,
    make_task: MakeTask,
    make_sync: Callable[..., EventSync],
    caplog: pytest.LogCaptureFixture,
) -> None:
    client, keys = queue.client, queue.keys
    queue.deadletter(make_task("a", kind="forbidden", dead_kind="forbidden"), None, now=T0)
    queue.deadletter(make_task("b", kind="rule", dead_kind="rule"), None, now=T0 + 1)
    # Written around the queue's scripts: a value that is not JSON (nor UTF-8) ...
    not_json = b'{"v":1,"id":"nj" \xff'
    client.zadd(keys.dead, {"nj": T0 + 3})
    client.hset(keys.deadtasks, "nj", not_json)
    # ... a creation time past the year 9999 ...
    far = make_task("far", dead_kind="timeout", created=10**20)
    queue.deadletter(far, None, now=T0 + 4)
    # ... and ids and times of death the store cannot hold.
    for raw_id, score, _ in UNSTORABLE:
        client.zadd(keys.dead, {raw_id: score})
        client.hset(keys.deadtasks, raw_id, make_task("x", dead_kind="timeout").to_json())
    counted: dict[str, int] = {}
    sync = make_sync(  # small batches: the entries left behind must not stop the paging
        batch_size=3, stats=lambda k, v: counted.__setitem__(k, counted.get(k, 0) + v)
    )
    sync.stream.ensure_group()
    client.xtrim(keys.events, maxlen=0)  # no event carries them: the sweep must

    with caplog.at_level(logging.ERROR, logger="scrapy_retryqueue"):
        assert sync.sweep_dead(older_than_ms=T0 + 10) == 4

    got = rows(store, keys.spider)
    assert {k: (r["status"], r["kind"]) for k, r in got.items()} == {
        "a": ("dead", "forbidden"),
        "b": ("dead", "rule"),
        "nj": ("dead", "malformed"),
        "far": ("dead", "timeout"),
    }
    # As a malformed envelope the crawl met: its bytes kept, nothing replaced.
    kept = got["nj"]["envelope"]
    assert base64.b64decode(kept["raw_base64"]) == not_json
    assert got["far"]["created_at"] == got["far"]["finished_at"] == at(T0 + 4)
    # What the store cannot hold is still in Redis, envelope and all.
    left = dict(client.zrange(keys.dead, 0, -1, withscores=True))
    assert set(left) == {raw_id for raw_id, _, _ in UNSTORABLE}
    assert set(client.hkeys(keys.deadtasks)) == set(left)
    # One ERROR line each, naming the key and the id; one count each.
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == len(UNSTORABLE) + 1
    for raw_id, _, why in UNSTORABLE:
        shown = ascii(raw_id.decode()[:80]) if raw_id != b"\xff\xfe" else ascii(raw_id)
        assert any(shown in line and keys.dead in line and why in line for line in errors), shown
    assert any("'nj'" in line and keys.deadtasks in line and "not JSON" in line for line in errors)
    assert counted["retryqueue/store/malformed"] == len(UNSTORABLE) + 1
    assert counted["retryqueue/store/swept"] == 4

    # The next sweep meets them again: not a new report, not a new count.
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="scrapy_retryqueue"):
        assert sync.sweep_dead(older_than_ms=T0 + 10) == 0
    assert caplog.records == []
    assert counted["retryqueue/store/malformed"] == len(UNSTORABLE) + 1
    assert client.zcard(keys.dead) == len(UNSTORABLE)


def test_retention_deletes_only_old_dead_letters_and_says_how_many(
    store: Store, queue: RedisDelayedQueue, make_task: MakeTask, make_sync: Callable[..., EventSync]
) -> None:
    now = int(datetime.now(UTC).timestamp() * 1000)
    day = 86_400_000
    queue.deadletter(make_task("old", dead_kind="timeout"), None, now=now - 10 * day)
    queue.deadletter(make_task("new", dead_kind="timeout"), None, now=now - day // 2)
    queue.schedule(make_task("ok", due=now - 20 * day), now=now - 20 * day)
    queue.claim(now=now - 20 * day, limit=1, lease_until=now, token="t")
    queue.ack("ok", "t", now=now - 20 * day, kind="timeout", url="u")
    make_sync().drain()
    spider = queue.keys.spider
    # Off by default: nothing is trimmed silently.
    assert apply_retention(store, spider=spider, dead_days=None, history_days=None) == (0, 0)
    assert apply_retention(store, spider=spider, dead_days=7, history_days=None) == (1, 0)
    assert set(rows(store, spider)) == {"new", "ok"}
    assert apply_retention(store, spider=spider, dead_days=7, history_days=30) == (0, 0)
    assert apply_retention(store, spider=spider, dead_days=7, history_days=10) == (0, 1)
    assert set(rows(store, spider)) == {"new"}


def test_a_row_the_database_refuses_does_not_block_the_others(
    new_pg_database: Callable[[], str], queue: RedisDelayedQueue, make_task: MakeTask
) -> None:
    store = Store(new_pg_database())  # SQLite would store any integer
    store.upgrade()
    queue.deadletter(make_task("good", dead_kind="timeout"), None, now=T0)
    # attempts_total does not fit PostgreSQL's integer.
    bad = make_task("bad", dead_kind="timeout", attempts={"timeout": 10**12})
    queue.deadletter(bad, None, now=T0 + 1)
    queue.deadletter(make_task("fine", dead_kind="timeout"), None, now=T0 + 2)
    counted: dict[str, int] = {}
    sync = EventSync(
        store,
        queue.client,
        queue.keys.spider,
        consumer="w",
        stats=lambda k, v: counted.__setitem__(k, counted.get(k, 0) + v),
    )
    assert sync.drain().events == 3
    assert set(rows(store, queue.keys.spider)) == {"good", "fine"}
    assert counted["retryqueue/store/rejected"] == 1
    assert sync.stream.pending_count() == 0
    # The refused one's dead letter is still in Redis, for a person to see.
    assert [m.decode() for m in queue.client.zrange(queue.keys.dead, 0, -1)] == ["bad"]
    store.close()


def test_a_drain_that_fails_midway_leaves_everything_for_the_next_one(
    store: Store,
    queue: RedisDelayedQueue,
    make_task: MakeTask,
    make_sync: Callable[..., EventSync],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for i in range(30):
        queue.schedule(make_task(f"t{i}", due=T0), now=T0)
    real_apply = sync_module.apply_batch
    calls = {"n": 0}

    def fail_on_the_third(conn: Any, batch: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("the database went away")
        return real_apply(conn, batch)

    monkeypatch.setattr(sync_module, "apply_batch", fail_on_the_third)
    sync = make_sync(batch_size=4)  # the helper has read batches ahead when it fails
    with pytest.raises(OSError):
        sync.drain()
    assert 0 < len(rows(store, queue.keys.spider)) < 30
    sync.drain()  # no waiting for a stale-entry claim: its own pending entries first
    assert len(rows(store, queue.keys.spider)) == 30
    assert sync.stream.pending_count() == 0


@pytest.mark.parametrize(
    ("value", "expected"), [("3", 3), (" -2 ", -2), ("²", None), ("x", None), (True, None), (7, 7)]
)
def test_a_number_read_from_an_envelope_never_raises(value: object, expected: object) -> None:
    from scrapy_retryqueue.store.writer import _int

    assert _int(value) == expected


CORPUS = Path(__file__).parent / "corpus" / "entries"
#: Dead letters that once stopped the store writer of their spider: the other
#: dead letters of the sweep stayed in Redis (Infinity: on PostgreSQL).
HOSTILE_DEAD = ("nested-10000-in-meta.json", "url-lone-surrogate.json", "created-infinity.json")


def test_hostile_dead_letters_are_stored_as_malformed_and_stop_neither_the_sweep_nor_the_stream(
    store: Store,
    queue: RedisDelayedQueue,
    make_task: MakeTask,
    make_sync: Callable[..., EventSync],
    caplog: pytest.LogCaptureFixture,
) -> None:
    client, keys = queue.client, queue.keys
    # Through the stream: dead events whose stored envelope was replaced.
    for name in HOSTILE_DEAD:
        queue.deadletter(make_task(f"evt-{name}", dead_kind="timeout"), None, now=T0)
        client.hset(keys.deadtasks, f"evt-{name}", (CORPUS / name).read_bytes())
    queue.deadletter(make_task("evt-good", dead_kind="timeout"), None, now=T0)
    counted: dict[str, int] = {}
    sync = make_sync(stats=lambda k, v: counted.__setitem__(k, counted.get(k, 0) + v))
    with caplog.at_level(logging.ERROR, logger="scrapy_retryqueue"):
        assert sync.drain().events == 4
    # Without events (trimmed): the sweep.
    for name in HOSTILE_DEAD:
        client.zadd(keys.dead, {f"swept-{name}": T0 + 1})
        client.hset(keys.deadtasks, f"swept-{name}", (CORPUS / name).read_bytes())
    client.zadd(keys.dead, {"swept-good": T0 + 1})
    client.hset(keys.deadtasks, "swept-good", make_task("swept-good", dead_kind="rule").to_json())
    with caplog.at_level(logging.ERROR, logger="scrapy_retryqueue"):
        assert sync.sweep_dead(older_than_ms=T0 + 10) == 4

    got = rows(store, keys.spider)
    assert {k: r["status"] for k, r in got.items()} == {
        **{f"{how}-{name}": "dead" for how in ("evt", "swept") for name in HOSTILE_DEAD},
        "evt-good": "dead",
        "swept-good": "dead",
    }
    for how in ("evt", "swept"):
        for name in HOSTILE_DEAD:
            envelope = got[f"{how}-{name}"]["envelope"]
            # Kept as the crawl keeps a malformed task: its stored text as it was.
            assert envelope["raw"].encode() == (CORPUS / name).read_bytes(), name
            assert envelope["last_error"]["kind"] == "malformed"
    assert got["swept-good"]["kind"] == "rule" and got["evt-good"]["url"]
    # Nothing left in Redis; one ERROR line and one count for each.
    assert client.zcard(keys.dead) == 0
    assert sync.stream.pending_count() == 0
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == counted["retryqueue/store/malformed"] == 2 * len(HOSTILE_DEAD)
    assert all("is malformed (envelope" in line for line in errors)
