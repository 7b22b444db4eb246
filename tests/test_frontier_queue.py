"""The leased frontier's scripts in Redis: push once per fingerprint, lease best first,
ack, hand back, renew, reap a dead node's leases, quarantine poison and malformed requests.

Each runs on a single server and on a Redis Cluster (every key shares the spider's slot).
"""

from __future__ import annotations

from typing import Any

import pytest

from scrapy_retryqueue.decision import kinds
from scrapy_retryqueue.queue.frontier import Entry, Finished, Joined, RedisFrontier
from scrapy_retryqueue.queue.keys import frontier_keys, keys_for


@pytest.fixture(params=["single", "cluster"])
def redis_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _entry(n: int, priority: int = 0, *, filtered: bool = True) -> Entry:
    request_id = f"fp{n}"
    return Entry(request_id, request_id if filtered else "", priority, f'{{"url":"http://x/{n}"}}')


def _frontier(client: Any, spider: str, order: str = "priority") -> RedisFrontier:
    return RedisFrontier(client, spider, order=order)


def test_push_keeps_each_fingerprint_once(redis_client: Any, spider_name: str) -> None:
    f = _frontier(redis_client, spider_name)
    assert f.push([_entry(1), _entry(2), _entry(1)]) == [True, True, False]
    # Leased and acknowledged, a fingerprint stays seen: the page is not fetched again.
    leased = f.lease(limit=10, lease_until=10**13, token="n:a:1")
    assert f.ack({i: "n:a:1" for i, _ in leased.requests}) == []
    assert f.push([_entry(1)]) == [False]
    assert f.counts() == (0, 0)
    # A request that is not filtered (dont_filter) goes in whatever was seen.
    assert f.push([Entry("fp1:x", "", 0, "{}")]) == [True]


def test_lease_hands_out_the_best_priority_first(redis_client: Any, spider_name: str) -> None:
    f = _frontier(redis_client, spider_name)
    f.push([_entry(1, 0), _entry(2, 10), _entry(3, -5), _entry(4, 3)])
    first = f.lease(limit=2, lease_until=10**13, token="n:a:1")
    assert [i for i, _ in first.requests] == ["fp2", "fp4"]
    assert (first.waiting, first.leased) == (2, 2)
    assert first.requests[0][1] == '{"url":"http://x/2"}'
    rest = f.lease(limit=5, lease_until=10**13, token="n:a:2")
    assert [i for i, _ in rest.requests] == ["fp1", "fp3"]
    assert (rest.waiting, rest.leased) == (0, 4)


def test_fifo_order_is_push_order(redis_client: Any, spider_name: str) -> None:
    f = _frontier(redis_client, spider_name, "fifo")
    f.push([_entry(3, 9), _entry(1, 0)])
    f.push([_entry(2, 99)])
    leased = f.lease(limit=5, lease_until=10**13, token="n:a:1")
    assert [i for i, _ in leased.requests] == ["fp3", "fp1", "fp2"]


def test_ack_needs_the_lease_token(redis_client: Any, spider_name: str) -> None:
    f = _frontier(redis_client, spider_name)
    f.push([_entry(1), _entry(2)])
    f.lease(limit=2, lease_until=10**13, token="n:a:1")
    assert f.ack({"fp1": "n:a:1", "fp2": "other:b:1"}) == ["fp2"]
    assert f.counts() == (0, 1)
    keys = keys_for(spider_name)
    assert redis_client.hexists(keys.frontier_requests, "fp1") == 0
    assert redis_client.hexists(keys.frontier_requests, "fp2") == 1


def test_release_puts_requests_back_in_their_order(redis_client: Any, spider_name: str) -> None:
    f = _frontier(redis_client, spider_name)
    f.push([_entry(1, 1), _entry(2, 5), _entry(3, 3)])
    f.lease(limit=2, lease_until=10**13, token="n:a:1")  # fp2, fp3
    assert f.release({"fp2": "n:a:1", "fp3": "n:a:1", "fp1": "n:a:1"}) == 2
    again = f.lease(limit=3, lease_until=10**13, token="n:b:1")
    assert [i for i, _ in again.requests] == ["fp2", "fp3", "fp1"]


