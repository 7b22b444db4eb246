"""LearnedBackoff: a retry timed by the recovery times the fleet has seen (decision/recovery.py).

Pure, no I/O: the runtime reads the records in its poll and hands them to
:meth:`LearnedBackoff.learned`; :meth:`~LearnedBackoff.delay` only looks at
what it holds (it runs on the reactor thread). docs/backoff.md explains the model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..exceptions import ConfigError
from ..settings.bounds import check_number
from ..settings.defaults import (
    LEARNED_EARLY_AT,
    LEARNED_JITTER,
    LEARNED_MIN_AT_RISK,
    LEARNED_MIN_OUTAGES,
    LEARNED_SKIP_BELOW,
    SETTING_INT_MAX,
    SETTINGS,
)
from .backoff import BackoffContext, BackoffStrategy, ExponentialBackoff, compute_backoff
from .recovery import Curve, RecoveryStats

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

#: Halvings that find the earliest time a curve gives a chance (its survival is
#: piecewise linear): a thousandth of the interval.
_BISECTIONS = 10


class LearnedBackoff:
    """The policy's own exponential schedule, moved by what the fleet has seen of the
    (kind, domain)'s outages (else the kind's over all domains), given how long this
    failure has lasted: a try the curve gives less than *skip_below* chance of
    finding the outage over is skipped (the schedule's next point is taken, no
    attempt used), and a try comes before the schedule's point once the curve gives
    *early_at* chance that the outage is over. Without a curve to go by, the
    *fallback* strategy (the policy's exponential backoff). Always within
    ``[base_delay (or Retry-After), max_delay]`` of the policy."""

    def __init__(
        self,
        *,
        skip_below: float = LEARNED_SKIP_BELOW,
        early_at: float = LEARNED_EARLY_AT,
        min_outages: float = LEARNED_MIN_OUTAGES,
        fallback: BackoffStrategy | None = None,
    ) -> None:
        # Checked as config/thresholds.py checks the settings (learned_backoff_settings): the
        # same bounds and error line when the strategy is built in code.
        for name, value in (
            ("RETRYQUEUE_LEARNED_SKIP_BELOW", skip_below),
            ("RETRYQUEUE_LEARNED_EARLY_AT", early_at),
        ):
            check_number(name, value, strict=True, maximum=1)
        if skip_below >= early_at:
            raise ConfigError(
                f"RETRYQUEUE_LEARNED_SKIP_BELOW ({skip_below!r}) must be below "
                f"RETRYQUEUE_LEARNED_EARLY_AT ({early_at!r})"
            )
        check_number(
            "RETRYQUEUE_LEARNED_MIN_OUTAGES",
            min_outages,
            minimum=1,
            finite=True,
            maximum=SETTING_INT_MAX,
        )
        self.skip_below = float(skip_below)
        self.early_at = float(early_at)
        self.min_outages = float(min_outages)
        self.fallback: BackoffStrategy = fallback or ExponentialBackoff()
        #: What the fleet has seen, as of the runtime's latest read.
        self.stats = RecoveryStats()

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> LearnedBackoff:
        settings = crawler.settings
        return cls(
            skip_below=_number(settings, "RETRYQUEUE_LEARNED_SKIP_BELOW"),
            early_at=_number(settings, "RETRYQUEUE_LEARNED_EARLY_AT"),
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
        why = "no outages seen"
        for source, curve in (
            (f"{kind} at {domain}", self.stats.curve(kind, domain)),
            (f"{kind} on all domains", self.stats.kind_curve(kind)),
        ):
            if curve is None:
                continue
            if curve.outages < self.min_outages or curve.at_risk_at(since) < LEARNED_MIN_AT_RISK:
                why = f"{curve.outages:.0f} outages of {source} seen, too few"
                continue
            if curve.survival(since) <= 0:
                why = f"no outage of {source} seen lasting past {since:.0f}s"
                continue
            return source, curve
        return why, None

    def delay_and_reason(self, ctx: BackoffContext) -> tuple[float, str]:
        """The delay, and why (for the DEBUG line and the audit log)."""
        policy = ctx.policy
        floor = policy.base_delay
        if ctx.retry_after is not None:
            floor = max(floor, ctx.retry_after)
        since = max(0.0, ctx.since_first)
        scheduled = self.fallback.delay(ctx)
        source, curve = self.curve_for(ctx.kind, ctx.domain, since)
        if curve is None:
            raw, why = scheduled, f"learned: {source}; policy backoff"
        else:
            s_now = curve.survival(since)

            def over(t: float) -> float:
                """The chance, by the curve, that the outage is over at age *t*."""
                return 1.0 - curve.survival(t) / s_now

            # Skip the schedule's tries that would almost surely fail: the next
            # points of the same schedule, no attempt used for them.
            at, step, skipped = since + scheduled, ctx.attempt, 0
            while over(at) < self.skip_below and at - since < policy.max_delay:
                step += 1
                skipped += 1
                at += compute_backoff(
                    step,
                    base_delay=policy.base_delay,
                    multiplier=policy.multiplier,
                    max_delay=policy.max_delay,
                    jitter=policy.jitter,
                    rand=ctx.rand,
                )
            # Sooner when the curve is sure enough before the schedule's point.
            planned, early = at, False
            if over(at) >= self.early_at:
                lo, hi = since, at
                for _ in range(_BISECTIONS):
                    mid = (lo + hi) / 2
                    lo, hi = (lo, mid) if over(mid) >= self.early_at else (mid, hi)
                # Jittered, so the tasks of one burst do not all come back at once.
                sooner = since + (hi - since) * (1 + LEARNED_JITTER * (ctx.rand() - 0.5))
                if sooner < at:
                    at, early = sooner, True
            raw = at - since
            seen = f"{source} ({curve.outages:.0f} outages)"
            parts = []
            if skipped:
                parts.append(
                    f"{seen} give the schedule's next {skipped} tries under "
                    f"{self.skip_below:.0%} to find it over"
                )
            if early:
                parts.append(
                    f"{self.early_at:.0%} of those still on at {since:.0f}s were over by "
                    f"{at:.0f}s, before the schedule's {planned:.0f}s"
                )
            if not parts:
                parts.append(
                    f"{over(at):.0%} of {seen} still on at {since:.0f}s over by {at:.0f}s, "
                    "the schedule's next try"
                )
            elif not early:
                parts.append(f"{over(at):.0%} over by {at:.0f}s")
            if early and not skipped:
                parts[0] = f"{seen}: " + parts[0]
            why = "learned: " + "; ".join(parts)
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
