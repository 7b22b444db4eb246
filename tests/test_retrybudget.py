"""The fleet's retry budget per domain: its record and arithmetic (pure), claim.lua's
enforcement against the real Redis (deferred, not dropped, no attempt used; the floor,
the share, the window; a hostile record), and the target: over every 10 s window no
domain gets more retries than its budget, driven in virtual time through the real script.

Every claim gets an explicit ``now`` (ms), so no test waits for time to pass.
"""

from __future__ import annotations

import logging
import random
from bisect import bisect_right
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
import scrapy
from scrapy import Request
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler

from scrapy_retryqueue.commands._status import budget_lines
from scrapy_retryqueue.config import load_config
from scrapy_retryqueue.decision.retrybudget import (
    REQUEST_SLOTS,
    SLOTS,
    BudgetRecord,
    parse_record,
    read_budgets,
    slice_ms,
)
from scrapy_retryqueue.exceptions import ConfigError
from scrapy_retryqueue.queue.delayed import Claimed, RedisDelayedQueue, RetryBudget, Write
from scrapy_retryqueue.queue.envelope import Task, task_from_json
from scrapy_retryqueue.runtime.reporting import Reporter
from scrapy_retryqueue.runtime.retrybudget import RequestCounts
from scrapy_retryqueue.settings.defaults import META_TASK
from scrapy_retryqueue.values import as_text, now_ms
from scrapy_retryqueue.view import live as view

from .runtimes import unopened_runtime

WINDOW = 10.0
SLICE = slice_ms(WINDOW)
BUDGET = RetryBudget(share=0.2, floor=1.0, window=WINDOW)
#: A time at the start of a slice, far from 0.
T0 = 1_700_000_000_000 // SLICE * SLICE
LEASE = 10**15


@pytest.fixture(params=["single", "cluster"])
def redis_kind(request: pytest.FixtureRequest) -> str:
    """The enforcement runs on one server and on a Redis Cluster (one slot per spider)."""
    return request.param


# -- the record and its arithmetic (pure) ---------------------------------------------


def test_a_record_reads_back_what_it_writes_and_slides_with_time() -> None:
    record = BudgetRecord(100, tuple(range(SLOTS)), tuple(range(SLOTS, 2 * SLOTS)))
    assert parse_record(record.text(SLICE), SLICE) == record
    moved = record.at(103)
    assert moved.index == 103
    assert moved.requests == (*range(3, SLOTS), 0, 0, 0)
    assert moved.retries == (*range(SLOTS + 3, 2 * SLOTS), 0, 0, 0)
    assert record.at(100 + SLOTS) == BudgetRecord(100 + SLOTS)
    # Another node's clock a little ahead: the record stays where it is.
    assert record.at(99) is record


def test_the_allowance_is_the_floor_plus_the_share_of_the_newest_requests() -> None:
    empty = BudgetRecord(5)
    assert empty.allowance(share=0.2, floor=1.0, window=10.0) == 10
    # Requests of the two oldest slices do not count (the report lag), the others do.
    requests = (1000, 1000, *([10] * REQUEST_SLOTS))
    record = BudgetRecord(5, requests, (0,) * SLOTS)
    assert record.allowance(share=0.2, floor=1.0, window=10.0) == 10 + 18
    # Retries count over every slot, the oldest too.
    retries = (7, *([0] * (SLOTS - 2)), 3)
    record = BudgetRecord(5, requests, retries)
    assert record.allowance(share=0.2, floor=1.0, window=10.0) == 28 - 10
    assert (
        BudgetRecord(5, requests, (40,) * SLOTS).allowance(share=0.2, floor=1.0, window=10.0) == 0
    )


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "garbage",
        "1000 5 " + " ".join(["1"] * (2 * SLOTS - 1)),
        "1000 5 " + " ".join(["1"] * (2 * SLOTS + 1)),
        "1000 5 " + " ".join(["-1"] * (2 * SLOTS)),
        "1000 5 " + " ".join(["1.5"] * (2 * SLOTS)),
        "1000 5 " + " ".join(["9" * 16] * (2 * SLOTS)),
        "1000 5 " + " ".join(["\u0661"] * (2 * SLOTS)),  # a digit, but not an ASCII one
        "1 " * 600,
    ],
)
def test_a_record_this_package_did_not_write_is_none(raw: str) -> None:
    assert parse_record(raw, 1000) is None
    assert parse_record(raw.encode(), 1000) is None


