"""The leased frontier on the node: what it holds, when a request counts as finished,
what one round trip writes and what it puts back when Redis did not take it; the
frontier's request encoding; the heartbeat's registration time."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from scrapy import Request, Spider
from scrapy.settings import Settings

from scrapy_retryqueue.config import load_config
from scrapy_retryqueue.crawl.frontier import FrontierDupeFilter
from scrapy_retryqueue.exceptions import EnvelopeError
from scrapy_retryqueue.queue.delayed import RedisDelayedQueue
from scrapy_retryqueue.queue.envelope import (
    frontier_request_from_json,
    frontier_request_to_json,
)
from scrapy_retryqueue.queue.frontier import Entry, Finished, Joined, Leased
from scrapy_retryqueue.runtime.frontier import Frontier, FrontierResult, finished_line


class _Spider(Spider):
    name = "s"

    def parse_page(self, response: Any) -> None:
        pass


def _frontier(*, joined: bool = True, **settings: Any) -> Frontier:
    """A node's frontier; *joined*: its first round trip (the join) is behind it."""
    serial = itertools.count()
    config = load_config(Settings({"CONCURRENT_REQUESTS": 4, **settings}))
    frontier = Frontier(config, lambda: f"n:a:{next(serial)}")
    frontier.joined = joined
    return frontier


class _Store:
    """Records what a round trip asks of Redis; answers as a healthy frontier would."""

    def __init__(
        self, leased: list[tuple[str, str]] | None = None, joined: Joined | None = None
    ) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.leased = leased or []
        self.joined = joined or Joined()

    def join(self, node_id: str, *, now: int, restart: bool, started: int) -> Joined:
        self.calls.append(("join", (node_id, restart, started)))
        return self.joined

    def push(self, entries: list[Entry]) -> list[bool]:
        self.calls.append(("push", [e.id for e in entries]))
        return [True] * len(entries)

    def ack(self, leases: dict[str, str]) -> list[str]:
        self.calls.append(("ack", dict(leases)))
        return []

    def quarantine(self, leases: dict[str, str]) -> int:
        self.calls.append(("quarantine", dict(leases)))
        return len(leases)

    def reap(self, *, now: int, max_reclaims: int) -> tuple[list[str], list[str]]:
        self.calls.append(("reap", max_reclaims))
        return [], []

    def renew(self, leases: dict[str, str], *, lease_until: int) -> list[str]:
        self.calls.append(("renew", dict(leases)))
        return []

    def lease(self, *, limit: int, lease_until: int, token: str) -> Leased:
        self.calls.append(("lease", limit))
        return Leased(self.leased[:limit], waiting=3, leased=limit)


def test_a_request_is_done_once_the_engine_no_longer_has_it() -> None:
    f = _frontier()
    a, b = Request("http://x/a"), Request("http://x/b")
    f.running = {"a": ("t1", a), "b": ("t1", b)}
    f.settle({b})
    assert f.done == {"a": "t1"} and list(f.running) == ["b"]
    # Scrapy that does not tell what is in progress: nothing is taken for done.
    f.settle(None)
    assert list(f.running) == ["b"]


def test_a_parked_failure_is_acked_only_once_its_park_is_written() -> None:
    f = _frontier()
    f.running = {"a": ("t1", Request("http://x/a"))}
    assert f.park_started("a")
    assert not f.park_started("unknown")
    f.settle(set())
    assert f.done == {}
    f.park_finished("a")
    f.settle(set())
    assert f.done == {"a": "t1"}


def test_a_request_whose_download_was_cancelled_is_handed_back_not_acked() -> None:
    f = _frontier()
    f.running = {"a": ("t1", Request("http://x/a"))}
    f.hand_back("a")
    f.hand_back("unknown")
    f.settle(set())
    assert f.done == {} and f.kept == {"a": "t1"}
    assert f.take_all()[3] == {"a": "t1"}


def test_one_round_trip_writes_pushes_before_acks_then_leases() -> None:
    f = _frontier()
    f.outbox = [Entry("c", "c", 0, "{}")]
    f.done = {"a": "t1"}
    store = _Store(leased=[("d", '{"url":"http://x/d"}')])
    result = f.io(store, maintain=True, lease=True)()  # type: ignore[arg-type]
    assert [name for name, _ in store.calls] == ["push", "ack", "reap", "lease"]
    assert store.calls[-1] == ("lease", 4)  # the batch: CONCURRENT_REQUESTS
    f.landed(result)
    assert [r[0] for r in f.ready] == ["d"] and f.outbox == [] and f.done == {}
    assert (f.waiting, f.leased) == (3, 4)
    assert len(f) == 1 + 3


