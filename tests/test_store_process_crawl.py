"""Real crawls with the default store writer, a process forked from the crawl: it
starts and ends with the crawl (closed, or killed: the child ends when its pipe
closes), and a writer process killed mid-crawl loses no dead letter."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from scrapy_retryqueue.queue.keys import all_keys, keys_for
from scrapy_retryqueue.store.db import Store

from .crawling import flaky_site, read_crawl, start_crawl
from .test_store_crawl import SETTINGS, expected, stored
from .waiting import wait_for

pytestmark = pytest.mark.e2e

FORKED = re.compile(r"the store writer runs in process (\d+), forked from the crawl")


def _writer_pid(log: Path) -> int | None:
    found = FORKED.search(log.read_text()) if log.exists() else None
    return int(found.group(1)) if found else None


def _gone(pid: int) -> bool:
    """No such process, or only its zombie (a killed crawl's child is reparented
    to a process that may never reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def _settings(redis_url: str, tmp_path: Path) -> dict[str, Any]:
    # No RETRYQUEUE_STORE_PROCESS: the default forks the writer.
    return {
        **SETTINGS,
        "CONCURRENT_REQUESTS": 4,
        "RETRYQUEUE_REDIS_URL": redis_url,
        "RETRYQUEUE_DATABASE_URL": f"sqlite:///{tmp_path / 'store.sqlite3'}",
    }


@pytest.mark.parametrize("end", ["closed", "killed"])
def test_the_writer_process_ends_with_the_crawl(
    redis_url: str, namespace: str, tmp_path: Path, end: str
) -> None:
    with flaky_site(pages=60, latency=0.3) as site:
        process, out = start_crawl(site.url, namespace, tmp_path, _settings(redis_url, tmp_path))
        log = out.with_suffix(".log")
        try:
            wait_for(lambda: _writer_pid(log), "the crawl to fork its writer")
            pid = _writer_pid(log)
            assert pid is not None and not _gone(pid)
            if end == "killed":
                # Nothing of the crawl runs after this: no close, no end of its writer.
                wait_for(lambda: "Spider opened" in log.read_text(), "the spider to open")
                process.kill()
            _, stderr = process.communicate(timeout=120)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
    if end == "closed":
        result = read_crawl(out, process.returncode, stderr)
        assert result.returncode == 0, result.log[-3000:]
        assert _gone(pid)  # ended and reaped by the crawl as it closed
    else:
        # Its end of the pipe closed with the crawl's process: it ends by itself.
        wait_for(lambda: _gone(pid), "the writer process to end with its crawl", timeout=20)


def test_no_dead_letter_is_lost_when_the_writer_process_is_killed_mid_crawl(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    store = Store(f"sqlite:///{tmp_path / 'store.sqlite3'}")
    store.upgrade()
    with flaky_site(pages=200, slow=1.5, retry_after=1, latency=0.2) as site:
        process, out = start_crawl(site.url, namespace, tmp_path, _settings(redis_url, tmp_path))
        log = out.with_suffix(".log")
        try:
            # Killed once it has written a first batch, with more dead letters to come.
            wait_for(lambda: stored(store, namespace), "the writer process to write", timeout=60)
            pid = _writer_pid(log)
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            _, stderr = process.communicate(timeout=240)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
        dead, _ = expected(site)
    result = read_crawl(out, process.returncode, stderr)
    assert result.returncode == 0, result.log[-3000:]
    assert "the store writer process ended unexpectedly" in result.log
    rows = stored(store, namespace)
    store.close()
    # Every page that died is a dead letter in the store, and none waits in Redis.
    assert {url: kind for url, (status, kind) in rows.items() if status == "dead"} == dead
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.zcard(keys_for(namespace).dead) == 0
    finally:
        client.close()


def test_several_crawlers_in_one_process_each_store_their_dead_letters(
    redis_client: Any, redis_url: str, tmp_path: Path
) -> None:
    # Two spiders of one CrawlerProcess: the first forks its writer; the second
    # forks one too, or, if the first started threads already, writes from a thread.
    names = [f"several{n}{os.urandom(3).hex()}" for n in range(2)]
    log = tmp_path / "several.log"
    settings = {
        **_settings(redis_url, tmp_path),
        "RETRYQUEUE_NAMESPACE": "",
        "LOG_FILE": str(log),
        # Two crawls in one process on a loaded machine: no healthy page may time out.
        "DOWNLOAD_TIMEOUT": 10,
    }
    try:
        with flaky_site(pages=60, slow=1.5, retry_after=1) as site:
            done = subprocess.run(
                [sys.executable, str(Path(__file__).parent / "several_crawl.py")]
                + [site.url, json.dumps(settings), *names],
                capture_output=True,
                text=True,
                timeout=240,
            )
            dead, _ = expected(site)
        text = log.read_text()
        assert done.returncode == 0, text[-3000:] + done.stderr[-2000:]
        forked = [int(pid) for pid in FORKED.findall(text)]
        threads = text.count("the store writer runs in a thread of the crawl")
        assert len(forked) + threads == len(names), text[-3000:]
        assert "WARNING: scrapy-retryqueue: the store writer" not in text
        # Each writer process ended with the crawl that forked it.
        assert [pid for pid in forked if not _gone(pid)] == []
        store = Store(f"sqlite:///{tmp_path / 'store.sqlite3'}")
        try:
            for name in names:
                rows = stored(store, name)
                assert {u: k for u, (s, k) in rows.items() if s == "dead"} == dead, name
        finally:
            store.close()
    finally:
        for name in names:
            redis_client.delete(*all_keys(keys_for(name)))
