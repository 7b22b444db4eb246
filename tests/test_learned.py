"""Learned recovery times: the records the scripts keep (recovery.py) and LearnedBackoff."""

from __future__ import annotations

import hashlib
import random
import re
from importlib import resources
from typing import Any

import pytest
import redis
from scrapy.settings import Settings

from scrapy_retryqueue.config import learned_backoff_settings
from scrapy_retryqueue.decision.backoff import BackoffContext, ExponentialBackoff
from scrapy_retryqueue.decision.classify import FailureInfo
from scrapy_retryqueue.decision.learned import LearnedBackoff
from scrapy_retryqueue.decision.policy import Policy, PolicyTable
from scrapy_retryqueue.decision.recovery import (
    EDGES,
    Record,
    RecoveryStats,
    bin_of,
    decode_record,
    empty_record,
    field_name,
    observation,
    read_records,
)
from scrapy_retryqueue.exceptions import ConfigError
from scrapy_retryqueue.queue.delayed import (
    SCRIPT_NAMES,
    SNIPPETS,
    RedisDelayedQueue,
    Write,
    load_script_source,
)
from scrapy_retryqueue.queue.domains import DOMAIN_SCRIPT_NAMES
from scrapy_retryqueue.queue.frontier import FRONTIER_SCRIPT_NAMES
from scrapy_retryqueue.settings.defaults import (
    RECOVERY_BINS,
    RECOVERY_FIRST_EDGE,
    RECOVERY_RECORD_MAX,
)

POLICY = Policy(
    retry=True, base_delay=2.0, multiplier=2.0, max_delay=300.0, max_retries=9, jitter="equal"
)
HALF_LIFE = 3600.0


def outages(durations: list[float], *, censored: list[float] = (), now: int = 0) -> Record:
    """A record as the scripts leave it after these outages (one outcome each)."""
    record = empty_record(now)
    for d in durations:
        # Known to have ended at d (not between a failure and a success).
        record = record.add(*observation(None, int(d * 1000)), True, now=now, half_life=HALF_LIFE)
    for d in censored:
        record = record.add(*observation(None, int(d * 1000)), False, now=now, half_life=HALF_LIFE)
    return record


def ctx(**fields: Any) -> BackoffContext:
    values: dict[str, Any] = {
        "kind": "server_error",
        "attempt": 0,
        "policy": POLICY,
        "domain": "a.example",
        "retry_after": None,
        "since_first": 0.0,
        "rand": random.Random(1).random,
    }
    values.update(fields)
    return BackoffContext(**values)


def test_bins_are_half_octaves_and_every_duration_has_one() -> None:
    assert bin_of(0) == bin_of(0.49) == 0
    assert bin_of(0.5) == 1 and bin_of(0.71) == 2 and bin_of(1.0) == 3
    assert bin_of(float("nan")) == 0 and bin_of(1e12) == RECOVERY_BINS - 1
    for b in range(1, RECOVERY_BINS):
        assert bin_of(EDGES[b] * 1.0001) == b


def test_a_task_counts_once_per_bin_however_often_it_fails() -> None:
    # Failed at 0, again at 3 s and 20 s, recovered at 50 s.
    record = empty_record()
    prior = None
    for wait, recovered in ((3000, False), (20000, False), (50000, True)):
        record = record.add(
            *observation(prior, wait, recovered), recovered, now=0, half_life=HALF_LIFE
        )
        prior = wait
    # Counted once in every bin it reached, however many times it failed there.
    assert record.at_risk == [1.0] * (bin_of(50) + 1)
    assert record.recovered[bin_of(50)] == 1 and sum(record.recovered) == 1


def test_survival_and_the_next_time_follow_the_outages_seen() -> None:
    stats = RecoveryStats({("server_error", "a.example"): outages([10.0] * 50 + [100.0] * 50)})
    curve = stats.curve("server_error", "a.example")
    assert curve is not None and curve.outages == 100
    assert curve.survival(5) == pytest.approx(1.0)
    assert curve.survival(20) == pytest.approx(0.5)
    assert curve.survival(200) == pytest.approx(0.0)
    # Half are over by ~10 s; once 20 s have passed, only the 100 s ones are left.
    assert 8 <= curve.next_time(0, 0.5) <= 14
    assert 70 <= curve.next_time(20, 0.5) <= 140
    # Nothing seen lasting past 200 s: the curve says nothing.
    assert curve.next_time(200, 0.5) is None


