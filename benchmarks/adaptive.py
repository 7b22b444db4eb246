"""11. Learned backoff against fixed formulas: simulated in virtual time, then on a real crawl.

Simulation: Ten domains, each with 150 outages in a row whose durations follow a stated
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

The retry budget (RETRYQUEUE_RETRY_BUDGET = 0.2, floor 1/s, window 10 s), off and
on, for each strategy: one domain crawled at 10 fresh requests/s for 40 min goes
down 8 times (lognormal outages, median 40 s, sigma 1, seed fixed); every fresh
request sent while it is down fails and is parked, and its retries go through
the real claim.lua on a private Redis in virtual time (a node's poll every
second carries the fresh requests it sent, claims what is due, runs each retry at
once; the retry fails while the domain is down). Figures per strategy and budget:
requests per second sent to the failing domain while it is down (fresh +
retries), the retries among them, the most retries in any 10 s window, windows
whose retries exceed the budget (floor x 10 s + 20 % of the fresh requests of
that window), failed retries per recovered task, the lag from the recovery to
the task's success (p50, p90), and tasks dead-lettered.
Real crawl ("crawl ..." figures): per strategy (the same three), five hosts (flaky sites on
127.0.x.2-6, --outages mode) whose outages have medians of 2, 5, 10, 20 and 40 s
(each pass's length drawn lognormal, sigma 0.3, fixed seed, the same draws
for every strategy: 1.8, 5.3, 12.0, 22.5, 36.9 s, then 2.0, 6.7, 7.8, 22.9,
43.4 s, and measured 1.8, 3.4, 6.2, 13.7, 50.5 s); each pass fetches 24 pages per host at once, so the
first request opens the host's outage window and every page fails in it.
Two passes teach the fleet (the records in Redis), the third is measured.
The three strategies run at the same time, each its own spider and hosts,
one crawl node each (tests/domains_crawl.py) on one Redis of their own, with
the server_error policy at 1 s base, x2, 30 s max, 6 retries, equal jitter
(full jitter: the same with "full"). Figures of the measured pass, from the
sites' logs: failed retries per recovered page, the lag from the host's
recovery to the page's 200 (p50, p90, s), pages never fetched (all are
recoverable), and retries per second a host got while down; and the lag over
the tasks (pages) every strategy recovered, since each plain lag is over what
that strategy recovered. ``python -m benchmarks.adaptive`` runs one round of the
crawl alone and prints its figures per host.
Family ("family ..." figures, benchmarks/outage_family.py, deterministic: once): eight
outage distributions (the last one's outages often outlast the policy) and issue 35's site, each with the default exponential backoff,
LearnedBackoff, the distribution oracle (the same plan over the true curve) and the
perfect oracle (one try at the outage's end: 0 failed, 0 lag, not listed), medians of 3
seeds; regret is LearnedBackoff's cost (RETRYQUEUE_LEARNED_TRY_COST x failed tries per
recovered task + mean lag) over the distribution oracle's.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import statistics
import subprocess
import sys
import threading
from bisect import bisect_right
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import redis

from scrapy_retryqueue.decision.backoff import ExponentialBackoff
from scrapy_retryqueue.decision.classify import FailureInfo
from scrapy_retryqueue.decision.kinds import POLICIES
from scrapy_retryqueue.decision.learned import LearnedBackoff
from scrapy_retryqueue.decision.policy import Policy, PolicyTable
from scrapy_retryqueue.decision.recovery import Record, RecoveryStats
from scrapy_retryqueue.queue.delayed import RedisDelayedQueue, RetryBudget, Write
from scrapy_retryqueue.queue.envelope import Task
from scrapy_retryqueue.queue.keys import all_keys, keys_for

from .common import ROOT, flaky_site, run_threads
from .outage_family import learn as _learn
from .outage_family import measure_family

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


#: A strategy's figures, and the lag (s) of each task it recovered, by task.
Outcome = tuple[dict[str, float], dict[str, float]]


def _table(strategy_name: str) -> tuple[PolicyTable, Any]:
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
    return table, strategy


def simulate(strategy_name: str) -> Outcome:
    table, strategy = _table(strategy_name)
    failure = FailureInfo(KIND, "HttpStatus", "HTTP 503", status=503)
    records: dict[tuple[str, str], Record] = {}
    failed = recovered = dead = 0
    lags: list[float] = []
    by_task: dict[str, float] = {}
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
                for i in range(TASKS_PER_OUTAGE):
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
                                by_task[f"{domain}/{n}/{i}"] = t - end
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
    }, by_task


# -- the retry budget: one busy domain's outages through the real claim script ---------

BUDGET = RetryBudget(share=0.2, floor=1.0, window=10.0)
BUDGET_RATE = 10  # fresh requests per second to the domain
BUDGET_OUTAGES = 8
BUDGET_MEDIAN = 40.0
BUDGET_SECONDS = 2400
#: Virtual time of the simulation's start (ms), far from 0.
T0 = 1_700_000_000_000


def _outages(rng: random.Random) -> list[tuple[float, float]]:
    """(start, end) of each outage, seconds, spread over the run with healthy spells."""
    spell = BUDGET_SECONDS / BUDGET_OUTAGES
    out = []
    for n in range(BUDGET_OUTAGES):
        length = min(spell * 0.8, rng.lognormvariate(0.0, 1.0) * BUDGET_MEDIAN)
        start = n * spell + rng.random() * (spell * 0.9 - length)
        out.append((start, start + length))
    return out


def simulate_budget(client: redis.Redis, strategy_name: str, budget_on: bool) -> dict[str, float]:
    table, strategy = _table(strategy_name)
    failure = FailureInfo(KIND, "HttpStatus", "HTTP 503", status=503)
    spider = f"adaptive-budget-{strategy_name}-{int(budget_on)}"
    client.delete(*all_keys(keys_for(spider)))
    queue = RedisDelayedQueue(client, spider, node_id="sim")
    budget = BUDGET if budget_on else None
    rng = random.Random(f"{SEED}-budget")
    decide_rng = random.Random(f"{SEED}-budget-{strategy_name}")
    outages = _outages(rng)
    domain = "busy.example"

    def outage_at(t: float) -> tuple[float, float] | None:
        for start, end in outages:
            if start <= t < end:
                return start, end
        return None

    #: id -> (task, its first failure (s), ms from it to its latest failure)
    tasks: dict[str, tuple[Task, float, int | None]] = {}
    records: dict[tuple[str, str], Record] = {}
    sent_fresh: list[float] = []
    retries_at: list[float] = []
    failed = recovered = dead = 0
    lags: list[float] = []
    serial = 0
    pending_fresh = 0
    second = 0
    while second < BUDGET_SECONDS or tasks:
        if second > BUDGET_SECONDS * 4:
            break  # a backlog that never drains would show as tasks left (dead)
        now_ms = T0 + second * 1000
        writes: list[Write] = []
        if second < BUDGET_SECONDS:
            for _ in range(BUDGET_RATE):
                t = second - 1 + rng.random()
                sent_fresh.append(t)
                pending_fresh += 1
                if t >= 0 and outage_at(t):
                    serial += 1
                    decision = table.decide(
                        failure, {KIND: 0}, domain=domain, rand=decide_rng.random, since_first=0.0
                    )
                    task = Task(
                        id=f"task-{serial}",
                        spider=spider,
                        request={"url": f"https://{domain}/{serial}"},
                        kind=KIND,
                        due=int(T0 + (t + decision.delay) * 1000),
                        attempts={KIND: 1},
                        created=int(T0 + t * 1000),
                    )
                    tasks[task.id] = (task, t, None)
                    writes.append(Write.for_task("schedule", task, None, int(T0 + t * 1000)))
        if writes:
            queue.apply(writes)
        token = f"poll-{second}"
        got = queue.claim(
            now=now_ms,
            limit=10_000,
            lease_until=now_ms + 60_000,
            token=token,
            budget=budget,
            requests={domain: pending_fresh} if pending_fresh else {},
        )
        pending_fresh = 0
        outcomes: list[Write] = []
        for task_id, _ in got.tasks:
            task, first, prior = tasks[task_id]
            retries_at.append(float(second))
            since = second - first
            wait_ms = int(since * 1000)
            attempts = task.attempts[KIND]
            if outage_at(second) is None:
                recovered += 1
                end = max((e for _, e in outages if e <= second), default=first)
                lags.append(second - end)
                _learn(records, domain, prior, wait_ms, True, second)
                outcomes.append(Write("ack", task_id, now_ms, token, kind=KIND))
                del tasks[task_id]
                continue
            failed += 1
            _learn(records, domain, prior, wait_ms, False, second)
            decision = table.decide(
                failure, {KIND: attempts}, domain=domain, rand=decide_rng.random, since_first=since
            )
            if not decision.retry:
                dead += 1
                outcomes.append(Write.for_task("deadletter", task, token, now_ms))
                del tasks[task_id]
                continue
            task = replace(
                task, attempts={KIND: attempts + 1}, due=int(now_ms + decision.delay * 1000)
            )
            tasks[task_id] = (task, first, wait_ms)
            outcomes.append(Write.for_task("reschedule", task, token, now_ms))
        if outcomes:
            queue.apply(outcomes)
        if isinstance(strategy, LearnedBackoff) and second % 30 == 0:
            strategy.learned(RecoveryStats(records))
        second += 1
    client.delete(*all_keys(keys_for(spider)))
    dead += len(tasks)
    sent_fresh.sort()
    down_s = sum(end - start for start, end in outages)
    fresh_down = sum(1 for t in sent_fresh if outage_at(t))
    retries_down = sum(1 for t in retries_at if outage_at(t))
    peak = over = 0
    for k, t in enumerate(retries_at):
        in_window = k + 1 - bisect_right(retries_at, t - BUDGET.window)
        fresh = bisect_right(sent_fresh, t) - bisect_right(sent_fresh, t - BUDGET.window)
        peak = max(peak, in_window)
        if in_window > BUDGET.floor * BUDGET.window + BUDGET.share * fresh:
            over += 1
    lags.sort()
    return {
        "requests/s down": (fresh_down + retries_down) / down_s,
        "retries/s down": retries_down / down_s,
        "peak retries per 10 s": float(peak),
        "retries over budget": float(over),
        "failed/recovered": failed / max(1, recovered),
        "lag p50 s": statistics.median(lags) if lags else 0.0,
        "lag p90 s": lags[int(len(lags) * 0.9)] if lags else 0.0,
        "dead": float(dead),
    }


# -- the real crawl -----------------------------------------------------------------

NODE = ROOT / "tests" / "domains_crawl.py"
#: Median outage of each host, s, and the spread of its passes' lengths (lognormal sigma).
CRAWL_MEDIANS = (2.0, 5.0, 10.0, 20.0, 40.0)
CRAWL_SIGMA = 0.3
CRAWL_PAGES = 24
#: Passes that teach the fleet before the measured one.
CRAWL_LEARNING_PASSES = 2
CRAWL_POLICY = {
    "retry": True,
    "base_delay": 1.0,
    "multiplier": 2.0,
    "max_delay": 30.0,
    "max_retries": 6,
    "jitter": "equal",
}
STRATEGIES = ("exponential", "full", "learned")
#: A pass that has not ended by then is a broken benchmark, s.
PASS_TIMEOUT = 300


def crawl_lengths() -> list[list[float]]:
    """Per pass, each host's outage length (s): the same draws for every strategy."""
    rng = random.Random(f"{SEED}-crawl")
    return [
        [round(median * rng.lognormvariate(0.0, CRAWL_SIGMA), 2) for median in CRAWL_MEDIANS]
        for _ in range(CRAWL_LEARNING_PASSES + 1)
    ]


