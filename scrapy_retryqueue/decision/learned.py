"""LearnedBackoff: a retry timed by the cheapest plan over the recovery times the fleet has seen.

Pure, no I/O: the runtime reads the records in its poll and hands them to
:meth:`LearnedBackoff.learned`; :meth:`~LearnedBackoff.delay` only looks at
what it holds (it runs on the reactor thread). The plan is decision/schedule.py's;
docs/backoff.md explains the model.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..exceptions import ConfigError
from ..settings.bounds import check_number
from ..settings.defaults import (
    LEARNED_JITTER,
    LEARNED_MIN_AT_RISK,
    LEARNED_MIN_OUTAGES,
    LEARNED_TRY_COST,
    LEARNED_TRY_COST_MAX,
    RETIRED_SETTINGS,
    SETTING_INT_MAX,
    SETTINGS,
)
from .backoff import BackoffContext, BackoffStrategy, ExponentialBackoff, PolicyFields
from .recovery import Curve, RecoveryStats
from .schedule import Schedule, horizon, not_before

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

#: Plans kept (one per curve shape and policy in use): a few KB each.
PLANS_KEPT = 256

#: Keyword arguments of the strategy before the plan replaced them, and their settings.
_RETIRED_ARGUMENTS = {
    "skip_below": "RETRYQUEUE_LEARNED_SKIP_BELOW",
    "early_at": "RETRYQUEUE_LEARNED_EARLY_AT",
}


class LearnedBackoff:
    """The next try of the cheapest plan over what the fleet has seen of the (kind,
    domain)'s outages (else the kind's over all domains), given how long this
    failure has lasted: each failed try is worth *try_cost* seconds of lag after the
    outage's end (decision/schedule.py). Always within ``[base_delay (or
    Retry-After), max_delay]`` of the policy, and never so early that the attempts
    left, *max_delay* apart, could not reach the last try of the policy's own
    exponential schedule. Without a curve to go by, exactly the *fallback* strategy
    (the policy's exponential backoff)."""

    def __init__(
        self,
        *,
        try_cost: float = LEARNED_TRY_COST,
        min_outages: float = LEARNED_MIN_OUTAGES,
        fallback: BackoffStrategy | None = None,
        **retired: Any,
    ) -> None:
        unknown = sorted(set(retired) - set(_RETIRED_ARGUMENTS))
        if unknown:
            raise TypeError(f"LearnedBackoff() got unexpected keyword argument(s) {unknown}")
        if retired:
            logger.warning(
                "scrapy-retryqueue: %s",
                retired_notice([_RETIRED_ARGUMENTS[name] for name in sorted(retired)]),
            )
        # Checked as config/thresholds.py checks the settings (learned_backoff_settings): the
        # same bounds and error line when the strategy is built in code.
        check_try_cost(try_cost)
        check_number(
            "RETRYQUEUE_LEARNED_MIN_OUTAGES",
            min_outages,
            minimum=1,
            finite=True,
            maximum=SETTING_INT_MAX,
        )
        self.try_cost = float(try_cost)
        self.min_outages = float(min_outages)
        self.fallback: BackoffStrategy = fallback or ExponentialBackoff()
        #: What the fleet has seen, as of the runtime's latest read.
        self.stats = RecoveryStats()
        #: Plans by curve shape and policy, least recently used first: computed at a
        #: shape's first use, then one pass per failure.
        self._plans: dict[tuple[Any, ...], Schedule] = {}

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> LearnedBackoff:
        settings = crawler.settings
        return cls(
            try_cost=_number(settings, "RETRYQUEUE_LEARNED_TRY_COST"),
            min_outages=_number(settings, "RETRYQUEUE_LEARNED_MIN_OUTAGES"),
        )

    def learned(self, stats: RecoveryStats) -> None:
        """The runtime's latest read of the recovery records (reactor thread)."""
        self.stats = stats

    def delay(self, ctx: BackoffContext) -> float:
        return self.delay_and_reason(ctx)[0]

    def curve_for(self, kind: str, domain: str | None, since: float) -> tuple[str, Curve | None]:
        """The curve that times a failure of *kind* at *domain* *since* s old, and
        where it comes from (or why there is none)."""
        return self._curve_for(kind, domain, since)[:2]

    def _curve_for(
        self, kind: str, domain: str | None, since: float
    ) -> tuple[str, Curve | None, bool]:
        """As curve_for, and whether a curve with enough outages was there at all (a
        failure past what it knows is timed by the fallback held to the attempts'
        guarantee; a cold one by the fallback alone)."""
        why, known = "no outages seen", False
        for source, curve in (
            (f"{kind} at {domain}", self.stats.curve(kind, domain)),
            (f"{kind} on all domains", self.stats.kind_curve(kind)),
        ):
            if curve is None:
                continue
            if curve.outages < self.min_outages:
                if not known:
                    why = f"{curve.outages:.0f} outages of {source} seen, too few"
                continue
            known = True
            if curve.at_risk_at(since) < LEARNED_MIN_AT_RISK:
                why = f"too few outages of {source} seen lasting past {since:.0f}s"
                continue
            if curve.survival(since) <= 0:
                why = f"no outage of {source} seen lasting past {since:.0f}s"
                continue
            return source, curve, True
        return why, None, known

    def plan(self, curve: Curve, policy: PolicyFields) -> Schedule:
        """The plan over *curve* for *policy*: kept by the curve's shape, so a read of the
        records that only decayed them (the same hazards) computes nothing again."""
        knots = curve.knots(LEARNED_MIN_AT_RISK)
        key = (
            tuple((round(t, 6), round(s, 9)) for t, s in knots),
            policy.base_delay,
            policy.multiplier,
            policy.max_delay,
            policy.max_retries,
        )
        plan = self._plans.pop(key, None)
        if plan is None:
            plan = Schedule(
                knots,
                try_cost=self.try_cost,
                base_delay=policy.base_delay,
                max_delay=policy.max_delay,
                reach=policy_reach(policy),
                max_tries=policy.max_retries,
            )
            while len(self._plans) >= PLANS_KEPT:
                del self._plans[next(iter(self._plans))]  # the least recently used
        self._plans[key] = plan
        return plan

    def delay_and_reason(self, ctx: BackoffContext) -> tuple[float, str]:
        """The delay, and why (for the DEBUG line and the audit log)."""
        since = max(0.0, ctx.since_first)
        source, curve, known = self._curve_for(ctx.kind, ctx.domain, since)
        if curve is None:
            return self._fallback(ctx, since, source, held=known)
        return self.delay_from(
            self.plan(curve, ctx.policy), ctx, f"{source} ({curve.outages:.0f} outages)"
        )

    def delay_from(self, plan: Schedule, ctx: BackoffContext, seen: str) -> tuple[float, str]:
        """The delay *plan* gives *ctx* within the bounds, and why: the strategy's own
        step, and the benchmarks' oracle's over a true curve."""
        policy = ctx.policy
        since = max(0.0, ctx.since_first)
        floor = (
            policy.base_delay
            if ctx.retry_after is None
            else max(policy.base_delay, ctx.retry_after)
        )
        guard = self._not_before(ctx)
        earliest = max(since + floor, guard)
        latest = since + max(policy.max_delay, floor)
        tries_left = policy.max_retries - ctx.attempt
        at = plan.next_try(since, earliest=earliest, latest=latest, tries_left=tries_left)
        if at is None:
            return self._fallback(ctx, since, f"{seen} says nothing past {since:.0f}s", held=True)
        # Jittered, so the tasks of one burst do not all come back at once.
        delay = (at - since) * (1 + LEARNED_JITTER * (ctx.rand() - 0.5))
        # In seconds from now, so that a floor or a cap is returned exactly.
        delay = min(max(delay, floor, guard - since), max(policy.max_delay, floor))
        s_now = plan.survival(since)
        over = 1.0 - plan.survival(since + delay) / s_now if s_now > 0 else 1.0
        why = (
            f"learned: {seen}: {over:.0%} of those still on at {since:.0f}s over by "
            f"{since + delay:.0f}s, the cheapest plan's next try at "
            f"{self.try_cost:g}s of lag a failed try"
        )
        if guard > since + floor and delay <= guard - since + 1e-9:
            why += " (no sooner: the attempts left must reach the policy's last try)"
        return delay, f"{why}: waits {delay:.1f}s"

    def _not_before(self, ctx: BackoffContext) -> float:
        policy = ctx.policy
        return not_before(
            policy_reach(policy), policy.max_retries - ctx.attempt, max_delay=policy.max_delay
        )

    def _fallback(
        self, ctx: BackoffContext, since: float, why: str, *, held: bool
    ) -> tuple[float, str]:
        delay = self.fallback.delay(ctx)
        note = "policy backoff"
        if held:
            # Past a curve's knowledge, the fallback from this attempt may not reach as
            # far as the whole default schedule would have after earlier learned tries.
            guard = min(self._not_before(ctx) - since, ctx.policy.max_delay)
            if delay < guard:
                delay, note = guard, "policy backoff, held so the attempts left reach its last try"
        return delay, f"learned: {why}; {note}: waits {delay:.1f}s"


def policy_reach(policy: PolicyFields) -> float:
    """How far (s since the first failure) the policy's own exponential schedule reaches."""
    return horizon(
        policy.max_retries,
        base_delay=policy.base_delay,
        multiplier=policy.multiplier,
        max_delay=policy.max_delay,
    )


def check_try_cost(value: Any) -> float:
    """RETRYQUEUE_LEARNED_TRY_COST's bounds: seconds of lag, above 0 and finite."""
    return float(
        check_number(
            "RETRYQUEUE_LEARNED_TRY_COST",
            value,
            strict=True,
            finite=True,
            maximum=LEARNED_TRY_COST_MAX,
        )
    )


def retired_notice(names: list[str]) -> str:
    """The one line that says retired LearnedBackoff settings are ignored, and what replaced them."""
    listed = " and ".join(names)
    return f"{listed} {'is' if len(names) == 1 else 'are'} ignored: {RETIRED_SETTINGS[names[0]]}"


def _number(settings: Any, name: str) -> float:
    value = settings.get(name)
    value = SETTINGS[name] if value is None else value
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number, got {value!r}") from None
