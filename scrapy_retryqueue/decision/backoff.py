"""Backoff delays: the strategy interface and the default exponential strategy.

Pure, no I/O. A strategy (RETRYQUEUE_BACKOFF) is any object with a
``delay(ctx)`` method; :class:`BackoffContext` is everything the decision
knows. The policy module applies the bounds around what it returns
(docs/backoff.md). What a strategy reads of a policy is :class:`PolicyFields`,
so that this module needs nothing of :mod:`.policy`, which builds on it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ..settings.defaults import BACKOFF_JITTER, BACKOFF_MULTIPLIER, JITTER_MODES

# Its home is .retryafter; strategies and projects have imported it from here.
from .retryafter import parse_retry_after

__all__ = [
    "BackoffContext",
    "BackoffStrategy",
    "ExponentialBackoff",
    "PolicyFields",
    "compute_backoff",
    "min_backoff",
    "parse_retry_after",
]


class PolicyFields(Protocol):
    """What a strategy reads of the policy resolved for one retry: its fields.

    :class:`scrapy_retryqueue.decision.policy.Policy` is the one the decision
    passes; a strategy that builds a changed policy (``dataclasses.replace``)
    gets a Policy back.
    """

    @property
    def retry(self) -> bool: ...
    @property
    def base_delay(self) -> float: ...
    @property
    def multiplier(self) -> float: ...
    @property
    def max_delay(self) -> float: ...
    @property
    def max_retries(self) -> int: ...
    @property
    def jitter(self) -> str: ...


@dataclass(frozen=True, slots=True)
class BackoffContext:
    """What a backoff strategy knows when it picks the delay of one retry."""

    #: The failure kind's name.
    kind: str
    #: Retries of this kind so far: 0 for the first retry.
    attempt: int
    #: The policy resolved for this kind, domain and request (a policy.Policy).
    policy: PolicyFields
    #: The request's host name, None when it has none.
    domain: str | None
    #: Seconds the server asked to wait (Retry-After), before any cap; None when it did not.
    retry_after: float | None
    #: Seconds since the task's first failure; 0 for a request's first failure.
    since_first: float
    #: Returns a float in [0, 1): the decision's random source (seeded in tests).
    rand: Callable[[], float]
    #: The URL of the request that failed.
    url: str | None = None


class BackoffStrategy(Protocol):
    """What RETRYQUEUE_BACKOFF names: ``delay(ctx)`` gives the seconds before the next try."""

    def delay(self, ctx: BackoffContext) -> float: ...


class ExponentialBackoff:
    """The default strategy: the server's Retry-After when it sent one, else the
    policy's exponential backoff with its jitter.

    ``base_delay * multiplier ** attempt``, capped at ``max_delay``, jittered as
    the policy's ``jitter`` says (:func:`compute_backoff`). A server that says
    when to come back knows better than a base delay chosen for every site: a
    ``Retry-After: 2`` is retried in 2 s, not in the 15-30 s of ``rate_limited``'s.
    """

    def delay(self, ctx: BackoffContext) -> float:
        if ctx.retry_after is not None:
            return ctx.retry_after  # capped by RETRYQUEUE_RETRY_AFTER_MAX in the bounds
        policy = ctx.policy
        return compute_backoff(
            ctx.attempt,
            base_delay=policy.base_delay,
            multiplier=policy.multiplier,
            max_delay=policy.max_delay,
            jitter=policy.jitter,
            rand=ctx.rand,
        )


def compute_backoff(
    attempt: int,
    *,
    base_delay: float,
    multiplier: float = BACKOFF_MULTIPLIER,
    max_delay: float,
    jitter: str = BACKOFF_JITTER,
    rand: Callable[[], float] = random.random,
) -> float:
    """Delay in seconds before retry number *attempt* (0 for the first retry).

    ``base_delay * multiplier ** attempt`` capped at *max_delay*, then jittered:
    ``none`` keeps it, ``full`` draws from [0, d], ``equal`` from [d/2, d].
    *rand* returns a float in [0, 1); pass a seeded one for exact tests.
    """
    if attempt < 0:
        raise ValueError(f"attempt must be >= 0, got {attempt}")
    try:
        delay = base_delay * multiplier**attempt
    except OverflowError:
        delay = max_delay
    delay = min(delay, max_delay)
    if jitter == "none":
        return delay
    if jitter == "full":
        return delay * rand()
    if jitter == "equal":
        return delay / 2 + delay / 2 * rand()
    raise ValueError(f"jitter must be one of {', '.join(JITTER_MODES)}; got {jitter!r}")


def min_backoff(
    attempt: int, *, base_delay: float, multiplier: float, max_delay: float, jitter: str
) -> float:
    """The smallest delay :func:`compute_backoff` can return for these inputs."""
    return compute_backoff(
        attempt,
        base_delay=base_delay,
        multiplier=multiplier,
        max_delay=max_delay,
        jitter=jitter,
        rand=lambda: 0.0,
    )
