"""A crawl that closes at once stores the dead letters other nodes left in Redis.

Other nodes of the spider park dead letters through the real queue; what became
of their events varies: nobody read them (the nodes ran with the store off), a
writer read them and died before it acknowledged them (its entries are pending
under its name, too recently for another writer to take them over), or the
stream was trimmed. Then a crawl of that spider with nothing to do (the example
spider with ``-a index=false``) runs with the store on: its close writes every one
of them into the store, in either writer mode, and Redis's dead set is empty.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from scrapy_retryqueue.queue.delayed import RedisDelayedQueue
from scrapy_retryqueue.queue.keys import keys_for
from scrapy_retryqueue.store.db import Store
from scrapy_retryqueue.store.redisops import EventStream
from scrapy_retryqueue.values import now_ms

from .crawling import crawl, stat_of

pytestmark = pytest.mark.e2e

#: Where the events of the other nodes' dead letters are when the crawl starts.
EVENTS = ("unread", "read_by_a_writer_that_died", "trimmed")


@pytest.mark.parametrize("writer", ["thread", "process"])
@pytest.mark.parametrize("events", EVENTS)
def test_a_crawl_that_closes_at_once_stores_the_dead_letters_waiting_in_redis(
    redis_client: Any,
    redis_url: str,
    spider_name: str,
    make_task: Any,
    tmp_path: Path,
    events: str,
    writer: str,
) -> None:
    keys = keys_for(spider_name)
    other = RedisDelayedQueue(redis_client, spider_name, node_id="node-b")
    kinds = {"d0": "not_found", "d1": "forbidden", "d2": "gone"}
    for task_id, kind in kinds.items():
        task = make_task(task_id, kind=kind, node="node-b")
        assert other.deadletter(task, None, now=now_ms())
    if events == "read_by_a_writer_that_died":
        # node-b's writer read the batch and died before its commit: the entries are
        # pending under its name, younger than RETRYQUEUE_STORE_CLAIM_IDLE.
        assert len(EventStream(redis_client, spider_name, consumer="node-b").read_new(100, 0)) == 3
    elif events == "trimmed":
        redis_client.xtrim(keys.events, maxlen=0)
    database = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    settings = {
        "RETRYQUEUE_REDIS_URL": redis_url,
        "RETRYQUEUE_DATABASE_URL": database,
        # The process is the default ("auto").
        **({"RETRYQUEUE_STORE_PROCESS": False} if writer == "thread" else {}),
        "TELNETCONSOLE_ENABLED": False,
        "LOG_LEVEL": "INFO",
    }
    # Nothing to crawl: no start request, no retry pending.
    done = crawl("http://127.0.0.1:9", spider_name, tmp_path, settings, "-a", "index=false")
    assert done.returncode == 0, done.log[-3000:]
    assert "'finish_reason': 'finished'" in done.log
    assert stat_of(done.log, "downloader/request_count") is None
    store = Store(database)
    table = store.table
    with store.connect() as conn:
        rows = conn.execute(
            select(table.c.task_id, table.c.status, table.c.kind).where(
                table.c.spider == spider_name
            )
        ).all()
    store.close()
    assert {task_id: (status, kind) for task_id, status, kind in rows} == {
        task_id: ("dead", kind) for task_id, kind in kinds.items()
    }, done.log[-3000:]
    # They left Redis once stored: its dead set and their envelopes are gone.
    assert redis_client.zcard(keys.dead) == 0
    assert redis_client.hlen(keys.deadtasks) == 0
    if events == "unread":
        # Their events carried them, as any writer writes them.
        assert stat_of(done.log, "retryqueue/store/dead_stored") == 3
    else:
        # No event to carry them: the close took them from the dead set, and said so.
        assert stat_of(done.log, "retryqueue/store/swept") == 3
        assert f"stored 3 dead letter(s) of {spider_name!r} that waited in Redis" in done.log