def test_censored_outages_keep_the_curve_open() -> None:
    curve = RecoveryStats({("t", "d"): outages([10.0] * 10, censored=[500.0] * 10)}).curve("t", "d")
    assert curve is not None
    assert curve.survival(1000) == pytest.approx(0.5)


def test_weights_halve_every_half_life() -> None:
    record = outages([10.0] * 8, now=0)
    assert record.decayed(int(HALF_LIFE * 1000), HALF_LIFE).at_risk[0] == pytest.approx(4.0)


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "x 1 0",
        "5 1",
        "5 -1 0",
        "5 nan 0",
        "5 inf 0",
        "5 1 2",  # more recoveries than tasks at risk
        "5 " + "1 0 " * (RECOVERY_BINS + 1),
        "5 " + "1" * 5000 + " 0",
    ],
)
def test_a_record_not_written_by_the_scripts_is_refused(raw: str) -> None:
    with pytest.raises(ValueError):
        decode_record(raw)


def test_malformed_records_are_isolated_not_fatal() -> None:
    good = outages([1.0] * 30).encode()
    stats, malformed = read_records(
        {
            b"server_error a.example": good,
            b"server_error b.example": b"\xff junk",
            b"nospace": good,
        },
        now=0,
        half_life=HALF_LIFE,
    )
    assert list(stats.records) == [("server_error", "a.example")]
    assert sorted(malformed) == ["nospace", "server_error b.example"]


# -- LearnedBackoff ---------------------------------------------------------------------


def learned(records: dict[tuple[str, str], Record], **kwargs: Any) -> LearnedBackoff:
    strategy = LearnedBackoff(**kwargs)
    strategy.learned(RecoveryStats(records))
    return strategy


def test_without_data_it_is_the_policys_backoff_within_the_bounds() -> None:
    strategy = learned({})
    for attempt in range(8):
        c = ctx(attempt=attempt, rand=random.Random(attempt).random)
        expected = ExponentialBackoff().delay(
            ctx(attempt=attempt, rand=random.Random(attempt).random)
        )
        delay, reason = strategy.delay_and_reason(c)
        # Exactly the fallback's delay, its jitter below base_delay included.
        assert delay == expected
        assert "no outages seen" in reason and "policy backoff" in reason


def test_too_few_outages_fall_back_to_the_kind_on_other_domains() -> None:
    few = outages([100.0] * 3)
    many = outages([40.0] * 40)
    strategy = learned({("server_error", "a.example"): few, ("server_error", "b.example"): many})
    delay, reason = strategy.delay_and_reason(ctx(domain="a.example"))
    assert "server_error on all domains" in reason
    assert 30 <= delay <= 70


@pytest.mark.parametrize("seed", range(40))
def test_the_bounds_hold_whatever_was_learned(seed: int) -> None:
    rng = random.Random(seed)
    durations = [rng.lognormvariate(rng.uniform(-1, 7), rng.uniform(0.2, 2)) for _ in range(60)]
    censored = [rng.uniform(0, 5000) for _ in range(rng.randrange(20))]
    strategy = learned({("server_error", "a.example"): outages(durations, censored=censored)})
    for _ in range(20):
        retry_after = rng.choice([None, rng.uniform(0, 400)])
        drawn = rng.random()
        c = ctx(
            attempt=rng.randrange(6),
            since_first=rng.choice([0.0, rng.uniform(0, 3000)]),
            retry_after=retry_after,
            rand=lambda value=drawn: value,
        )
        delay, reason = strategy.delay_and_reason(c)
        if "policy backoff" in reason:
            # The fallback's delay (its jitter may go below base_delay), never sooner.
            assert delay >= ExponentialBackoff().delay(c)
        else:
            assert delay >= POLICY.base_delay
            assert "cheapest plan" in reason
        if retry_after is not None:
            assert delay >= retry_after
        assert delay <= max(POLICY.max_delay, retry_after or 0)