def test_a_record_of_another_slice_length_is_empty() -> None:
    record = BudgetRecord(5, (3,) * SLOTS, (1,) * SLOTS)
    assert parse_record(record.text(500), 1000) == BudgetRecord(0)


def test_read_budgets_shows_the_busiest_domains_and_names_the_malformed() -> None:
    now = T0 + 3 * SLICE
    index = now // SLICE
    busy = BudgetRecord(index, (0,) * (SLOTS - 1) + (50,), (0,) * (SLOTS - 1) + (12,))
    quiet = BudgetRecord(index, (0,) * (SLOTS - 1) + (5,), (0,) * SLOTS)
    stale = BudgetRecord(index - 2 * SLOTS, (9,) * SLOTS, (9,) * SLOTS)
    raw = {
        b"quiet.example": quiet.text(SLICE).encode(),
        b"busy.example": busy.text(SLICE).encode(),
        b"stale.example": stale.text(SLICE).encode(),
        b"bad.example": b"\xff\xfe",
        b"ahead.example": BudgetRecord(index + 2 * SLOTS).text(SLICE).encode(),
    }
    states, malformed = read_budgets(raw, now=now, share=0.2, floor=1.0, window=WINDOW)
    assert [(s.domain, s.requests, s.retries, s.allowance) for s in states] == [
        ("busy.example", 50, 12, 10 + 10 - 12),
        ("quiet.example", 5, 0, 11),
    ]
    assert malformed == ["ahead.example", "bad.example"]


# -- settings --------------------------------------------------------------------------


def test_the_budget_is_off_by_default_and_read_when_set() -> None:
    config = load_config(Settings())
    assert (config.retry_budget, config.retry_budget_floor, config.retry_budget_window) == (
        0.0,
        1.0,
        10.0,
    )
    config = load_config(
        Settings(
            {
                "RETRYQUEUE_RETRY_BUDGET": "0.25",
                "RETRYQUEUE_RETRY_BUDGET_FLOOR": 0.5,
                "RETRYQUEUE_RETRY_BUDGET_WINDOW": 30,
            }
        )
    )
    assert (config.retry_budget, config.retry_budget_floor, config.retry_budget_window) == (
        0.25,
        0.5,
        30.0,
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("RETRYQUEUE_RETRY_BUDGET", -0.1),
        ("RETRYQUEUE_RETRY_BUDGET", 11),
        ("RETRYQUEUE_RETRY_BUDGET", "lots"),
        ("RETRYQUEUE_RETRY_BUDGET", float("nan")),
        ("RETRYQUEUE_RETRY_BUDGET_FLOOR", 0),
        ("RETRYQUEUE_RETRY_BUDGET_FLOOR", -1),
        ("RETRYQUEUE_RETRY_BUDGET_WINDOW", 0.5),
        ("RETRYQUEUE_RETRY_BUDGET_WINDOW", float("inf")),
    ],
)
def test_a_bad_budget_setting_is_one_error_naming_it(name: str, value: Any) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(Settings({name: value}))
    assert name in str(info.value)
    assert repr(value) in str(info.value) or str(value) in str(info.value)


# -- this node's counts and what it tells ---------------------------------------------


def test_only_fresh_requests_are_counted_and_only_when_the_budget_is_on() -> None:
    on = RequestCounts(load_config(Settings({"RETRYQUEUE_RETRY_BUDGET": 0.2})))
    off = RequestCounts(load_config(Settings()))
    for counts in (on, off):
        counts.sent(Request("https://a.example/1"))
        counts.sent(Request("https://a.example/2"))
        counts.sent(Request("https://b.example/"))
    assert on.take() == {"a.example": 2, "b.example": 1}
    assert on.take() == {}
    assert off.budget is None
    assert off.take() == {}


def test_the_runtime_counts_fresh_downloads_not_the_queues_retries() -> None:
    from scrapy_retryqueue.runtime import RetryQueueRuntime
    from scrapy_retryqueue.runtime.taskref import task_ref

    crawler = get_crawler(settings_dict={"RETRYQUEUE_RETRY_BUDGET": 0.2})
    runtime = RetryQueueRuntime(crawler)
    runtime.download_succeeded(Request("https://a.example/fresh"))
    task = Task(id="t", spider="s", request={"url": "https://a.example/retry"}, kind="timeout")
    retry = Request("https://a.example/retry", meta={META_TASK: task_ref(task, "tok")})
    runtime.download_succeeded(retry)
    assert runtime.requests.take() == {"a.example": 1}


