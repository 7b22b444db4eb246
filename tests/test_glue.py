"""The Scrapy glue in a real crawl: middleware, spider middleware, extension.

One crawl (tests/glue_crawl.py, in a subprocess) against the flaky site and the
real Redis exercises every case; each test checks one behaviour of it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
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
MALFORMED_ID = "0" * 40


@pytest.fixture(scope="module")
def glue(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("glue")
    spider = f"glue{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(redis_url)
    keys = keys_for(spider)
    # A hand-edited task, due now, that the crawl must dead-letter and survive.
    client.hset(keys.tasks, MALFORMED_ID, '{"v": 1, "id": "broken"')
    client.zadd(keys.due, {MALFORMED_ID: 0})
    site = subprocess.Popen(
        [sys.executable, str(ROOT / "example_project" / "flaky_site.py"), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert site.stdout is not None
    site_url = site.stdout.readline().strip().removeprefix("listening on ")
    audit = tmp / "audit.jsonl"
    settings = {
        "RETRYQUEUE_REDIS_URL": redis_url,
        "RETRYQUEUE_POLL_INTERVAL": 0.1,
        "RETRYQUEUE_POLICIES": {
            kind: FAST for kind in ("server_error", "parse", "storage", "connection")
        },
        "RETRYQUEUE_AUDIT_LOG": str(audit),
        "RETRYQUEUE_NODE_ID": "glue-node",
        # Dead letters stay in Redis, where these tests read them (the SQL
        # store has tests of its own).
        "RETRYQUEUE_STORE_ENABLED": False,
    }
    out = tmp / "out.json"
    try:
        done = subprocess.run(
            [
                *(sys.executable, str(ROOT / "tests" / "glue_crawl.py")),
                *(site_url, spider, json.dumps(settings), str(out)),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(out.read_text())
        queue = RedisDelayedQueue(client, spider, node_id="test")
        dead = {task_id: raw for task_id, raw in queue.dead_letters()}
        result.update(
            log=done.stderr,
            dead=dead,
            counts=queue.counts(now=int(time.time() * 1000)),
            audit=[json.loads(line) for line in audit.read_text().splitlines()],
        )
        yield result
    finally:
        site.terminate()
        site.wait(10)
        client.delete(*all_keys(keys))
        client.close()


def events(glue: dict[str, Any], case: str) -> list[str]:
    return [
        e["event"] + (f":{e['error']}" if "error" in e else "")
        for e in glue["observed"]
        if e["case"] == case
    ]


def dead_by_case(glue: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out = {}
    for task_id, raw in glue["dead"].items():
        if task_id == MALFORMED_ID:
            continue
        task = task_from_json(raw)
        out[task.request.get("meta", {}).get("case", "?")] = {
            "kind": task.dead_kind,
            "error": task.last_error,
        }
    return out


def test_errback_sees_request_parked_then_the_callback_runs(glue: dict[str, Any]) -> None:
    assert events(glue, "parked_then_ok") == ["errback:RequestParked", "parsed"]


def test_a_permanent_status_is_dead_lettered_and_the_errback_gets_the_real_failure(
    glue: dict[str, Any],
) -> None:
    assert events(glue, "dead_404") == ["errback:HttpError"]
    assert dead_by_case(glue)["dead_404"]["kind"] == "not_found"


def test_meta_max_retries_zero_gives_up_at_once(glue: dict[str, Any]) -> None:
    assert events(glue, "max_retries_0") == ["errback:HttpError"]
    assert dead_by_case(glue)["max_retries_0"]["kind"] == "server_error"


def test_meta_policy_can_turn_retries_off(glue: dict[str, Any]) -> None:
    assert events(glue, "policy_no_retry") == ["errback:HttpError"]
    assert dead_by_case(glue)["policy_no_retry"]["kind"] == "server_error"


def test_a_bad_meta_value_is_reported_and_the_settings_policy_used(glue: dict[str, Any]) -> None:
    assert events(glue, "bad_meta") == ["errback:RequestParked", "parsed"]
    assert glue["stats"]["retryqueue/meta_error"] == 1
    assert "meta['retryqueue_max_retries'] must be a whole number" in glue["log"]
    assert "'lots'" in glue["log"]


def test_dont_retry_passes_the_failure_through_untouched(glue: dict[str, Any]) -> None:
    assert events(glue, "dont_retry") == ["errback:HttpError"]
    assert "dont_retry" not in dead_by_case(glue)


def test_an_unserializable_request_is_dead_lettered_naming_the_key(glue: dict[str, Any]) -> None:
    dead = dead_by_case(glue)
    # Its meta could not be stored, so the case label is lost with it: find it by kind.
    (entry,) = [d for d in dead.values() if d["kind"] == "unserializable"]
    assert "meta['obj']" in entry["error"]["message"]
    assert "Unserializable" in entry["error"]["message"]
    assert events(glue, "unserializable") == ["errback:HttpError"]


def test_permanent_failure_in_a_callback_is_a_rule_dead_letter(glue: dict[str, Any]) -> None:
    assert events(glue, "rule") == ["rule"]
    entry = dead_by_case(glue)["rule"]
    assert entry["kind"] == "rule"
    assert entry["error"]["message"] == "this page is out of scope"


def test_permanent_failure_is_its_dead_letter_line_not_a_spider_error(
    glue: dict[str, Any],
) -> None:
    log, stats = glue["log"], glue["stats"]
    assert "(rule: not retried by policy; this page is out of scope)" in log
    # Raised on purpose: no traceback of it, no spider_exceptions stat.
    assert "exceptions.PermanentFailure" not in log
    assert "spider_exceptions/PermanentFailure" not in stats
    # A genuine parse error keeps Scrapy's report: its traceback, its stat.
    assert stats["spider_exceptions/ValueError"] == 1
    assert "Traceback" in log and "parked for a retry (parse) due in" in log


def test_a_parse_error_is_retried_and_parsed_later(glue: dict[str, Any]) -> None:
    assert events(glue, "parse") == ["parse_error", "parsed"]
    assert glue["stats"]["retryqueue/scheduled/parse"] == 1


def test_a_refused_item_write_is_retried_as_storage(glue: dict[str, Any]) -> None:
    assert events(glue, "storage") == ["item_page", "item_page"]
    assert glue["stats"]["retryqueue/scheduled/storage"] == 1
    assert glue["stats"]["item_scraped_count"] == 1


def test_a_malformed_task_is_dead_lettered_with_its_raw_text(glue: dict[str, Any]) -> None:
    doc = json.loads(glue["dead"][MALFORMED_ID])
    assert doc["dead_kind"] == "malformed"
    assert doc["raw"] == '{"v": 1, "id": "broken"'
    assert "not JSON" in doc["last_error"]["message"]
    assert glue["stats"]["retryqueue/dead/malformed"] == 1


def test_nothing_is_left_pending_and_the_crawl_finished(glue: dict[str, Any]) -> None:
    assert (glue["counts"].due, glue["counts"].leased) == (0, 0)
    assert glue["stats"]["finish_reason"] == "finished"
    stats = glue["stats"]
    # Four retries recovered (parked_then_ok, bad_meta, parse, storage).
    assert stats["retryqueue/recovered"] == 4
    assert stats["retryqueue/reinjected"] == 4
    # dead_404, max_retries_0, policy_no_retry, unserializable, rule, malformed.
    assert stats["retryqueue/dead"] == 6


def test_internal_no_callback_requests_are_left_alone(glue: dict[str, Any]) -> None:
    # robots.txt answered 404: RobotsTxtMiddleware handles that, not a dead letter.
    assert glue["stats"]["robotstxt/response_status_count/404"] == 1
    urls = [task_from_json(raw).url for tid, raw in glue["dead"].items() if tid != MALFORMED_ID]
    assert urls and not [url for url in urls if url.endswith("/robots.txt")]


def test_the_add_on_replaces_scrapys_retry_middleware(glue: dict[str, Any]) -> None:
    enabled = glue["log"].split("Enabled downloader middlewares:")[1].split("]")[0]
    assert "scrapy_retryqueue.crawl.middleware.RetryQueueMiddleware" in enabled
    assert "scrapy.downloadermiddlewares.retry.RetryMiddleware" not in enabled


def test_the_audit_log_has_one_json_line_per_event(glue: dict[str, Any]) -> None:
    audit = glue["audit"]
    by_event: dict[str, int] = {}
    for line in audit:
        by_event[line["event"]] = by_event.get(line["event"], 0) + 1
        assert line["node"] == "glue-node"
        assert line["url"].startswith("http://")
    assert by_event["scheduled"] == 4
    assert by_event["recovered"] == 4
    # The malformed task is no request of this node: not audited as one.
    assert by_event["dead"] == 5
    scheduled = next(line for line in audit if line["event"] == "scheduled")
    assert {"task", "kind", "attempt", "delay", "ts"} <= set(scheduled)


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("RETRYQUEUE_POLL_INTERVAL", "-1", "RETRYQUEUE_POLL_INTERVAL must be > 0, got -1.0"),
        (
            "RETRYQUEUE_POLICIES",
            '{"timout": {}}',
            "RETRYQUEUE_POLICIES names unknown kind(s) ['timout']",
        ),
        ("RETRYQUEUE_REDIS_URL", "http://cache:6379", "RETRYQUEUE_REDIS_URL must be a redis://"),
        (
            "RETRYQUEUE_REDIS_URL",
            "redis://127.0.0.1:1/12",
            "Redis at redis://127.0.0.1:1/12 (RETRYQUEUE_REDIS_URL) does not answer",
        ),
    ],
)
def test_a_bad_setting_stops_the_crawl_naming_it(setting: str, value: str, message: str) -> None:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "scrapy.cmdline", "crawl", "flaky", "-s", f"{setting}={value}"],
        cwd=ROOT / "example_project",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert time.monotonic() - started < 30
    # One ERROR line that says it all, and no traceback after it.
    [error] = [line for line in done.stderr.splitlines() if " ERROR: " in line]
    assert message in error
    assert "Traceback" not in done.stderr
    # It stopped before fetching anything.
    assert "Crawled" not in done.stderr


def test_an_unreachable_redis_at_start_can_be_crawled_through_on_the_spool(
    tmp_path: Path,
) -> None:
    from .crawling import crawl, flaky_site

    with flaky_site(pages=5) as site:
        done = crawl(
            site.url,
            f"spool{uuid.uuid4().hex[:6]}",
            tmp_path,
            {
                "RETRYQUEUE_REDIS_URL": "redis://127.0.0.1:1/12",
                "RETRYQUEUE_START_WITHOUT_REDIS": True,
                "RETRYQUEUE_EMBEDDED_DIR": str(tmp_path / "embedded"),
                "RETRYQUEUE_IDLE_TIMEOUT": 2,
                "RETRYQUEUE_STORE_ENABLED": False,
            },
        )
    assert done.returncode == 0, done.log[-3000:]
    assert "Redis is unreachable" in done.log
    assert "'finish_reason': 'retryqueue_work_left'" in done.log
    assert "write(s) Redis did not take, kept in" in done.log


def test_listing_the_components_by_hand_works_like_the_add_on(
    redis_url: str, tmp_path: Path
) -> None:
    from .crawling import crawl, flaky_site

    spider = f"manual{uuid.uuid4().hex[:6]}"
    settings = {
        "ADDONS": {},
        "DOWNLOADER_MIDDLEWARES": {
            "scrapy.downloadermiddlewares.retry.RetryMiddleware": None,
            "scrapy_retryqueue.RetryQueueMiddleware": 550,
        },
        "SPIDER_MIDDLEWARES": {"scrapy_retryqueue.RetryQueueSpiderMiddleware": 950},
        "EXTENSIONS": {"scrapy_retryqueue.RetryQueueExtension": 500},
        "RETRYQUEUE_REDIS_URL": redis_url,
        "RETRYQUEUE_POLL_INTERVAL": 0.1,
        "RETRYQUEUE_POLICIES": {kind: FAST for kind in ("server_error", "parse", "rate_limited")},
        "DOWNLOAD_TIMEOUT": 10,
        "LOG_LEVEL": "INFO",
    }
    client = redis.Redis.from_url(redis_url)
    try:
        with flaky_site(pages=20, retry_after=1) as site:
            done = crawl(site.url, spider, tmp_path, settings)
            scenarios = site.get_json("/__scenarios")
        assert done.returncode == 0, done.log[-2000:]
        parsed = {item["url"].removeprefix(site.url) for item in done.items}
        should = {path for path, info in scenarios.items() if info["expected"] == "parsed"}
        assert parsed == should  # the parse_once and 503 pages came back
        queue = RedisDelayedQueue(client, spider, node_id="test")
        dead = {task_from_json(raw).url.removeprefix(site.url) for _, raw in queue.dead_letters()}
        assert dead == {path for path, info in scenarios.items() if info["expected"] != "parsed"}
        enabled = done.log.split("Enabled downloader middlewares:")[1].split("]")[0]
        assert "RetryQueueMiddleware" in enabled
        assert "downloadermiddlewares.retry.RetryMiddleware" not in enabled
    finally:
        client.delete(*all_keys(keys_for(spider)))
        client.close()
