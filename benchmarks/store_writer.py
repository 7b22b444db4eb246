"""Store writer throughput into the local PostgreSQL, against plain executemany.

    python benchmarks/store_writer.py [--tasks 20000] [--batch-size 500]

Two event mixes are written from a real Redis events stream into a fresh
PostgreSQL database by EventSync (read with XREADGROUP, envelopes fetched,
rows built, upserted idempotently, stored dead letters removed from Redis,
entries acknowledged after each commit):

- dead:      one ``dead`` event per task (the dead-letter path; each event one row)
- lifecycle: scheduled → claimed → succeeded / dead per task (three events a row)

The baselines insert the very row writes the writer made (built beforehand,
in memory, batch by batch) into a copy of the table with the same indexes but
no unique key, in the same run and with the same batches:

- core:     SQLAlchemy Core ``conn.execute(insert(table), rows)`` (batched VALUES)
- dbapi:    psycopg2 ``cursor.executemany`` of the same INSERT

Ratio = baseline time / writer time (1.0: as fast as a plain insert of the rows).
Needs Redis on 127.0.0.1:6379 and PostgreSQL on 127.0.0.1:5432 (RETRYQUEUE_BENCH_*).
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from typing import Any

import redis
import sqlalchemy
from sqlalchemy import Column, MetaData, Table, insert, text

from scrapy_retryqueue.queue.delayed import RedisDelayedQueue
from scrapy_retryqueue.queue.envelope import Task
from scrapy_retryqueue.queue.keys import all_keys, keys_for
from scrapy_retryqueue.store.db import Store
from scrapy_retryqueue.store.sync import EventSync
from scrapy_retryqueue.store.upsert import write_table
from scrapy_retryqueue.store.writer import (
    COLUMNS,
    ENVELOPE_FROM_DEAD,
    ENVELOPE_FROM_TASKS,
    build_batch,
    parse_entries,
    parse_envelope,
)

REDIS_URL = os.environ.get("RETRYQUEUE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
PG_URL = os.environ.get(
    "RETRYQUEUE_BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
T0 = 1_700_000_000_000


def make_task(spider: str, i: int, kind: str) -> Task:
    error = {
        "kind": kind,
        "type": "HttpError",
        "message": "Ignoring non-200 response: HTTP 503 Service Unavailable",
        "status": 503,
    }
    return Task(
        id=uuid.uuid4().hex + uuid.uuid4().hex[:8],
        spider=spider,
        request={
            "url": f"https://shop{i % 50}.example.com/category/{i % 977}/item/{i}?ref=list&page={i % 9}",
            "headers": [
                ["Accept", "text/html,application/xhtml+xml"],
                ["Referer", "https://shop.example.com/"],
            ],
            "meta": {
                "depth": 3,
                "category": f"c{i % 977}",
                "listing": {"page": i % 9, "pos": i % 24},
            },
            "callback": "parse_item",
            "errback": "failed",
        },
        attempts={kind: 3, "timeout": 1},
        kind=kind,
        first_error=error,
        last_error=error,
        node="bench-node",
        created=T0,
        updated=T0 + 1,
        due=T0,
        dead_kind=kind,
    )


def fill(queue: RedisDelayedQueue, mix: str, tasks: int) -> None:
    spider = queue.keys.spider
    pipe_every = 500
    if mix == "dead":
        for i in range(tasks):
            queue.deadletter(make_task(spider, i, "server_error"), None, now=T0 + i)
        return
    for start in range(0, tasks, pipe_every):
        batch = [
            make_task(spider, i, "server_error")
            for i in range(start, min(tasks, start + pipe_every))
        ]
        for task in batch:
            task.dead_kind = None
            queue.schedule(task, now=T0)
        claimed = queue.claim(now=T0 + 1, limit=len(batch), lease_until=T0 + 10**9, token="t")
        for n, (task_id, _) in enumerate(claimed.tasks):
            if n % 4 == 0:
                task = next(t for t in batch if t.id == task_id)
                task.dead_kind = "server_error"
                queue.deadletter(task, "t", now=T0 + 2)
            else:
                queue.ack(task_id, "t", now=T0 + 2, kind="server_error", url="u")


def rows_of(client: redis.Redis, spider: str, batch_size: int) -> list[list[dict[str, Any]]]:
    """The row writes the writer makes, batch by batch, built in memory from the
    same events and envelopes (read before the writer runs)."""
    keys = keys_for(spider)
    entries = client.xrange(keys.events)
    batches = []
    for start in range(0, len(entries), batch_size):
        events = parse_entries(spider, entries[start : start + batch_size])
        envelopes = {}
        for source, key, types in (
            ("tasks", keys.tasks, ENVELOPE_FROM_TASKS),
            ("dead", keys.deadtasks, ENVELOPE_FROM_DEAD),
        ):
            ids = list(dict.fromkeys(e.task_id for e in events if e.type in types))
            for task_id, raw in zip(ids, client.hmget(key, ids) if ids else [], strict=True):
                envelopes[(spider, source, task_id)] = parse_envelope(raw)
        batch = build_batch(events, envelopes)
        batches.append([row for generation in batch.generations for row in generation])
    return batches


PLAIN = "bench_plain_tasks"


def create_plain_table(store: Store) -> Table:
    """A copy of the tasks table with the same columns and indexes, (spider, task_id)
    not unique, so the same row writes can be plainly inserted."""
    with store.begin() as conn:
        conn.execute(text(f"DROP TABLE IF EXISTS {PLAIN}"))
        conn.execute(text(f"CREATE TABLE {PLAIN} (LIKE retryqueue_tasks INCLUDING DEFAULTS)"))
        for n, index in enumerate(store.table.indexes):
            cols = ", ".join(c.name for c in index.columns)
            conn.execute(text(f"CREATE INDEX {PLAIN}_ix{n} ON {PLAIN} ({cols})"))
        conn.execute(text(f"CREATE INDEX {PLAIN}_key ON {PLAIN} (spider, task_id)"))
    return Table(
        PLAIN, MetaData(), *(Column(c.name, c.type) for c in write_table.columns if c.name != "id")
    )


def run_writer(
    store: Store, client: redis.Redis, spider: str, batch_size: int
) -> tuple[float, int, int]:
    sync = EventSync(store, client, spider, consumer="bench", batch_size=batch_size)
    started = time.perf_counter()
    result = sync.drain()
    return time.perf_counter() - started, result.events, result.rows


def baseline_core(store: Store, plain: Table, batches: list[list[dict[str, Any]]]) -> float:
    with store.begin() as conn:
        conn.execute(text(f"TRUNCATE {PLAIN}"))
    started = time.perf_counter()
    for rows in batches:
        with store.begin() as conn:
            conn.execute(insert(plain), rows)
    return time.perf_counter() - started


def baseline_dbapi(store: Store, batches: list[list[dict[str, Any]]]) -> float:
    with store.begin() as conn:
        conn.execute(text(f"TRUNCATE {PLAIN}"))
    columns = list(COLUMNS)
    sql = f"INSERT INTO {PLAIN} ({', '.join(columns)}) VALUES ({', '.join(['%s'] * len(columns))})"
    params = [[tuple(r[c] for c in columns) for r in rows] for rows in batches]
    raw = store.engine.raw_connection()
    started = time.perf_counter()
    try:
        cursor = raw.cursor()
        for batch in params:
            cursor.executemany(sql, batch)
            raw.commit()
    finally:
        raw.close()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--no-dbapi", action="store_true", help="skip the slow DB-API baseline")
    args = parser.parse_args()

    admin = sqlalchemy.create_engine(sqlalchemy.make_url(PG_URL).set(drivername="postgresql+psycopg2"),
                                     isolation_level="AUTOCOMMIT")  # fmt: skip
    name = f"rq_bench_{uuid.uuid4().hex[:8]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = sqlalchemy.make_url(PG_URL).set(database=name).render_as_string(False)
    store = Store(url)
    store.upgrade()
    plain = create_plain_table(store)
    client = redis.Redis.from_url(REDIS_URL)
    print(f"PostgreSQL {store.engine.dialect.server_version_info}, {args.tasks} tasks per mix, "
          f"batch size {args.batch_size}")  # fmt: skip
    try:
        for mix in ("dead", "lifecycle"):
            spider = f"bench{uuid.uuid4().hex[:6]}"
            queue = RedisDelayedQueue(client, spider, node_id="bench-node")
            fill(queue, mix, args.tasks)
            batches = rows_of(client, spider, args.batch_size)
            seconds, events, written = run_writer(store, client, spider, args.batch_size)
            assert written == sum(len(b) for b in batches), "the writer wrote other rows"
            assert client.zcard(queue.keys.dead) == 0, "dead letters left in Redis"
            core = baseline_core(store, plain, batches)
            line = (
                f"{mix:9}  writer {events:7,} events ({written:6,} row writes) in {seconds:5.2f}s "
                f"= {events / seconds:7,.0f} events/s | core executemany {written / core:6,.0f} "
                f"rows/s, ratio {core / seconds:.2f}"
            )
            if not args.no_dbapi:
                dbapi = baseline_dbapi(store, batches)
                line += f" | dbapi executemany {written / dbapi:6,.0f} rows/s, ratio {dbapi / seconds:.2f}"
            print(line, flush=True)
            client.delete(*all_keys(queue.keys))
    finally:
        store.close()
        client.close()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


if __name__ == "__main__":
    main()
