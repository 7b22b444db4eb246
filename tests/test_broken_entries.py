"""One broken entry in Redis never harms another: a real crawl among broken tasks.

The queue-level cases (a claim beside an envelope that is not UTF-8, a ghost
id, an id that is not UTF-8) are in tests/test_queue.py, on one server and on
a cluster; here a crawl of the bundled flaky site meets them among its tasks
and must fetch every good page and report each bad entry.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy

from scrapy_retryqueue.queue.envelope import Task
from scrapy_retryqueue.queue.keys import keys_for

from .crawling import Site, crawl, flaky_site, stat_of

pytestmark = pytest.mark.e2e

GOOD = 24
CORPUS = Path(__file__).parent / "corpus" / "entries"
#: Live tasks that once hung a crawl (the poll dropped them without a line,
#: leased for ever), from the fuzzer's corpus.
HOSTILE_TASKS = (
    "created-infinity.json",
    "due-1e999.json",
    "nested-10000-in-meta.json",
    "class-not-a-class.json",
    "class-runs-code.json",
    "encoding-unknown.json",
)
#: Not UTF-8: the byte 0xff where JSON text must be.
NOT_UTF8 = b'{"v":1,"id":"bad","request":{"url":"http://x/\xff"}}'
SETTINGS: dict[str, Any] = {
    "CONCURRENT_REQUESTS": 32,
    "LOG_LEVEL": "INFO",
    "TELNETCONSOLE_ENABLED": False,
    "RETRYQUEUE_POLL_INTERVAL": 0.2,
    "RETRYQUEUE_IDLE_TIMEOUT": 5,
}


@pytest.fixture
def site() -> Iterator[Site]:
    with flaky_site(pages=100) as running:
        yield running


def test_a_crawl_among_broken_entries_fetches_every_good_page_and_reports_each(
    site: Site, spider_name: str, redis_url: str, tmp_path: Path
) -> None:
    client = redis.Redis.from_url(redis_url)
    keys = keys_for(spider_name)
    now = int(time.time() * 1000)
    good = site.pages("ok")[:GOOD]
    assert len(good) == GOOD
    # Good tasks due now, as a crawl would have parked them; among them, in the
    # same claim batch, an envelope that is not UTF-8 and an id without one.
    for n, url in enumerate(good):
        task = Task(
            id=f"good-{n:02d}",
            spider=spider_name,
            request={"url": url, "callback": "parse_page"},
            attempts={"timeout": 1},
            kind="timeout",
            created=now,
            updated=now,
            due=now - 1000,
        )
        client.hset(keys.tasks, task.id, task.to_json())
        client.zadd(keys.due, {task.id: task.due})
    client.hset(keys.tasks, "bad-utf8", NOT_UTF8)
    client.zadd(keys.due, {"bad-utf8": now - 1000})
    client.zadd(keys.due, {"ghost-id": now - 1000})
    for name in HOSTILE_TASKS:
        client.hset(keys.tasks, f"task-{name}", (CORPUS / name).read_bytes())
        client.zadd(keys.due, {f"task-{name}": now - 1000})
    store = tmp_path / "store.sqlite3"

    done = crawl(
        site.url,
        spider_name,
        tmp_path,
        {
            **SETTINGS,
            "RETRYQUEUE_REDIS_URL": redis_url,
            "RETRYQUEUE_DATABASE_URL": f"sqlite:///{store}",
        },
        "-a",
        "index=false",
    )

    assert done.returncode == 0, done.log[-3000:]
    # Every good page fetched and parsed, once; nothing left behind.
    assert sorted(item["url"] for item in done.items) == sorted(good)
    assert "poll failed" not in done.log
    assert stat_of(done.log, "retryqueue/dead/poison") is None
    assert stat_of(done.log, "retryqueue/reinjected") == GOOD
    assert stat_of(done.log, "retryqueue/recovered") == GOOD
    # Both bad entries reported: a log line each, stats, dead letters of kind malformed.
    assert "task 'bad-utf8' is malformed (envelope is not JSON: not UTF-8 text" in done.log
    assert "1 task id(s) in the due set had no envelope ('ghost-id')" in done.log
    for name in HOSTILE_TASKS:
        assert f"task 'task-{name}' is malformed (envelope" in done.log, name
    # Refused by name, not imported (tests/test_fuzz_entries.py checks sys.modules).
    assert "'this.Request' is not a scrapy Request class this process has imported" in done.log
    assert "Traceback" not in done.log
    assert stat_of(done.log, "retryqueue/dead/malformed") == 2 + len(HOSTILE_TASKS)
    assert stat_of(done.log, "retryqueue/ghosts") == 1
    assert client.zcard(keys.due) == client.zcard(keys.leased) == 0

    # The store writer kept both as dead letters (and took them out of Redis);
    # the bad one keeps its bytes.
    engine = sqlalchemy.create_engine(f"sqlite:///{store}")
    with engine.connect() as conn:
        rows = {
            row.task_id: row
            for row in conn.execute(
                sqlalchemy.text(
                    "SELECT task_id, status, kind, envelope FROM retryqueue_tasks "
                    "WHERE spider = :spider AND status = 'dead'"
                ),
                {"spider": spider_name},
            )
        }
    engine.dispose()
    hostile = {f"task-{name}" for name in HOSTILE_TASKS}
    assert set(rows) == {"bad-utf8", "ghost-id"} | hostile
    assert {row.kind for row in rows.values()} == {"malformed"}
    bad = json.loads(rows["bad-utf8"].envelope)
    assert base64.b64decode(bad["raw_base64"]) == NOT_UTF8
    ghost = json.loads(rows["ghost-id"].envelope)
    assert ghost["last_error"]["type"] == "MissingEnvelope"
    client.close()