def test_renew_keeps_held_leases_and_reports_lost_ones(redis_client: Any, spider_name: str) -> None:
    f = _frontier(redis_client, spider_name)
    f.push([_entry(1), _entry(2)])
    f.lease(limit=2, lease_until=1000, token="n:a:1")
    assert f.renew({"fp1": "n:a:1", "fp2": "n:b:7"}, lease_until=5000) == ["fp2"]
    reclaimed, poisoned = f.reap(now=2000, max_reclaims=3)
    assert (reclaimed, poisoned) == (["fp2"], [])
    assert f.counts() == (1, 1)


def test_a_node_that_stalled_past_its_leases_keeps_what_nobody_took(
    redis_client: Any, spider_name: str
) -> None:
    from scrapy import Request
    from scrapy.settings import Settings

    from scrapy_retryqueue.config import load_config
    from scrapy_retryqueue.runtime.frontier import Frontier
    from scrapy_retryqueue.values import now_ms

    store = _frontier(redis_client, spider_name)
    store.push([_entry(1), _entry(2)])
    # Leased, one popped and downloading, then the node stalled past both leases.
    expired = now_ms() - 1000
    leased = store.lease(limit=2, lease_until=expired, token="n:a:0")
    node = Frontier(load_config(Settings({"RETRYQUEUE_LEASE_TIME": 3})), lambda: "n:a:1")
    (first, _), (second, raw) = leased.requests
    node.running[first] = ("n:a:0", Request("http://x/1"))
    node.ready.append((second, raw, "n:a:0"))

    result = node.io(store, maintain=True, lease=True)()

    # Renewed before the reap: neither reclaimed nor leased again; both still its own.
    assert (result.reclaimed, result.lost, result.leased.requests) == ([], [], [])
    keys = keys_for(spider_name)
    for request_id in (first, second):
        assert redis_client.hget(keys.frontier_owners, request_id) in (b"n:a:0", "n:a:0")
        assert redis_client.zscore(keys.frontier_leased, request_id) > now_ms()


def test_a_dead_nodes_leases_return_then_poison_is_quarantined(
    redis_client: Any, spider_name: str
) -> None:
    f = _frontier(redis_client, spider_name)
    f.push([_entry(1, 4)])
    for round_ in range(2):
        leased = f.lease(limit=1, lease_until=100, token=f"n:a:{round_}")
        assert [i for i, _ in leased.requests] == ["fp1"]
        assert f.reap(now=100, max_reclaims=1) == ((["fp1"], []) if round_ == 0 else ([], ["fp1"]))
    assert f.counts() == (0, 0)
    assert f.quarantined() == {"fp1": (kinds.POISON, '{"url":"http://x/1"}')}
    # Its fingerprint stays seen: a poison page is not fetched again by a re-push.
    assert f.push([_entry(1)]) == [False]


def test_a_malformed_request_is_quarantined_as_stored(redis_client: Any, spider_name: str) -> None:
    f = _frontier(redis_client, spider_name)
    f.push([Entry("fp9", "fp9", 0, "not json \x00")])
    f.lease(limit=1, lease_until=10**13, token="n:a:1")
    assert f.quarantine({"fp9": "stale:x:1"}) == 0
    assert f.quarantine({"fp9": "n:a:1"}) == 1
    assert f.quarantined() == {"fp9": (kinds.MALFORMED, "not json \x00")}
    assert f.counts() == (0, 0)


def test_a_ghost_leaves_the_frontier(redis_client: Any, spider_name: str) -> None:
    f = _frontier(redis_client, spider_name)
    f.push([_entry(1), _entry(2, 5)])
    redis_client.hdel(keys_for(spider_name).frontier_requests, "fp2")  # written around
    leased = f.lease(limit=5, lease_until=10**13, token="n:a:1")
    assert [i for i, _ in leased.requests] == ["fp1"]
    assert leased.ghosts == ["fp2"]
    assert (leased.waiting, leased.leased) == (0, 1)