def test_the_first_round_trip_joins_the_fleets_crawl_before_it_pushes() -> None:
    f = _frontier(joined=False, RETRYQUEUE_NODE_ID="node-9", RETRYQUEUE_FRONTIER_RESTART=True)
    f.outbox = [Entry("c", "c", 0, "{}")]
    store = _Store()
    result = f.io(store, maintain=False, lease=True)()  # type: ignore[arg-type]
    assert [name for name, _ in store.calls] == ["join", "push", "lease"]
    assert store.calls[0] == ("join", ("node-9", True, f.started))
    f.landed(result)
    assert f.joined and f.refused is None
    again = _Store()
    f.io(again, maintain=False, lease=True)()  # type: ignore[arg-type]
    assert [name for name, _ in again.calls] == ["lease"]


def test_a_node_that_finds_the_crawl_finished_writes_nothing_and_drops_what_it_has() -> None:
    f = _frontier(joined=False)
    f.outbox = [Entry("c", "c", 0, "{}")]
    f.local.append(Request("http://x/unstorable"))
    finished = Finished(1_700_000_000_000, "node-1")
    store = _Store(leased=[("d", "{}")], joined=Joined(finished, refused=True))
    result = f.io(store, maintain=True, lease=True)()  # type: ignore[arg-type]
    assert [name for name, _ in store.calls] == ["join"]
    f.landed(result)
    assert f.refused == finished
    assert len(f) == 0 and not f.holds


def test_a_join_that_did_not_land_is_tried_again() -> None:
    f = _frontier(joined=False)
    f.io(_Store(), maintain=False, lease=True)  # type: ignore[arg-type]
    f.failed()
    store = _Store()
    f.io(store, maintain=False, lease=True)()  # type: ignore[arg-type]
    assert store.calls[0][0] == "join"


def test_a_spider_fed_from_redis_neither_joins_nor_is_refused() -> None:
    f = _frontier(joined=False)
    f.seeds = False
    store = _Store()
    f.io(store, maintain=False, lease=True)()  # type: ignore[arg-type]
    assert [name for name, _ in store.calls] == ["lease"]


def test_the_line_of_a_node_that_finds_the_crawl_finished_says_when_and_what_to_do() -> None:
    at = 1_700_000_000_000  # 2023-11-14 22:13:20 UTC
    finished = Finished(at, "node-1")
    refused = finished_line("s", Joined(finished, refused=True), started=at + 1, restart=False)
    assert "'s' on the leased frontier finished at 2023-11-14 22:13:20 UTC (" in refused
    assert "d ago, on node node-1); this node crawls nothing." in refused
    assert refused.endswith("run it with -s RETRYQUEUE_FRONTIER_RESTART=True")
    late = finished_line("s", Joined(finished, refused=True), started=at - 1, restart=True)
    assert "after this node started: the node came too late to that crawl" in late
    restarted = finished_line("s", Joined(finished), started=at + 1, restart=True)
    assert restarted.endswith("; this node starts a new crawl of it (RETRYQUEUE_FRONTIER_RESTART)")


def test_what_redis_did_not_take_waits_for_the_next_round_trip() -> None:
    f = _frontier()
    f.outbox = [Entry("c", "c", 0, "{}")]
    f.done = {"a": "t1"}
    f.io(_Store(), maintain=False, lease=True)  # type: ignore[arg-type]
    f.outbox.append(Entry("e", "e", 0, "{}"))  # pushed meanwhile
    f.failed()
    assert [e.id for e in f.outbox] == ["c", "e"] and f.done == {"a": "t1"}


def test_renewals_cover_what_the_node_holds_and_lost_leases_are_dropped() -> None:
    f = _frontier(RETRYQUEUE_LEASE_TIME=3, RETRYQUEUE_POLL_INTERVAL=1)
    f.ready.append(("r", "{}", "t1"))
    f.running = {"a": ("t2", Request("http://x/a"))}
    f.kept = {"k": "t3"}
    store = _Store()
    result = f.io(store, maintain=True, lease=False)()  # type: ignore[arg-type]
    assert ("renew", {"r": "t1", "a": "t2", "k": "t3"}) in store.calls
    assert store.calls[-1] == ("lease", 0)  # not leasing: counts only
    result.lost = ["a", "r"]
    f.landed(result)
    assert not f.ready and not f.running


