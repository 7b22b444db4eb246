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


#: One repetition of the same-instant start: a tiny healthy site, one request at a
#: time per node, short waits, so that a repetition takes seconds.
START_SITE = {"pages": 12, "mix": "healthy", "latency": 0.2}
START_NODES = {
    "CONCURRENT_REQUESTS": 1,
    "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
    # The start page waits for every node to be up (see below): no timeout meanwhile.
    "DOWNLOAD_TIMEOUT": 60,
    "RETRYQUEUE_LEASE_TIME": 1.5,
    "RETRYQUEUE_POLL_INTERVAL": 0.2,
}
#: The race this guards against showed in 2 of 5 starts; 8 repetitions miss a
#: failure that common with odds under 2 %, at two fifths of the suite time 20 took.
REPETITIONS = 8
#: Repetitions run side by side (each has its own site and spider).
AT_ONCE = 4


def test_three_nodes_started_at_the_same_instant_all_take_part_every_time(
    redis_url: str, tmp_path: Path
) -> None:
    """Three nodes launched at the same instant; the site answers nothing until all
    three have opened the spider (it is stopped with SIGSTOP), so however far apart
    a loaded machine starts them, the crawl is still to come for each: the first
    node holds the start page's lease, and the others must stay for it rather than
    leave with an empty frontier in view."""
    from concurrent.futures import ThreadPoolExecutor

    def hold(site: Any) -> None:
        site.process.send_signal(signal.SIGSTOP)

    def release_when_all_opened(fleet: Any) -> None:
        try:
            wait_for(lambda: fleet.registered() == 3, "three nodes registered", 120)
        finally:
            fleet.site.process.send_signal(signal.SIGCONT)

    def repetition(n: int) -> Any:
        workdir = tmp_path / f"rep{n}"
        workdir.mkdir()
        return run_fleet(
            nodes=3,
            pages=START_SITE["pages"],
            redis_url=redis_url,
            workdir=workdir,
            site_options=START_SITE,
            node_settings=START_NODES,
            on_site=hold,
            watch=release_when_all_opened,
        )

    with ThreadPoolExecutor(AT_ONCE) as pool:
        fleets = list(pool.map(repetition, range(REPETITIONS)))
    for n, fleet in enumerate(fleets):
        report = f"repetition {n}:\n{fleet.report()}"
        for node in fleet.nodes:
            assert node.returncode == 0, node.log[-3000:]
            # No node left while the fleet held the start page's lease.
            assert node.fetched > 0, report
        assert fleet.lost == set(), report
        assert fleet.duplicates == 0, report
