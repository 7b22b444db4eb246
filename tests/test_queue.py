"""RedisDelayedQueue and its Lua scripts, against the real Redis.

Every call gets an explicit ``now`` (ms), so no test waits for time to pass.
"""

from __future__ import annotations

import base64
import json
import re
import threading
from collections import Counter
from collections.abc import Callable
from importlib import resources
from typing import Any

import pytest
import redis

from scrapy_retryqueue.queue.delayed import (
    SCRIPT_NAMES,
    SNIPPETS,
    RedisDelayedQueue,
    load_script_source,
)
from scrapy_retryqueue.queue.domains import DOMAIN_SCRIPT_NAMES
from scrapy_retryqueue.queue.envelope import Task, malformed_envelope, task_from_json
from scrapy_retryqueue.queue.frontier import FRONTIER_SCRIPT_NAMES
from scrapy_retryqueue.queue.keys import Keys, all_keys
from scrapy_retryqueue.settings.defaults import ENVELOPE_VERSION
from scrapy_retryqueue.values import as_text

MakeTask = Callable[..., Task]


@pytest.fixture(params=["single", "cluster"])
def redis_kind(request: pytest.FixtureRequest) -> str:
    """Every queue test runs on one server and on a three-master Redis Cluster."""
    return request.param


LEASE = 30_000


def events(client: redis.Redis, keys: Keys) -> list[dict[str, str]]:
    return [
        {as_text(k): as_text(v) for k, v in fields.items()}
        for _, fields in client.xrange(keys.events)
    ]


def hget(client: redis.Redis, key: str, field: str) -> str | None:
    raw = client.hget(key, field)
    return None if raw is None else as_text(raw)


def snapshot(client: redis.Redis, keys: Keys) -> dict[str, Any]:
    """Everything in one namespace, to show that a refused call changed nothing."""
    return {
        "due": client.zrange(keys.due, 0, -1, withscores=True),
        "leased": client.zrange(keys.leased, 0, -1, withscores=True),
        "tasks": client.hgetall(keys.tasks),
        "owners": client.hgetall(keys.owners),
        "reclaims": client.hgetall(keys.reclaims),
        "dead": client.zrange(keys.dead, 0, -1, withscores=True),
        "deadtasks": client.hgetall(keys.deadtasks),
        "events": client.xlen(keys.events),
    }


def where(client: redis.Redis, keys: Keys, task_id: str) -> set[str]:
    """The structures that hold *task_id*."""
    found = set()
    for name in ("due", "leased", "dead"):
        if client.zscore(getattr(keys, name), task_id) is not None:
            found.add(name)
    for name in ("tasks", "taskinfo", "owners", "reclaims", "deadtasks", "deadkinds"):
        if client.hexists(getattr(keys, name), task_id):
            found.add(name)
    return found


def claim_ids(queue: RedisDelayedQueue, **kwargs: Any) -> list[str]:
    return [task_id for task_id, _ in queue.claim(**kwargs).tasks]


# -- schedule -----------------------------------------------------------------


def test_schedule_parks_task_in_due_with_envelope_and_event(
    queue: RedisDelayedQueue, redis_client: redis.Redis, make_task: MakeTask
) -> None:
    task = make_task("a", url="https://example.com/x", kind="rate_limited", due=5_000)
    task.attempts = {"rate_limited": 3, "timeout": 1}

    assert queue.schedule(task, now=1_000) is True

    k = queue.keys
    assert redis_client.zscore(k.due, "a") == 5_000
    assert hget(redis_client, k.tasks, "a") == task.to_json()
    assert queue.get_task("a") == task.to_json()
    assert where(redis_client, k, "a") == {"due", "tasks", "taskinfo"}
    assert events(redis_client, k) == [
        {
            "type": "scheduled",
            "id": "a",
            "kind": "rate_limited",
            "attempt": "3",
            "due": "5000",
            "node": "node-a",
            "ts": "1000",
            "url": "https://example.com/x",
            # Signed only with RETRYQUEUE_SIGNING_KEYS (test_signing_queue.py).
            "sig": "",
        }
    ]


@pytest.mark.parametrize("state", ["due", "leased"])
def test_schedule_refuses_live_task_and_changes_nothing(
    queue: RedisDelayedQueue, redis_client: redis.Redis, make_task: MakeTask, state: str
) -> None:
    original = make_task("a", due=1_000)
    assert queue.schedule(original, now=0)
    if state == "leased":
        assert claim_ids(queue, now=1_000, limit=10, lease_until=9_000, token="t1") == ["a"]
    before = snapshot(redis_client, queue.keys)

    again = make_task("a", url="https://example.com/other", kind="server_error", due=2_000)
    assert queue.schedule(again, now=1_500) is False

    assert snapshot(redis_client, queue.keys) == before
    assert queue.get_task("a") == original.to_json()


def test_schedule_accepts_id_again_once_it_is_done(
    queue: RedisDelayedQueue, redis_client: redis.Redis, make_task: MakeTask
) -> None:
    assert queue.schedule(make_task("a", due=0), now=0)
    assert claim_ids(queue, now=0, limit=1, lease_until=LEASE, token="t") == ["a"]
    assert queue.ack("a", "t", now=10)

    second = make_task("a", kind="parse", due=500)
    assert queue.schedule(second, now=20) is True
    assert redis_client.zscore(queue.keys.due, "a") == 500
    assert queue.get_task("a") == second.to_json()


# -- claim --------------------------------------------------------------------


def test_claim_takes_due_tasks_in_due_order_up_to_limit(
    queue: RedisDelayedQueue, redis_client: redis.Redis, make_task: MakeTask
) -> None:
    dues = {"e": 500, "b": 200, "d": 400, "a": 100, "c": 300, "late": 10_000}
    tasks = {task_id: make_task(task_id, due=due) for task_id, due in dues.items()}
    for task in tasks.values():
        assert queue.schedule(task, now=0)

    claimed = queue.claim(now=400, limit=3, lease_until=400 + LEASE, token="tok")

    assert [task_id for task_id, _ in claimed.tasks] == ["a", "b", "c"]
    assert claimed.tasks == [(i, tasks[i].to_json()) for i in ("a", "b", "c")]
    assert [task_from_json(raw) for _, raw in claimed.tasks] == [tasks[i] for i in "abc"]
    assert (claimed.due, claimed.leased, claimed.next_due) == (3, 3, 400)

    k = queue.keys
    for task_id in "abc":
        assert redis_client.zscore(k.leased, task_id) == 400 + LEASE
        assert hget(redis_client, k.owners, task_id) == "tok"
        assert where(redis_client, k, task_id) == {"leased", "tasks", "taskinfo", "owners"}
    claimed_events = [e for e in events(redis_client, k) if e["type"] == "claimed"]
    # One event for the whole batch, listing its ids.
    assert claimed_events == [{"type": "claimed", "ids": "a b c", "node": "node-a", "ts": "400"}]

    # "d" is due exactly at now; "e" and "late" are not due yet.
    rest = queue.claim(now=400, limit=10, lease_until=400 + LEASE, token="tok2")
    assert [task_id for task_id, _ in rest.tasks] == ["d"]
    assert (rest.due, rest.leased, rest.next_due) == (2, 4, 500)
    assert redis_client.zscore(k.due, "e") == 500
    assert redis_client.zscore(k.due, "late") == 10_000


