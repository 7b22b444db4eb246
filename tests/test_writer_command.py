"""``scrapy retryqueue writer`` as a person runs it: its help, one-line errors, and a
writer that serves two spiders until Ctrl-C, then says so in one line and exits with 0."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sqlalchemy import select

from scrapy_retryqueue.queue.delayed import RedisDelayedQueue
from scrapy_retryqueue.queue.envelope import Task
from scrapy_retryqueue.queue.keys import all_keys, keys_for
from scrapy_retryqueue.store.db import Store

from .storecli import scrapy
from .waiting import wait_for


def test_its_help_names_every_option_with_its_default(tmp_path: Path) -> None:
    done = scrapy("retryqueue", "writer", "-h", cwd=tmp_path)
    assert done.code == 0, done.err
    text = " ".join(done.out.split())
    assert "RETRYQUEUE_STORE_ENABLED = False" in text
    assert "(default: every spider with an events stream in Redis" in text
    assert "(default: 10)" in text
    assert "(default: <host name>:<pid>:writer)" in text
    # And the command's own help lists it.
    assert "scrapy retryqueue writer" in scrapy("retryqueue", "-h", cwd=tmp_path).out


def test_a_bad_option_or_a_redis_that_does_not_answer_is_one_line(tmp_path: Path) -> None:
    for args, expected in (
        (("--bogus",), "unrecognized arguments: --bogus"),
        (("--rescan", "0"), "--rescan must be > 0 seconds, got 0"),
        (("--rescan", "soon"), "argument --rescan: invalid float value: 'soon'"),
    ):
        done = scrapy("retryqueue", "writer", *args, cwd=tmp_path)
        assert done.code == 2, done
        assert done.err.startswith("error: ") and expected in done.err, done.err
        assert done.err.count("\n") == 1 and "Traceback" not in done.err
    down = scrapy(
        "retryqueue", "writer", cwd=tmp_path,
        settings={"RETRYQUEUE_REDIS_URL": "redis://user:hunter2@127.0.0.1:1/0"},
    )  # fmt: skip
    assert down.code == 2
    assert down.err.startswith("error: Redis at redis://user:***@127.0.0.1:1/0 does not answer")
    assert down.err.count("\n") == 1 and "hunter2" not in down.err


def test_it_serves_two_spiders_until_ctrl_c(
    redis_client: Any, redis_url: str, spider_name: str, tmp_path: Path
) -> None:
    other = f"{spider_name}b"
    now = int(time.time() * 1000)
    for spider in (spider_name, other):
        queue = RedisDelayedQueue(redis_client, spider, node_id="node-a")
        for n in range(3):
            task = Task(
                id=f"{spider}-{n}",
                spider=spider,
                request={"url": f"https://example.com/{n}"},
                kind="not_found",
                dead_kind="not_found",
            )
            queue.deadletter(task, None, now=now)
    database = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    settings = {
        "RETRYQUEUE_REDIS_URL": redis_url,
        "RETRYQUEUE_DATABASE_URL": database,
        "RETRYQUEUE_STORE_INTERVAL": 0.2,
    }
    command = [sys.executable, "-m", "scrapy.cmdline", "retryqueue", "writer"]
    command += ["--spider", f"{spider_name},{other}", "--consumer", "writer-1"]
    for name, value in settings.items():
        command += ["-s", f"{name}={value}"]
    err = tmp_path / "stderr"
    with err.open("w") as stderr:
        process = subprocess.Popen(command, cwd=tmp_path, stderr=stderr, text=True)
    try:
        wait_for(lambda: "Ctrl-C or SIGTERM stops it" in err.read_text(), "the start line")

        def dead_in_redis() -> int:
            return sum(redis_client.zcard(keys_for(s).dead) for s in (spider_name, other))

        wait_for(lambda: dead_in_redis() == 0, "both spiders' dead letters stored", timeout=60)
        process.send_signal(signal.SIGINT)
        process.wait(30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        redis_client.delete(*all_keys(keys_for(other)))
    lines = err.read_text().splitlines()
    assert process.returncode == 0, lines
    assert lines[0] == (
        f"writer writer-1: spider(s) {spider_name}, {other} from Redis {redis_url} into "
        f"{database}; Ctrl-C or SIGTERM stops it"
    )
    assert lines[1:] == [
        "writer writer-1 stopped: 6 event(s) written, 6 dead letter(s) stored, for 2 spider(s)"
    ]
    store = Store(database)
    with store.connect() as conn:
        table = store.table
        rows = conn.execute(select(table.c.spider, table.c.status)).all()
    store.close()
    assert sorted((spider, status) for spider, status in rows) == sorted(
        [(spider_name, "dead")] * 3 + [(other, "dead")] * 3
    )