def _node_settings(redis_url: str, strategy: str) -> dict[str, Any]:
    policy = dict(CRAWL_POLICY, jitter="full") if strategy == "full" else CRAWL_POLICY
    settings: dict[str, Any] = {
        "RETRYQUEUE_REDIS_URL": redis_url,
        "RETRYQUEUE_NODE_ID": f"bench-{strategy}",
        "RETRYQUEUE_STORE_ENABLED": False,
        "RETRYQUEUE_POLL_INTERVAL": 0.2,
        "RETRYQUEUE_LEASE_TIME": 10,
        "RETRYQUEUE_IDLE_TIMEOUT": 120,
        "RETRYQUEUE_POLICIES": {"server_error": policy},
        "RETRYQUEUE_LEARNED_REFRESH": 1.0,
        "CONCURRENT_REQUESTS": 64,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 32,
        "CONCURRENT_ITEMS": 10,
        "DOWNLOAD_TIMEOUT": 5,
        "LOG_LEVEL": "WARNING",
    }
    if strategy == "learned":
        settings["RETRYQUEUE_BACKOFF"] = "scrapy_retryqueue.LearnedBackoff"
    return settings


#: Per strategy, per host of its last measured pass: (outage s, failed retries,
#: recovered, dead, lag p50): printed by ``python -m benchmarks.adaptive``.
PER_HOST: dict[str, list[tuple[float, int, int, int, float]]] = {}


