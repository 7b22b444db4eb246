"""Retry policies: a failure and the attempts so far become a decision.

Pure: the caller passes the random source. Policies are resolved
per kind, per domain and per request (meta), in that order.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from .backoff import compute_backoff
from .classify import FailureInfo
from .defaults import (
    INTERNAL_KINDS,
    JITTER_MODES,
    META_MAX_RETRIES,
    META_POLICY,
    POLICY_FIELDS,
    POLICY_KINDS,
    UNKNOWN_KIND,
)
from .exceptions import ConfigError


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


class PolicyTable:
    """Policies per kind, per domain and per request, resolved in that order."""

    def __init__(
        self,
        policies: Mapping[str, Policy],
        domain_policies: Mapping[str, Mapping[str, Policy]],
        *,
        retry_after_max: float,
    ) -> None:
        self.policies = dict(policies)
        # Longest suffix first, so "shop.example.com" beats "example.com".
        self.domain_policies = dict(sorted(domain_policies.items(), key=lambda item: -len(item[0])))
        self.retry_after_max = retry_after_max

    def policy_for(
        self,
        kind: str,
        domain: str | None = None,
        meta_policy: Mapping[str, Any] | None = None,
        meta_max_retries: int | None = None,
    ) -> Policy:
        policy = self.policies.get(kind) or self.policies[UNKNOWN_KIND]
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
    ) -> Decision:
        kind = failure.kind
        done = int(attempts.get(kind, 0))
        if kind in INTERNAL_KINDS:
            return Decision(kind, False, 0.0, done, f"{kind}: never retried")
        policy = self.policy_for(kind, domain, meta_policy, meta_max_retries)
        if not policy.retry:
            return Decision(kind, False, 0.0, done, f"{kind}: not retried by policy")
        if done >= policy.max_retries:
            return Decision(kind, False, 0.0, done, f"{kind}: gave up after {done} retries")
        delay = compute_backoff(
            done,
            base_delay=policy.base_delay,
            multiplier=policy.multiplier,
            max_delay=policy.max_delay,
            jitter=policy.jitter,
            rand=rand,
        )
        if failure.retry_after is not None:
            delay = max(delay, min(failure.retry_after, self.retry_after_max))
        return Decision(
            kind, True, delay, done + 1, f"{kind}: retry {done + 1} of {policy.max_retries}"
        )

    def check_meta_policy(self, value: Any) -> Mapping[str, Any]:
        """Validate a request's ``retryqueue_policy`` meta; ConfigError names the bad part."""
        where = f"meta[{META_POLICY!r}]"
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where} must be a dict of kind -> policy fields, got {value!r}")
        for kind, overrides in value.items():
            if kind not in POLICY_KINDS:
                raise ConfigError(
                    f"{where} names unknown kind {kind!r}; known: {', '.join(POLICY_KINDS)}"
                )
            self.policies[kind].merged(overrides, where=f"{where}[{kind!r}]")
        return value
