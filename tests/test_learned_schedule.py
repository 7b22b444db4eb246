"""LearnedBackoff's plan (decision/schedule.py): the recursion against brute force, the bounds
it holds, the fallback without data, and its settings (the new one, the retired ones)."""

from __future__ import annotations

import itertools
import logging
import math
import random
from typing import Any

import pytest
from scrapy.settings import Settings

from scrapy_retryqueue.config import learned_backoff_settings
from scrapy_retryqueue.config.load import load_config
from scrapy_retryqueue.config.readers import unknown_settings
from scrapy_retryqueue.decision.backoff import BackoffContext, ExponentialBackoff
from scrapy_retryqueue.decision.classify import FailureInfo
from scrapy_retryqueue.decision.learned import LearnedBackoff, policy_reach
from scrapy_retryqueue.decision.policy import Policy, PolicyTable
from scrapy_retryqueue.decision.recovery import Record, RecoveryStats, empty_record, observation
from scrapy_retryqueue.decision.schedule import Schedule, horizon
from scrapy_retryqueue.exceptions import ConfigError

POLICY = Policy(
    retry=True, base_delay=1.0, multiplier=2.0, max_delay=60.0, max_retries=12, jitter="equal"
)


def outages(durations: list[float]) -> Record:
    record = empty_record()
    for d in durations:
        record = record.add(*observation(None, int(d * 1000)), True, now=0, half_life=1e9)
    return record


def ctx(**fields: Any) -> BackoffContext:
    values: dict[str, Any] = {
        "kind": "server_error",
        "attempt": 0,
        "policy": POLICY,
        "domain": "a.example",
        "retry_after": None,
        "since_first": 0.0,
        "rand": lambda: 0.5,
    }
    values.update(fields)
    return BackoffContext(**values)


def learned(durations: list[float], **kwargs: Any) -> LearnedBackoff:
    strategy = LearnedBackoff(**kwargs)
    strategy.learned(RecoveryStats({("server_error", "a.example"): outages(durations)}))
    return strategy


# -- the recursion against brute force ----------------------------------------------------


def _survival(knots: list[tuple[float, float]], t: float) -> float:
    for (t0, s0), (t1, s1) in itertools.pairwise(knots):
        if t0 <= t <= t1:
            return s0 + (s1 - s0) * (t - t0) / (t1 - t0)
    return knots[-1][1]


def _lag(knots: list[tuple[float, float]], a: float, b: float) -> float:
    """E[(b - T); a < T <= b] by a fine midpoint sum, not by the module's areas."""
    steps = 400
    width = (b - a) / steps
    s_a = _survival(knots, a)
    return sum(s_a - _survival(knots, a + (k + 0.5) * width) for k in range(steps)) * width


def _brute(
    knots: list[tuple[float, float]],
    grid: list[float],
    start: float,
    tries: int,
    *,
    cost: float,
    base: float,
    top: float,
    reach: float,
) -> float:
    """Every plan from a failed try at *start* with *tries* left, each next try a grid point
    base..top after the last, ending on the grid's last point (or given up past reach)."""
    end = grid[-1]
    best = math.inf
    stack: list[tuple[float, int, float]] = [(start, tries, 0.0)]
    while stack:
        t, left, so_far = stack.pop()
        if t + left * top < reach - 1e-9:
            continue
        if t >= end:
            best = min(best, so_far)
            continue
        if left == 0:
            best = min(best, so_far + _lag(knots, t, end))
            continue
        for x in grid:
            if t + base - 1e-9 <= x <= t + top + 1e-9:
                step = cost * _survival(knots, x) + _lag(knots, t, x)
                stack.append((x, left - 1, so_far + step))
    return best


@pytest.mark.parametrize("seed", range(6))
def test_the_recursion_finds_the_cheapest_plan_brute_force_finds(seed: int) -> None:
    rng = random.Random(seed)
    # A small curve: four segments, S falling from 1 to what is left at 4 s.
    drops = sorted(rng.random() for _ in range(4))
    knots = [(0.0, 1.0)] + [(float(k + 1), 1.0 - drops[k] * 0.95) for k in range(4)]
    cost = rng.choice([0.1, 0.5, 2.0])
    base, top = 0.5, rng.choice([1.0, 1.5, 2.0])
    tries = rng.choice([3, 4, 6])
    reach = rng.choice([0.0, 3.0])
    plan = Schedule(
        knots, try_cost=cost, base_delay=base, max_delay=top, reach=reach, max_tries=tries
    )
    grid = plan._t  # the points the recursion chooses among
    for start in (0.0, 0.5, 1.0, 2.0):
        for left in range(1, tries + 1):
            expected = _brute(knots, grid, start, left, cost=cost, base=base, top=top, reach=reach)
            got = plan.cost_from(start, left)
            if math.isinf(expected):
                assert math.isinf(got)
            else:
                assert got == pytest.approx(expected, rel=1e-3, abs=1e-4), (start, left)