def test_a_fast_domain_is_retried_sooner_and_a_slow_one_later_than_exponential() -> None:
    strategy = learned(
        {
            ("server_error", "fast.example"): outages([3.0] * 25 + [6.0] * 25),
            ("server_error", "slow.example"): outages([150.0] * 50),
        }
    )
    exponential = ExponentialBackoff()
    # The third retry of the fast site: 5 s gone, exponential waits 4 to 8 s more;
    # what is left of its outages ends by 8 s.
    fast = ctx(domain="fast.example", attempt=2, since_first=5.0)
    assert strategy.delay(fast) < exponential.delay(replace_rand(fast, 0.0))
    slow = ctx(domain="slow.example", attempt=0, since_first=0.0)
    delay, reason = strategy.delay_and_reason(slow)
    assert delay > exponential.delay(replace_rand(slow, 0.999))
    assert "slow.example" in reason and "50 outages" in reason


def replace_rand(c: BackoffContext, value: float) -> BackoffContext:
    from dataclasses import replace

    return replace(c, rand=lambda: value)


def test_the_reason_reaches_the_decision() -> None:
    strategy = learned({("server_error", "a.example"): outages([40.0] * 40)})
    table = PolicyTable(
        {"server_error": POLICY, "unknown": POLICY}, {}, retry_after_max=3600, backoff=strategy
    )
    decision = table.decide(
        FailureInfo("server_error", "HttpStatus", "503"), {}, domain="a.example"
    )
    assert decision.retry and decision.reason.startswith("server_error: retry 1 of 9; learned:")
    assert f"waits {decision.delay:.1f}s" in decision.reason


@pytest.mark.parametrize(
    "kwargs",
    [
        {"try_cost": 0},
        {"try_cost": -1},
        {"try_cost": float("inf")},
        {"try_cost": float("nan")},
        {"try_cost": True},
        {"try_cost": 10**6},
        {"min_outages": 0},
        {"min_outages": float("nan")},
    ],
)
def test_bad_settings_are_one_clear_error(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="RETRYQUEUE_LEARNED_"):
        LearnedBackoff(**kwargs)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("try_cost", 0),
        ("try_cost", -1),
        ("try_cost", float("inf")),
        ("try_cost", 1e6),
        ("try_cost", True),
        ("try_cost", [1]),
        ("min_outages", 0.5),
        ("min_outages", float("nan")),
        ("min_outages", 2**60),
        ("min_outages", [3]),
    ],
)
def test_built_in_code_or_from_settings_a_bad_value_is_the_same_error(
    name: str, value: Any
) -> None:
    with pytest.raises(ConfigError) as built:
        LearnedBackoff(**{name: value})
    with pytest.raises(ConfigError) as read:
        learned_backoff_settings(Settings({f"RETRYQUEUE_LEARNED_{name.upper()}": value}))
    assert str(built.value) == str(read.value)
    assert f"RETRYQUEUE_LEARNED_{name.upper()}" in str(built.value)


# -- the scripts ------------------------------------------------------------------------


@pytest.mark.parametrize("redis_kind", ["single", "cluster"])
def test_the_scripts_keep_the_record_as_recovery_py_says(
    queue: RedisDelayedQueue, redis_client: redis.Redis, make_task: Any
) -> None:
    t0 = 1_700_000_000_000
    field = field_name("server_error", "example.com")
    expected = empty_record()
    prior: int | None = None
    for n, (wait, op) in enumerate(
        [(3000, "reschedule"), (20000, "reschedule"), (50000, "ack"), (90000, "deadletter")]
    ):
        task = make_task("t" if n < 3 else "u", created=t0, updated=t0, due=t0)
        if n in (0, 3):
            assert queue.schedule(task, now=t0)
            prior = None
        assert [
            i
            for i, _ in queue.claim(
                now=t0 + wait, limit=1, lease_until=t0 + 10**7, token=f"k{n}"
            ).tasks
        ]
        now = t0 + wait
        if op == "ack":
            write = Write(
                "ack",
                task.id,
                now,
                f"k{n}",
                kind="server_error",
                url=task.url,
                created=t0,
                host="example.com",
                learn="server_error",
                prior=prior,
            )
        else:
            write = Write.for_task(op, task, f"k{n}", now)
            write = Write(
                **{
                    **{f: getattr(write, f) for f in write.__slots__},
                    "learn": "server_error",
                    "prior": prior,
                }
            )
        assert queue.apply([write]) == [True]
        expected = expected.add(
            *observation(prior, wait, op == "ack"),
            op == "ack",
            now=now,
            half_life=queue.learned_half_life_ms / 1000,
            gap=(prior, wait) if op == "ack" else None,
        )
        prior = wait
    stored = redis_client.hget(queue.keys.recovery, field)
    assert stored is not None and stored.decode() == expected.encode()