def test_claim_of_an_empty_queue_reports_no_next_due(queue: RedisDelayedQueue) -> None:
    claimed = queue.claim(now=1_000, limit=10, lease_until=LEASE, token="t")
    assert (claimed.tasks, claimed.due, claimed.leased, claimed.next_due) == ([], 0, 0, None)


def test_claim_with_limit_zero_only_reports_counts(
    queue: RedisDelayedQueue, redis_client: redis.Redis, make_task: MakeTask
) -> None:
    for i, due in enumerate((100, 200, 300)):
        assert queue.schedule(make_task(f"t{i}", due=due), now=0)
    assert claim_ids(queue, now=100, limit=1, lease_until=LEASE, token="t") == ["t0"]
    before = snapshot(redis_client, queue.keys)

    claimed = queue.claim(now=1_000, limit=0, lease_until=LEASE, token="t")

    assert (claimed.tasks, claimed.due, claimed.leased, claimed.next_due) == ([], 2, 1, 200)
    assert snapshot(redis_client, queue.keys) == before


# -- broken entries: one never harms another -------------------------------------

#: An envelope that is not UTF-8 text (a byte 0xff where JSON text must be).
NOT_UTF8 = b'{"v":1,"id":"bad","request":{"url":"https://example.com/\xff"}}'


def test_claim_hands_out_every_good_task_beside_an_envelope_that_is_not_utf8(
    queue: RedisDelayedQueue, redis_client: redis.Redis, make_task: MakeTask
) -> None:
    k = queue.keys
    good = {task_id: make_task(task_id, due=due) for task_id, due in (("a", 0), ("b", 2), ("c", 3))}
    for task in good.values():
        assert queue.schedule(task, now=0)
    redis_client.hset(k.tasks, "bad", NOT_UTF8)
    redis_client.zadd(k.due, {"bad": 1})

    claimed = queue.claim(now=10, limit=10, lease_until=10 + LEASE, token="tok")

    # The good tasks as text, in due order; the bad one as the bytes it was stored as.
    assert claimed.tasks == [
        ("a", good["a"].to_json()),
        ("bad", NOT_UTF8),
        ("b", good["b"].to_json()),
        ("c", good["c"].to_json()),
    ]
    assert (claimed.ghosts, claimed.ghosts_kept) == ([], [])
    # All four are leased: the caller dead-letters the bad one under its lease.
    assert {as_text(x) for x in redis_client.zrange(k.leased, 0, -1)} == {"a", "b", "c", "bad"}
    envelope = malformed_envelope("bad", NOT_UTF8, "not UTF-8", "node-a")
    assert queue.deadletter_raw("bad", envelope, "tok", now=20, kind="malformed", url="") is True
    kept = json.loads(hget(redis_client, k.deadtasks, "bad") or "")
    assert base64.b64decode(kept["raw_base64"]) == NOT_UTF8
    assert (kept["dead_kind"], kept["id"]) == ("malformed", "bad")
    assert where(redis_client, k, "bad") == {"dead", "deadtasks", "deadkinds"}
    for task_id in "abc":
        assert queue.ack(task_id, "tok", now=30) is True


def test_claim_dead_letters_a_ghost_and_reports_it(
    queue: RedisDelayedQueue, redis_client: redis.Redis, make_task: MakeTask
) -> None:
    k = queue.keys
    assert queue.schedule(make_task("a", due=0), now=0)
    assert queue.schedule(make_task("b", due=2), now=0)
    redis_client.zadd(k.due, {"ghost": 1})
    redis_client.hset(k.reclaims, "ghost", 2)

    claimed = queue.claim(now=50, limit=10, lease_until=50 + LEASE, token="tok")

    assert [task_id for task_id, _ in claimed.tasks] == ["a", "b"]
    assert (claimed.ghosts, claimed.ghosts_kept) == (["ghost"], [])
    assert (claimed.due, claimed.leased) == (0, 2)
    assert where(redis_client, k, "ghost") == {"dead", "deadtasks", "deadkinds"}
    assert redis_client.zscore(k.dead, "ghost") == 50
    doc = json.loads(hget(redis_client, k.deadtasks, "ghost") or "")
    assert doc["v"] == ENVELOPE_VERSION
    assert (doc["id"], doc["kind"], doc["dead_kind"], doc["node"]) == (
        "ghost", "malformed", "malformed", "node-a"
    )  # fmt: skip
    assert doc["last_error"]["type"] == "MissingEnvelope"
    assert "without an envelope" in doc["last_error"]["message"]
    assert (doc["created"], doc["due"]) == (50, 50)
    dead_events = [e for e in events(redis_client, k) if e["type"] == "dead"]
    assert dead_events == [
        {
            "type": "dead",
            "id": "ghost",
            "kind": "malformed",
            "node": "node-a",
            "ts": "50",
            "url": "",
        }
    ]
    # Only the good tasks are in the claim's event.
    claimed_events = [e for e in events(redis_client, k) if e["type"] == "claimed"]
    assert [e["ids"] for e in claimed_events] == ["a b"]


def test_a_ghost_never_overwrites_a_dead_letter_of_its_id(
    queue: RedisDelayedQueue, redis_client: redis.Redis, make_task: MakeTask
) -> None:
    k = queue.keys
    assert queue.deadletter(make_task("x", dead_kind="not_found"), None, now=5)
    before = hget(redis_client, k.deadtasks, "x")
    redis_client.zadd(k.due, {"x": 1})

    claimed = queue.claim(now=50, limit=10, lease_until=50 + LEASE, token="tok")

    assert (claimed.tasks, claimed.ghosts, claimed.ghosts_kept) == ([], [], ["x"])
    assert where(redis_client, k, "x") == {"dead", "deadtasks", "deadkinds"}
    assert hget(redis_client, k.deadtasks, "x") == before
    assert redis_client.zscore(k.dead, "x") == 5
    assert [e["type"] for e in events(redis_client, k)] == ["dead"]


def test_reap_returns_a_leased_ghost_to_due_where_the_claim_reports_it(
    queue: RedisDelayedQueue, redis_client: redis.Redis, make_task: MakeTask
) -> None:
    k = queue.keys
    assert queue.schedule(make_task("g", due=0), now=0)
    assert claim_ids(queue, now=0, limit=1, lease_until=100, token="t") == ["g"]
    redis_client.hdel(k.tasks, "g")  # its envelope lost while it was leased
    redis_client.hset(k.reclaims, "g", 1)

    assert queue.reap(now=100, limit=10, max_reclaims=3) == ([], [])
    assert where(redis_client, k, "g") == {"due"}
    claimed = queue.claim(now=100, limit=10, lease_until=100 + LEASE, token="t2")
    assert (claimed.tasks, claimed.ghosts) == ([], ["g"])
    assert where(redis_client, k, "g") == {"dead", "deadtasks", "deadkinds"}


