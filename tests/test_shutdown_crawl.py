"""Ctrl-C at any moment: the crawl closes and exits (real crawls, real Redis).

Scrapy stops a crawl by closing its spider, but only once its engine runs; a
Ctrl-C between the "Spider opened" line and the engine's start (while the
spider_opened handlers run, the add-on connecting among them) made it stop the
reactor with the spider open, and the add-on's worker thread then kept the
process alive for good, a second Ctrl-C included.

The window is widened by a documented step of opening, not by a stand-in: an
earlier crawl that ended while Redis was down left writes in the local spool
(docs/guarantees.md), and opening adopts them, reading the file on the reactor
thread. They also show that the stop loses nothing: they are in Redis after it,
or still in the spool for the next crawl.

A second Ctrl-C stops the reactor before the add-on's close is done, wherever
the close is: its worker thread must not keep the process alive either.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from scrapy_retryqueue.config import redact_url
from scrapy_retryqueue.queue.delayed import Write
from scrapy_retryqueue.queue.envelope import Task
from scrapy_retryqueue.queue.keys import keys_for
from scrapy_retryqueue.queue.spool import Spool

from .crawling import flaky_site, read_crawl, start_crawl
from .servers import RedisServer
from .waiting import wait_for

pytestmark = pytest.mark.e2e

#: Writes left in the spool: adopting them holds the opening for half a second or more,
#: a window a Ctrl-C sent on "Crawled 0 pages" falls in on a loaded machine too (5,000
#: held it a tenth of a second: once the store writer no longer opened its database
#: while the spider opened, the Ctrl-C came after the opening in one CI-like run).
SPOOLED = 30_000
#: How long a stopped crawl may take to exit (it took well under 5 s; the bug: forever).
EXIT_WITHIN = 30
SETTINGS = {
    "LOG_LEVEL": "INFO",
    "TELNETCONSOLE_ENABLED": False,
    "DOWNLOAD_TIMEOUT": 2,
}


def leave_spool(directory: Path, spider: str, redis_url: str) -> None:
    """The spool file a crawl that ended while Redis was down leaves behind:
    SPOOLED retries of *spider*, due in an hour."""
    now = int(time.time() * 1000)
    spool = Spool(
        directory, spider, "earlier", queue=redact_url(redis_url), memory_limit=0, limit=SPOOLED
    )
    spool.open()
    writes = []
    for n in range(SPOOLED):
        task = Task(
            id=f"left{n}",
            spider=spider,
            request={"url": f"http://127.0.0.1:9/{n}", "callback": "parse_page"},
            attempts={"server_error": 1},
            kind="server_error",
            node="earlier",
            created=now,
            updated=now,
            due=now + 3_600_000,
        )
        writes.append(Write.for_task("schedule", task, None, now))
    spool.put_back(writes)
    assert spool.close() == SPOOLED


def spooled_lines(directory: Path) -> int:
    return sum(
        1
        for path in (directory / "spool").rglob("*.jsonl")
        for line in path.read_text().splitlines()
        if line.strip()
    )


@pytest.mark.parametrize("ctrl_c", [1, 2], ids=["ctrl-c", "ctrl-c-twice"])
def test_ctrl_c_while_the_spider_opens_closes_it_and_exits(
    redis_url: str, namespace: str, tmp_path: Path, ctrl_c: int
) -> None:
    local = tmp_path / "local"
    leave_spool(local, namespace, redis_url)
    settings = {
        **SETTINGS,
        "RETRYQUEUE_REDIS_URL": redis_url,
        "RETRYQUEUE_EMBEDDED_DIR": str(local),
    }
    with flaky_site(pages=20) as site:
        process, out = start_crawl(site.url, namespace, tmp_path, settings)
        log = out.with_suffix(".log")
        try:
            # LogStats' first line comes from its spider_opened handler, the first of
            # them: Scrapy has logged "Spider opened", its engine has not started.
            wait_for(
                lambda: log.exists() and "Crawled 0 pages" in log.read_text(),
                "the spider to open",
                timeout=60,
            )
            process.send_signal(signal.SIGINT)
            started = time.monotonic()
            if ctrl_c == 2:
                wait_for(lambda: "shutting down gracefully" in log.read_text(), "the first stop")
                process.send_signal(signal.SIGINT)  # force stop
            stderr, took = exit_of(process, started, "the Ctrl-C")
        finally:
            kill_if_running(process)
    result = read_crawl(out, process.returncode, stderr)
    assert result.returncode == 0, result.log[-3000:]
    # The stop came while the spider opened (what this test is about), and the
    # add-on closed it: Scrapy's closing lines, the stats, the feed.
    assert "stopped while the spider opens" in result.log, result.log[-3000:]
    for line in ("Closing spider (shutdown)", "Dumping Scrapy stats", "Spider closed (shutdown)"):
        assert line in result.log, result.log[-3000:]
    assert f"{SPOOLED} write(s) spooled by an earlier crawl" in result.log
    # Nothing held is lost: the adopted writes are in Redis, or spooled again.
    client = redis.Redis.from_url(redis_url)
    due = client.zcard(keys_for(namespace).due)
    client.close()
    assert due + spooled_lines(local) == SPOOLED
    print(f"exited {took:.1f}s after the Ctrl-C; {due} of {SPOOLED} adopted writes in Redis")


def exit_of(process: subprocess.Popen[str], since: float, what: str) -> tuple[str, float]:
    """The crawl's stderr and how long after *since* it exited; fails past EXIT_WITHIN."""
    try:
        _, stderr = process.communicate(timeout=EXIT_WITHIN)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the crawl did not exit within {EXIT_WITHIN}s of {what}")
    return stderr, time.monotonic() - since


def kill_if_running(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.kill()
        process.communicate()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis of this test's own: the test pauses it."""
    server = RedisServer(tmp_path / "redis-data", "--save", "")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_a_forced_stop_during_the_close_exits(own_redis: RedisServer, tmp_path: Path) -> None:
    """Ctrl-C twice mid-crawl: the reactor stops before the add-on's close is done, and
    its worker thread, which the close stops, must not keep the process alive."""
    settings = {
        **SETTINGS,
        "RETRYQUEUE_REDIS_URL": own_redis.url,
        "RETRYQUEUE_EMBEDDED_DIR": str(tmp_path / "local"),
        "RETRYQUEUE_STORE_ENABLED": False,
        "CONCURRENT_REQUESTS": 2,
    }
    client = redis.Redis.from_url(own_redis.url, socket_timeout=5)
    with flaky_site(pages=200, latency=0.5) as site:
        process, out = start_crawl(site.url, "forced", tmp_path, settings)
        log = out.with_suffix(".log")
        try:
            wait_for(lambda: site.get_json("/__log"), "the crawl to fetch pages", timeout=60)
            # Every write of the crawl (polls, the closing calls) now waits, up to its
            # socket timeout (10 s): the close cannot end before the second Ctrl-C.
            client.execute_command("CLIENT", "PAUSE", 60_000, "WRITE")
            process.send_signal(signal.SIGINT)  # Ctrl-C: the close waits for Redis ...
            wait_for(lambda: "Closing spider" in log.read_text(), "the spider to close")
            process.send_signal(signal.SIGINT)  # ... and again: stop now
            stderr, took = exit_of(process, time.monotonic(), "the second Ctrl-C")
        finally:
            kill_if_running(process)
            client.execute_command("CLIENT", "UNPAUSE")
            client.close()
    result = read_crawl(out, process.returncode, stderr)
    assert "forcing unclean shutdown" in result.log, result.log[-3000:]
    print(f"exited {took:.1f}s after the second Ctrl-C (rc {process.returncode})")
