"""One node of a fleet polls early for each due time; the others wait for their jittered poll.

The pure choice (decision/pollshare) first, then the extension's schedule of
polls (``_next_delay``) built in-process with a view of the fleet as the runtime's
last poll read it.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path

import pytest
import scrapy
from scrapy.utils.misc import build_from_crawler
from scrapy.utils.test import get_crawler

from scrapy_retryqueue import RetryQueueExtension
from scrapy_retryqueue.decision.pollshare import (
    JITTER,
    alive_after,
    jittered,
    live_nodes,
    polls_early,
)
from scrapy_retryqueue.queue.claim import Claimed
from scrapy_retryqueue.settings.defaults import FLEET_HEARTBEAT_MIN_MS, MIN_POLL_INTERVAL

NODES = [f"node-{i}" for i in range(50)]
#: Due times a few ms apart, as a busy spider's are.
DUES = [1_700_000_000_000 + 37 * i for i in range(2000)]


def _chosen(live: list[str], due: int) -> list[str]:
    return [node for node in live if polls_early(node, live, due)]


def test_exactly_one_live_node_polls_early_for_each_due_time() -> None:
    for due in DUES:
        assert len(_chosen(NODES, due)) == 1
    # Every node reaches the same answer whatever order it lists the fleet in.
    shuffled = random.Random(1).sample(NODES, len(NODES))
    assert all(_chosen(shuffled, due) == _chosen(NODES, due) for due in DUES[:100])


def test_the_due_times_spread_over_the_nodes() -> None:
    wins = Counter(_chosen(NODES, due)[0] for due in DUES)
    assert set(wins) == set(NODES)
    # 40 due times a node on average; a fair draw keeps each within about 3 sigma.
    assert max(wins.values()) < 70 and min(wins.values()) > 15


def test_a_node_leaving_moves_only_its_own_due_times() -> None:
    # Rendezvous hashing: the others keep their due times when one node goes.
    before = {due: _chosen(NODES, due)[0] for due in DUES}
    after = {due: _chosen(NODES[1:], due)[0] for due in DUES}
    moved = [due for due in DUES if before[due] != after[due]]
    assert moved and all(before[due] == NODES[0] for due in moved)


def test_a_lone_node_is_always_chosen() -> None:
    assert all(polls_early("alone", [], due) for due in DUES)
    assert all(polls_early("alone", ["alone"], due) for due in DUES)


def test_a_node_missing_from_the_live_list_never_replaces_the_live_choice() -> None:
    outsider_won = 0
    for due in DUES:
        if polls_early("newcomer", NODES, due):
            outsider_won += 1
            # The live nodes, who do not see it, still choose one of themselves.
            assert len(_chosen(NODES, due)) == 1
    # It competes like any other node: about one due time in 51.
    assert 0 < outsider_won < len(DUES) / 10


def test_live_nodes_are_those_whose_heartbeat_is_within_the_alive_window() -> None:
    now = 1_700_000_000_000
    window = max(3 * 1000, FLEET_HEARTBEAT_MIN_MS)
    fleet = {
        "fresh": (now - 10, 0, 0),
        "edge": (now - window, 0, 0),
        "dead": (now - window - 1, now, now),
    }
    assert alive_after(now, 1.0) == now - window
    assert live_nodes(fleet, now, 1.0) == ["edge", "fresh"]
    # A longer poll interval keeps a node alive for three of its polls.
    assert live_nodes(fleet, now, 10.0) == ["dead", "edge", "fresh"]


def test_the_jitter_stays_within_ten_percent_and_varies() -> None:
    rng = random.Random(7)
    draws = [jittered(2.0, rng) for _ in range(1000)]
    assert JITTER == 0.1
    assert all(1.8 <= d <= 2.2 for d in draws)
    assert max(draws) - min(draws) > 0.3  # spread over the range, not a constant


# -- the extension's schedule of polls ---------------------------------------------------

POLL = 1.0
ME = "me"


class Spider(scrapy.Spider):
    name = "pollshare"


@pytest.fixture
def extension(tmp_path: Path, redis_url: str) -> RetryQueueExtension:
    """The extension of a crawler that was never opened: its schedule reads only the
    last poll's counts and what the runtime's last poll read of the fleet."""
    crawler = get_crawler(
        Spider,
        {
            "RETRYQUEUE_REDIS_URL": redis_url,
            "RETRYQUEUE_EMBEDDED_DIR": str(tmp_path / "embedded"),
            "RETRYQUEUE_NODE_ID": ME,
            "RETRYQUEUE_POLL_INTERVAL": POLL,
            "RETRYQUEUE_STORE_ENABLED": False,
        },
    )
    return build_from_crawler(RetryQueueExtension, crawler)


def _due_in(seconds: float, *, mine: bool, live: list[str]) -> int:
    """A due time (ms) about *seconds* ahead that this node is (or is not) chosen for."""
    due = int((time.time() + seconds) * 1000)
    while polls_early(ME, live, due) != mine:
        due += 1
    return due


def _assert_polls_at(extension: RetryQueueExtension, due: int) -> None:
    """The next poll is at *due*: the delay is the time left until then (read around it)."""
    before = due / 1000 - time.time()
    delay = extension._next_delay()
    after = due / 1000 - time.time()
    assert after <= delay <= before


def _fleet(live: list[str], dead: list[str] = ()) -> dict[str, tuple[int, int, int]]:
    now = int(time.time() * 1000)
    stale = alive_after(now, POLL) - 1000
    return {
        **{node: (now, now, now) for node in live},
        **{node: (stale, stale, stale) for node in dead},
    }


def test_the_chosen_node_polls_at_the_due_time(extension: RetryQueueExtension) -> None:
    live = [ME, "a", "b", "c"]
    extension.runtime.fleet = _fleet(live)
    due = _due_in(0.4, mine=True, live=live)
    extension._counts = Claimed(next_due=due)
    _assert_polls_at(extension, due)


def test_the_others_wait_for_their_jittered_poll(extension: RetryQueueExtension) -> None:
    live = [ME, "a", "b", "c"]
    extension.runtime.fleet = _fleet(live)
    extension._counts = Claimed(next_due=_due_in(0.4, mine=False, live=live))
    delays = [extension._next_delay() for _ in range(200)]
    assert all(POLL * (1 - JITTER) <= d <= POLL * (1 + JITTER) for d in delays)
    assert len(set(delays)) > 100  # jittered, not the same for every node


def test_a_dead_nodes_heartbeat_does_not_take_the_due_time(
    extension: RetryQueueExtension,
) -> None:
    # Were "gone" still alive, it would be the one chosen; its heartbeat is too old.
    due = _due_in(0.4, mine=False, live=[ME, "gone"])
    extension.runtime.fleet = _fleet([ME], dead=["gone"])
    extension._counts = Claimed(next_due=due)
    _assert_polls_at(extension, due)


def test_a_lone_node_polls_at_every_due_time_as_before(extension: RetryQueueExtension) -> None:
    for fleet in ({}, _fleet([ME])):  # before its first poll, and alone
        extension.runtime.fleet = fleet
        for seconds in (0.2, 0.5, 0.85):
            due = int((time.time() + seconds) * 1000)
            extension._counts = Claimed(next_due=due)
            _assert_polls_at(extension, due)
        # Sooner than the floor: the floor.
        extension._counts = Claimed(next_due=int(time.time() * 1000) + 10)
        assert extension._next_delay() == MIN_POLL_INTERVAL


def test_a_task_due_already_keeps_the_short_poll_while_there_is_room(
    extension: RetryQueueExtension,
) -> None:
    extension.runtime.fleet = _fleet([ME, "a", "b"])
    extension._counts = Claimed(next_due=int(time.time() * 1000) - 5)
    assert extension.runtime.room > 0
    assert extension._next_delay() == MIN_POLL_INTERVAL