def test_a_task_id_that_is_not_utf8_round_trips_and_harms_no_other_task(
    queue: RedisDelayedQueue, redis_client: redis.Redis, make_task: MakeTask
) -> None:
    k = queue.keys
    raw_id = b"id-\xff"
    assert queue.schedule(make_task("a", due=0), now=0)
    redis_client.hset(k.tasks, raw_id, make_task("odd").to_json())
    redis_client.zadd(k.due, {raw_id: 1})

    claimed = queue.claim(now=10, limit=10, lease_until=10 + LEASE, token="tok")

    ids = [task_id for task_id, _ in claimed.tasks]
    assert ids[0] == "a" and len(ids) == 2
    odd = ids[1]
    assert odd.encode("utf-8", "surrogateescape") == raw_id
    # Writes under that id reach the entry it was read from.
    assert queue.renew({odd: "tok"}, lease_until=20 + LEASE) == []
    assert redis_client.zscore(k.leased, raw_id) == 20 + LEASE
    envelope = malformed_envelope(odd, "x", "odd id", "node-a")
    assert queue.deadletter_raw(odd, envelope, "tok", now=20, kind="malformed", url="")
    assert redis_client.zscore(k.dead, raw_id) == 20
    assert redis_client.zscore(k.leased, raw_id) is None
    assert queue.ack("a", "tok", now=30) is True


def test_two_nodes_claiming_in_turn_never_share_a_task(
    redis_client: redis.Redis, spider_name: str, make_task: MakeTask
) -> None:
    node_a = RedisDelayedQueue(redis_client, spider_name, node_id="node-a")
    node_b = RedisDelayedQueue(redis_client, spider_name, node_id="node-b")
    ids = [f"task-{i:03d}" for i in range(100)]
    for i, task_id in enumerate(ids):
        assert node_a.schedule(make_task(task_id, due=i), now=0)

    got: dict[str, list[str]] = {"a": [], "b": []}
    tokens = {"a": "token-a", "b": "token-b"}
    turn = 0
    while True:
        name, node = (("a", node_a), ("b", node_b))[turn % 2]
        batch = claim_ids(node, now=1_000, limit=7, lease_until=1_000 + LEASE, token=tokens[name])
        got[name] += batch
        turn += 1
        if not batch and turn > 2:
            break

    assert got["a"] and got["b"]
    assert not set(got["a"]) & set(got["b"])
    assert sorted(got["a"] + got["b"]) == ids
    owners = {as_text(k): as_text(v) for k, v in redis_client.hgetall(node_a.keys.owners).items()}
    assert owners == {i: "token-a" for i in got["a"]} | {i: "token-b" for i in got["b"]}
    assert node_a.counts(now=1_000).leased == 100


def test_concurrent_claims_from_threads_never_hand_out_a_task_twice(
    redis_client: redis.Redis,
    new_redis_client: Callable[[], Any],
    spider_name: str,
    make_task: MakeTask,
) -> None:
    ids = {f"task-{i:03d}" for i in range(500)}
    producer = RedisDelayedQueue(redis_client, spider_name, node_id="producer")
    for i, task_id in enumerate(sorted(ids)):
        assert producer.schedule(make_task(task_id, due=i % 50), now=0)

    workers = 4
    start = threading.Barrier(workers)
    results: list[list[str]] = [[] for _ in range(workers)]
    errors: list[BaseException] = []

    def claim_all(n: int) -> None:
        client = new_redis_client()
        try:
            node = RedisDelayedQueue(client, spider_name, node_id=f"node-{n}")
            start.wait(timeout=10)
            while batch := claim_ids(
                node, now=1_000, limit=5, lease_until=1_000 + LEASE, token=f"token-{n}"
            ):
                results[n] += batch
        except BaseException as exc:
            errors.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=claim_all, args=(n,)) for n in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    assert not any(thread.is_alive() for thread in threads)

    every = [task_id for batch in results for task_id in batch]
    duplicates = [task_id for task_id, n in Counter(every).items() if n > 1]
    assert duplicates == []
    assert set(every) == ids
    assert len(every) == len(ids)
    counts = producer.counts(now=1_000)
    assert (counts.due, counts.leased) == (0, 500)


# -- renew --------------------------------------------------------------------


def test_renew_extends_only_leases_held_with_their_token(
    queue: RedisDelayedQueue, redis_client: redis.Redis, make_task: MakeTask
) -> None:
    for task_id in ("a", "b", "c"):
        assert queue.schedule(make_task(task_id, due=0), now=0)
    assert claim_ids(queue, now=0, limit=2, lease_until=1_000, token="mine") == ["a", "b"]

    lost = queue.renew(
        {"a": "mine", "b": "theirs", "c": "mine", "ghost": "mine"}, lease_until=9_000
    )

    assert sorted(lost) == ["b", "c", "ghost"]
    k = queue.keys
    assert redis_client.zscore(k.leased, "a") == 9_000
    assert redis_client.zscore(k.leased, "b") == 1_000
    assert redis_client.zscore(k.leased, "c") is None
    assert redis_client.zscore(k.leased, "ghost") is None
    assert redis_client.zscore(k.due, "c") == 0
    assert queue.renew({}, lease_until=9_000) == []


def test_renew_reports_reaped_lease_as_lost(
    queue: RedisDelayedQueue, redis_client: redis.Redis, make_task: MakeTask
) -> None:
    assert queue.schedule(make_task("a", due=0), now=0)
    assert claim_ids(queue, now=0, limit=1, lease_until=1_000, token="mine") == ["a"]
    assert queue.reap(now=1_000, limit=10, max_reclaims=5) == (["a"], [])

    assert queue.renew({"a": "mine"}, lease_until=9_000) == ["a"]
    assert redis_client.zscore(queue.keys.leased, "a") is None
    assert redis_client.zscore(queue.keys.due, "a") == 1_000


# -- ack ----------------------------------------------------------------------


def test_ack_removes_task_everywhere_and_records_success(
    queue: RedisDelayedQueue, redis_client: redis.Redis, make_task: MakeTask
) -> None:
    assert queue.schedule(make_task("a", due=0), now=0)
    assert claim_ids(queue, now=0, limit=1, lease_until=100, token="t1") == ["a"]
    queue.reap(now=100, limit=10, max_reclaims=5)  # leaves a reclaim count behind
    assert claim_ids(queue, now=200, limit=1, lease_until=300, token="t2") == ["a"]
    assert where(redis_client, queue.keys, "a") == {
        "leased",
        "tasks",
        "taskinfo",
        "owners",
        "reclaims",
    }

    assert queue.ack("a", "t2", now=250, kind="timeout", url="https://Example.com:8080/a") is True

    assert where(redis_client, queue.keys, "a") == set()
    assert events(redis_client, queue.keys)[-1] == {
        "type": "succeeded",
        "id": "a",
        "kind": "timeout",
        "node": "node-a",
        "ts": "250",
        "url": "https://Example.com:8080/a",
        # Not known: nobody said when the task was created.
        "wait": "",
        "domain": "example.com",
        "sig": "",
    }