def test_the_next_try_is_the_first_of_the_cheapest_plan() -> None:
    knots = [(0.0, 1.0), (1.0, 0.9), (2.0, 0.2), (3.0, 0.15), (4.0, 0.0)]
    plan = Schedule(knots, try_cost=0.3, base_delay=0.5, max_delay=2.0, max_tries=5)
    at = plan.next_try(0.0, earliest=0.5, latest=2.0, tries_left=5)
    assert at is not None
    # No other first try in reach is cheaper, by brute force from each of them.
    grid = plan._t

    def total(first: float) -> float:
        return (
            0.3 * _survival(knots, first)
            + _lag(knots, 0.0, first)
            + _brute(knots, grid, first, 4, cost=0.3, base=0.5, top=2.0, reach=0.0)
        )

    best = min(total(x) for x in grid if 0.5 <= x <= 2.0)
    assert total(at) == pytest.approx(best, rel=1e-3)
    # Most outages end between 1 and 2 s: the first try is not before most have.
    assert 1.5 <= at <= 2.0


def test_a_costlier_try_is_made_later() -> None:
    knots = [(0.0, 1.0), (2.0, 0.5), (8.0, 0.1), (30.0, 0.0)]
    picks = [
        Schedule(knots, try_cost=cost, base_delay=1.0, max_delay=60.0).next_try(
            0.0, earliest=1.0, latest=60.0, tries_left=10
        )
        for cost in (0.05, 1.0, 20.0)
    ]
    assert picks[0] is not None and picks[1] is not None and picks[2] is not None
    assert picks[0] < picks[1] < picks[2]


# -- the bounds -----------------------------------------------------------------------------


# The floor and the cap whatever was learned: tests/test_learned.py (the bounds hold
# whatever was learned), censored outages included.


def test_a_long_retry_after_is_waited_whatever_the_curve() -> None:
    strategy = learned([2.0] * 40)
    assert strategy.delay(ctx(retry_after=45.0)) >= 45.0
    assert strategy.delay(ctx(retry_after=0.2)) >= POLICY.base_delay


def _tries(strategy: Any, outage: float, policy: Policy, seed: int) -> tuple[bool, list[float]]:
    """A task failing at 0 in an outage of *outage* s: recovered?, and its tries' times."""
    table = PolicyTable(
        {"server_error": policy, "unknown": policy}, {}, retry_after_max=3600, backoff=strategy
    )
    failure = FailureInfo("server_error", "HttpStatus", "503")
    rng = random.Random(seed)
    t, attempts, times = 0.0, 0, []
    while True:
        decision = table.decide(
            failure,
            {"server_error": attempts},
            domain="a.example",
            rand=rng.random,
            since_first=t,
        )
        if not decision.retry:
            return False, times
        attempts += 1
        t += decision.delay
        times.append(t)
        if t >= outage:
            return True, times


@pytest.mark.parametrize(
    "durations",
    [[0.8] * 40, [1.5, 3.0, 6.0] * 20, [30.0] * 40, [2.0] * 30 + [200.0] * 10, [500.0] * 40],
    ids=["short", "spread", "30s", "bimodal", "longer-than-the-policy"],
)
def test_no_outage_the_default_could_outlast_runs_the_attempts_out(durations: list[float]) -> None:
    # The policy's own schedule reaches 1 + 2 + ... + 32 + 6 x 60 = 423 s without
    # jitter: every outage up to then is recovered, whatever the curve taught.
    reach = horizon(12, base_delay=1.0, multiplier=2.0, max_delay=60.0)
    assert reach == policy_reach(POLICY) == 423.0
    strategy = learned(durations)
    for seed, outage in enumerate([0.5, 2.0, 9.0, 61.0, 150.0, 300.0, 422.0]):
        recovered, times = _tries(strategy, outage, POLICY, seed)
        assert recovered, (outage, times)
        assert len(times) <= POLICY.max_retries
    # An outage longer than any reach: the last try is no sooner than the policy's.
    recovered, times = _tries(strategy, 10_000.0, POLICY, 99)
    assert not recovered and len(times) == 12 and times[-1] >= reach - 1e-6


def test_the_plan_spares_attempts_on_a_slow_site() -> None:
    # Outages of about 100 s: exponential fails at 1, 3, 7, 15, 31 and 63 s; the plan
    # tries where the outages seen end.
    strategy = learned([90.0, 100.0, 110.0] * 20)
    recovered, times = _tries(strategy, 105.0, POLICY, 1)
    default = _tries(ExponentialBackoff(), 105.0, POLICY, 1)[1]
    assert recovered and len(times) <= 5 < len(default)
    # One try before the outages seen start to end at 64 s: max_delay allows no fewer.
    assert len([t for t in times if t < 64]) == 1


# -- without data: the fallback, exactly ------------------------------------------------------


class Constant:
    def delay(self, ctx: BackoffContext) -> float:
        return 0.25