def test_a_round_trip_held_up_past_a_third_of_the_lease_renews_before_it_reaps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import time

    from scrapy_retryqueue.runtime import frontier as frontier_module
    from scrapy_retryqueue.runtime import renewal

    f = _frontier(RETRYQUEUE_LEASE_TIME=3)
    f.running = {"a": ("t2", Request("http://x/a"))}
    f._renewal.last = time.time()  # renewed a moment ago: no renewal due
    on_time = _Store()
    f.io(on_time, maintain=True, lease=False)()  # type: ignore[arg-type]
    assert [call for call, _ in on_time.calls] == ["reap", "lease"]

    # Made, then the process froze before the worker ran it: by then its leases
    # may have run out, and the reap would take them.
    clock = [frontier_module.now_ms()]
    monkeypatch.setattr(frontier_module, "now_ms", lambda: clock[0])
    monkeypatch.setattr(renewal, "now_ms", lambda: clock[0])
    io = f.io(held_up := _Store(), maintain=True, lease=False)
    clock[0] += 1000
    io()
    assert [call for call, _ in held_up.calls] == ["renew", "reap", "lease"]
    assert held_up.calls[0] == ("renew", {"a": "t2"})


def test_a_full_batch_in_hand_leases_no_more() -> None:
    f = _frontier()
    for n in range(3):
        f.ready.append((str(n), "{}", "t"))
    store = _Store()
    f.io(store, maintain=False, lease=True)()  # type: ignore[arg-type]
    assert store.calls == [("lease", 0)]


def test_take_all_hands_back_everything_held() -> None:
    f = _frontier()
    f.ready.append(("r", "{}", "t1"))
    f.running = {"a": ("t2", Request("http://x/a"))}
    f.kept = {"k": "t3"}
    f.done = {"d": "t4"}
    entries, acks, bad, release = f.take_all()
    assert entries == [] and bad == {}
    assert acks == {"d": "t4"} and release == {"r": "t1", "a": "t2", "k": "t3"}
    assert not f.holds


def test_frontier_result_defaults() -> None:
    assert FrontierResult(Leased(), "t").lost == []


def test_the_frontier_stores_requests_as_json_and_keeps_dont_filter() -> None:
    spider = _Spider()
    request = Request(
        "http://x/a",
        callback=spider.parse_page,
        method="POST",
        body=b"\x00\xff",
        headers={"X-A": "1"},
        priority=7,
        dont_filter=True,
        meta={"k": [1], "retryqueue_frontier": {"id": "old", "token": "t"}},
    )
    text = frontier_request_to_json(request, spider)
    assert "retryqueue_frontier" not in text  # a lease is never stored
    back = frontier_request_from_json(text, spider)
    assert (back.url, back.method, back.body, back.priority) == (
        "http://x/a",
        "POST",
        b"\x00\xff",
        7,
    )
    assert back.dont_filter is True and back.callback == spider.parse_page
    assert back.meta == {"k": [1]} and back.headers["X-A"] == b"1"
    plain = frontier_request_from_json(
        frontier_request_to_json(Request("http://x/b"), spider), spider
    )
    assert plain.dont_filter is False


@pytest.mark.parametrize(
    "raw", [b"\xff\xfe", "[]", '{"url": 3}', "{", '{"url":"http://x","_class":"os.system"}']
)
def test_an_unreadable_frontier_request_is_one_clear_error(raw: Any) -> None:
    with pytest.raises(EnvelopeError):
        frontier_request_from_json(raw, _Spider())


@pytest.mark.parametrize(
    "raw",
    [
        '{"url":"http://x","priority":NaN}',  # no JSON: NaN
        '{"url":"http://x","meta":{"a":1e999}}',  # a number no float holds
        '{"url":"http://x","meta":{"a":"\\ud800"}}',  # a lone surrogate
        '{"url":"http://x","meta":' + "[" * 200 + "]" * 200 + "}",  # nested too deep
        '{"url":"http://x","callback":"__init__"}',  # no spider method's name
    ],
)
def test_a_frontier_request_is_read_as_strictly_as_an_envelope(raw: str) -> None:
    with pytest.raises(EnvelopeError):
        frontier_request_from_json(raw, _Spider())


def test_a_frontier_requests_class_is_never_imported_to_be_checked() -> None:
    import sys

    module = "scrapy_retryqueue_no_such_module_imported"
    raw = f'{{"url":"http://x","_class":"{module}.Request"}}'
    with pytest.raises(EnvelopeError, match="has imported"):
        frontier_request_from_json(raw, _Spider())
    assert module not in sys.modules
    # A Request class this process has imported is rebuilt as that class.
    from scrapy.http import FormRequest

    stored = frontier_request_to_json(FormRequest("http://x/f", formdata={"a": "1"}), _Spider())
    assert type(frontier_request_from_json(stored, _Spider())) is FormRequest