def _pass_figures(sites: list[Any], strategy: str = "") -> Outcome:
    failed = recovered = dead = sent_down = 0
    lags: list[float] = []
    down = 0.0
    PER_HOST[strategy] = []
    by_page: dict[str, float] = {}
    for index, site in enumerate(sites):
        before = (failed, recovered, dead, len(lags))
        (window,) = site.get_json("/__outages")[-1:]
        down += window["length"]
        per_page: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for entry in site.get_json("/__log"):
            per_page[entry["path"]].append(entry)
        for path, entries in per_page.items():
            entries.sort(key=lambda e: e["t"])
            failures = [e for e in entries if e["status"] == 503]
            if not failures:
                continue  # first fetched after the outage: no task
            sent_down += len(failures) - 1
            ok = [e for e in entries if e["status"] == 200]
            if ok:
                recovered += 1
                failed += len(failures) - 1
                lags.append(max(0.0, ok[0]["t"] - window["end"]))
                by_page[f"{index}{path}"] = lags[-1]
            else:
                dead += 1
        host_lags = sorted(lags[before[3] :])
        PER_HOST[strategy].append(
            (
                window["length"],
                failed - before[0],
                recovered - before[1],
                dead - before[2],
                statistics.median(host_lags) if host_lags else math.nan,
            )
        )
    lags.sort()
    return {
        "failed/recovered": failed / max(1, recovered),
        "lag p50 s": statistics.median(lags) if lags else math.nan,
        "lag p90 s": lags[int(len(lags) * 0.9)] if lags else math.nan,
        "dead": float(dead),
        "retries/s down": sent_down / down if down else 0.0,
    }, by_page


