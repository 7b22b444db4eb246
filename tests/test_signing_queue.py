"""The queue with RETRYQUEUE_SIGNING_KEYS, against the real Redis: what each script signs
and records, and what a claim hands back to tell a replay by.

Every call gets an explicit ``now`` (ms), so no test waits for time to pass.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import redis

from scrapy_retryqueue.exceptions import SignatureError
from scrapy_retryqueue.queue import events as ev
from scrapy_retryqueue.queue.delayed import RedisDelayedQueue
from scrapy_retryqueue.queue.envelope import Task, task_from_json
from scrapy_retryqueue.queue.events import parse_entry
from scrapy_retryqueue.queue.signature import (
    check_claimed,
    split_signed,
    verify_envelope,
    verify_event,
)
from scrapy_retryqueue.secure.signing import KeyRing, generate_key, parse_keys
from scrapy_retryqueue.values import as_text

MakeTask = Callable[..., Task]
LEASE = 30_000
RING = KeyRing(parse_keys([generate_key()]))


@pytest.fixture(params=["single", "cluster"])
def redis_kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def signed(redis_client: redis.Redis, spider_name: str) -> RedisDelayedQueue:
    return RedisDelayedQueue(
        redis_client,
        spider_name,
        node_id="node-a",
        signing=RING,
        finished_keep=3600.0,
        finished_max=3,
    )


def _events(client: redis.Redis, queue: RedisDelayedQueue) -> list[ev.Event]:
    out = []
    for entry_id, fields in client.xrange(queue.keys.events):
        out += [e for e in parse_entry(entry_id, fields) if isinstance(e, ev.Event)]
    return out


def test_a_scheduled_envelope_is_signed_and_its_version_kept_beside_it(
    signed: RedisDelayedQueue, redis_client: redis.Redis, make_task: MakeTask, spider_name: str
) -> None:
    task = make_task("a", due=5_000, updated=1_000)
    assert signed.schedule(task, now=1_000)
    stored = as_text(redis_client.hget(signed.keys.tasks, "a"))
    text, signature = split_signed(stored)
    assert signature is not None and text == task.to_json()
    verify_envelope(stored, RING, "")
    assert task_from_json(stored) == task  # readers that know no signature read it as ever
    assert redis_client.hget(signed.keys.versions, "a") == b"1000"
    [event] = _events(redis_client, signed)
    assert event.signature
    verify_event(event.fields, RING, "", spider_name)
    # One changed field, and the signature no longer holds.
    forged = dict(event.fields, url="https://evil.test/")
    with pytest.raises(SignatureError):
        verify_event(forged, RING, "", spider_name)
    # Nor in another project's namespace.
    with pytest.raises(SignatureError):
        verify_envelope(stored, RING, "other")


def test_a_claim_returns_the_records_replays_are_told_by(
    signed: RedisDelayedQueue, redis_client: redis.Redis, make_task: MakeTask, spider_name: str
) -> None:
    signed.schedule(make_task("a", updated=1_000), now=1_000)
    claimed = signed.claim(now=2_000, limit=10, lease_until=LEASE, token="t1")
    assert [t for t, _ in claimed.tasks] == ["a"]
    assert claimed.records == {"a": (1_000, None)}
    doc = json.loads(claimed.tasks[0][1])
    check_claimed(doc, task_id="a", spider=spider_name, version=1_000, finished=None)
    # Acknowledged with the version it was claimed at: the live record becomes a finished one.
    assert signed.ack("a", "t1", now=3_000, version=1_000)
    assert redis_client.hget(signed.keys.versions, "a") is None
    assert redis_client.zscore(signed.keys.finished, "a") == 1_000
    [*_, succeeded] = _events(redis_client, signed)
    verify_event(succeeded.fields, RING, "", spider_name)

    # The same envelope put back (a replay): the claim says its task finished with it.
    redis_client.hset(signed.keys.tasks, "a", claimed.tasks[0][1])
    redis_client.zadd(signed.keys.due, {"a": 0})
    again = signed.claim(now=4_000, limit=10, lease_until=LEASE, token="t2")
    assert again.records == {"a": (None, 1_000)}
    with pytest.raises(SignatureError, match="replay"):
        check_claimed(doc, task_id="a", spider=spider_name, version=None, finished=1_000)


def test_an_older_attempt_than_the_live_one_is_a_replay(spider_name: str) -> None:
    doc = {"id": "a", "spider": spider_name, "updated": 1_000}
    check_claimed(doc, task_id="a", spider=spider_name, version=1_000, finished=None)
    with pytest.raises(SignatureError, match="replay"):
        check_claimed(doc, task_id="a", spider=spider_name, version=2_000, finished=None)
    with pytest.raises(SignatureError, match="moved"):
        check_claimed(doc, task_id="b", spider=spider_name, version=1_000, finished=None)
    with pytest.raises(SignatureError, match="moved"):
        check_claimed(doc, task_id="a", spider="other", version=1_000, finished=None)
    # A task of the same id that lived again after it finished is no replay.
    later = {**doc, "updated": 5_000}
    check_claimed(later, task_id="a", spider=spider_name, version=5_000, finished=1_000)


def test_a_forged_entry_is_dead_lettered_under_its_own_id_and_records_nothing(
    signed: RedisDelayedQueue, redis_client: redis.Redis, make_task: MakeTask
) -> None:
    # A real dead letter of "a" waits for the store...
    signed.deadletter(make_task("a", dead_kind="not_found", updated=500), None, now=500)
    # ... when a forged envelope claims to be task "a" again.
    redis_client.hset(signed.keys.tasks, "a", '{"v":1}')
    redis_client.zadd(signed.keys.due, {"a": 0})
    claimed = signed.claim(now=1_000, limit=10, lease_until=LEASE, token="t1")
    assert [t for t, _ in claimed.tasks] == ["a"]
    assert signed.deadletter_raw(
        "a", '{"kept":1}', "t1", now=1_000, kind="forged", url="", dead_id="a:forged:1000"
    )
    k = signed.keys
    assert redis_client.zscore(k.dead, "a") == 500  # the real one is still there
    assert redis_client.hget(k.deadkinds, "a:forged:1000") == b"forged"
    assert not redis_client.exists(k.tasks) and not redis_client.zcard(k.leased)
    # The real dead letter's record stays, the forged one adds none.
    assert redis_client.zrange(k.finished, 0, -1, withscores=True) == [(b"a", 500.0)]


def test_finished_records_are_trimmed_by_count_and_age(
    signed: RedisDelayedQueue, redis_client: redis.Redis, make_task: MakeTask
) -> None:
    for i in range(5):
        signed.schedule(make_task(f"t{i}", updated=1_000 + i), now=1_000 + i)
    claimed = signed.claim(now=2_000, limit=10, lease_until=LEASE, token="t")
    for task_id, raw in claimed.tasks:
        signed.ack(task_id, "t", now=3_000, version=json.loads(raw)["updated"])
    # finished_max is 3: the oldest two went.
    assert [as_text(x) for x in redis_client.zrange(signed.keys.finished, 0, -1)] == [
        "t2",
        "t3",
        "t4",
    ]
    # An hour later (finished_keep), a new finish takes the old records with it.
    signed.schedule(make_task("late", updated=3_700_000), now=3_700_000)
    signed.claim(now=3_700_000, limit=10, lease_until=3_800_000, token="u")
    signed.ack("late", "u", now=3_700_100, version=3_700_000)
    assert redis_client.zrange(signed.keys.finished, 0, -1) == [b"late"]


def test_no_record_is_later_than_the_script_that_writes_it(
    signed: RedisDelayedQueue, redis_client: redis.Redis, make_task: MakeTask
) -> None:
    # A version written around the scripts, far in the future, would refuse every later
    # life of the task as a replay: the record is capped at the writer's now.
    signed.schedule(make_task("a", updated=1_000), now=1_000)
    redis_client.hset(signed.keys.versions, "a", "99999999999999")
    signed.claim(now=2_000, limit=10, lease_until=LEASE, token="t")
    signed.cancel(["a"], now=2_500)
    assert redis_client.zscore(signed.keys.finished, "a") == 2_500


def test_without_a_key_nothing_is_signed_nor_recorded(
    queue: RedisDelayedQueue, redis_client: redis.Redis, make_task: MakeTask
) -> None:
    queue.schedule(make_task("a", updated=1_000), now=1_000)
    assert split_signed(as_text(redis_client.hget(queue.keys.tasks, "a")))[1] is None
    claimed = queue.claim(now=2_000, limit=10, lease_until=LEASE, token="t")
    assert claimed.records == {}
    queue.ack("a", "t", now=3_000, version=1_000)
    assert not redis_client.exists(queue.keys.versions, queue.keys.finished)
    assert all(e.signature == "" for e in _events(redis_client, queue))
