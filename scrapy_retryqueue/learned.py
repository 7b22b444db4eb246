"""LearnedBackoff: a retry timed by the recovery times the fleet has seen (recovery.py).

Pure, no I/O: the runtime reads the records in its poll and hands them to
:meth:`LearnedBackoff.learned`; :meth:`~LearnedBackoff.delay` only looks at
what it holds (it runs on the reactor thread). docs/backoff.md explains the model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .backoff import BackoffContext, BackoffStrategy, ExponentialBackoff
from .bounds import check_number
from .defaults import (
    LEARNED_ATTEMPT_COST,
    LEARNED_DEAD_COST,
    LEARNED_JITTER,
    LEARNED_MIN_AT_RISK,
    LEARNED_MIN_OUTAGES,
    LEARNED_PLAN_DEPTH,
    SETTING_INT_MAX,
    SETTINGS,
)
from .exceptions import ConfigError
from .probing import Schedule
from .recovery import Curve, RecoveryStats

if TYPE_CHECKING:
    from scrapy.crawler import Crawler


class LearnedBackoff:
    """Places the next attempt where, by the (kind, domain) curve given how long the
    outage has lasted, the expected failed attempts (each worth *attempt_cost*
    seconds) plus the lag after the recovery are least over the attempts the
    policy has left (probing.py); else by the kind's curve over all domains, else
    the *fallback* strategy (the policy's exponential backoff); always within
    ``[base_delay (or Retry-After), max_delay]`` of the policy."""

    def __init__(
        self,
        *,
        attempt_cost: float = LEARNED_ATTEMPT_COST,
        min_outages: float = LEARNED_MIN_OUTAGES,
        fallback: BackoffStrategy | None = None,
    ) -> None:
        # Checked as config.py checks the settings (learned_backoff_settings): the
        # same bounds and error line when the strategy is built in code.
        self.attempt_cost = float(
            check_number("RETRYQUEUE_LEARNED_ATTEMPT_COST", attempt_cost, strict=True, finite=True)
        )
        self.min_outages = float(
            check_number(
                "RETRYQUEUE_LEARNED_MIN_OUTAGES",
                min_outages,
                minimum=1,
                finite=True,
                maximum=SETTING_INT_MAX,
            )
        )
        self.fallback: BackoffStrategy = fallback or ExponentialBackoff()
        #: What the fleet has seen, as of the runtime's latest read.
        self.stats = RecoveryStats()
        #: Solved schedules of the current stats, by (curve, base, max, depth).
        self._schedules: dict[tuple[int, float, float, int], Schedule] = {}

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> LearnedBackoff:
        settings = crawler.settings
        return cls(
            attempt_cost=_number(settings, "RETRYQUEUE_LEARNED_ATTEMPT_COST"),
            min_outages=_number(settings, "RETRYQUEUE_LEARNED_MIN_OUTAGES"),
        )

    def learned(self, stats: RecoveryStats) -> None:
        """The runtime's latest read of the recovery records (reactor thread)."""
        self.stats = stats
        self._schedules = {}

    def schedule(self, curve: Curve, base: float, latest: float, depth: int) -> Schedule:
        """The solved schedule of *curve* under these bounds, solved once per read."""
        key = (id(curve), base, latest, depth)
        found = self._schedules.get(key)
        if found is None:
            found = Schedule(
                curve,
                base=base,
                latest=latest,
                depth=depth,
                cost=self.attempt_cost,
                dead_cost=LEARNED_DEAD_COST,
            )
            self._schedules[key] = found
        return found

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
            depth = min(max(1, policy.max_retries), LEARNED_PLAN_DEPTH)
            plan = self.schedule(chosen[1], policy.base_delay, policy.max_delay, depth)
            left = max(1, policy.max_retries - ctx.attempt)
            when = plan.next(since, earliest=floor, attempts=left)
            if when is None:
                thin = f"no outage of {chosen[0]} seen lasting past {since:.0f}s"
        if chosen is None or when is None:
            raw = self.fallback.delay(ctx)
            why = f"learned: {thin}; policy backoff"
        else:
            source, curve = chosen
            jitter = 1 + LEARNED_JITTER * (ctx.rand() - 0.5)
            raw = (when - since) * jitter
            s_now = curve.survival(since)
            over = 1.0 - curve.survival(when) / s_now if s_now > 0 else 1.0
            why = (
                f"learned: {over:.0%} of {source} ({curve.outages:.0f} outages) "
                f"still on at {since:.0f}s were over by {when:.0f}s, the best next try "
                f"for a failed one worth {self.attempt_cost:g}s of lag"
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
