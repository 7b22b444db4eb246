"""Which node of a fleet polls early for a task's due time, and the jitter of regular polls.

Every node of a spider reads the same next due time from its claim
(``Claimed.next_due``). Were each of them to poll at that moment, one would claim
the task and the others would find nothing: with hundreds of nodes those empty
polls are most of Redis's load (docs/capacity.md). So one node per due time polls
early for it, chosen by rendezvous hashing: of the live nodes (heartbeat within
:func:`alive_after`'s window), the one with the highest hash of (node id, due
ms). Every node computes the same answer from its own view of the heartbeats,
with no coordination; due times spread evenly over the nodes. The others wait for
their regular poll, so a task whose chosen node is dead, busy or full is at most
one poll interval (plus the jitter) later than its due time. A lone node, or one
with no view of the fleet yet, is always chosen.

The regular interval is jittered (* uniform(0.9, 1.1), :func:`jittered`) so that
nodes that started together do not keep polling, and winning claims, in the same
order. No I/O.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Mapping

from ..settings.defaults import FLEET_HEARTBEAT_MIN_MS

#: The regular poll interval is drawn from ``interval * (1 +- JITTER)``.
JITTER = 0.1
#: Heartbeats a node may miss before the fleet stops counting it alive.
ALIVE_POLLS = 3


def alive_after(now_ms: int, poll_interval: float) -> int:
    """The oldest heartbeat (epoch ms) of a node still alive at *now_ms*: ALIVE_POLLS
    poll intervals ago, at least FLEET_HEARTBEAT_MIN_MS."""
    return now_ms - max(ALIVE_POLLS * int(poll_interval * 1000), FLEET_HEARTBEAT_MIN_MS)


def live_nodes(
    fleet: Mapping[str, tuple[int, ...]], now_ms: int, poll_interval: float
) -> list[str]:
    """The nodes of *fleet* (node -> (heartbeat ms, ...), as a poll reads it) alive at
    *now_ms*, sorted."""
    after = alive_after(now_ms, poll_interval)
    return sorted(node for node, fields in fleet.items() if fields and fields[0] >= after)


def _score(node: str, due_ms: int) -> tuple[bytes, str]:
    # A hash every process computes alike (not Python's hash(), salted per process);
    # the name breaks a tie, so that exactly one node wins.
    digest = hashlib.blake2b(f"{due_ms}\0{node}".encode(), digest_size=8).digest()
    return digest, node


def polls_early(node: str, live: Iterable[str], due_ms: int) -> bool:
    """Whether *node* is the one to poll early for a task due at *due_ms*: the highest
    score of (node id, due ms) among *live* and *node* itself.

    A node missing from *live* (one the others may not see yet) competes too: it may
    poll beside the live node the others chose, never instead of it."""
    mine = _score(node, due_ms)
    return all(other == node or _score(other, due_ms) < mine for other in live)


def jittered(interval: float, rng: random.Random | None = None) -> float:
    """*interval* * uniform(1 - JITTER, 1 + JITTER): the regular wait between polls."""
    draw = (rng or random).uniform(1 - JITTER, 1 + JITTER)
    return interval * draw
