"""The capacity benchmark's fleet of simulated nodes, run small: it claims every retry once.

``python -m benchmarks.capacity`` runs the same code with up to 500 nodes on a
private Redis and cluster; here 20 nodes share the test Redis for about a second
and a half. Nothing here is timed: the figures are the benchmark's to report.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from benchmarks.fleet_capacity import FleetPlan, fairness, jain, percentile, run_fleet, spread_names
from scrapy_retryqueue.queue.keys import all_keys, keys_for


@pytest.fixture
def fleet_spiders(redis_url: str) -> Iterator[tuple[str, ...]]:
    """Two spider names of the fleet's own; their keys are deleted afterwards."""
    names = spread_names(2, 1, None)
    yield names
    client = redis.Redis.from_url(redis_url)
    for name in names:
        client.delete(*all_keys(keys_for(name)))
    client.close()


def test_a_fleet_of_twenty_nodes_claims_every_retry_once(
    redis_url: str, fleet_spiders: tuple[str, ...]
) -> None:
    plan = FleetPlan(
        nodes=20,
        spiders=fleet_spiders,
        url=redis_url,
        rate=40,
        idle=0.6,
        busy=1.0,
        poll_interval=0.2,
        work=0.05,
        processes=0,  # threads of this process: the code path the worker processes run
        due_after=(0.05, 0.3),
    )
    client = redis.Redis.from_url(redis_url)
    try:
        result = run_fleet(plan, "one server", [client], client)
        leftovers = [k for s in fleet_spiders for k in all_keys(keys_for(s)) if client.exists(k)]
    finally:
        client.close()
    assert result.errors == []
    assert result.scheduled > 0
    assert result.duplicates == 0
    assert result.lost == 0
    assert result.claimed == result.scheduled
    assert result.acks_refused == 0
    # Every node polled while at rest, and the claims are counted per node.
    assert result.polls_idle >= plan.nodes
    assert result.fairness["mean"] * plan.nodes == pytest.approx(result.claimed)
    assert leftovers == []


def test_jain_index_and_shares() -> None:
    assert jain([3, 3, 3]) == 1.0
    assert jain([4, 0, 0, 0]) == 0.25
    shares = fairness([1, 2, 3])
    assert (shares["min_share"], shares["max_share"]) == (0.5, 1.5)
    assert shares["jain_if_random"] == pytest.approx(2 / 3)


def test_percentile_is_a_value_of_the_sample() -> None:
    values = list(range(1, 101))
    assert percentile(values, 0.99) == 99
    assert percentile(values, 0.5) == 50
    assert percentile([7], 0.99) == 7
