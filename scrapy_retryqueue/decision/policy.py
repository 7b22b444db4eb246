"""Retry policies: a failure and the attempts so far become a decision.

Pure: the caller passes the random source and the backoff strategy. Policies
are resolved per kind, per domain and per request (meta), in that order; the
strategy picks the delay and the policy's bounds and Retry-After hold around it.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from ..exceptions import ConfigError
from ..settings.defaults import JITTER_MODES, META_MAX_RETRIES, META_POLICY, POLICY_FIELDS
from . import kinds
from .backoff import BackoffContext, BackoffStrategy, ExponentialBackoff
from .classify import FailureInfo

logger = logging.getLogger(__name__)

#: The fields of a policy (what RETRYQUEUE_POLICIES and RETRYQUEUE_KINDS may set).
POLICY_FIELD_NAMES = tuple(POLICY_FIELDS)


@dataclass(frozen=True, slots=True)
class Policy:
    retry: bool
    base_delay: float
    multiplier: float
    max_delay: float
    max_retries: int
    jitter: str

    def merged(self, overrides: Mapping[str, Any], *, where: str) -> Policy:
        """This policy with *overrides* applied and validated; *where* names the source."""
        if not isinstance(overrides, Mapping):
            raise ConfigError(f"{where} must be a dict of policy fields, got {overrides!r}")
        known = {f.name for f in fields(Policy)}
        unknown = set(overrides) - known
        if unknown:
            raise ConfigError(
                f"{where} has unknown field(s) {sorted(unknown)}; known: {sorted(known)}"
            )
        values: dict[str, Any] = {}
        for name, value in overrides.items():
            values[name] = _check_field(name, value, where=f"{where}[{name!r}]")
        policy = replace(self, **values)
        if policy.max_delay < policy.base_delay:
            raise ConfigError(
                f"{where}: max_delay ({policy.max_delay}) is below base_delay ({policy.base_delay})"
            )
        return policy

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], *, where: str) -> Policy:
        return cls(**POLICY_FIELDS).merged(values, where=where)


def _check_field(name: str, value: Any, *, where: str) -> Any:
    if name == "retry":
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be True or False, got {value!r}")
        return value
    if name == "jitter":
        if value not in JITTER_MODES:
            raise ConfigError(f"{where} must be one of {', '.join(JITTER_MODES)}; got {value!r}")
        return value
    if name == "max_retries":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"{where} must be a whole number >= 0, got {value!r}")
        return value
    # NaN passes every comparison and inf cannot become a due time in ms.
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise ConfigError(f"{where} must be a number >= 0, got {value!r}")
    if name == "multiplier" and value < 1:
        raise ConfigError(f"{where} must be >= 1, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do with a failed attempt."""

    kind: str
    retry: bool
    #: Seconds until the next attempt (0 when not retried).
    delay: float
    #: Retries of this kind so far, this one included when retried.
    attempt: int
    reason: str