@pytest.mark.parametrize(
    "records",
    [{}, {("server_error", "a.example"): outages([5.0] * 19)}],
    ids=["nothing-seen", "too-few-outages"],
)
def test_without_enough_data_it_is_exactly_the_fallback(records: dict[Any, Record]) -> None:
    for fallback in (None, Constant()):
        strategy = LearnedBackoff(fallback=fallback)
        strategy.learned(RecoveryStats(records))
        reference = fallback or ExponentialBackoff()
        for attempt in range(12):
            for value in (0.0, 0.3, 0.999):
                c = ctx(attempt=attempt, since_first=attempt * 3.0, rand=lambda v=value: v)
                delay, reason = strategy.delay_and_reason(c)
                assert delay == reference.delay(c)
                assert "policy backoff" in reason
                assert "held" not in reason


def test_the_plan_is_computed_once_per_curve_shape() -> None:
    strategy = learned([4.0] * 40)
    strategy.delay(ctx())
    strategy.delay(ctx(attempt=1, since_first=1.0))
    [plan] = strategy._plans.values()
    # A later read whose records only decayed (the same hazards): the same plan.
    record = strategy.stats.records[("server_error", "a.example")]
    strategy.learned(RecoveryStats({("server_error", "a.example"): record.decayed(10**9, 3600)}))
    strategy.delay(ctx())
    assert list(strategy._plans.values()) == [plan]
    # New outcomes: a new plan.
    strategy.learned(
        RecoveryStats({("server_error", "a.example"): outages([4.0] * 40 + [9.0] * 5)})
    )
    strategy.delay(ctx())
    assert len(strategy._plans) == 2


# -- the settings ---------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -0.5, "cheap", float("nan"), float("inf"), 1e9, True])
def test_a_bad_try_cost_is_one_error_naming_the_setting(value: Any) -> None:
    with pytest.raises(ConfigError, match="RETRYQUEUE_LEARNED_TRY_COST") as read:
        learned_backoff_settings(Settings({"RETRYQUEUE_LEARNED_TRY_COST": value}))
    assert "\n" not in str(read.value)
    with pytest.raises(ConfigError, match="RETRYQUEUE_LEARNED_TRY_COST"):
        load_config(Settings({"RETRYQUEUE_LEARNED_TRY_COST": value}))


def test_the_try_cost_is_read_from_the_settings_text() -> None:
    assert learned_backoff_settings(Settings({"RETRYQUEUE_LEARNED_TRY_COST": "2.5"}))[0] == 2.5


def test_the_retired_settings_get_one_warning_naming_what_replaced_them() -> None:
    config = load_config(
        Settings({"RETRYQUEUE_LEARNED_SKIP_BELOW": 0.1, "RETRYQUEUE_LEARNED_EARLY_AT": 0.9})
    )
    said = [n for n in config.notices if "SKIP_BELOW" in n or "EARLY_AT" in n]
    assert len(said) == 1
    [notice] = said
    assert "RETRYQUEUE_LEARNED_EARLY_AT and RETRYQUEUE_LEARNED_SKIP_BELOW are ignored" in notice
    assert "RETRYQUEUE_LEARNED_TRY_COST" in notice
    # Not also called a misspelt setting.
    assert unknown_settings(["RETRYQUEUE_LEARNED_SKIP_BELOW"]) == []
    assert not [n for n in load_config(Settings({})).notices if "ignored" in n]


def test_a_strategy_built_in_code_with_the_retired_arguments_says_so(caplog: Any) -> None:
    with caplog.at_level(logging.WARNING):
        strategy = LearnedBackoff(skip_below=0.04)
    lines = [r for r in caplog.records if "RETRYQUEUE_LEARNED_SKIP_BELOW" in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.WARNING]
    assert "is ignored" in lines[0].getMessage()
    assert strategy.try_cost == LearnedBackoff().try_cost
    with pytest.raises(TypeError):
        LearnedBackoff(skip_beloww=0.04)


def test_a_crawl_setting_a_retired_setting_says_so_once_at_start(
    tmp_path: Any, caplog: Any
) -> None:
    from scrapy import Spider
    from scrapy.utils.misc import build_from_crawler
    from scrapy.utils.test import get_crawler

    from scrapy_retryqueue import Addon
    from scrapy_retryqueue.crawl.middleware import RetryQueueMiddleware

    class Retired(Spider):
        name = "retired"

    crawler = get_crawler(
        Retired,
        {
            "ADDONS": {Addon: 0},
            "RETRYQUEUE_EMBEDDED_DIR": str(tmp_path),
            "RETRYQUEUE_REDIS_URL": "redis://127.0.0.1:1/0",
            "RETRYQUEUE_START_WITHOUT_REDIS": True,
            "RETRYQUEUE_BACKOFF": "scrapy_retryqueue.LearnedBackoff",
            "RETRYQUEUE_LEARNED_SKIP_BELOW": 0.1,
        },
    )
    with caplog.at_level(logging.WARNING):
        build_from_crawler(RetryQueueMiddleware, crawler)
        build_from_crawler(RetryQueueMiddleware, crawler)
    said = [r for r in caplog.records if "SKIP_BELOW" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.WARNING]
    assert (
        said[0]
        .getMessage()
        .startswith("scrapy-retryqueue: RETRYQUEUE_LEARNED_SKIP_BELOW is ignored: ")
    )
    assert "RETRYQUEUE_LEARNED_TRY_COST" in said[0].getMessage()