def test_the_scripts_start_a_hostile_record_over_and_keep_at_most_max_records(
    redis_client: redis.Redis, spider_name: str, make_task: Any
) -> None:
    queue = RedisDelayedQueue(redis_client, spider_name, node_id="n", learned_max_records=2)
    t0 = 1_700_000_000_000
    keys = queue.keys
    redis_client.hset(keys.recovery, "server_error a.example", "1e999 nan " + "9" * 5000)
    redis_client.hset(keys.recovery, "server_error b.example", "1 2 3")
    for i, host in enumerate(["a.example", "b.example", "c.example"]):
        task = make_task(f"x{i}", url=f"https://{host}/p", created=t0, updated=t0, due=t0)
        assert queue.schedule(task, now=t0)
        assert queue.claim(now=t0, limit=1, lease_until=t0 + 10**7, token="k").tasks
        write = Write(
            "ack",
            task.id,
            t0 + 4000,
            "k",
            kind="server_error",
            url=task.url,
            created=t0,
            host=host,
            learn="server_error",
        )
        assert queue.apply([write]) == [True]
    raw = redis_client.hgetall(keys.recovery)
    fresh = empty_record().add(
        *observation(None, 4000, True), True, now=t0 + 4000, half_life=HALF_LIFE, gap=(None, 4000)
    )
    assert set(raw) == {b"server_error a.example", b"server_error b.example"}
    assert raw[b"server_error a.example"].decode() == fresh.encode()
    assert raw[b"server_error b.example"].decode() == fresh.encode()


# -- the one learning function the scripts share (lua/lib/recovery.lua) -----------------

LUA = resources.files("scrapy_retryqueue.queue") / "lua"
SNIPPET = (LUA / "lib" / "recovery.lua").read_text("utf-8")
EVERY_SCRIPT = sorted(set(SCRIPT_NAMES + DOMAIN_SCRIPT_NAMES + FRONTIER_SCRIPT_NAMES))


def test_the_snippet_spells_the_records_limits_as_defaults_py_does() -> None:
    match = re.search(r"^local function learn\(.*?^end$", SNIPPET, re.M | re.S)
    assert match, "lua/lib/recovery.lua has no learn function"
    code = match.group(0)
    # Longer than RECOVERY_RECORD_MAX characters: started over.
    assert re.findall(r"#raw <= (\d+)", code) == [str(RECOVERY_RECORD_MAX)]
    # More numbers than "<updated>" and RECOVERY_BINS pairs: started over.
    assert re.findall(r"count > (\d+)", code) == [str(2 * RECOVERY_BINS + 1)]
    # The header says the same numbers.
    assert f"RECOVERY_RECORD_MAX ({RECOVERY_RECORD_MAX})" in SNIPPET
    assert f"RECOVERY_BINS ({RECOVERY_BINS})" in SNIPPET
    # The bins' edges, for spreading a recovery over its gap, as recovery.EDGES has them.
    assert f"RECOVERY_FIRST_EDGE ({RECOVERY_FIRST_EDGE})" in SNIPPET
    assert f"return {RECOVERY_FIRST_EDGE} * 2 ^ ((b - 1) / 2)" in SNIPPET
    assert re.findall(r"b \+ 1 < (\d+)", SNIPPET) == [str(RECOVERY_BINS)]


@pytest.mark.parametrize("name", EVERY_SCRIPT)
def test_the_snippet_is_prepended_to_exactly_the_scripts_that_learn(name: str) -> None:
    own = (LUA / f"{name}.lua").read_text("utf-8")
    calls = re.findall(r"\blearn\(KEYS\[(\d+)\]", own)
    assert "local function learn" not in own, f"{name}.lua keeps its own copy of learn()"
    if not calls:
        assert "learn(" not in own.replace("-- learn()", "")
        assert SNIPPET not in load_script_source(name)
        return
    assert "recovery" in SNIPPETS.get(name, ()), f"{name}.lua calls learn() without the snippet"
    assert load_script_source(name).startswith(SNIPPET)
    assert load_script_source(name).endswith(own)
    # The key it passes is the one its header lists as the recovery hash.
    recovery = re.findall(r"^-- KEYS\[(\d+)\]\s+recovery\s+HASH", own, re.M)
    assert calls == recovery, name
    assert "lib/recovery.lua" in own, f"{name}.lua does not say that the snippet is prepended"