def test_deferrals_are_counted_and_said_in_one_line_per_window(
    caplog: pytest.LogCaptureFixture,
) -> None:
    crawler = get_crawler(settings_dict={"RETRYQUEUE_RETRY_BUDGET": 0.2})
    crawler.stats.open_spider()
    reporter = Reporter(crawler, load_config(crawler.settings))
    with caplog.at_level(logging.INFO, logger="scrapy_retryqueue"):
        for _ in range(3):
            reporter.budget(Claimed(budget_deferred={"a.example": 4, "b.example": 1}))
        reporter.budget(Claimed(budget_malformed=["x.example"]))
        reporter.budget(Claimed(budget_malformed=["x.example"]))
    lines = [r for r in caplog.records if "retry budget" in r.getMessage()]
    assert [r.levelname for r in lines] == ["INFO", "WARNING"]
    assert "deferred due retries 5 times, of 2 domain(s) (a.example 4, b.example 1)" in (
        lines[0].getMessage()
    )
    assert crawler.stats.get_value("retryqueue/budget/deferred") == 15
    assert crawler.stats.get_value("retryqueue/budget/malformed") == 2
    # What was deferred after the line is said at the end of the crawl.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="scrapy_retryqueue"):
        reporter.summary()
    assert "deferred due retries 10 times, of 2 domain(s)" in caplog.text


# -- claim.lua against the real Redis ---------------------------------------------------


def _park(queue: RedisDelayedQueue, make_task: Callable[..., Task], host: str, n: int) -> None:
    writes = [
        Write.for_task(
            "schedule", make_task(f"{host}-{i}", url=f"https://{host}/{i}", due=T0), None, T0
        )
        for i in range(n)
    ]
    assert all(queue.apply(writes))


def _claim(queue: RedisDelayedQueue, now: int, **kwargs: Any) -> Claimed:
    kwargs.setdefault("budget", BUDGET)
    return queue.claim(
        now=now, limit=kwargs.pop("limit", 500), lease_until=LEASE, token="t", **kwargs
    )


def _hosts(claimed: Claimed) -> dict[str, int]:
    out: dict[str, int] = {}
    for task_id, _ in claimed.tasks:
        host = task_id.rsplit("-", 1)[0]
        out[host] = out.get(host, 0) + 1
    return out


def test_the_floor_holds_a_domain_without_requests_and_the_rest_waits_unspent(
    queue: RedisDelayedQueue, make_task: Callable[..., Task], redis_client: redis.Redis
) -> None:
    _park(queue, make_task, "a.example", 30)
    _park(queue, make_task, "b.example", 3)
    before = {as_text(k): as_text(v) for k, v in redis_client.hgetall(queue.keys.tasks).items()}
    got = _claim(queue, T0 + 1)
    # floor 1/s x 10 s: ten retries for a.example; b.example has its own budget.
    assert _hosts(got) == {"a.example": 10, "b.example": 3}
    assert got.budget_deferred == {"a.example": 20}
    # Deferred, not dropped: due again at the next slice, the envelope as it was.
    assert got.due == 20
    assert {s for _, s in redis_client.zrange(queue.keys.due, 0, -1, withscores=True)} == {
        T0 + SLICE
    }
    for task_id, raw in redis_client.hgetall(queue.keys.tasks).items():
        task_id = as_text(task_id)
        if task_id in before and not task_id.startswith("b."):
            assert as_text(raw) == before[task_id]
            assert task_from_json(as_text(raw)).attempts == {"timeout": 1}
    # Within the window, no more until retries slide out of it.
    assert _hosts(_claim(queue, T0 + SLICE)) == {}
    assert redis_client.zcard(queue.keys.dead) == 0


