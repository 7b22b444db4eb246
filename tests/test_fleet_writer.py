"""A fleet set up with the store off on its nodes and one ``scrapy retryqueue writer``
process: the store gets every dead letter and every task's row exactly once, also when
that writer is killed with -9 in the middle of the crawl and started again.

Runs example_project/run_fleet.py's fleet (the flaky site, three `scrapy crawl
flaky_fleet` nodes sharing one Redis) against a PostgreSQL database of its own.
"""

from __future__ import annotations

import importlib
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.exc import ProgrammingError

from scrapy_retryqueue.queue.keys import keys_for
from scrapy_retryqueue.store.db import Store
from scrapy_retryqueue.store.writer import STATUS_OF

from . import crawling  # noqa: F401  (puts example_project on sys.path)
from .waiting import wait_for

run_fleet_module = importlib.import_module("run_fleet")

pytestmark = pytest.mark.e2e


def rows_of(database: str, spider: str) -> list[tuple[str, str, str, str]]:
    """(task id, url, status, kind) of every row of *spider*; none while there is no table."""
    store = Store(database)
    try:
        table = store.table
        with store.connect() as conn:
            query = select(table.c.task_id, table.c.url, table.c.status, table.c.kind)
            return [tuple(row) for row in conn.execute(query.where(table.c.spider == spider))]
    except ProgrammingError:  # no table: the writer has not made the schema yet
        return []
    finally:
        store.close()


def test_one_writer_for_three_nodes_stores_everything_once_across_a_kill_9(
    redis_url: str, new_pg_database: Callable[[], str], tmp_path: Path
) -> None:
    database = new_pg_database()
    spider = f"fw{uuid.uuid4().hex[:8]}"
    at_kill: dict[str, Any] = {}

    def writer(name: str) -> Any:
        return run_fleet_module.Writer(
            redis_url=redis_url,
            database_url=database,
            spider=name,
            log=tmp_path / "writer.log",
            # What the killed writer read and never acknowledged is taken over soon.
            RETRYQUEUE_STORE_CLAIM_IDLE=1,
        )

    def kill_and_restart(store_writer: Any) -> None:
        wait_for(lambda: rows_of(database, spider), "the writer to store rows", timeout=60)
        store_writer.kill()
        at_kill["rows"] = len(rows_of(database, spider))
        at_kill["events"] = events_so_far(redis_url, spider)
        store_writer.start()
        at_kill["writer"] = store_writer

    fleet = run_fleet_module.run_fleet(
        nodes=3,
        pages=200,
        redis_url=redis_url,
        workdir=tmp_path,
        spider=spider,
        writer=writer,
        during=kill_and_restart,
        # Slow enough pages that the crawl outlasts the writer's first stored rows on
        # a loaded machine: the kill must fall mid-crawl (asserted below).
        site_options={"latency": 0.2},
    )
    for node in fleet.nodes:
        assert node.returncode == 0, node.log[-3000:]
    assert fleet.lost == set() and fleet.duplicates == 0, fleet.report()
    log = (tmp_path / "writer.log").read_text()
    assert at_kill["writer"].exits == [-9, 0], log
    # Killed mid-crawl: the fleet kept writing events after it died. (Counting tasks is
    # not enough: every failing page may have failed once before the kill.)
    assert 0 < at_kill["events"] < sum(len(types) for types in fleet.events.values())

    rows = rows_of(database, spider)
    # One row per task the fleet's events name, none missing, none twice, one per page.
    assert Counter(task_id for task_id, *_ in rows) == Counter(set(fleet.events)), log
    assert len({url for _, url, _, _ in rows}) == len(rows)
    # Each row says how its task ended, as its last event does.
    last = {task_id: STATUS_OF[types[-1]] for task_id, types in fleet.events.items()}
    assert {task_id: status for task_id, _, status, _ in rows} == last
    # Every page that dies is a dead letter with its kind, and only those.
    assert {url: kind for _, url, status, kind in rows if status == "dead"} == fleet.dead
    assert at_kill["rows"] < len(rows)
    assert log.count("Ctrl-C or SIGTERM stops it") == 2
    assert log.count(" stopped: ") == 1 and "Traceback" not in log
    print(
        f"{len(rows)} rows ({len(fleet.dead)} dead letters) for {len(fleet.events)} tasks; "
        f"killed at {at_kill['rows']} rows / {at_kill['events']} events; "
        f"crawl {fleet.seconds:.1f}s"
    )


def events_so_far(redis_url: str, spider: str) -> int:
    """How many task events the spider's events stream holds so far (one entry may
    name several tasks, each an event)."""
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        count = 0
        for _, fields in client.xrange(keys_for(spider, run_fleet_module.NAMESPACE).events):
            raw = fields.get(b"ids", fields.get(b"id", b""))
            count += len(raw.split())
        return count
    finally:
        client.close()
