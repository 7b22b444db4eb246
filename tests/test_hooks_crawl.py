"""RETRYQUEUE_RETRY_HOOK and the retryqueue_* signals in a real crawl.

One crawl (tests/hooks_crawl.py, in a subprocess) against the flaky site and
the real Redis: a retry kept as it is, one replaced by the hook (another
header), one vetoed, and a 404; its signal handlers record what they saw.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

from scrapy_retryqueue.queue.delayed import RedisDelayedQueue
from scrapy_retryqueue.queue.envelope import task_from_json
from scrapy_retryqueue.queue.keys import all_keys, keys_for

ROOT = Path(__file__).resolve().parents[1]
FAST = {"base_delay": 0.2, "max_delay": 1}


@pytest.fixture(scope="module")
def hooked(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("hooks")
    spider = f"hooks{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(redis_url)
    site = subprocess.Popen(
        [sys.executable, str(ROOT / "example_project" / "flaky_site.py"), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert site.stdout is not None
    site_url = site.stdout.readline().strip().removeprefix("listening on ")
    settings = {
        "RETRYQUEUE_REDIS_URL": redis_url,
        "RETRYQUEUE_POLL_INTERVAL": 0.1,
        "RETRYQUEUE_POLICIES": {"server_error": FAST},
        "RETRYQUEUE_STORE_ENABLED": False,
    }
    out = tmp / "out.json"
    try:
        done = subprocess.run(
            [
                *(sys.executable, str(ROOT / "tests" / "hooks_crawl.py")),
                *(site_url, spider, json.dumps(settings), str(out)),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(out.read_text())
        queue = RedisDelayedQueue(client, spider, node_id="test")
        result["dead"] = {task_id: task_from_json(raw) for task_id, raw in queue.dead_letters()}
        result["log"] = done.stderr
        yield result
    finally:
        site.terminate()
        site.wait(10)
        client.delete(*all_keys(keys_for(spider)))
        client.close()


def seen(hooked: dict[str, Any], case: str) -> list[dict[str, Any]]:
    return [e for e in hooked["observed"] if e["case"] == case]


def names(hooked: dict[str, Any], case: str) -> list[str]:
    return [e["event"] for e in seen(hooked, case)]


def test_a_kept_retry_is_scheduled_then_recovered(hooked: dict[str, Any]) -> None:
    # The recovered signal comes once the ack is written, which may be after
    # the callback ran.
    assert names(hooked, "keep")[:2] == ["signal_scheduled", "errback"]
    assert sorted(names(hooked, "keep")[2:]) == ["parsed", "signal_recovered"]
    by_event = {e["event"]: e for e in seen(hooked, "keep")}
    scheduled, recovered, parsed = (
        by_event["signal_scheduled"],
        by_event["signal_recovered"],
        by_event["parsed"],
    )
    assert scheduled["kind"] == "server_error" and scheduled["attempt"] == 1
    assert scheduled["outcome"] == "parked"
    assert recovered["task_id"] == scheduled["task_id"]
    assert recovered["kind"] == "server_error"
    assert recovered["attempts"] == {"server_error": 1}
    assert parsed["hooked"] is None


def test_the_hooks_replacement_is_what_is_downloaded_again(hooked: dict[str, Any]) -> None:
    assert names(hooked, "replace")[:2] == ["signal_scheduled", "errback"]
    assert sorted(names(hooked, "replace")[2:]) == ["parsed", "signal_recovered"]
    [parsed] = [e for e in seen(hooked, "replace") if e["event"] == "parsed"]
    assert parsed["hooked"] == "attempt-1"
    assert hooked["stats"]["retryqueue/hook/replaced"] == 1


def test_a_vetoed_retry_is_a_dead_letter_of_kind_vetoed(hooked: dict[str, Any]) -> None:
    # A fresh request's dead letter does not wait for Redis: its errback may come
    # before the signal (sent once the write is accepted).
    assert sorted(names(hooked, "veto")) == ["errback", "signal_dead"]
    events = {e["event"]: e for e in seen(hooked, "veto")}
    dead_signal, errback = events["signal_dead"], events["errback"]
    assert dead_signal["kind"] == "vetoed"
    assert "vetoed by RETRYQUEUE_RETRY_HOOK" in dead_signal["reason"]
    assert errback["error"] == "HttpError"
    task = hooked["dead"][dead_signal["task_id"]]
    assert task.dead_kind == "vetoed"
    assert task.last_error["status"] == 500
    assert hooked["stats"]["retryqueue/hook/vetoed"] == 1
    assert hooked["stats"]["retryqueue/dead/vetoed"] == 1


def test_a_permanent_failure_signals_dead_without_asking_the_hook(
    hooked: dict[str, Any],
) -> None:
    assert sorted(names(hooked, "dead_404")) == ["errback", "signal_dead"]
    [dead_signal] = [e for e in seen(hooked, "dead_404") if e["event"] == "signal_dead"]
    assert dead_signal["kind"] == "not_found"


def test_the_crawl_ends_with_nothing_pending(hooked: dict[str, Any]) -> None:
    stats = hooked["stats"]
    assert stats["retryqueue/scheduled"] == 2
    assert stats["retryqueue/recovered"] == 2
    assert stats["retryqueue/dead"] == 2
    assert "hook/error" not in json.dumps(stats)