def test_the_share_of_reported_requests_raises_the_allowance(
    queue: RedisDelayedQueue, make_task: Callable[..., Task]
) -> None:
    _park(queue, make_task, "a.example", 100)
    got = _claim(queue, T0 + 1, requests={"a.example": 100, "other.example": 7})
    assert _hosts(got) == {"a.example": 10 + 20}
    # A claim with no room still carries the counts (the next poll's deposit).
    got = _claim(queue, T0 + 2, limit=0, requests={"a.example": 50})
    assert got.tasks == []
    assert _hosts(_claim(queue, T0 + SLICE)) == {"a.example": 10}
    states, _ = read_budgets(
        queue.budget_records(), now=T0 + SLICE, share=0.2, floor=1.0, window=WINDOW
    )
    assert {(s.domain, s.requests, s.retries) for s in states} == {
        ("a.example", 150, 40),
        ("other.example", 7, 0),
    }


def test_the_window_slides_and_every_task_is_claimed_in_the_end(
    queue: RedisDelayedQueue, make_task: Callable[..., Task], redis_client: redis.Redis
) -> None:
    _park(queue, make_task, "a.example", 25)
    assert _hosts(_claim(queue, T0)) == {"a.example": 10}
    # The retries stay counted for a window and one slice more (SLOTS slices).
    assert _hosts(_claim(queue, T0 + (SLOTS - 1) * SLICE)) == {}
    assert _hosts(_claim(queue, T0 + SLOTS * SLICE)) == {"a.example": 10}
    # A longest wait on deferrals does not dead-letter a task the budget holds.
    got = _claim(queue, T0 + 2 * SLOTS * SLICE, deferral_max_wait_ms=1)
    assert _hosts(got) == {"a.example": 5}
    assert redis_client.zcard(queue.keys.dead) == 0
    assert redis_client.zcard(queue.keys.due) == 0


def test_without_a_budget_nothing_is_held_or_written(
    queue: RedisDelayedQueue, make_task: Callable[..., Task], redis_client: redis.Redis
) -> None:
    _park(queue, make_task, "a.example", 30)
    got = _claim(queue, T0 + 1, budget=None, requests={"a.example": 5})
    assert _hosts(got) == {"a.example": 30}
    assert not redis_client.exists(queue.keys.budget)


def test_a_probe_held_by_the_budget_is_not_marked_in_flight(
    queue: RedisDelayedQueue, make_task: Callable[..., Task], redis_client: redis.Redis
) -> None:
    _park(queue, make_task, "a.example", 12)
    assert _hosts(_claim(queue, T0)) == {"a.example": 10}
    # a.example's cooldown has ended (half-open); its probe would be the next claim,
    # but the budget is spent: no probe is recorded, so none blocks the domain later.
    redis_client.zadd(queue.keys.cooling, {"a.example": T0})
    got = _claim(queue, T0 + SLICE, cooldowns=True)
    assert got.tasks == [] and got.budget_deferred == {"a.example": 2}
    assert not redis_client.hexists(queue.keys.probes, "a.example")


@pytest.mark.parametrize(
    "raw",
    [
        b"garbage",
        b"\xff" * 40,
        b"500 5 " + b" ".join([b"99999"] * (2 * SLOTS)),  # another slice length, silently
        f"{SLICE} {T0 // SLICE + 10**9} ".encode() + b" ".join([b"0"] * (2 * SLOTS)),
        b"x" * 100_000,
    ],
    ids=["text", "bytes", "other-slice", "far-ahead", "huge"],
)
def test_a_hostile_record_is_started_over_and_reported(
    queue: RedisDelayedQueue,
    make_task: Callable[..., Task],
    redis_client: redis.Redis,
    raw: bytes,
) -> None:
    redis_client.hset(queue.keys.budget, "a.example", raw)
    _park(queue, make_task, "a.example", 30)
    got = _claim(queue, T0 + 1)
    assert _hosts(got) == {"a.example": 10}
    expected_report = [] if raw.startswith(b"500 ") else ["a.example"]
    assert got.budget_malformed == expected_report
    record = parse_record(redis_client.hget(queue.keys.budget, "a.example"), SLICE)
    assert record is not None and sum(record.retries) == 10


# -- the target: no domain over its budget in any window, in virtual time ----------------