def test_the_succeeded_event_says_how_long_the_task_took_to_recover(
    queue: RedisDelayedQueue, redis_client: redis.Redis, make_task: MakeTask
) -> None:
    assert queue.schedule(make_task("a", due=0, created=1_000), now=1_000)
    assert claim_ids(queue, now=2_000, limit=1, lease_until=9_000, token="t") == ["a"]
    url = "http://user@[::1]:8080/a"
    assert queue.ack("a", "t", now=61_000, kind="timeout", url=url, created=1_000) is True
    last = events(redis_client, queue.keys)[-1]
    assert (last["type"], last["wait"], last["domain"]) == ("succeeded", "60000", "::1")
    # Acknowledging twice is refused: the lease is gone.
    assert queue.ack("a", "t2", now=260) is False


@pytest.mark.parametrize("token", ["wrong", ""])
def test_ack_with_wrong_token_is_refused(
    queue: RedisDelayedQueue, redis_client: redis.Redis, make_task: MakeTask, token: str
) -> None:
    assert queue.schedule(make_task("a", due=0), now=0)
    assert claim_ids(queue, now=0, limit=1, lease_until=LEASE, token="right") == ["a"]
    before = snapshot(redis_client, queue.keys)

    assert queue.ack("a", token, now=10) is False
    assert snapshot(redis_client, queue.keys) == before


def test_ack_of_a_due_task_is_refused(
    queue: RedisDelayedQueue, redis_client: redis.Redis, make_task: MakeTask
) -> None:
    assert queue.schedule(make_task("a", due=0), now=0)
    before = snapshot(redis_client, queue.keys)
    assert queue.ack("a", "", now=10) is False
    assert snapshot(redis_client, queue.keys) == before


def test_ack_after_lease_expired_and_another_node_claimed_is_refused(
    redis_client: redis.Redis, spider_name: str, make_task: MakeTask
) -> None:
    node_a = RedisDelayedQueue(redis_client, spider_name, node_id="node-a")
    node_b = RedisDelayedQueue(redis_client, spider_name, node_id="node-b")
    task = make_task("a", due=0)
    assert node_a.schedule(task, now=0)
    assert claim_ids(node_a, now=0, limit=1, lease_until=1_000, token="token-a") == ["a"]
    # Node A stalls; its lease expires and is reaped, and node B takes the task.
    assert node_b.reap(now=1_001, limit=10, max_reclaims=5) == (["a"], [])
    assert claim_ids(node_b, now=1_001, limit=1, lease_until=5_000, token="token-b") == ["a"]
    before = snapshot(redis_client, node_a.keys)

    assert node_a.ack("a", "token-a", now=1_500) is False
    assert snapshot(redis_client, node_a.keys) == before
    assert hget(redis_client, node_a.keys.owners, "a") == "token-b"

    assert node_b.ack("a", "token-b", now=1_600) is True
    assert where(redis_client, node_a.keys, "a") == set()
    succeeded = [e for e in events(redis_client, node_a.keys) if e["type"] == "succeeded"]
    assert [(e["id"], e["node"]) for e in succeeded] == [("a", "node-b")]


# -- reschedule ---------------------------------------------------------------


def test_reschedule_moves_leased_task_back_to_due_with_new_envelope(
    queue: RedisDelayedQueue, redis_client: redis.Redis, make_task: MakeTask
) -> None:
    first = make_task("a", due=0)
    assert queue.schedule(first, now=0)
    assert claim_ids(queue, now=0, limit=1, lease_until=100, token="t1") == ["a"]
    queue.reap(now=100, limit=10, max_reclaims=5)
    assert claim_ids(queue, now=100, limit=1, lease_until=LEASE, token="t2") == ["a"]
    assert hget(redis_client, queue.keys.reclaims, "a") == "1"

    second = make_task(
        "a", kind="server_error", due=60_000, attempts={"timeout": 1, "server_error": 2}
    )
    assert queue.reschedule(second, "t2", now=200) is True

    k = queue.keys
    assert where(redis_client, k, "a") == {"due", "tasks", "taskinfo"}
    assert redis_client.zscore(k.due, "a") == 60_000
    assert queue.get_task("a") == second.to_json()
    assert events(redis_client, k)[-1] == {
        "type": "scheduled",
        "id": "a",
        "kind": "server_error",
        "attempt": "2",
        "due": "60000",
        "node": "node-a",
        "ts": "200",
        "url": "https://example.com/a",
        "sig": "",
    }
    # Not due before its new time.
    assert claim_ids(queue, now=59_999, limit=10, lease_until=LEASE, token="t3") == []


def test_reschedule_with_stale_token_changes_nothing(
    queue: RedisDelayedQueue, redis_client: redis.Redis, make_task: MakeTask
) -> None:
    original = make_task("a", due=0)
    assert queue.schedule(original, now=0)
    assert claim_ids(queue, now=0, limit=1, lease_until=LEASE, token="right") == ["a"]
    before = snapshot(redis_client, queue.keys)

    assert queue.reschedule(make_task("a", due=9_999), "stale", now=10) is False

    assert snapshot(redis_client, queue.keys) == before
    assert queue.get_task("a") == original.to_json()


# -- deadletter ---------------------------------------------------------------


def test_deadletter_of_a_leased_task_with_its_token(
    queue: RedisDelayedQueue, redis_client: redis.Redis, make_task: MakeTask
) -> None:
    assert queue.schedule(make_task("a", due=0), now=0)
    assert claim_ids(queue, now=0, limit=1, lease_until=100, token="t1") == ["a"]
    queue.reap(now=100, limit=10, max_reclaims=5)
    assert claim_ids(queue, now=100, limit=1, lease_until=LEASE, token="t2") == ["a"]
    dead = make_task("a", kind="server_error", dead_kind="not_found", url="https://example.com/d")

    assert queue.deadletter(dead, "t2", now=5_000) is True

    k = queue.keys
    assert where(redis_client, k, "a") == {"dead", "deadtasks", "deadkinds"}
    assert redis_client.zscore(k.dead, "a") == 5_000
    assert task_from_json(hget(redis_client, k.deadtasks, "a") or "") == dead
    assert events(redis_client, k)[-1] == {
        "type": "dead",
        "id": "a",
        "kind": "not_found",
        "node": "node-a",
        "ts": "5000",
        "url": "https://example.com/d",
        "sig": "",
    }


def test_deadletter_with_stale_token_changes_nothing(
    queue: RedisDelayedQueue, redis_client: redis.Redis, make_task: MakeTask
) -> None:
    assert queue.schedule(make_task("a", due=0), now=0)
    assert claim_ids(queue, now=0, limit=1, lease_until=LEASE, token="right") == ["a"]
    before = snapshot(redis_client, queue.keys)
    assert queue.deadletter(make_task("a", kind="parse"), "stale", now=10) is False
    assert snapshot(redis_client, queue.keys) == before


