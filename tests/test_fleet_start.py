"""A fleet shares the work however its nodes start: at the same instant, or one late.

Runs example_project/run_fleet.py's fleet: the flaky site, and `scrapy crawl
flaky_fleet` nodes sharing one Redis (scrapy-redis's frontier and dupefilter,
scrapy-retryqueue's failures).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest

from . import crawling  # noqa: F401  (puts example_project on sys.path)

run_fleet = importlib.import_module("run_fleet").run_fleet

pytestmark = pytest.mark.e2e

PAGES = 200
SLOW_NODES = {"CONCURRENT_REQUESTS": 2, "CONCURRENT_REQUESTS_PER_DOMAIN": 2}


def _check_shared(fleet: Any) -> None:
    for node in fleet.nodes:
        assert node.returncode == 0, node.log[-3000:]
        # Every node took part of the frontier: none left at once.
        assert node.fetched > 0, (node.name, fleet.report())
        # scrapy-redis's deprecation warning is kept out of the crawl's log.
        assert "StatsCollector.inc_value() is deprecated" not in node.log
    # Every parseable page parsed exactly once across the fleet.
    assert fleet.lost == set(), fleet.report()
    assert fleet.duplicates == 0, fleet.report()
    # The retries were shared too.
    assert sum(1 for node in fleet.nodes if node.retried) >= 2, fleet.report()


def test_three_nodes_started_at_the_same_instant_share_the_crawl(
    redis_url: str, tmp_path: Path
) -> None:
    # Slow enough (2 requests a node, 0.2 s a page) that a node whose Scrapy starts a
    # second or two after the others on a loaded machine still finds the frontier full.
    fleet = run_fleet(
        nodes=3,
        pages=PAGES,
        redis_url=redis_url,
        workdir=tmp_path,
        site_options={"latency": 0.2},
        node_settings=SLOW_NODES,
    )
    _check_shared(fleet)


def test_a_node_started_late_joins_a_crawl_in_progress(redis_url: str, tmp_path: Path) -> None:
    # The first two nodes crawl slowly (2 requests each, 0.2 s a page: 10 s or more for
    # the frontier), so the late node, started 1 s after they begin, finds work left
    # however long Scrapy takes to start on this machine.
    fleet = run_fleet(
        nodes=3,
        pages=PAGES,
        redis_url=redis_url,
        workdir=tmp_path,
        late=1.0,
        site_options={"latency": 0.2},
        node_settings=SLOW_NODES,
    )
    _check_shared(fleet)
    late = fleet.nodes[-1]
    assert "Spider opened" in late.log
