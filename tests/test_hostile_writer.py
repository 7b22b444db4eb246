"""A writer to the queue's Redis without the signing key, against real crawls on a real Redis.

The site counts every fetch per path. Between crawls of one spider, a hostile writer
adds forged envelopes (a live one with its URL changed), moved ones (a live one copied
under another task id, or another spider's), hand-written and re-keyed ones, an older
attempt over a live task, and, once those tasks succeeded, copies of their envelopes.
With RETRYQUEUE_SIGNING_KEYS: none of them is fetched, no callback of theirs runs, each
is reported once (a WARNING line, a stat, a forged dead letter in the store), no
legitimate task is lost, and every crawl closes on its own once its real work is done.
Without a key: what docs/guarantees.md says an unsigned queue allows, and no crawl
stays open for an entry it cannot finish (the hang this issue found).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy

from scrapy_retryqueue.queue.delayed import RedisDelayedQueue
from scrapy_retryqueue.queue.envelope import Task
from scrapy_retryqueue.queue.keys import Keys, all_keys, keys_for
from scrapy_retryqueue.queue.signature import sign_envelope
from scrapy_retryqueue.secure.signing import KeyRing, generate_key, parse_keys
from scrapy_retryqueue.values import as_text

from .sitecrawl import ROOT, Site, serving

pytestmark = pytest.mark.e2e

KEY, EVIL_KEY = generate_key(), generate_key()
#: Pages of the site; the first FAILING answer 503 once, then 200.
PAGES, FAILING = 48, 40
SETTINGS: dict[str, Any] = {
    "CONCURRENT_REQUESTS": 16,
    "DOWNLOAD_TIMEOUT": 5,
    "RETRYQUEUE_POLL_INTERVAL": 0.2,
    # The first crawl leaves its retries (due in a minute) for the next one at once;
    # an operator makes them due now (retry_now) before the next crawl.
    "RETRYQUEUE_IDLE_TIMEOUT": 1,
    "RETRYQUEUE_POLICIES": {
        "server_error": {"base_delay": 60, "max_delay": 60, "jitter": "none", "max_retries": 3}
    },
}


def answer(path: str, query: dict[str, list[str]], times: list[float]) -> tuple[int, bytes]:
    if path == "/":
        links = "".join(f'<a href="/p/{i}">{i}</a>' for i in range(PAGES))
        return 200, f"<html><body>{links}</body></html>".encode()
    match = re.fullmatch(r"/p/(\d+)", path)
    if match and int(match.group(1)) < FAILING and len(times) == 1:
        return 503, b"<html>busy</html>"
    return 200, f"<html><h1>{path}</h1></html>".encode()


@pytest.fixture
def site() -> Iterator[Site]:
    with serving(Site(answer)) as running:
        yield running


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    connection = redis.Redis.from_url(redis_url)
    yield connection
    connection.close()


@pytest.fixture
def other_spider(client: redis.Redis, namespace: str) -> Iterator[str]:
    name = f"o{namespace}"
    yield name
    client.delete(*all_keys(keys_for(name)))


def run(
    spider: str, site: Site, tmp_path: Path, settings: dict[str, Any], *, index: bool
) -> dict[str, Any]:
    """One crawl of tests/hostile_crawl.py to its end: what it parsed, stats, log."""
    out = tmp_path / f"{spider}-{time.monotonic_ns()}.json"
    started = time.monotonic()
    done = subprocess.run(
        [
            *(sys.executable, str(ROOT / "tests" / "hostile_crawl.py"), spider, site.url),
            *("true" if index else "false", json.dumps({**SETTINGS, **settings}), str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    result["log"] = done.stderr
    result["seconds"] = time.monotonic() - started
    return result


def hits(site: Site, prefix: str) -> int:
    with site.lock:
        return sum(len(times) for path, times in site.hits.items() if path.startswith(prefix))


def page_hits(site: Site) -> dict[str, int]:
    with site.lock:
        return {p: len(t) for p, t in site.hits.items() if p.startswith("/p/")}


def put(client: redis.Redis, keys: Keys, task_id: str, raw: str, version: Any = None) -> None:
    """What a writer with Redis access does: an envelope, due now, and (the careful
    attacker) the version record a signed task has beside it."""
    client.hset(keys.tasks, task_id, raw)
    client.zadd(keys.due, {task_id: 0})
    if version is not None:
        client.hset(keys.versions, task_id, version)


def due_now(client: redis.Redis, spider: str, task_ids: list[str]) -> None:
    """What a person does from the dashboard: the waiting retries due now."""
    operator = RedisDelayedQueue(client, spider, node_id="operator")
    assert all(operator.retry_now(task_ids, now=int(time.time() * 1000)))


def hand_written(spider: str, task_id: str, url: str) -> str:
    now = int(time.time() * 1000)
    return Task(
        id=task_id,
        spider=spider,
        request={"url": url, "callback": "steal", "meta": {"download_slot": "x"}},
        attempts={"server_error": 1},
        kind="server_error",
        created=now,
        updated=now,
    ).to_json()


def forged_lines(log: str) -> list[str]:
    return re.findall(r"scrapy-retryqueue: task '([^']+)' is forged \(([^)]*)\)", log)


def store_rows(store: Path) -> list[dict[str, Any]]:
    engine = sqlalchemy.create_engine(f"sqlite:///{store}")
    with engine.connect() as conn:
        rows = conn.execute(
            sqlalchemy.text("SELECT task_id, status, kind, url FROM retryqueue_tasks")
        )
        found = [dict(row._mapping) for row in rows]
    engine.dispose()
    return found


def test_with_a_signing_key_no_forged_moved_rekeyed_or_replayed_entry_is_fetched(
    site: Site,
    namespace: str,
    other_spider: str,
    client: redis.Redis,
    redis_url: str,
    tmp_path: Path,
) -> None:
    store = tmp_path / "store.sqlite3"
    settings = {
        "RETRYQUEUE_REDIS_URL": redis_url,
        "RETRYQUEUE_DATABASE_URL": f"sqlite:///{store}",
        "RETRYQUEUE_SIGNING_KEYS": [KEY],
    }
    keys = keys_for(namespace)
    ring = KeyRing(parse_keys([KEY]))

    first = run(namespace, site, tmp_path, settings, index=True)
    assert first["stats"]["retryqueue/scheduled"] == FAILING
    pending = {as_text(k): as_text(v) for k, v in client.hgetall(keys.tasks).items()}
    versions = {as_text(k): as_text(v) for k, v in client.hgetall(keys.versions).items()}
    assert len(pending) == FAILING and versions.keys() == pending.keys()
    live = sorted(pending)

    # -- the hostile writer, while the retries wait -----------------------------------
    injected: dict[str, str] = {}
    # An older attempt over a live task: written as a node would (first, as the only
    # task due now), then its first envelope put back over its second.
    node = RedisDelayedQueue(client, namespace, node_id="earlier-node", signing=ring)
    now = int(time.time() * 1000)
    stale = Task(
        id="stale",
        spider=namespace,
        request={"url": f"{site.url}/p/stale", "callback": "parse_page"},
        attempts={"server_error": 1},
        kind="server_error",
        created=now,
        updated=now,
    )
    node.schedule(stale, now=now)
    first_attempt = as_text(client.hget(keys.tasks, "stale"))
    assert [t for t, _ in node.claim(now=now, limit=1, lease_until=now + 60_000, token="t").tasks]
    stale.attempts, stale.updated = {"server_error": 2}, now + 5
    assert node.reschedule(stale, "t", now=now + 5)
    client.hset(keys.tasks, "stale", first_attempt)
    injected["stale"] = "replay"
    for i, task_id in enumerate(live[:3]):
        raw = re.sub(r"/p/\d+", f"/evil/forged-{i}", pending[task_id], count=1)
        put(client, keys, f"forged-{i}", raw, versions[task_id])
        injected[f"forged-{i}"] = "bad signature"
    for i, task_id in enumerate(live[3:6]):
        put(client, keys, f"moved-{i}", pending[task_id], versions[task_id])
        injected[f"moved-{i}"] = "moved"
    for i in range(3):
        put(
            client, keys, f"hand-{i}", hand_written(namespace, f"hand-{i}", f"{site.url}/evil/h{i}")
        )
        injected[f"hand-{i}"] = "unsigned"
    evil = KeyRing(parse_keys([EVIL_KEY]))
    for i in range(2):
        text = hand_written(namespace, f"rekeyed-{i}", f"{site.url}/evil/k{i}")
        put(client, keys, f"rekeyed-{i}", sign_envelope(text, evil, ""), int(time.time() * 1000))
        injected[f"rekeyed-{i}"] = "unknown key"
    # Another spider's signed task (a key of the fleet, the wrong queue).
    theirs = sign_envelope(hand_written(other_spider, "other-0", f"{site.url}/evil/o"), ring, "")
    put(client, keys, "other-0", theirs, int(time.time() * 1000))
    injected["other-0"] = "moved"
    due_now(client, namespace, live)

    second = run(namespace, site, tmp_path, settings, index=False)

    # Not one of them fetched, nor a callback of theirs run.
    assert hits(site, "/evil/") == 0 and hits(site, "/p/stale") == 0
    assert second["stolen"] == []
    # Each reported once, with why.
    reported = forged_lines(second["log"])
    assert sorted(task_id for task_id, _ in reported) == sorted(injected)
    for task_id, why in reported:
        assert why.startswith(injected[task_id]), (task_id, why)
    stats = second["stats"]
    assert stats["retryqueue/forged"] == stats["retryqueue/dead/forged"] == len(injected)
    assert stats["retryqueue/forged/moved"] == 4 and stats["retryqueue/forged/replay"] == 1
    # Every legitimate task ran, once; the crawl closed on its own.
    assert page_hits(site) == {f"/p/{i}": (2 if i < FAILING else 1) for i in range(PAGES)}
    assert sorted(first["parsed"] + second["parsed"]) == sorted(
        f"{site.url}/p/{i}" for i in range(PAGES)
    )
    assert second["stats"]["finish_reason"] == "finished"
    assert client.zcard(keys.due) == client.zcard(keys.leased) == 0

    # -- the same writer puts back the envelopes of tasks that succeeded ---------------
    for task_id in live:
        put(client, keys, task_id, pending[task_id], versions[task_id])
    third = run(namespace, site, tmp_path, settings, index=False)
    assert page_hits(site) == {f"/p/{i}": (2 if i < FAILING else 1) for i in range(PAGES)}
    assert third["parsed"] == [] and third["stats"]["retryqueue/forged/replay"] == FAILING
    assert sorted(t for t, _ in forged_lines(third["log"])) == live
    assert third["stats"]["finish_reason"] == "finished"

    # The store: each refused entry is a forged dead letter of its own, none a row that
    # looks like the crawl's; the real tasks' rows still say they succeeded.
    rows = store_rows(store)
    forged = [r for r in rows if r["kind"] == "forged"]
    assert len(forged) == len(injected) + FAILING
    assert all(r["status"] == "dead" and r["url"] is None for r in forged)
    assert not [r for r in rows if r["url"] and "/evil/" in r["url"]]
    real = {r["task_id"]: r["status"] for r in rows if r["task_id"] in pending}
    assert real == dict.fromkeys(pending, "succeeded")
    for result in (first, second, third):
        assert result["seconds"] < 60


def test_without_a_key_the_queue_allows_what_the_docs_say_and_no_crawl_hangs(
    site: Site, namespace: str, client: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    settings = {"RETRYQUEUE_REDIS_URL": redis_url, "RETRYQUEUE_STORE_ENABLED": False}
    keys = keys_for(namespace)
    run(namespace, site, tmp_path, settings, index=True)
    pending = {as_text(k): as_text(v) for k, v in client.hgetall(keys.tasks).items()}
    live = sorted(pending)
    # Copies under other task ids: before the fix, each one's request was acknowledged
    # under the id its envelope names, and its own lease was held (and renewed) for as
    # long as the crawl lasted: no crawl of the spider ever closed again.
    for i, task_id in enumerate(live[:3]):
        put(client, keys, f"moved-{i}", pending[task_id])
        raw = re.sub(r"/p/\d+", f"/evil/moved-{i}", pending[task_id], count=1)
        put(client, keys, f"moved-url-{i}", raw)
    # Hand-written ones that name their own id: nothing tells them from the crawl's.
    for i in range(3):
        put(
            client, keys, f"hand-{i}", hand_written(namespace, f"hand-{i}", f"{site.url}/evil/h{i}")
        )
    # Off the spider's allowed_domains (localhost is not 127.0.0.1 to the offsite rule).
    offsite = site.url.replace("127.0.0.1", "localhost")
    put(client, keys, "away-0", hand_written(namespace, "away-0", f"{offsite}/evil/away"))
    due_now(client, namespace, live)

    second = run(namespace, site, tmp_path, settings, index=False)
    assert second["stats"]["finish_reason"] == "finished"
    assert second["seconds"] < 60
    assert client.zcard(keys.due) == client.zcard(keys.leased) == 0
    # The copies under other ids: refused (not fetched), reported once each.
    assert sorted(t for t, _ in forged_lines(second["log"])) == sorted(
        [*(f"moved-{i}" for i in range(3)), *(f"moved-url-{i}" for i in range(3))]
    )
    assert hits(site, "/evil/moved") == 0
    # What an unsigned queue allows: a request within allowed_domains, with a callback
    # of the spider's, is fetched and its callback run.
    assert hits(site, "/evil/h") == 3
    assert sorted(second["stolen"]) == sorted(f"{site.url}/evil/h{i}" for i in range(3))
    # Not one off the spider's domains.
    assert hits(site, "/evil/away") == 0 and second["stats"]["retryqueue/offsite"] == 1
    assert "is outside the spider's allowed_domains" in second["log"]
    # Every legitimate task ran once.
    assert page_hits(site) == {f"/p/{i}": (2 if i < FAILING else 1) for i in range(PAGES)}

    # Replays of tasks that succeeded: an unsigned queue cannot tell them (docs'
    # table); they run again, and the crawl still closes on its own.
    for task_id in live[:5]:
        put(client, keys, task_id, pending[task_id])
    third = run(namespace, site, tmp_path, settings, index=False)
    assert len(third["parsed"]) == 5 and third["stats"]["finish_reason"] == "finished"
    assert client.zcard(keys.due) == client.zcard(keys.leased) == 0