def test_deadletter_without_token_for_a_request_never_parked(
    queue: RedisDelayedQueue, redis_client: redis.Redis, make_task: MakeTask
) -> None:
    dead = make_task("fresh", kind="forbidden", dead_kind="forbidden")

    assert queue.deadletter(dead, None, now=700) is True

    k = queue.keys
    assert where(redis_client, k, "fresh") == {"dead", "deadtasks", "deadkinds"}
    assert redis_client.zscore(k.dead, "fresh") == 700
    assert hget(redis_client, k.deadtasks, "fresh") == dead.to_json()
    event = events(redis_client, k)[-1]
    assert (event["type"], event["id"], event["kind"]) == ("dead", "fresh", "forbidden")


@pytest.mark.parametrize("state", ["due", "leased"])
def test_deadletter_without_token_refused_while_task_is_live(
    queue: RedisDelayedQueue, redis_client: redis.Redis, make_task: MakeTask, state: str
) -> None:
    assert queue.schedule(make_task("a", due=0), now=0)
    if state == "leased":
        assert claim_ids(queue, now=0, limit=1, lease_until=LEASE, token="t") == ["a"]
    before = snapshot(redis_client, queue.keys)

    assert queue.deadletter(make_task("a", dead_kind="rule"), None, now=10) is False
    assert snapshot(redis_client, queue.keys) == before


def test_deadletter_raw_keeps_malformed_text_as_is(
    queue: RedisDelayedQueue, redis_client: redis.Redis
) -> None:
    raw = '{"v": 1, "id": "m", not json \u00e9 {{'
    assert queue.deadletter_raw("m", raw, None, now=42, kind="malformed", url="") is True

    assert hget(redis_client, queue.keys.deadtasks, "m") == raw
    assert queue.dead_letters() == [("m", raw)]
    event = events(redis_client, queue.keys)[-1]
    assert (event["type"], event["kind"], event["url"]) == ("dead", "malformed", "")


# -- reap ---------------------------------------------------------------------


def test_reap_returns_expired_leases_to_due_now(
    queue: RedisDelayedQueue, redis_client: redis.Redis, make_task: MakeTask
) -> None:
    for task_id in ("a", "b", "c"):
        assert queue.schedule(make_task(task_id, due=0), now=0)
    assert claim_ids(queue, now=0, limit=1, lease_until=1_000, token="t") == ["a"]
    assert claim_ids(queue, now=0, limit=1, lease_until=2_000, token="t") == ["b"]
    assert claim_ids(queue, now=0, limit=1, lease_until=3_000, token="t") == ["c"]

    assert queue.reap(now=999, limit=10, max_reclaims=3) == ([], [])
    assert queue.reap(now=2_000, limit=10, max_reclaims=3) == (["a", "b"], [])

    k = queue.keys
    for task_id in ("a", "b"):
        assert where(redis_client, k, task_id) == {"due", "tasks", "taskinfo", "reclaims"}
        assert redis_client.zscore(k.due, task_id) == 2_000
        assert hget(redis_client, k.reclaims, task_id) == "1"
    assert redis_client.zscore(k.leased, "c") == 3_000
    assert hget(redis_client, k.owners, "c") == "t"
    assert [e for e in events(redis_client, k) if e["type"] == "reclaimed"] == [
        {"type": "reclaimed", "id": task_id, "reclaims": "1", "node": "node-a", "ts": "2000"}
        for task_id in ("a", "b")
    ]
    # Reclaimed tasks are due at once.
    assert claim_ids(queue, now=2_000, limit=10, lease_until=9_000, token="t2") == ["a", "b"]


def test_reap_takes_at_most_limit_oldest_leases_first(
    queue: RedisDelayedQueue, make_task: MakeTask
) -> None:
    for i in range(5):
        assert queue.schedule(make_task(f"t{i}", due=0), now=0)
        assert claim_ids(queue, now=0, limit=1, lease_until=500 - i * 100, token="t") == [f"t{i}"]

    assert queue.reap(now=1_000, limit=2, max_reclaims=3) == (["t4", "t3"], [])
    assert queue.counts(now=1_000).leased == 3


def test_reap_counts_reclaims_and_dead_letters_poison(
    queue: RedisDelayedQueue, redis_client: redis.Redis, make_task: MakeTask
) -> None:
    task = make_task("p", kind="timeout", due=0, attempts={"timeout": 2}, created=5, updated=6)
    assert queue.schedule(task, now=0)
    k = queue.keys
    max_reclaims = 2

    now = 0
    for expiry in range(1, max_reclaims + 1):
        assert claim_ids(queue, now=now, limit=1, lease_until=now + 100, token=f"t{expiry}") == [
            "p"
        ]
        now += 100
        assert queue.reap(now=now, limit=10, max_reclaims=max_reclaims) == (["p"], [])
        assert hget(redis_client, k.reclaims, "p") == str(expiry)

    assert claim_ids(queue, now=now, limit=1, lease_until=now + 100, token="last") == ["p"]
    assert queue.reap(now=now + 100, limit=10, max_reclaims=max_reclaims) == ([], ["p"])

    assert where(redis_client, k, "p") == {"dead", "deadtasks", "deadkinds"}
    assert redis_client.zscore(k.dead, "p") == now + 100
    raw = hget(redis_client, k.deadtasks, "p")
    assert raw is not None
    # The envelope as it was (no script edits its JSON); the kind it died of beside it.
    assert task_from_json(raw) == task
    assert hget(redis_client, k.deadkinds, "p") == "poison"
    assert events(redis_client, k)[-1] == {
        "type": "dead",
        "id": "p",
        "kind": "poison",
        "reclaims": str(max_reclaims + 1),
        "node": queue.node_id,
        "ts": str(now + 100),
    }
    assert queue.dead_letters() == [("p", raw)]


def test_reap_mixes_reclaimed_and_poisoned(
    queue: RedisDelayedQueue, redis_client: redis.Redis, make_task: MakeTask
) -> None:
    for task_id in ("fresh", "poison"):
        assert queue.schedule(make_task(task_id, due=0), now=0)
    redis_client.hset(queue.keys.reclaims, "poison", 1)
    assert claim_ids(queue, now=0, limit=2, lease_until=100, token="t") == ["fresh", "poison"]

    assert queue.reap(now=100, limit=10, max_reclaims=1) == (["fresh"], ["poison"])


# -- release ------------------------------------------------------------------


def test_release_hands_back_held_tasks_at_once(
    queue: RedisDelayedQueue, redis_client: redis.Redis, make_task: MakeTask
) -> None:
    for task_id in ("a", "b", "c", "d"):
        assert queue.schedule(make_task(task_id, due=0), now=0)
    assert claim_ids(queue, now=0, limit=3, lease_until=LEASE, token="mine") == ["a", "b", "c"]

    released = queue.release({"a": "mine", "b": "other", "c": "mine", "d": "mine"}, now=500)

    assert released == 2
    k = queue.keys
    for task_id in ("a", "c"):
        assert where(redis_client, k, task_id) == {"due", "tasks", "taskinfo"}
        assert redis_client.zscore(k.due, task_id) == 500
    assert redis_client.zscore(k.leased, "b") == LEASE
    assert hget(redis_client, k.owners, "b") == "mine"
    assert redis_client.zscore(k.due, "d") == 0
    assert [e for e in events(redis_client, k) if e["type"] == "released"] == [
        {"type": "released", "id": task_id, "node": "node-a", "ts": "500"} for task_id in "ac"
    ]
    assert queue.release({}, now=500) == 0