def crawl_strategy(redis_url: str, workdir: Path, index: int, strategy: str) -> Outcome:
    """Every pass of one strategy on its own hosts; the measured pass's figures."""
    lengths = crawl_lengths()
    spider = f"adaptive-{strategy}"
    settings = json.dumps(_node_settings(redis_url, strategy))
    hosts = [f"127.0.{20 + index}.{2 + j}" for j in range(len(CRAWL_MEDIANS))]
    with contextlib.ExitStack() as stack:
        sites = [
            stack.enter_context(
                flaky_site(
                    host=host,
                    mix="healthy",
                    pages=CRAWL_PAGES,
                    outages=",".join(str(lengths[p][j]) for p in range(len(lengths))),
                )
            )
            for j, host in enumerate(hosts)
        ]
        urls = [f"{site.url}/page/{n}" for n in range(CRAWL_PAGES) for site in sites]
        figures: Outcome = ({}, {})
        for p in range(len(lengths)):
            for site in sites:
                if p:
                    site.reset()  # arms the pass's outage
            out = workdir / f"{spider}-{p}.json"
            subprocess.run(
                [sys.executable, str(NODE), json.dumps(urls), spider, settings, str(out)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=PASS_TIMEOUT,
                check=True,
            )
            figures = _pass_figures(sites, strategy)
    return figures


def crawl(redis_url: str, workdir: Path) -> dict[str, Outcome]:
    """The strategies' real crawls, side by side (threads waiting on subprocesses)."""
    results: dict[str, Outcome] = {}
    errors: list[BaseException] = []

    def run(index: int, strategy: str) -> None:
        try:
            results[strategy] = crawl_strategy(redis_url, workdir, index, strategy)
        except BaseException as exc:  # said by the caller, not lost in a thread
            errors.append(exc)

    run_threads(
        [threading.Thread(target=run, args=(i, name)) for i, name in enumerate(STRATEGIES)], errors
    )
    return results


def _compare(figures: dict[str, float], outcomes: dict[str, Outcome], prefix: str) -> None:
    """Each strategy's figures; its lag over the tasks every strategy recovered (the
    plain lag is over what each recovered, so one that saves more of the long outages
    is measured on a slower population); and the learned ones against exponential."""
    common = set.intersection(*(set(lags) for _, lags in outcomes.values()))
    for name, (values, lags) in outcomes.items():
        for figure, value in values.items():
            figures[f"{prefix}{name} {figure}"] = value
        both = sorted(lags[task] for task in common)
        figures[f"{prefix}{name} lag p50 s, tasks all recovered"] = _p(both, 0.5)
        figures[f"{prefix}{name} lag p90 s, tasks all recovered"] = _p(both, 0.9)
    exp = outcomes["exponential"][0]
    exp_p50 = figures[f"{prefix}exponential lag p50 s, tasks all recovered"]
    exp_p90 = figures[f"{prefix}exponential lag p90 s, tasks all recovered"]
    for name in ("learned",):
        learned = outcomes[name][0]
        figures[f"{prefix}{name} ÷ exponential failed/recovered"] = (
            learned["failed/recovered"] / exp["failed/recovered"]
        )
        figures[f"{prefix}{name} ÷ exponential lag p50"] = learned["lag p50 s"] / exp["lag p50 s"]
        figures[f"{prefix}{name} ÷ exponential lag p90"] = learned["lag p90 s"] / exp["lag p90 s"]
        p50 = figures[f"{prefix}{name} lag p50 s, tasks all recovered"]
        p90 = figures[f"{prefix}{name} lag p90 s, tasks all recovered"]
        figures[f"{prefix}{name} ÷ exponential lag p50, tasks all recovered"] = p50 / exp_p50
        figures[f"{prefix}{name} ÷ exponential lag p90, tasks all recovered"] = p90 / exp_p90
        figures[f"{prefix}{name} minus exponential dead"] = learned["dead"] - exp["dead"]


def _p(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    return statistics.median(values) if q == 0.5 else values[int(len(values) * q)]


#: The simulation is deterministic: a round after the first reuses its outcomes.
_SIMULATED: dict[str, Outcome] = {}
_BUDGETED: dict[str, float] = {}
_FAMILY: dict[str, float] = {}


def measure(redis_url: str, tmp: Path) -> dict[str, float]:
    figures: dict[str, float] = {}
    if not _SIMULATED:
        _SIMULATED.update({name: simulate(name) for name in STRATEGIES})
    _compare(figures, _SIMULATED, "")
    if not _BUDGETED:
        client = redis.Redis.from_url(redis_url)
        try:
            for name in ("exponential", "full", "learned"):
                for on in (False, True):
                    for figure, value in simulate_budget(client, name, on).items():
                        _BUDGETED[f"budget {'on' if on else 'off'}, {name}: {figure}"] = value
        finally:
            client.close()
    figures.update(_BUDGETED)
    if not _FAMILY:
        _FAMILY.update(measure_family())
    figures.update(_FAMILY)
    _compare(figures, crawl(redis_url, tmp), "crawl ")
    return figures


if __name__ == "__main__":
    # The real crawl alone: python -m benchmarks.adaptive
    import tempfile

    from .common import own_redis

    with tempfile.TemporaryDirectory() as tmp, own_redis() as url:
        for strategy, (values, _) in crawl(url, Path(tmp)).items():
            print(strategy, json.dumps(values))
            for host in PER_HOST[strategy]:
                length, failed, recovered, dead, lag = host
                print(
                    f"  outage {length:.1f} s: {failed} failed retries, {recovered} recovered, "
                    f"{dead} dead, lag p50 {lag:.1f} s"
                )