def test_a_frontier_request_keeps_the_projects_meta_only() -> None:
    # Frozen meta, as a retry's: an environment proxy and DOWNLOAD_TIMEOUT's default
    # download_timeout are set again by the middlewares when the request comes back.
    request = Request(
        "http://x/a",
        meta={"k": 1, "proxy": "http://env:3128", "_scheme_proxy": True, "download_timeout": 180},
    )
    text = frontier_request_to_json(request, _Spider(), recomputed={"download_timeout": 180.0})
    assert frontier_request_from_json(text, _Spider()).meta == {"k": 1}


def test_the_frontier_dupefilter_lets_every_request_through() -> None:
    df = FrontierDupeFilter.from_spider(_Spider())
    assert df.request_seen(Request("http://x/a")) is False
    assert df.request_seen(Request("http://x/a")) is False
    df.clear()  # scrapy-redis's flush (SCHEDULER_PERSIST False) calls it


def test_a_heartbeat_carries_the_registration_time(redis_client: Any, spider_name: str) -> None:
    queue = RedisDelayedQueue(redis_client, spider_name, node_id="n1")
    redis_client.hset(queue.keys.nodes, "old", "100 90")  # an older version's heartbeat
    redis_client.hset(queue.keys.nodes, "junk", "not a heartbeat")
    nodes = queue.heartbeat(now=5000, last_busy=4000, registered=1000)
    assert nodes == {"n1": (5000, 4000, 1000), "old": (100, 90, 0)}
    # A node that gives no registration time registers now.
    assert queue.heartbeat(now=6000, last_busy=0)["n1"] == (6000, 0, 6000)


def _queue_for(tmp_path: Any, redis_url: str, **settings: Any) -> Any:
    from scrapy.utils.test import get_crawler

    from scrapy_retryqueue.crawl.frontier import LeasedPriorityQueue

    crawler = get_crawler(
        _Spider,
        {
            "RETRYQUEUE_REDIS_URL": redis_url,
            "RETRYQUEUE_EMBEDDED_DIR": str(tmp_path),
            "RETRYQUEUE_STORE_ENABLED": False,
            **settings,
        },
    )
    spider = _Spider()
    spider.crawler = crawler
    return LeasedPriorityQueue(None, spider, "%(spider)s:requests")


def test_the_queue_class_warns_of_a_dupefilter_that_can_lose_requests(
    tmp_path: Any, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING"):
        _queue_for(tmp_path, redis_url, DUPEFILTER_CLASS="scrapy_redis.dupefilter.RFPDupeFilter")
    lines = [r.getMessage() for r in caplog.records if "DUPEFILTER_CLASS" in r.getMessage()]
    assert len(lines) == 1 and "scrapy_retryqueue.crawl.frontier.FrontierDupeFilter" in lines[0]
    caplog.clear()
    with caplog.at_level("WARNING"):
        q = _queue_for(
            tmp_path,
            redis_url,
            DUPEFILTER_CLASS="scrapy_retryqueue.crawl.frontier.FrontierDupeFilter",
        )
        _queue_for(
            tmp_path, redis_url, SCHEDULER="scrapy_retryqueue.crawl.frontier.LeasedScheduler"
        )
    assert not [r for r in caplog.records if "DUPEFILTER_CLASS" in r.getMessage()]
    # Before the spider opens, the queue holds nothing and never blocks.
    assert len(q) == 0 and q.pop() is None


def test_the_leased_scheduler_needs_no_redis_of_scrapy_redis_and_persists(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from scrapy.utils.test import get_crawler

    from scrapy_retryqueue.crawl.frontier import FrontierDupeFilter, LeasedScheduler

    crawler = get_crawler(_Spider, {"REDIS_URL": "redis://127.0.0.1:1/0"})
    scheduler = LeasedScheduler.from_crawler(crawler)
    assert scheduler.server is None and scheduler.persist is True
    assert isinstance(scheduler.df, FrontierDupeFilter)
    assert scheduler.queue_cls == "scrapy_retryqueue.crawl.frontier.LeasedPriorityQueue"
    fifo = get_crawler(
        _Spider,
        {
            "SCHEDULER_QUEUE_CLASS": "scrapy_retryqueue.crawl.frontier.LeasedFifoQueue",
            "SCHEDULER_PERSIST": False,
        },
    )
    scheduler = LeasedScheduler.from_crawler(fifo)
    assert scheduler.queue_cls.endswith("LeasedFifoQueue") and scheduler.persist is False
    # A queue class that pops destructively is not taken, and the log says so.
    popping = get_crawler(_Spider, {"SCHEDULER_QUEUE_CLASS": "scrapy_redis.queue.PriorityQueue"})
    with caplog.at_level("WARNING"):
        assert LeasedScheduler.from_crawler(popping).queue_cls.endswith("LeasedPriorityQueue")
    assert ["scrapy_redis.queue.PriorityQueue" in r.getMessage() for r in caplog.records] == [True]
