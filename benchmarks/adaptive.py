"""11. Learned backoff against fixed formulas, simulated: the strategies' real code in virtual time.

Ten domains, each with 150 outages in a row whose durations follow a stated
distribution (lognormal with sigma 1, and a heavy-tailed Pareto with alpha 1.5)
at medians of 2 s, 10 s, 40 s, 150 s and 600 s; each outage fails 4 tasks, first
failing at random moments in it; every task recovers when its outage ends. Each
failure goes through PolicyTable.decide with the default server_error policy
(1 s base, 240 s max, 9 retries, equal jitter) and the strategy under test:
ExponentialBackoff (the default), the same with full jitter, LearnedBackoff. The
learned records are kept by recovery.Record.add (what the scripts do) and handed
to the strategy after every outage (the poll's refresh); the first 20 % of each
domain's outages are its warm-up and are not counted. Fixed seeds. Figures:
failed retries per recovered task, the lag from the site's recovery to the
task's success (p50, p90, s), recoverable tasks dead-lettered (all are
recoverable here), and retries per second sent to a domain while it is down.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

from scrapy_retryqueue.backoff import ExponentialBackoff
from scrapy_retryqueue.classify import FailureInfo
from scrapy_retryqueue.defaults import LEARNED_HALF_LIFE, POLICIES
from scrapy_retryqueue.learned import LearnedBackoff
from scrapy_retryqueue.policy import Policy, PolicyTable
from scrapy_retryqueue.recovery import Record, RecoveryStats, empty_record, observation

KIND = "server_error"
MEDIANS = (2.0, 10.0, 40.0, 150.0, 600.0)
OUTAGES = 150
TASKS_PER_OUTAGE = 4
WARMUP = 0.2
SEED = 19


def _duration(rng: random.Random, shape: str, median: float) -> float:
    if shape == "lognormal":
        return rng.lognormvariate(0.0, 1.0) * median
    # Pareto(alpha) scaled so its median is *median*: heavy tail.
    alpha = 1.5
    return median / 2 ** (1 / alpha) * rng.paretovariate(alpha)


class FullJitter(ExponentialBackoff):
    """The policy's exponential backoff with full jitter (AWS's advice)."""

    def delay(self, ctx: Any) -> float:
        return super().delay(replace(ctx, policy=replace(ctx.policy, jitter="full")))


def simulate(strategy_name: str) -> dict[str, float]:
    policy = Policy.from_dict(POLICIES[KIND], where=KIND)
    if strategy_name == "learned":
        strategy: Any = LearnedBackoff()
    elif strategy_name == "full":
        strategy = FullJitter()
    else:
        strategy = ExponentialBackoff()
    table = PolicyTable(
        {KIND: policy, "unknown": policy}, {}, retry_after_max=3600, backoff=strategy
    )
    failure = FailureInfo(KIND, "HttpStatus", "HTTP 503", status=503)
    records: dict[tuple[str, str], Record] = {}
    failed = recovered = dead = 0
    lags: list[float] = []
    sent_down = 0
    down_time = 0.0
    for shape in ("lognormal", "pareto"):
        for median in MEDIANS:
            domain = f"{shape}-{median:g}.example"
            rng = random.Random(f"{SEED}-{shape}-{median}")
            decide_rng = random.Random(f"{SEED}-{strategy_name}-{domain}")
            clock = 0.0
            for n in range(OUTAGES):
                length = _duration(rng, shape, median)
                start, end = clock, clock + length
                counted = n >= OUTAGES * WARMUP
                if counted:
                    down_time += length
                for _ in range(TASKS_PER_OUTAGE):
                    t = start + rng.random() * length
                    first, prior, attempts = t, None, 0
                    while True:
                        decision = table.decide(
                            failure,
                            {KIND: attempts},
                            domain=domain,
                            rand=decide_rng.random,
                            since_first=t - first,
                        )
                        wait_ms = int((t - first) * 1000)
                        if not decision.retry:
                            dead += counted
                            _learn(records, domain, prior, wait_ms, False, t)
                            break
                        attempts += 1
                        t += decision.delay
                        if t >= end:
                            recovered += counted
                            if counted:
                                lags.append(t - end)
                            _learn(records, domain, prior, int((t - first) * 1000), True, t)
                            break
                        failed += counted
                        sent_down += counted
                        _learn(records, domain, prior, int((t - first) * 1000), False, t)
                        prior = int((t - first) * 1000)
                # The next outage starts after a healthy spell; the fleet reads what it learned.
                clock = end + 60 + rng.random() * 600
                if isinstance(strategy, LearnedBackoff):
                    strategy.learned(RecoveryStats(records))
    lags.sort()
    return {
        "failed/recovered": failed / max(1, recovered),
        "lag p50 s": statistics.median(lags),
        "lag p90 s": lags[int(len(lags) * 0.9)],
        "dead": float(dead),
        "retries/s down": sent_down / down_time,
    }


def _learn(
    records: dict[tuple[str, str], Record],
    domain: str,
    prior: int | None,
    wait_ms: int,
    recovered: bool,
    now_s: float,
) -> None:
    key = (KIND, domain)
    record = records.get(key) or empty_record(int(now_s * 1000))
    first, last = observation(prior, wait_ms)
    records[key] = record.add(
        first, last, recovered, now=int(now_s * 1000), half_life=LEARNED_HALF_LIFE
    )


def measure(redis_url: str, tmp: Path) -> dict[str, float]:
    results = {name: simulate(name) for name in ("exponential", "full", "learned")}
    figures: dict[str, float] = {}
    for name, values in results.items():
        for figure, value in values.items():
            figures[f"{name} {figure}"] = value
    exp, learned = results["exponential"], results["learned"]
    figures["learned ÷ exponential failed/recovered"] = (
        learned["failed/recovered"] / exp["failed/recovered"]
    )
    figures["learned ÷ exponential lag p50"] = learned["lag p50 s"] / exp["lag p50 s"]
    figures["learned ÷ exponential lag p90"] = learned["lag p90 s"] / exp["lag p90 s"]
    figures["learned minus exponential dead"] = learned["dead"] - exp["dead"]
    return figures
