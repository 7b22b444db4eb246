"""Nothing lost when nodes die: the leased frontier of a scrapy-redis fleet.

Runs example_project/run_fleet.py's fleet (the flaky site, `scrapy crawl
flaky_fleet` nodes over scrapy-redis's scheduler with the leased frontier as its
queue) and kills nodes with SIGKILL once they have crawled a share of the site.
"""

from __future__ import annotations

import importlib
import signal
from pathlib import Path
from typing import Any

import pytest

from . import crawling  # noqa: F401  (puts example_project on sys.path)
from .waiting import wait_for

run_fleet = importlib.import_module("run_fleet").run_fleet

pytestmark = pytest.mark.e2e

PAGES = 200
#: Slow enough (4 requests a node, 0.15 s a page) that the nodes to kill have
#: requests in hand when they die, and the survivors have a crawl to finish.
NODES = {"CONCURRENT_REQUESTS": 4, "CONCURRENT_REQUESTS_PER_DOMAIN": 4}


def _kill_after(share: int, victims: list[str], held: dict[str, int]) -> Any:
    def watch(fleet: Any) -> None:
        for name in victims:
            wait_for(lambda n=name: fleet.parsed(n) >= share, f"{name} parsed {share}", 120)
            held[name] = fleet.held(name)
            process, _ = fleet.nodes[name]
            process.send_signal(signal.SIGKILL)

    return watch


@pytest.mark.parametrize("victims", [["node-0"], ["node-0", "node-1"]], ids=["one", "two"])
def test_nodes_killed_mid_crawl_lose_no_page(
    redis_url: str, tmp_path: Path, victims: list[str]
) -> None:
    held: dict[str, int] = {}
    fleet = run_fleet(
        nodes=3,
        pages=PAGES,
        redis_url=redis_url,
        workdir=tmp_path,
        site_options={"latency": 0.15},
        node_settings=NODES,
        watch=_kill_after(15, victims, held),
    )
    report = f"{fleet.report()}\nheld when killed: {held}"
    for node in fleet.nodes:
        if node.name in victims:
            assert node.returncode == -signal.SIGKILL, report
        else:
            assert node.returncode == 0, node.log[-3000:]
    # The killed nodes had requests in hand: the test kills mid-work.
    assert sum(held.values()) > 0, report
    # Every parseable page parsed: the killed nodes' requests were taken over.
    assert fleet.lost == set(), report
    # Only what the killed nodes held can run twice.
    assert fleet.duplicates <= sum(held.values()), report
    survivors = [n for n in fleet.nodes if n.name not in victims]
    assert sum(n.stats.get("retryqueue/frontier/reclaimed", 0) for n in survivors) > 0, report