def test_the_frontier_passes_keys_in_the_order_each_header_documents(
    redis_client: Any, spider_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import re
    from importlib import resources

    from scrapy_retryqueue.queue.frontier import FRONTIER_SCRIPT_NAMES

    f = _frontier(redis_client, spider_name)
    passed: dict[str, list[str]] = {}
    run = f._run

    def record(name: str, keys: list[str], args: list[Any]) -> Any:
        passed[name] = keys
        return run(name, keys, args)

    monkeypatch.setattr(f, "_run", record)
    f.push([_entry(1), _entry(2)])
    f.lease(limit=2, lease_until=100, token="t")
    f.renew({"fp1": "t"}, lease_until=100)
    f.ack({"fp1": "t"})
    f.quarantine({"fp2": "t"})
    f.push([_entry(3)])
    f.lease(limit=1, lease_until=100, token="t")
    f.release({"fp3": "t"})
    f.reap(now=0, max_reclaims=1)
    f.finish(alive_after=0)
    f.join("n", now=0, restart=False, started=0)
    assert set(passed) == set(FRONTIER_SCRIPT_NAMES)
    keys = keys_for(spider_name)
    special = {
        "frontier": "frontier",
        "retry_due": "due",
        "retry_leased": "leased",
        "nodes": "nodes",
    }
    for name in FRONTIER_SCRIPT_NAMES:
        source = (
            resources.files("scrapy_retryqueue.queue").joinpath("lua", f"{name}.lua").read_text()
        )
        names = dict(re.findall(r"^-- KEYS\[(\d+)\] (\w+)", source, re.M))
        fields = [names[i] for i in sorted(names, key=int)]
        if name == "renew":
            expected = [keys.frontier_leased, keys.frontier_owners]
        else:
            expected = [getattr(keys, special.get(n, f"frontier_{n}")) for n in fields]
        assert passed[name] == expected, name


def test_a_finished_crawl_forgets_what_its_frontier_saw(
    redis_client: Any, spider_name: str
) -> None:
    f = _frontier(redis_client, spider_name)
    keys = keys_for(spider_name)
    f.push([_entry(1)])
    # Work left: a request waiting, then a retry pending, then a node still crawling.
    assert f.finish(alive_after=0) is False
    f.ack({i: "t" for i, _ in f.lease(limit=1, lease_until=10**13, token="t").requests})
    redis_client.zadd(keys.due, {"task": 1})
    assert f.finish(alive_after=0) is False
    redis_client.delete(keys.due)
    redis_client.hset(keys.nodes, "other", "5000 5000 1000")
    assert f.finish(alive_after=4000) is False
    # That node's heartbeat is old: it died. The crawl is over.
    assert f.finish(alive_after=6000) is True
    assert f.push([_entry(1)]) == [True]


def test_a_crawl_that_ran_out_of_work_is_marked_and_a_node_joining_after_it_is_refused(
    redis_client: Any, spider_name: str
) -> None:
    f = _frontier(redis_client, spider_name)
    keys = keys_for(spider_name)
    f.push([_entry(1)])
    f.ack({i: "t" for i, _ in f.lease(limit=1, lease_until=10**13, token="t").requests})
    assert f.finish(alive_after=0, mark=Finished(5000, "node-1")) is True
    assert redis_client.get(keys.frontier_finished) == b"5000 node-1"
    # A node that starts then crawls nothing: it is not even registered.
    refused = Joined(Finished(5000, "node-1"), refused=True)
    assert f.join("node-2", now=6000, restart=False, started=5500) == refused
    # Asked to start a new crawl, a node started before the finish came late to that
    # crawl: refused too (a fleet launched with the setting on every node).
    assert f.join("node-2", now=6000, restart=True, started=4000) == refused
    assert f.join("node-2", now=6000, restart=True, started=5000) == refused
    assert not redis_client.hexists(keys.nodes, "node-2")
    assert redis_client.exists(keys.frontier_finished)
    # A node started after it starts a new crawl: the mark goes, the node registers.
    restarted = f.join("node-2", now=7000, restart=True, started=5001)
    assert restarted == Joined(Finished(5000, "node-1"), refused=False)
    assert not redis_client.exists(keys.frontier_finished)
    assert redis_client.hget(keys.nodes, "node-2") == b"7000 7000 7000"
    assert f.push([_entry(1)]) == [True]  # what the last crawl saw is forgotten
    assert f.join("node-3", now=7000, restart=False, started=1) == Joined()


def test_a_node_joining_a_crawl_as_it_ends_keeps_it_open(
    redis_client: Any, spider_name: str
) -> None:
    # The frontier is empty and nothing is pending: the last node leaves. A node that
    # joins at that instant registers in the same step as its check, so the leaving
    # node finds it crawling and marks nothing; the newcomer finishes it in its turn.
    f = _frontier(redis_client, spider_name)
    keys = keys_for(spider_name)
    f.push([_entry(1)])
    f.ack({i: "t" for i, _ in f.lease(limit=1, lease_until=10**13, token="t").requests})
    assert f.join("late", now=10_000, restart=False, started=9000) == Joined()
    assert f.finish(alive_after=9500, mark=Finished(10_001, "first")) is False
    assert not redis_client.exists(keys.frontier_finished)
    assert f.push([_entry(1)]) == [False]  # still seen: the newcomer fetches nothing twice
    redis_client.hdel(keys.nodes, "late")
    assert f.finish(alive_after=9500, mark=Finished(10_002, "late")) is True
    assert redis_client.get(keys.frontier_finished) == b"10002 late"


def test_a_crawl_over_when_its_node_was_stopped_is_not_marked(
    redis_client: Any, spider_name: str
) -> None:
    # Ctrl-C, CLOSESPIDER_*: the spider did not run out of work (its start requests
    # may not all be in), so the next crawl starts afresh rather than being refused.
    f = _frontier(redis_client, spider_name)
    keys = keys_for(spider_name)
    f.push([_entry(1)])
    f.ack({i: "t" for i, _ in f.lease(limit=1, lease_until=10**13, token="t").requests})
    assert f.finish(alive_after=0) is True
    assert not redis_client.exists(keys.frontier_finished)
    assert f.join("next", now=1, restart=False, started=0) == Joined()
    assert f.push([_entry(1)]) == [True]


def test_a_mark_this_version_did_not_write_still_marks_the_crawl_finished(
    redis_client: Any, spider_name: str
) -> None:
    keys = keys_for(spider_name)
    redis_client.set(keys.frontier_finished, b"\xff not a time")
    f = _frontier(redis_client, spider_name)
    refused = f.join("n", now=1, restart=False, started=1)
    assert refused.refused and refused.finished is not None and refused.finished.at == 0
    # Finished at an unknown time: long before any node started, so it can restart.
    assert not f.join("n", now=1, restart=True, started=1).refused
    assert not redis_client.exists(keys.frontier_finished)


def test_the_frontier_keeps_its_keys_in_the_projects_namespace(
    redis_client: Any, spider_name: str
) -> None:
    project = f"p{spider_name}"
    keys, bare = keys_for(spider_name, project), keys_for(spider_name)
    try:
        f = RedisFrontier(redis_client, spider_name, project=project)
        assert f.keys == keys
        f.push([_entry(1), _entry(2)])
        leased = f.lease(limit=1, lease_until=10**13, token="n:a:1")
        assert len(leased.requests) == 1
        assert redis_client.zcard(keys.frontier) == 1
        assert redis_client.zcard(keys.frontier_leased) == 1
        assert redis_client.hlen(keys.frontier_requests) == 2
        assert redis_client.scard(keys.frontier_seen) == 2
        # Nothing in the layout without a namespace, nor in another project's.
        assert redis_client.exists(*frontier_keys(bare)) == 0
        assert RedisFrontier(redis_client, spider_name).counts() == (0, 0)
        other = RedisFrontier(redis_client, spider_name, project=f"other{project}")
        assert other.counts() == (0, 0)
        assert f.counts() == (1, 1)
    finally:
        redis_client.delete(*frontier_keys(keys))