def test_unclaim_hands_back_what_a_lost_claim_leased_and_counts_no_reclaim(
    queue: RedisDelayedQueue, redis_client: redis.Redis, make_task: MakeTask
) -> None:
    for task_id in ("a", "b", "c", "d"):
        assert queue.schedule(make_task(task_id, due=0), now=0)
    # A poll's claim ran, and its reply was lost: the node holds none of these.
    assert claim_ids(queue, now=0, limit=2, lease_until=LEASE, token="node-a:7") == ["a", "b"]
    assert claim_ids(queue, now=0, limit=1, lease_until=LEASE, token="node-b:1") == ["c"]

    back = queue.unclaim(["node-a:7", "node-a:8"], now=500)

    assert sorted(back) == ["a", "b"]
    k = queue.keys
    for task_id in ("a", "b"):
        assert where(redis_client, k, task_id) == {"due", "tasks", "taskinfo"}
        assert redis_client.zscore(k.due, task_id) == 500
        assert redis_client.hget(k.reclaims, task_id) is None
    assert hget(redis_client, k.owners, "c") == "node-b:1"  # another claim's: untouched
    released = [e for e in events(redis_client, k) if e["type"] == "released"]
    assert sorted(e["id"] for e in released) == ["a", "b"]
    assert queue.unclaim(["node-a:7"], now=600) == []  # settled: nothing more
    assert queue.unclaim([], now=600) == []


def test_a_poll_whose_reply_was_lost_has_its_claim_handed_back_by_the_next(
    queue: RedisDelayedQueue, redis_client: redis.Redis, make_task: MakeTask
) -> None:
    from scrapy.settings import Settings

    from scrapy_retryqueue.config import load_config
    from scrapy_retryqueue.runtime.leases import Leases

    for task_id in ("a", "b", "c"):
        assert queue.schedule(make_task(task_id, due=0), now=0)
    leases = Leases(load_config(Settings({"RETRYQUEUE_NODE_ID": "node-a"})))
    heartbeat = queue.heartbeat

    def lost(**kwargs: Any) -> Any:
        raise redis.TimeoutError("Timeout reading from socket")

    queue.heartbeat = lost  # type: ignore[method-assign]  # after the claim ran
    io, token = leases.poll_io(queue, None, last_busy=0)
    with pytest.raises(redis.TimeoutError):
        io()
    assert redis_client.zcard(queue.keys.leased) == 3  # leased under a token nobody holds
    leases.doubt(token)  # what the runtime does with an outage (test_facade.py)

    queue.heartbeat = heartbeat  # type: ignore[method-assign]
    io, next_token = leases.poll_io(queue, None, last_busy=0)
    result = io()
    leases.settle(result.settled)

    assert sorted(result.unclaimed) == ["a", "b", "c"]
    assert sorted(task_id for task_id, _ in result.claimed.tasks) == ["a", "b", "c"]
    assert {hget(redis_client, queue.keys.owners, t) for t in "abc"} == {next_token}
    assert result.reclaimed == [] and redis_client.hlen(queue.keys.reclaims) == 0
    assert leases.doubtful == set()


def test_a_node_that_stalled_past_its_lease_keeps_the_task_nobody_took(
    queue: RedisDelayedQueue, redis_client: redis.Redis, make_task: MakeTask
) -> None:
    from scrapy.settings import Settings

    from scrapy_retryqueue.config import load_config
    from scrapy_retryqueue.runtime.leases import Leases
    from scrapy_retryqueue.values import now_ms

    assert queue.schedule(make_task("a", due=0), now=0)
    leases = Leases(load_config(Settings({"RETRYQUEUE_NODE_ID": "node-a"})))
    # Claimed, then the node stalled: its lease ran out and no other node polled.
    expired = now_ms() - 1000
    assert claim_ids(queue, now=0, limit=1, lease_until=expired, token="node-a:0") == ["a"]
    leases.hold("a", "node-a:0")

    io, _ = leases.poll_io(queue, None, last_busy=0)
    result = io()

    # Renewed before the reap: not reclaimed, not claimed a second time, still its own.
    assert (result.reclaimed, result.lost, result.claimed.tasks) == ([], [], [])
    assert hget(redis_client, queue.keys.owners, "a") == "node-a:0"
    assert redis_client.zscore(queue.keys.leased, "a") > now_ms()
    assert redis_client.hget(queue.keys.reclaims, "a") is None