def checked_delay(value: Any, *, max_delay: float) -> float:
    """*value* (seconds) clamped to at most *max_delay*; ValueError when it is not a
    finite number >= 0 (a bool is no number here)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise ValueError(f"expected a finite number of seconds >= 0, got {value!r}")
    return min(float(value), max_delay)


def _name_of(strategy: object) -> str:
    cls = strategy if isinstance(strategy, type) else type(strategy)
    return f"{cls.__module__}.{cls.__qualname__}"


class PolicyTable:
    """Policies per kind, per domain and per request, resolved in that order."""

    def __init__(
        self,
        policies: Mapping[str, Policy],
        domain_policies: Mapping[str, Mapping[str, Policy]],
        *,
        retry_after_max: float,
        backoff: BackoffStrategy | None = None,
        kind_table: kinds.KindTable = kinds.BUILTIN_TABLE,
    ) -> None:
        self.policies = dict(policies)
        # Longest suffix first, so "shop.example.com" beats "example.com".
        self.domain_policies = dict(sorted(domain_policies.items(), key=lambda item: -len(item[0])))
        self.retry_after_max = retry_after_max
        #: RETRYQUEUE_BACKOFF: picks each retry's delay within the policy's bounds.
        self.backoff: BackoffStrategy = backoff if backoff is not None else ExponentialBackoff()
        self.kinds = kind_table

    def policy_for(
        self,
        kind: str,
        domain: str | None = None,
        meta_policy: Mapping[str, Any] | None = None,
        meta_max_retries: int | None = None,
    ) -> Policy:
        policy = self.policies.get(kind) or self.policies[kinds.UNKNOWN]
        if domain:
            # The longest matching suffix that names this kind wins; a shorter
            # one still applies to kinds the longer one leaves out.
            for suffix, per_kind in self.domain_policies.items():
                if kind in per_kind and (domain == suffix or domain.endswith("." + suffix)):
                    policy = per_kind[kind]
                    break
        if meta_policy and kind in meta_policy:
            policy = policy.merged(meta_policy[kind], where=f"meta[{META_POLICY!r}][{kind!r}]")
        if meta_max_retries is not None:
            policy = policy.merged(
                {"max_retries": meta_max_retries}, where=f"meta[{META_MAX_RETRIES!r}]"
            )
        return policy

    def decide(
        self,
        failure: FailureInfo,
        attempts: Mapping[str, int],
        *,
        domain: str | None = None,
        meta_policy: Mapping[str, Any] | None = None,
        meta_max_retries: int | None = None,
        rand: Callable[[], float] = random.random,
        since_first: float = 0.0,
        url: str | None = None,
        on_error: Callable[[str], None] | None = None,
    ) -> Decision:
        """What to do with *failure*, given the retries of each kind so far.

        The backoff strategy picks the delay (*since_first* and *url* are for
        it); *on_error* hears of a strategy that failed or returned no valid
        delay (the policy's exponential delay is used instead), else it is logged.
        """
        kind = failure.kind
        done = int(attempts.get(kind, 0))
        if self.kinds.is_internal(kind):
            return Decision(kind, False, 0.0, done, f"{kind}: never retried")
        policy = self.policy_for(kind, domain, meta_policy, meta_max_retries)
        if not policy.retry:
            return Decision(kind, False, 0.0, done, f"{kind}: not retried by policy")
        if done >= policy.max_retries:
            return Decision(kind, False, 0.0, done, f"{kind}: gave up after {done} retries")
        ctx = BackoffContext(
            kind=kind,
            attempt=done,
            policy=policy,
            domain=domain,
            retry_after=failure.retry_after,
            since_first=since_first,
            rand=rand,
            url=url,
        )
        why: list[str] = []
        delay = self.bounded(self._strategy_delay(ctx, on_error, why), policy, failure.retry_after)
        reason = f"{kind}: retry {done + 1} of {policy.max_retries}"
        return Decision(kind, True, delay, done + 1, "; ".join([reason, *why]))

    def bounded(self, delay: float, policy: Policy, retry_after: float | None) -> float:
        """A valid delay within the policy's bounds: at most its max_delay, and at least
        the server's Retry-After (capped at RETRYQUEUE_RETRY_AFTER_MAX) when it sent one."""
        delay = min(max(delay, 0.0), policy.max_delay)
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.retry_after_max))
        return delay

    def _strategy_delay(
        self, ctx: BackoffContext, on_error: Callable[[str], None] | None, why: list[str]
    ) -> float:
        """The strategy's delay; a strategy with ``delay_and_reason(ctx)`` also says why
        (appended to *why*: the decision's reason, in the DEBUG line and the audit log)."""
        strategy = self.backoff
        try:
            explain = getattr(strategy, "delay_and_reason", None)
            if explain is not None:
                value, reason = explain(ctx)
                why.append(str(reason))
            else:
                value = strategy.delay(ctx)
        except Exception as exc:
            problem = f"raised {type(exc).__name__}: {exc}"
        else:
            try:
                return checked_delay(value, max_delay=ctx.policy.max_delay)
            except (ValueError, OverflowError):  # 10**400 does not fit a float
                problem = f"returned {_short(value)}, not a finite number of seconds >= 0"
        # A broken strategy must neither stop the crawl nor lose the request.
        message = (
            f"RETRYQUEUE_BACKOFF {_name_of(strategy)}.delay() {problem} for a {ctx.kind} "
            "retry; using the policy's exponential delay"
        )
        if on_error is not None:
            on_error(message)
        else:
            logger.error("scrapy-retryqueue: %s", message)
        return ExponentialBackoff().delay(ctx)

    def check_meta_policy(self, value: Any) -> Mapping[str, Any]:
        """Validate a request's ``retryqueue_policy`` meta; ConfigError names the bad part."""
        where = f"meta[{META_POLICY!r}]"
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where} must be a dict of kind -> policy fields, got {value!r}")
        for kind, overrides in value.items():
            if kind not in self.policies:
                raise ConfigError(
                    f"{where} names unknown kind {kind!r}; known: {', '.join(self.policies)}"
                )
            self.policies[kind].merged(overrides, where=f"{where}[{kind!r}]")
        return value


def _short(value: Any) -> str:
    """A strategy's return value for a log line, however large it is."""
    text = repr(value) if not isinstance(value, int) or value.bit_length() < 4000 else "a huge int"
    return text if len(text) <= 80 else text[:77] + "..."