def test_evalsha_names_the_combined_text(queue: RedisDelayedQueue) -> None:
    for name in SNIPPETS:
        script = queue._scripts[name]
        assert script.sha == hashlib.sha1(load_script_source(name).encode()).hexdigest()


# -- how the plan moves the tries ------------------------------------------------------


def test_tries_the_curve_says_would_fail_are_not_made() -> None:
    # Every outage seen lasted 100 s: exponential's tries at 2, 6, 14, 30, 62 s all fail;
    # the plan spends no attempt before the outages seen end.
    strategy = learned({("server_error", "a.example"): outages([100.0] * 40)})
    delay, reason = strategy.delay_and_reason(ctx(rand=lambda: 0.5))
    assert 90 <= delay <= 130
    assert "a.example (40 outages)" in reason and "cheapest plan" in reason
    assert delay > ExponentialBackoff().delay(ctx(attempt=4, rand=lambda: 0.999)) + 30


def test_a_try_comes_before_the_schedule_once_the_curve_is_sure_enough() -> None:
    # Outages end between 4 and 6 s or between 8 and 10; at 7 s gone the schedule waits
    # 8 to 16 s, the plan tries by the end of the second group.
    strategy = learned({("server_error", "a.example"): outages([5.0] * 40 + [9.0] * 40)})
    c = ctx(attempt=2, since_first=7.0, rand=lambda: 0.5)
    delay, reason = strategy.delay_and_reason(c)
    assert delay < ExponentialBackoff().delay(replace_rand(c, 0.0))
    assert 7.0 + delay >= 8.0
    assert "cheapest plan" in reason


def test_a_costlier_try_means_fewer_tries_and_later_ones() -> None:
    records = {("server_error", "a.example"): outages([1.0] * 10 + [3.0] * 30 + [50.0] * 40)}
    cheap, dear = learned(records, try_cost=0.05), learned(records, try_cost=20.0)
    assert cheap.delay(ctx(rand=lambda: 0.5)) < dear.delay(ctx(rand=lambda: 0.5))


def test_nothing_to_say_past_the_longest_outage_seen() -> None:
    strategy = learned({("server_error", "a.example"): outages([10.0] * 40)})
    c = ctx(attempt=3, since_first=100.0, rand=lambda: 0.5)
    delay, reason = strategy.delay_and_reason(c)
    # The fallback's own delay: its tries left reach as far as the whole schedule's.
    assert delay == ExponentialBackoff().delay(c)
    assert "policy backoff" in reason


def test_a_recovery_is_spread_over_the_gap_between_the_last_failure_and_the_success() -> None:
    assert observation(20_000, 50_000, True) == (bin_of(20) + 1, bin_of(50))
    assert observation(None, 8_000, True) == (0, bin_of(8))
    assert observation(20_000, 50_000) == (bin_of(20) + 1, bin_of(50))
    # Failed at 20 s, succeeded at 50 s: each bin of [20, 50] s recovers its share of
    # the gap, and is at risk by the share from its lower edge on.
    record = (
        empty_record()
        .add(*observation(None, 20_000), False, now=0, half_life=HALF_LIFE)
        .add(
            *observation(20_000, 50_000, True),
            True,
            now=0,
            half_life=HALF_LIFE,
            gap=(20_000, 50_000),
        )
    )
    assert sum(record.recovered) == pytest.approx(1.0)
    for b in range(bin_of(20), bin_of(50) + 1):
        lo, hi = EDGES[b], EDGES[b + 1]
        assert record.recovered[b] == pytest.approx((min(hi, 50) - max(lo, 20)) / 30)
        assert record.at_risk[b] == pytest.approx(1.0 if lo <= 20 else (50 - lo) / 30)
    assert record.recovered[: bin_of(20)] == [0.0] * bin_of(20)
    # A first retry that succeeded: its recovery spread from the first failure on.
    one = empty_record().add(
        *observation(None, 3000, True), True, now=0, half_life=HALF_LIFE, gap=(None, 3000)
    )
    assert sum(one.recovered) == pytest.approx(1.0) and one.at_risk[0] == 1.0