def test_a_poll_held_up_past_a_third_of_the_lease_renews_before_it_reaps(
    queue: RedisDelayedQueue,
    redis_client: redis.Redis,
    make_task: MakeTask,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import time

    from scrapy.settings import Settings

    from scrapy_retryqueue.config import load_config
    from scrapy_retryqueue.runtime import leases as leases_module
    from scrapy_retryqueue.runtime import renewal
    from scrapy_retryqueue.runtime.leases import Leases

    assert queue.schedule(make_task("a", due=0), now=0)
    leases = Leases(load_config(Settings({"RETRYQUEUE_LEASE_TIME": 3})))
    start = leases_module.now_ms()
    assert claim_ids(queue, now=0, limit=1, lease_until=start + 500, token="node-a:0") == ["a"]
    leases.hold("a", "node-a:0")
    leases._renewal.last = time.time()  # renewed a moment ago: no renewal due

    # Made, then the process froze past the lease before the worker ran it.
    clock = [start]
    monkeypatch.setattr(leases_module, "now_ms", lambda: clock[0])
    monkeypatch.setattr(renewal, "now_ms", lambda: clock[0])
    io, _ = leases.poll_io(queue, None, last_busy=0)
    clock[0] = start + 1500
    result = io()

    assert (result.reclaimed, result.lost, result.claimed.tasks) == ([], [], [])
    assert hget(redis_client, queue.keys.owners, "a") == "node-a:0"
    assert redis_client.zscore(queue.keys.leased, "a") == start + 1500 + 3000


def test_a_task_whose_last_write_waits_behind_a_poll_is_renewed_not_reaped(
    queue: RedisDelayedQueue, redis_client: redis.Redis, make_task: MakeTask
) -> None:
    from scrapy.settings import Settings
    from twisted.internet.defer import Deferred

    from scrapy_retryqueue.config import load_config
    from scrapy_retryqueue.queue.delayed import Write
    from scrapy_retryqueue.runtime.leases import Leases
    from scrapy_retryqueue.values import now_ms

    assert queue.schedule(make_task("a", due=0), now=0)
    leases = Leases(load_config(Settings({"RETRYQUEUE_NODE_ID": "node-a"})))
    expired = now_ms() - 1000  # the node stalled past the lease
    assert claim_ids(queue, now=0, limit=1, lease_until=expired, token="node-a:0") == ["a"]
    leases.hold("a", "node-a:0")
    # The page succeeded: its ack is submitted, and waits behind the poll below.
    ack_landed: Deferred[None] = Deferred()
    leases.written_by("a", ack_landed)
    assert leases.room == leases.config.max_in_flight

    io, _ = leases.poll_io(queue, None, last_busy=0)
    result = io()
    assert (result.reclaimed, result.lost, result.claimed.tasks) == ([], [], [])
    assert hget(redis_client, queue.keys.owners, "a") == "node-a:0"

    # The ack then lands under the lease it was written with.
    assert queue.apply([Write("ack", "a", now_ms(), "node-a:0", kind="timeout")]) == [True]
    ack_landed.callback(None)
    assert leases.writing == {} and where(redis_client, queue.keys, "a") == set()
    # A renewal that finds it gone now is no lost lease of this node's.
    assert leases.lost(["a"]) == []


def test_a_projects_queue_probes_and_unclaims_its_own_keys_after_adopting_the_old_layout(
    queue: RedisDelayedQueue, redis_client: redis.Redis, make_task: MakeTask
) -> None:
    # On a cluster too: both layouts of a spider share its slot, and every call of
    # the project's queue (the probe, a lost claim handed back) goes to that slot.
    assert queue.schedule(make_task("a", due=0), now=0)  # before namespaces
    project = RedisDelayedQueue(redis_client, queue.keys.spider, node_id="node-a", project="p")
    try:
        assert project.keys.due.startswith("retryqueue:p:{")
        assert project.adopt_unnamespaced() > 0
        project.probe()
        assert redis_client.exists(project.keys.due) and not redis_client.exists(queue.keys.due)
        assert claim_ids(project, now=0, limit=1, lease_until=LEASE, token="node-a:1") == ["a"]
        assert project.unclaim(["node-a:1"], now=5) == ["a"]
        assert where(redis_client, project.keys, "a") == {"due", "tasks", "taskinfo"}
        released = [e for e in events(redis_client, project.keys) if e["type"] == "released"]
        assert [e["id"] for e in released] == ["a"]
    finally:
        redis_client.delete(*all_keys(project.keys))


# -- counts, dead_letters, clear ----------------------------------------------


def test_counts(queue: RedisDelayedQueue, make_task: MakeTask) -> None:
    empty = queue.counts(now=0)
    assert (empty.due, empty.due_now, empty.leased, empty.dead, empty.next_due) == (
        0,
        0,
        0,
        0,
        None,
    )
    for task_id, due in (("a", 100), ("b", 200), ("c", 300), ("d", 400)):
        assert queue.schedule(make_task(task_id, due=due), now=0)
    assert claim_ids(queue, now=100, limit=1, lease_until=LEASE, token="t") == ["a"]
    assert queue.deadletter(make_task("x", dead_kind="rule"), None, now=0)

    counts = queue.counts(now=300)
    assert (counts.due, counts.due_now, counts.leased, counts.dead, counts.next_due) == (
        3,
        2,
        1,
        1,
        200,
    )


def test_dead_letters_oldest_first_with_limit(
    queue: RedisDelayedQueue, make_task: MakeTask
) -> None:
    tasks = {i: make_task(i, dead_kind="rule") for i in ("late", "early", "middle")}
    for task_id, now in (("late", 300), ("early", 100), ("middle", 200)):
        assert queue.deadletter(tasks[task_id], None, now=now)

    assert queue.dead_letters() == [(i, tasks[i].to_json()) for i in ("early", "middle", "late")]
    assert queue.dead_letters(limit=2) == [(i, tasks[i].to_json()) for i in ("early", "middle")]
    assert queue.dead_letters(limit=0) == []


def clear(queue: RedisDelayedQueue) -> None:
    """Delete every key of the queue's namespace."""
    queue.client.delete(*all_keys(queue.keys))


def test_clear_deletes_the_namespace_only(
    queue: RedisDelayedQueue, redis_client: redis.Redis, make_task: MakeTask
) -> None:
    other = RedisDelayedQueue(redis_client, queue.keys.spider + "x", node_id="node-a")
    try:
        assert queue.schedule(make_task("a", due=0), now=0)
        assert queue.schedule(make_task("b", due=0), now=0)
        assert claim_ids(queue, now=0, limit=1, lease_until=100, token="t") == ["a"]
        queue.reap(now=100, limit=1, max_reclaims=5)
        assert queue.deadletter(make_task("c", dead_kind="rule"), None, now=0)
        assert other.schedule(make_task("a", due=0), now=0)
        assert redis_client.exists(*all_keys(queue.keys)) >= 6

        clear(queue)

        assert redis_client.exists(*all_keys(queue.keys)) == 0
        assert other.counts(now=0).due == 1
    finally:
        clear(other)


def test_events_stream_is_trimmed_near_maxlen(
    redis_client: redis.Redis, spider_name: str, make_task: MakeTask
) -> None:
    queue = RedisDelayedQueue(redis_client, spider_name, node_id="node-a", events_maxlen=100)
    for i in range(1_000):
        assert queue.schedule(make_task(f"t{i}", due=0), now=i)

    length = redis_client.xlen(queue.keys.events)
    assert 100 <= length < 400
    last = events(redis_client, queue.keys)[-1]
    assert (last["id"], last["ts"]) == ("t999", "999")


# -- the scripts themselves ---------------------------------------------------

_HEADER_REF = re.compile(r"^--\s+(KEYS|ARGV)\[(\d+)(\.\.)?\]\s*(\w*)", re.MULTILINE)
_BODY_REF = re.compile(r"\b(KEYS|ARGV)\[(\d+)\]")
_CALL = re.compile(r"redis\.p?call\(")
# KEYS[i] too: a script over a variable list of keys (adopt.lua) indexes it.
_CALL_ON_KEY = re.compile(r"redis\.p?call\(\s*'([A-Za-z]+)'\s*,\s*KEYS\[[^\]]+\]\s*[,)]")


def _blocks(source: str) -> tuple[str, str]:
    """(header, body) of a Lua file: the leading comment block, then the code."""
    lines = source.splitlines()
    n = next(i for i, line in enumerate(lines) if not line.startswith("--"))
    return "\n".join(lines[:n]), "\n".join(lines[n:])


def _lua(path: str) -> str:
    return resources.files("scrapy_retryqueue.queue").joinpath("lua", path).read_text("utf-8")


def _script(name: str) -> tuple[str, str]:
    """(header, body) of the script *name* as Redis runs it: the header of
    ``lua/<name>.lua``, then the code of the snippets prepended to it
    (``lua/lib/``, :data:`SNIPPETS`) and its own."""
    header, body = _blocks(_lua(f"{name}.lua"))
    assert load_script_source(name).endswith(_lua(f"{name}.lua"))
    snippets = [_blocks(_lua(f"lib/{snippet}.lua"))[1] for snippet in SNIPPETS.get(name, ())]
    return header, "\n".join([*snippets, body])


#: A snippet function's first parameter is the one key it touches, passed by its caller.
_SNIPPET_KEY = re.compile(r"^local function (\w+)\((\w+)\s*,", re.M)


def _snippet_keys(name: str) -> dict[str, str]:
    """{function: its key parameter} of the snippets prepended to script *name*."""
    found: dict[str, str] = {}
    for snippet in SNIPPETS.get(name, ()):
        found.update(_SNIPPET_KEY.findall(_lua(f"lib/{snippet}.lua")))
    return found


def test_every_script_is_loaded_by_the_queue() -> None:
    lua = resources.files("scrapy_retryqueue.queue").joinpath("lua")
    files = {p.name.removesuffix(".lua") for p in lua.iterdir() if p.name.endswith(".lua")}
    assert files == set(SCRIPT_NAMES) | set(DOMAIN_SCRIPT_NAMES) | set(FRONTIER_SCRIPT_NAMES)
    snippets = {p.name.removesuffix(".lua") for p in lua.joinpath("lib").iterdir()}
    assert snippets == {s for used in SNIPPETS.values() for s in used}


@pytest.mark.parametrize("snippet", sorted({s for used in SNIPPETS.values() for s in used}))
def test_a_snippet_documents_itself_and_numbers_no_keys_or_argv(snippet: str) -> None:
    header, body = _blocks(_lua(f"lib/{snippet}.lua"))
    assert re.search(r"^-- Returns ", header, re.MULTILINE), f"lib/{snippet}.lua: no 'Returns'"
    # Its callers number their KEYS and ARGV each their own way: it takes what it needs.
    assert not _BODY_REF.findall(body), f"lib/{snippet}.lua indexes KEYS or ARGV itself"
    assert "no KEYS or ARGV of its own" in header
    functions = dict(_SNIPPET_KEY.findall(body))
    assert functions, f"lib/{snippet}.lua defines no function over a key"
    for function, key in functions.items():
        assert re.search(rf"^--\s+{function}\({key},", header, re.M), f"{function} undocumented"


#: Every script once (the frontier reuses renew.lua).
ALL_SCRIPTS = sorted(set(SCRIPT_NAMES + DOMAIN_SCRIPT_NAMES + FRONTIER_SCRIPT_NAMES))


@pytest.mark.parametrize("name", ALL_SCRIPTS)
def test_script_header_documents_keys_argv_and_returns(name: str) -> None:
    header, body = _script(name)
    assert re.search(r"^-- Returns ", header, re.MULTILINE), f"{name}.lua: no 'Returns' line"

    documented: dict[str, set[int]] = {"KEYS": set(), "ARGV": set()}
    open_from: dict[str, int | None] = {"KEYS": None, "ARGV": None}
    for kind, index, is_range, _ in _HEADER_REF.findall(header):
        if is_range:
            open_from[kind] = int(index)
        else:
            documented[kind].add(int(index))
    # A script over a variable list of keys (adopt.lua) documents it as a range.
    assert documented["KEYS"] or open_from["KEYS"] == 1, f"{name}.lua documents no KEYS"

    used: dict[str, set[int]] = {"KEYS": set(), "ARGV": set()}
    for kind, index in _BODY_REF.findall(body):
        used[kind].add(int(index))
    for kind in ("KEYS", "ARGV"):
        start = open_from[kind]
        undocumented = {i for i in used[kind] - documented[kind] if start is None or i < start}
        assert not undocumented, f"{name}.lua uses undocumented {kind} {sorted(undocumented)}"
        assert documented[kind] <= used[kind], (
            f"{name}.lua documents unused {kind} {sorted(documented[kind] - used[kind])}"
        )
        # Numbered without gaps: KEYS[1..n], ARGV[1..m].
        assert documented[kind] == set(range(1, len(documented[kind]) + 1))


@pytest.mark.parametrize("name", sorted(set(SCRIPT_NAMES + FRONTIER_SCRIPT_NAMES)))
def test_script_touches_keys_only_through_keys_argument(name: str) -> None:
    _, body = _script(name)
    calls = _CALL.findall(body)
    on_keys = _CALL_ON_KEY.findall(body)
    # A prepended snippet calls Redis on its key parameter; every caller passes a KEYS[...].
    # (Two functions of one snippet may share a key parameter: its calls count once.)
    for key in set(_snippet_keys(name).values()):
        on_keys += re.findall(rf"redis\.p?call\(\s*'([A-Za-z]+)'\s*,\s*{key}\s*[,)]", body)
    for function, key in _snippet_keys(name).items():
        code = "\n".join(line.split("--", 1)[0] for line in body.splitlines())
        uses = re.findall(rf"\b{function}\(([^,)]*)", code)
        assert uses[0] == key, f"{name}.lua: {function} has no key parameter"
        assert uses[1:] and all(re.fullmatch(r"KEYS\[\d+\]", u) for u in uses[1:]), (
            f"{name}.lua passes {function} a key not from KEYS[...]: {uses[1:]}"
        )
    assert calls, f"{name}.lua makes no redis.call"
    assert len(on_keys) == len(calls), f"{name}.lua calls Redis on a key not from KEYS[...]"
    assert not {cmd.upper() for cmd in on_keys} & {"KEYS", "SCAN", "EVAL", "EVALSHA"}
    assert "redis.call('KEYS'" not in body.replace('"', "'")
    assert "retryqueue" not in body


def test_queue_passes_keys_in_the_order_each_header_documents(
    queue: RedisDelayedQueue,
    make_task: MakeTask,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    passed: dict[str, list[str]] = {}
    run = queue._run

    def record(name: str, keys: list[str], args: list[Any]) -> Any:
        passed[name] = keys
        return run(name, keys, args)

    monkeypatch.setattr(queue, "_run", record)
    task = make_task("a", due=0)
    queue.schedule(task, now=0)
    queue.claim(now=0, limit=1, lease_until=100, token="t")
    queue.renew({"a": "t"}, lease_until=100)
    queue.reschedule(task, "t", now=0)
    queue.claim(now=0, limit=1, lease_until=100, token="t")
    queue.release({"a": "t"}, now=0)
    queue.claim(now=0, limit=1, lease_until=100, token="u")
    queue.unclaim(["u"], now=0)
    queue.claim(now=0, limit=1, lease_until=100, token="t")
    queue.ack("a", "t", now=0)
    queue.deadletter(make_task("b", dead_kind="rule"), None, now=0)
    queue.reap(now=0, limit=1, max_reclaims=1)
    queue.schedule(make_task("c", due=10), now=0)
    queue.retry_now(["c"], now=0)
    queue.cancel(["c"], now=0)
    namespaced = RedisDelayedQueue(queue.client, queue.keys.spider, node_id="n", project="p")
    monkeypatch.setattr(namespaced, "_run", record)
    namespaced.adopt_unnamespaced()
    assert set(passed) == set(SCRIPT_NAMES)
    # adopt: every key of the spider without a namespace, then the same in the project's.
    assert passed.pop("adopt") == [*all_keys(queue.keys), *all_keys(namespaced.keys)]
    namespaced.client.delete(*all_keys(namespaced.keys))

    keys = queue.keys
    for name in sorted(passed):
        header, _ = _script(name)
        names = {int(i): n for kind, i, _, n in _HEADER_REF.findall(header) if kind == "KEYS"}
        expected = [getattr(keys, names[i]) for i in sorted(names)]
        assert passed[name] == expected, name
