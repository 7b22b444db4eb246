"""Per-domain cooldowns: domain_fail.lua, domain_ok.lua and claim.lua's skipping,
against the real Redis (a single server and a Redis Cluster).

Every call gets an explicit ``now`` (ms), so no test waits for time to pass.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import redis

from scrapy_retryqueue.queue.delayed import RedisDelayedQueue
from scrapy_retryqueue.queue.domains import DomainCooldowns, parse_state
from scrapy_retryqueue.queue.envelope import Task
from scrapy_retryqueue.values import as_text

MakeTask = Callable[..., Task]
LEASE = 30_000
BASE = 10_000
MAX = 600_000


@pytest.fixture(params=["single", "cluster"])
def redis_kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def domains(redis_client: redis.Redis, spider_name: str) -> DomainCooldowns:
    return DomainCooldowns(redis_client, spider_name, node_id="node-a")


def states(domains: DomainCooldowns) -> dict[str, dict[str, Any]]:
    """Every domain with a state: domain -> {state, until, level, reason, since}."""
    return {
        as_text(domain): parse_state(raw)
        for domain, raw in domains.client.hgetall(domains.keys.domains).items()
    }


def fail(domains: DomainCooldowns, domain: str, now: int, **kw: Any) -> Any:
    args: dict[str, Any] = {
        "cause": "throttle",
        "wait_ms": 0,
        "base_ms": BASE,
        "max_ms": MAX,
        "burst_threshold": 3,
        "burst_window_ms": 5_000,
        "reason": "rate_limited: HTTP 429",
    }
    args.update(kw)
    return domains.fail(domain, now=now, **args)


def domain_events(client: redis.Redis, domains: DomainCooldowns) -> list[dict[str, str]]:
    return [
        {as_text(k): as_text(v) for k, v in fields.items()}
        for _, fields in client.xrange(domains.keys.events)
        if fields.get(b"type") == b"domain"
    ]


def test_a_throttling_answer_trips_the_domain_at_once(
    domains: DomainCooldowns, redis_client: redis.Redis
) -> None:
    change = fail(domains, "shop.test", 1_000, wait_ms=30_000)
    assert change.changed and change.state == "cooling" and change.previous == "open"
    # The later of Retry-After (30 s) and the domain's own backoff (10 s).
    assert change.until == 31_000 and change.level == 0
    assert domains.cooling() == {"shop.test": 31_000}
    state = states(domains)["shop.test"]
    assert state["state"] == "cooling" and state["until"] == 31_000 and state["since"] == 1_000
    [event] = domain_events(redis_client, domains)
    assert event["domain"] == "shop.test" and event["state"] == "cooling"
    assert event["previous"] == "open" and event["until"] == "31000"
    assert event["node"] == "node-a" and event["ts"] == "1000"


def test_own_backoff_wins_over_a_short_retry_after(domains: DomainCooldowns) -> None:
    assert fail(domains, "shop.test", 0, wait_ms=2_000).until == BASE


def test_failures_while_cooling_extend_only_to_a_longer_wait(
    domains: DomainCooldowns, redis_client: redis.Redis
) -> None:
    fail(domains, "shop.test", 0)
    shorter = fail(domains, "shop.test", 1_000, wait_ms=5_000)
    assert not shorter.changed and shorter.until == BASE
    longer = fail(domains, "shop.test", 2_000, wait_ms=20_000)
    assert longer.changed and longer.until == 22_000 and longer.level == 0
    burst = fail(domains, "shop.test", 3_000, cause="burst")
    assert not burst.changed
    assert len(domain_events(redis_client, domains)) == 2


def test_a_burst_trips_at_the_threshold_within_the_window(domains: DomainCooldowns) -> None:
    assert not fail(domains, "api.test", 0, cause="burst").changed
    assert not fail(domains, "api.test", 1_000, cause="burst").changed
    # The window (5 s) has passed since the first: counting starts again.
    assert not fail(domains, "api.test", 6_000, cause="burst").changed
    assert not fail(domains, "api.test", 7_000, cause="burst").changed
    change = fail(domains, "api.test", 8_000, cause="burst")
    assert change.changed and change.until == 8_000 + BASE
    # Other domains are not affected.
    assert domains.cooling() == {"api.test": 8_000 + BASE}


def test_a_failed_probe_extends_the_cooldown_with_backoff(domains: DomainCooldowns) -> None:
    fail(domains, "shop.test", 0)
    first = fail(domains, "shop.test", BASE + 1)  # half-open: the probe failed
    assert first.changed and first.previous == "cooling" and first.level == 1
    assert first.until == BASE + 1 + 2 * BASE
    second = fail(domains, "shop.test", first.until, cause="burst")
    assert second.level == 2 and second.until == first.until + 4 * BASE
    assert states(domains)["shop.test"]["since"] == 0


def test_the_backoff_is_capped(domains: DomainCooldowns) -> None:
    now = 0
    for _ in range(10):
        now = fail(domains, "shop.test", now).until
    # 10 s * 2^10 is far beyond the 600 s cap.
    change = fail(domains, "shop.test", now)
    assert change.level == 10 and change.until == now + MAX


def test_success_reopens_only_after_the_cooldown(
    domains: DomainCooldowns, redis_client: redis.Redis
) -> None:
    fail(domains, "shop.test", 0)
    assert not domains.ok("shop.test", now=BASE - 1).changed
    assert domains.cooling() == {"shop.test": BASE}
    change = domains.ok("shop.test", now=BASE)
    assert change.changed and change.state == "open"
    assert domains.cooling() == {} and states(domains) == {}
    assert not domains.ok("shop.test", now=BASE + 1).changed
    assert [e["state"] for e in domain_events(redis_client, domains)] == ["cooling", "open"]
    # Reopened: the next trip starts from level 0 again.
    assert fail(domains, "shop.test", 50_000).level == 0


def test_unknown_cause_is_refused(domains: DomainCooldowns) -> None:
    with pytest.raises(ValueError, match="cause"):
        fail(domains, "shop.test", 0, cause="other")


# -- claim.lua with cooldowns -----------------------------------------------------------


def claim(queue: RedisDelayedQueue, now: int, *, cooldowns: bool = True, limit: int = 10) -> list:
    claimed = queue.claim(
        now=now, limit=limit, lease_until=now + LEASE, token="t", cooldowns=cooldowns
    )
    return [task_id for task_id, _ in claimed.tasks]


def test_claim_skips_tasks_of_a_cooling_domain_and_moves_them_to_its_end(
    queue: RedisDelayedQueue,
    domains: DomainCooldowns,
    redis_client: redis.Redis,
    make_task: MakeTask,
) -> None:
    queue.schedule(make_task("hot1", url="http://Shop.Test:8080/a", due=0), now=0)
    queue.schedule(make_task("hot2", url="https://user@shop.test/b?x=1", due=0), now=0)
    queue.schedule(make_task("calm", url="http://calm.test/c", due=0), now=0)
    fail(domains, "shop.test", 100)

    assert claim(queue, 200) == ["calm"]
    k = queue.keys
    assert redis_client.zscore(k.due, "hot1") == 100 + BASE
    assert redis_client.zscore(k.due, "hot2") == 100 + BASE
    assert claim(queue, 300) == []


def test_claim_without_cooldowns_ignores_domain_state(
    queue: RedisDelayedQueue, domains: DomainCooldowns, make_task: MakeTask
) -> None:
    queue.schedule(make_task("hot", url="http://shop.test/a", due=0), now=0)
    fail(domains, "shop.test", 100)
    assert claim(queue, 200, cooldowns=False) == ["hot"]


def test_a_half_open_domain_gets_a_single_probe(
    queue: RedisDelayedQueue,
    domains: DomainCooldowns,
    redis_client: redis.Redis,
    make_task: MakeTask,
) -> None:
    for i in range(3):
        queue.schedule(make_task(f"hot{i}", url=f"http://shop.test/{i}", due=0), now=0)
    queue.schedule(make_task("calm", url="http://calm.test/", due=0), now=0)
    fail(domains, "shop.test", 0)
    now = BASE + 5
    assert sorted(claim(queue, now)) == ["calm", "hot0"]
    k = queue.keys
    leased = {as_text(i) for i in redis_client.zrange(k.leased, 0, -1)}
    assert leased == {"calm", "hot0"}
    assert as_text(redis_client.hget(k.probes, "shop.test")) == str(now + LEASE)
    for task_id in ("hot1", "hot2"):
        assert redis_client.zscore(k.due, task_id) == now + 1000
    # A second node polling while the probe is in flight claims nothing of the domain.
    assert claim(queue, now + 1000) == []
    # The probe succeeds: the domain reopens and its tasks flow at full speed.
    assert domains.ok("shop.test", now=now + 1500).changed
    assert sorted(claim(queue, now + 2000)) == ["hot1", "hot2"]


def test_an_expired_probe_lease_lets_another_probe_through(
    queue: RedisDelayedQueue, domains: DomainCooldowns, make_task: MakeTask
) -> None:
    for i in range(2):
        queue.schedule(make_task(f"hot{i}", url=f"http://shop.test/{i}", due=0), now=0)
    fail(domains, "shop.test", 0)
    assert claim(queue, BASE, limit=1) == ["hot0"]
    # hot0's node died: its probe lease (and task lease) expire.
    later = BASE + LEASE + 1
    assert claim(queue, later) == ["hot1"]


def test_domain_state_is_plain_words_with_every_field(domains: DomainCooldowns) -> None:
    # Not JSON: no script parses JSON text.
    fail(domains, "shop.test", 5, reason="rate_limited: HTTP 429 (twice)")
    raw = as_text(domains.client.hget(domains.keys.domains, "shop.test"))
    assert raw == f"cooling {5 + BASE} 0 5 rate_limited: HTTP 429 (twice)"
    assert parse_state(raw) == {
        "state": "cooling",
        "until": 5 + BASE,
        "level": 0,
        "since": 5,
        "reason": "rate_limited: HTTP 429 (twice)",
    }


def test_a_state_an_older_version_wrote_as_json_still_cools_and_reopens(
    domains: DomainCooldowns,
) -> None:
    k = domains.keys
    old = {"state": "cooling", "until": BASE, "level": 2, "reason": "x", "since": 0}
    domains.client.hset(k.domains, "shop.test", json.dumps(old))
    domains.client.zadd(k.cooling, {"shop.test": BASE})
    assert states(domains)["shop.test"] == old  # people's views read it too
    # Still cooling: a failure in flight does not trip it again.
    assert fail(domains, "shop.test", BASE - 5_000).changed is False
    assert domains.ok("shop.test", now=BASE - 1).changed is False
    # Once its end has passed, a success reopens it.
    assert domains.ok("shop.test", now=BASE + 1).changed is True
    assert states(domains) == {}
    assert domains.cooling() == {}


@pytest.mark.parametrize("raw", ["", "cooling", "{", "cooling x 0 0 r", "\xff", "[[[[[[[["])
def test_an_unreadable_state_is_none(raw: str) -> None:
    assert parse_state(raw) is None
    assert parse_state(raw.encode("latin-1")) is None
    assert parse_state("[" * 100_000) is None
    assert parse_state(None) is None


def test_a_task_that_would_wait_too_long_is_a_rate_limited_dead_letter(
    queue: RedisDelayedQueue,
    domains: DomainCooldowns,
    redis_client: redis.Redis,
    make_task: MakeTask,
) -> None:
    old = make_task("old", url="http://shop.test/old", due=0, created=0)
    young = make_task("young", url="http://shop.test/young", due=0, created=90_000)
    queue.schedule(old, now=0)
    queue.schedule(young, now=0)
    redis_client.hset(queue.keys.reclaims, "old", 1)
    fail(domains, "shop.test", 100_000)  # cooling until 110 s
    claimed = queue.claim(
        now=100_500,
        limit=10,
        lease_until=100_500 + LEASE,
        token="t",
        cooldowns=True,
        deferral_max_wait_ms=60_000,
    )
    assert claimed.tasks == []
    k = queue.keys
    # old: created at 0, would wait until 110 s > 60 s: dead, kind rate_limited.
    assert redis_client.zscore(k.dead, "old") == 100_500
    # The envelope as it was (no script edits its JSON); the kind it died of beside it.
    assert redis_client.hget(k.deadtasks, "old") == old.to_json().encode()
    assert redis_client.hget(k.deadkinds, "old") == b"rate_limited"
    assert redis_client.hget(k.taskinfo, "old") is None
    assert redis_client.hget(k.tasks, "old") is None
    assert redis_client.zscore(k.due, "old") is None
    assert redis_client.hget(k.reclaims, "old") is None
    # young: created at 90 s, waits until 110 s (20 s): moved, not dead.
    assert redis_client.zscore(k.due, "young") == 110_000
    dead_events = [
        {as_text(a): as_text(b) for a, b in fields.items()}
        for _, fields in redis_client.xrange(k.events)
        if fields.get(b"type") == b"dead"
    ]
    assert dead_events == [
        {
            "type": "dead",
            "id": "old",
            "kind": "rate_limited",
            "node": "node-a",
            "ts": "100500",
            "url": "http://shop.test/old",
        }
    ]


def test_no_wait_limit_by_default(
    queue: RedisDelayedQueue, domains: DomainCooldowns, make_task: MakeTask
) -> None:
    queue.schedule(make_task("old", url="http://shop.test/old", due=0, created=0), now=0)
    fail(domains, "shop.test", 10_000_000)
    assert claim(queue, 10_000_001) == []
    assert queue.client.zscore(queue.keys.due, "old") == 10_000_000 + BASE


def test_a_task_an_older_version_parked_is_claimed_without_cooldown_or_wait_limit(
    queue: RedisDelayedQueue,
    domains: DomainCooldowns,
    redis_client: redis.Redis,
    make_task: MakeTask,
) -> None:
    # Parked before taskinfo existed: its host and creation time are in its
    # envelope only, which no script reads; so no cooldown holds it.
    queue.schedule(make_task("old", url="http://shop.test/old", due=0, created=0), now=0)
    queue.schedule(make_task("new", url="http://shop.test/new", due=0, created=0), now=0)
    redis_client.hdel(queue.keys.taskinfo, "old")
    fail(domains, "shop.test", 100_000)
    claimed = queue.claim(
        now=100_500,
        limit=10,
        lease_until=100_500 + LEASE,
        token="t",
        cooldowns=True,
        deferral_max_wait_ms=60_000,
    )
    assert [task_id for task_id, _ in claimed.tasks] == ["old"]
    # The new one waited too long: a rate_limited dead letter, as before.
    assert redis_client.hget(queue.keys.deadkinds, "new") == b"rate_limited"


def test_a_task_without_a_creation_time_waits_with_no_limit(
    queue: RedisDelayedQueue,
    domains: DomainCooldowns,
    redis_client: redis.Redis,
    make_task: MakeTask,
) -> None:
    queue.schedule(make_task("t", url="http://shop.test/t", due=0, created=0), now=0)
    redis_client.hset(queue.keys.taskinfo, "t", " shop.test http://shop.test/t")
    fail(domains, "shop.test", 100_000)
    claimed = queue.claim(
        now=100_500,
        limit=10,
        lease_until=100_500 + LEASE,
        token="t",
        cooldowns=True,
        deferral_max_wait_ms=60_000,
    )
    assert claimed.tasks == []
    assert redis_client.zscore(queue.keys.due, "t") == 100_000 + BASE
