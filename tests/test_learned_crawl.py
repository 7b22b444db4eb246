"""LearnedBackoff in a real crawl: a learned delay shorter than the default's for a domain
whose outages have been short, longer for one whose outages have been long.

The records are seeded by running outcomes through the real scripts (a
reschedule, then an ack, per outage), then a crawl (tests/kinds_crawl.py, in a
subprocess) with RETRYQUEUE_BACKOFF = LearnedBackoff fetches one URL on each
domain of a small site served here (127.0.0.1 and localhost are two domains of
one server). ``/down/NAME?for=S`` is down (503) for S seconds from its first
fetch, which it answers after a second (time for the crawl's first read of
the records); the site records when each URL was fetched.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import redis

from scrapy_retryqueue.decision.kinds import SERVER_ERROR
from scrapy_retryqueue.queue.delayed import RedisDelayedQueue, Write

from .sitecrawl import Site, run_crawl, serving, spider_named

#: server_error here: the default strategy would wait 1 s, then 6 s, then 36 s.
POLICY = {
    "retry": True,
    "base_delay": 1.0,
    "multiplier": 6.0,
    "max_delay": 36.0,
    "max_retries": 3,
    "jitter": "none",
}
FAST, SLOW = "127.0.0.1", "localhost"
#: Outages seen per domain (failed at, succeeded at, s from the first failure): the
#: scripts date each recovery midway, about 2 s for the fast one, 12 s for the slow.
SEEN = {FAST: (1.5, 2.5), SLOW: (11.0, 13.0)}
#: How long the site's first answer of a URL takes, s.
FIRST_ANSWER = 1.0


def answer(path: str, query: dict[str, list[str]], times: list[float]) -> tuple[int, bytes]:
    """``/down/NAME?for=S``: 503 for S seconds from its first fetch, then 200; the
    first answer of each path takes FIRST_ANSWER seconds."""
    if len(times) == 1:
        time.sleep(FIRST_ANSWER)  # the test's server thread, not the crawl's
    if times[-1] - times[0] < float(query["for"][0]):
        return 503, b"<html>down</html>"
    return 200, b"<html>up</html>"


@pytest.fixture
def site() -> Iterator[Site]:
    with serving(Site(answer)) as served:
        yield served


@pytest.fixture
def spider(redis_url: str) -> Iterator[str]:
    with spider_named("learned", redis_url) as name:
        yield name


def seed(client: redis.Redis, spider: str, port: int, make_task: object) -> None:
    """30 outages per domain through the real scripts: each task failed at once, was
    rescheduled at its first figure of SEEN and succeeded at its second."""
    queue = RedisDelayedQueue(client, spider, node_id="seeder")
    # Recent: the records' weights halve every RETRYQUEUE_LEARNED_HALF_LIFE (a week).
    t0 = int(time.time() * 1000) - 60_000
    for host, (failed_at, succeeded_at) in SEEN.items():
        for n in range(30):
            task = make_task(  # type: ignore[operator]
                f"{host}-{n}",
                url=f"http://{host}:{port}/seen/{n}",
                kind=SERVER_ERROR,
                created=t0,
                updated=t0,
                due=t0,
            )
            assert queue.schedule(task, now=t0)
            prior = None
            for wait, op in ((failed_at, "reschedule"), (succeeded_at, "ack")):
                now = t0 + int(wait * 1000)
                token = f"seed-{op}"
                assert queue.claim(now=now, limit=1, lease_until=now + 10**7, token=token).tasks
                write = replace(
                    Write.for_task(op, replace(task, due=now + 1), token, now),
                    learn=SERVER_ERROR,
                    prior=prior,
                )
                assert queue.apply([write]) == [True]
                prior = int(wait * 1000)
    assert client.hlen(queue.keys.recovery) == 2


def test_a_learned_delay_is_shorter_for_a_fast_domain_and_longer_for_a_slow_one(
    site: Site, spider: str, redis_url: str, tmp_path: Path, make_task: object
) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        seed(client, spider, site.port, make_task)
    finally:
        client.close()
    # Down 3 s and 13 s from the first fetch: 2 s and 12 s after its answer.
    urls = [
        f"http://{FAST}:{site.port}/down/fast?for=3",
        f"http://{SLOW}:{site.port}/down/slow?for=13",
    ]
    settings = {
        "RETRYQUEUE_REDIS_URL": redis_url,
        "RETRYQUEUE_STORE_ENABLED": False,
        "RETRYQUEUE_POLL_INTERVAL": 0.1,
        "RETRYQUEUE_BACKOFF": "scrapy_retryqueue.LearnedBackoff",
        "RETRYQUEUE_POLICIES": {SERVER_ERROR: POLICY},
        "LOG_LEVEL": "DEBUG",
    }
    crawl = run_crawl(spider, urls, settings, tmp_path)

    assert sorted(crawl["parsed"]) == sorted(urls)
    fast, slow = site.hits["/down/fast"], site.hits["/down/slow"]
    # The default would fail again 1 s after the first answer and succeed 6 s later,
    # 8 s after the first fetch; learned, the first retry waits for the ~2 s its
    # domain's outages lasted, and succeeds.
    assert len(fast) == 2, site.gaps("/down/fast")
    assert fast[-1] - fast[0] < 6.0, site.gaps("/down/fast")
    # The default would retry 1 s after the first answer; learned, about 12 s later
    # (never past max_delay), so one retry is all it takes or nearly.
    first_gap = slow[1] - slow[0] - FIRST_ANSWER
    assert 7.0 <= first_gap < POLICY["max_delay"] + 3.0, site.gaps("/down/slow")
    assert len(slow) <= 3, site.gaps("/down/slow")
    # Each learned choice says why, from the domain's own curve.
    log = crawl["log"]
    assert f"{SERVER_ERROR} at {FAST} (30 outages)" in log, log[-3000:]
    assert f"{SERVER_ERROR} at {SLOW} (30 outages)" in log
    assert "RETRYQUEUE_BACKOFF" not in log  # no error line about the strategy