def test_no_domain_gets_more_retries_than_its_budget_over_any_window(
    redis_client: redis.Redis, spider_name: str, make_task: Callable[..., Task]
) -> None:
    """Two nodes of one spider poll every second (a quarter second apart), report the
    fresh requests each sent to a failing domain (sent up to a poll interval before the
    report), and claim what is due; the domain has far more due retries than its budget.
    For every retry claimed at t, the retries in (t - 10 s, t] stay within
    floor x 10 s + 20 % of the requests sent in (t - 10 s, t]. Fresh traffic rises,
    stops, and comes back, so the floor and the share both bind."""
    rng = random.Random(19)
    nodes = [RedisDelayedQueue(redis_client, spider_name, node_id=f"node-{i}") for i in range(2)]
    _park(nodes[0], make_task, "down.example", 3000)
    _park(nodes[0], make_task, "other.example", 50)

    def rate(t_s: float) -> float:  # fresh requests per second to down.example
        return 30.0 if t_s < 40 else 0.0 if t_s < 70 else 8.0

    sent: list[int] = []  # send times (ms) of fresh requests to down.example
    retries: list[int] = []  # claim times (ms) of its retries
    others = 0  # retries of other.example claimed
    pending = [0, 0]  # requests each node sent and has not reported yet
    step = 250
    for tick in range(0, 100_000, step):
        now = T0 + tick
        # Both nodes send fresh requests; each reports at its own poll.
        n = sum(1 for _ in range(int(rate(tick / 1000) * step / 1000 * 4)) if rng.random() < 0.25)
        for _ in range(n):
            node = rng.randrange(2)
            pending[node] += 1
            sent.append(now - rng.randrange(step))
        node = (tick // step) % 4
        if node in (0, 2):
            i = node // 2
            got = nodes[i].claim(
                now=now,
                limit=40,
                lease_until=LEASE,
                token=f"t{tick}",
                budget=BUDGET,
                requests={"down.example": pending[i]} if pending[i] else {},
            )
            pending[i] = 0
            retries += [now for task_id, _ in got.tasks if task_id.startswith("down.")]
            others += sum(1 for task_id, _ in got.tasks if task_id.startswith("other."))
    sent.sort()
    assert len(retries) > 200  # the budget was exercised, not idle
    window = int(WINDOW * 1000)
    worst = 0.0
    for k, t in enumerate(retries):
        in_window = k + 1 - bisect_right(retries, t - window)
        requests = bisect_right(sent, t) - bisect_right(sent, t - window)
        allowed = BUDGET.floor * WINDOW + BUDGET.share * requests
        assert in_window <= allowed, (t - T0, in_window, requests)
        worst = max(worst, in_window / allowed)
    # The budget is used, not only respected: the busiest window comes near it.
    assert worst > 0.8
    # Nothing was dropped: every down.example task is claimed or still waiting.
    waiting = redis_client.zcard(nodes[0].keys.due)
    assert len(retries) + others + waiting == 3000 + 50
    assert redis_client.zcard(nodes[0].keys.dead) == 0


# -- the wiring: downloads counted, carried by the poll, told by the reporter, shown ---------


class BudgetSpider(scrapy.Spider):
    name = "budget"


def test_a_nodes_fresh_downloads_reach_the_fleets_record_through_its_poll(
    queue: RedisDelayedQueue,
    make_task: Callable[..., Task],
    redis_client: redis.Redis,
    tmp_path: Path,
) -> None:
    runtime = unopened_runtime(
        BudgetSpider, tmp_path, RETRYQUEUE_RETRY_BUDGET=0.2, RETRYQUEUE_MAX_IN_FLIGHT=100
    )
    runtime.crawler.stats.open_spider()
    for i in range(50):
        runtime.download_succeeded(Request(f"https://a.example/{i}"))
    _park(queue, make_task, "a.example", 30)
    io, _ = runtime.leases.poll_io(
        queue, None, last_busy=0, budget=runtime.requests.budget, requests=runtime.requests.take()
    )
    result = runtime._polled(io())
    # Now, not in virtual time: the floor's 10 and 20 % of the 50 requests just reported.
    assert len(result.claimed.tasks) == 20
    assert result.claimed.budget_deferred == {"a.example": 10}
    assert runtime.crawler.stats.get_value("retryqueue/budget/deferred") == 10
    states, malformed = view.budgets(
        redis_client, queue.keys.spider, now_ms(), share=0.2, floor=1.0, window=WINDOW
    )
    assert [(s.domain, s.requests, s.retries, s.allowance) for s in states] == [
        ("a.example", 50, 20, 0)
    ]
    assert malformed == []


def test_the_status_line_names_the_busiest_domains_and_what_they_may_still_get() -> None:
    entry = {
        "budget": {
            "share": 0.2,
            "floor": 1.0,
            "window": 10.0,
            "domains": [
                {"domain": "shop.example", "requests": 104, "retries": 31, "allowance": 0},
                {"domain": "cdn.example", "requests": 12, "retries": 0, "allowance": 12},
            ],
            "unreadable": ["bad.example"],
        }
    }
    assert budget_lines(entry) == [
        "  retry budget (0.2 of requests + 1/s, last 10s): shop.example 31 retries / 104 "
        "requests, over budget; cdn.example 0 retries / 12 requests, 12 more allowed; "
        "1 unreadable records (started over at next claim)"
    ]
    assert budget_lines({"budget": None}) == []
    assert budget_lines({"budget": {**entry["budget"], "domains": [], "unreadable": []}}) == []


@pytest.mark.parametrize("redis_kind", ["single"])  # the command's settings name one server
def test_status_reports_each_domains_budget_from_redis(
    queue: RedisDelayedQueue,
    make_task: Callable[..., Task],
    redis_url: str,
    tmp_path: Path,
) -> None:
    from scrapy_retryqueue.commands._status import render_table, report
    from scrapy_retryqueue.view.sources import Sources

    _park(queue, make_task, "a.example", 15)
    queue.claim(
        now=now_ms(),
        limit=100,
        lease_until=LEASE,
        token="t",
        budget=BUDGET,
        requests={"a.example": 20},
    )
    settings = Settings(
        {
            "RETRYQUEUE_REDIS_URL": redis_url,
            "RETRYQUEUE_EMBEDDED_DIR": str(tmp_path),
            "RETRYQUEUE_RETRY_BUDGET": 0.2,
        }
    )
    sources = Sources(settings)
    try:
        out = report(sources, [queue.keys.spider])
    finally:
        sources.close()
    budget = out["spiders"][queue.keys.spider]["budget"]
    assert budget["domains"] == [
        {"domain": "a.example", "requests": 20, "retries": 14, "limit": 14, "allowance": 0}
    ]
    assert "a.example 14 retries / 20 requests, over budget" in render_table(out)
    # Off in the settings the command runs with: no budget part.
    sources = Sources(
        Settings({"RETRYQUEUE_REDIS_URL": redis_url, "RETRYQUEUE_EMBEDDED_DIR": str(tmp_path)})
    )
    try:
        assert report(sources, [queue.keys.spider])["spiders"][queue.keys.spider]["budget"] is None
    finally:
        sources.close()


def test_any_mutation_of_a_record_is_read_or_started_over_never_an_error(
    queue: RedisDelayedQueue, make_task: Callable[..., Task], redis_client: redis.Redis
) -> None:
    rng = random.Random(1919)
    good = BudgetRecord(T0 // SLICE, (3,) * SLOTS, (1,) * SLOTS).text(SLICE).encode()
    alphabet = b"0123456789 -.e\xff\x00\t\n"
    _park(queue, make_task, "a.example", 400)
    for n in range(150):
        raw = bytearray(good)
        for _ in range(rng.randrange(1, 6)):
            at = rng.randrange(len(raw))
            action = rng.randrange(3)
            if action == 0:
                raw[at] = rng.choice(alphabet)
            elif action == 1:
                del raw[at]
            else:
                raw[at:at] = bytes([rng.choice(alphabet)]) * rng.randrange(1, 30)
        redis_client.hset(queue.keys.budget, "a.example", bytes(raw))
        got = _claim(queue, T0 + n, limit=1)
        expected = parse_record(bytes(raw), SLICE)
        if expected is None or expected.index - (T0 + n) // SLICE > SLOTS:
            assert got.budget_malformed == ["a.example"], bytes(raw)
        else:
            assert got.budget_malformed == [], bytes(raw)
        stored = parse_record(redis_client.hget(queue.keys.budget, "a.example"), SLICE)
        assert stored is not None  # whatever it met, the script leaves a record that reads


def test_a_host_that_is_not_utf8_in_taskinfo_harms_no_claim(
    queue: RedisDelayedQueue, make_task: Callable[..., Task], redis_client: redis.Redis
) -> None:
    _park(queue, make_task, "a.example", 12)
    for i in range(12):
        redis_client.hset(queue.keys.taskinfo, f"a.example-{i}", b"0 h\xffst https://x/")
    got = _claim(queue, T0 + 1)
    assert len(got.tasks) == 10
    assert got.budget_deferred == {"h\udcffst": 2}
