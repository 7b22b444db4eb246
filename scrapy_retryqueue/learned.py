"""LearnedBackoff: a retry timed by the recovery times the fleet has seen (recovery.py).

Pure, no I/O: the runtime reads the records in its poll and hands them to
:meth:`LearnedBackoff.learned`; :meth:`~LearnedBackoff.delay` only looks at
what it holds (it runs on the reactor thread). docs/backoff.md explains the model.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from .backoff import BackoffContext, BackoffStrategy, ExponentialBackoff
from .defaults import (
    LEARNED_JITTER,
    LEARNED_MIN_AT_RISK,
    LEARNED_MIN_OUTAGES,
    LEARNED_TARGET,
    SETTINGS,
)
from .exceptions import ConfigError
from .recovery import Curve, RecoveryStats

if TYPE_CHECKING:
    from scrapy.crawler import Crawler


class LearnedBackoff:
    """Waits until the outage, given how long it has lasted, is over with probability
    *target*, by the (kind, domain) curve, else the kind's over all domains, else the
    *fallback* strategy (the policy's exponential backoff); always within
    ``[base_delay (or Retry-After), max_delay]`` of the policy."""

    def __init__(
        self,
        *,
        target: float = LEARNED_TARGET,
        min_outages: float = LEARNED_MIN_OUTAGES,
        fallback: BackoffStrategy | None = None,
    ) -> None:
        if not (isinstance(target, (int, float)) and 0 < target < 1):
            raise ConfigError(f"RETRYQUEUE_LEARNED_TARGET must be between 0 and 1, got {target!r}")
        if not (
            isinstance(min_outages, (int, float))
            and not isinstance(min_outages, bool)
            and math.isfinite(min_outages)
            and min_outages >= 1
        ):
            raise ConfigError(
                f"RETRYQUEUE_LEARNED_MIN_OUTAGES must be a number >= 1, got {min_outages!r}"
            )
        self.target = float(target)
        self.min_outages = float(min_outages)
        self.fallback: BackoffStrategy = fallback or ExponentialBackoff()
        #: What the fleet has seen, as of the runtime's latest read.
        self.stats = RecoveryStats()

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> LearnedBackoff:
        settings = crawler.settings
        return cls(
            target=_number(settings, "RETRYQUEUE_LEARNED_TARGET"),
            min_outages=_number(settings, "RETRYQUEUE_LEARNED_MIN_OUTAGES"),
        )

    def learned(self, stats: RecoveryStats) -> None:
        """The runtime's latest read of the recovery records (reactor thread)."""
        self.stats = stats

    def delay(self, ctx: BackoffContext) -> float:
        return self.delay_and_reason(ctx)[0]

    def delay_and_reason(self, ctx: BackoffContext) -> tuple[float, str]:
        """The delay, and why (for the DEBUG line and the audit log)."""
        policy = ctx.policy
        floor = policy.base_delay
        if ctx.retry_after is not None:
            floor = max(floor, ctx.retry_after)
        since = max(0.0, ctx.since_first)
        chosen: tuple[str, Curve] | None = None
        thin = "no outages seen"
        for source, curve in (
            (f"{ctx.kind} at {ctx.domain}", self.stats.curve(ctx.kind, ctx.domain)),
            (f"{ctx.kind} on all domains", self.stats.kind_curve(ctx.kind)),
        ):
            if curve is None:
                continue
            if curve.outages < self.min_outages or curve.at_risk_at(since) < LEARNED_MIN_AT_RISK:
                thin = f"{curve.outages:.0f} outages of {source} seen, too few"
                continue
            chosen = (source, curve)
            break
        when = None
        if chosen is not None:
            when = chosen[1].next_time(since, self.target)
            if when is None:
                thin = f"no outage of {chosen[0]} seen lasting past {since:.0f}s"
        if chosen is None or when is None:
            raw = self.fallback.delay(ctx)
            why = f"learned: {thin}; policy backoff"
        else:
            source, curve = chosen
            jitter = 1 + LEARNED_JITTER * (ctx.rand() - 0.5)
            raw = (when - since) * jitter
            why = (
                f"learned: {self.target:.0%} of {source} ({curve.outages:.0f} outages) "
                f"still on at {since:.0f}s were over by {when:.0f}s"
            )
        delay = min(max(raw, floor), policy.max_delay)
        if ctx.retry_after is not None:
            delay = max(delay, ctx.retry_after)  # the policy caps it (RETRY_AFTER_MAX)
        return delay, f"{why}: waits {delay:.1f}s"


def _number(settings: Any, name: str) -> float:
    value = settings.get(name)
    value = SETTINGS[name] if value is None else value
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number, got {value!r}") from None
