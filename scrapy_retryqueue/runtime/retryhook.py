"""The retry hook (RETRYQUEUE_RETRY_HOOK): built once per crawler, asked about each retry.

:func:`build_hook` makes the callable of the setting (a class is instantiated,
through ``from_crawler`` when it has one); :func:`ask_hook` reads what it answers
about one retry: keep it, replace its request, veto it or re-time it, the delay
bounded as a backoff strategy's is. A broken hook never loses a request: the
retry goes ahead as decided. docs/hooks.md is the reference.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..decision import kinds
from ..decision.policy import Decision, checked_delay
from ..exceptions import ConfigError

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request
    from scrapy.crawler import Crawler

    from ..decision.classify import FailureInfo
    from ..decision.policy import Policy, PolicyTable


def build_hook(hook: Any, crawler: Crawler) -> Callable[..., Any] | None:
    """The retry hook to call: a class is instantiated (from_crawler when it has one)."""
    if hook is None or not isinstance(hook, type):
        return hook
    from scrapy.utils.misc import build_from_crawler

    try:
        instance = build_from_crawler(hook, crawler)
    except Exception as exc:
        raise ConfigError(
            f"RETRYQUEUE_RETRY_HOOK {hook.__module__}.{hook.__qualname__} could not be "
            f"built: {type(exc).__name__}: {exc}"
        ) from None
    if not callable(instance):
        raise ConfigError(
            f"RETRYQUEUE_RETRY_HOOK {hook.__module__}.{hook.__qualname__} builds an object "
            "that is not callable "
            f"(it needs a __call__(request, decision) method)"
        )
    return instance


def ask_hook(
    hook: Callable[..., Any],
    request: Request,
    decision: Decision,
    failure: FailureInfo,
    policy: Policy | None,
    table: PolicyTable,
) -> tuple[Request, Decision, tuple[str, str | None] | None]:
    """Ask the hook about a retry: keep, replace, veto or re-time it.

    Returns the request and the decision to go on with, and what the planner
    notes of the answer: its stat and an error line (None when the hook kept the
    retry as it is).
    """
    from scrapy import Request as ScrapyRequest

    delay: float | None = None
    try:
        result = hook(request, decision)
        if isinstance(result, (int, float)) and not isinstance(result, bool):
            # Bounded as the strategy's delay is; a cooldown probe (its
            # policy does not retry) at most by the wait it was given.
            retried = policy is not None and policy.retry
            ceiling = policy.max_delay if retried and policy else decision.delay
            try:
                delay = checked_delay(result, max_delay=ceiling)
            except ValueError as exc:
                raise TypeError(f"it returned {result!r}: {exc}") from None
            if retried and policy is not None:
                delay = table.bounded(delay, policy, failure.retry_after)
        elif result is not None and result is not False and not isinstance(result, ScrapyRequest):
            raise TypeError(
                f"it returned {result!r}; expected None, False, a scrapy.Request "
                "or a delay in seconds"
            )
    except Exception as exc:
        # A broken hook must not lose the request: the retry goes ahead as decided.
        error = (
            f"RETRYQUEUE_RETRY_HOOK failed for {request.url} "
            f"({type(exc).__name__}: {exc}); retrying it unchanged"
        )
        return request, decision, ("retryqueue/hook/error", error)
    if delay is not None:
        return request, replace(decision, delay=delay), ("retryqueue/hook/delayed", None)
    if result is None:
        return request, decision, None
    if result is False:
        vetoed = Decision(
            kinds.VETOED,
            False,
            0.0,
            decision.attempt - 1,
            f"{decision.kind}: retry vetoed by RETRYQUEUE_RETRY_HOOK",
        )
        return request, vetoed, ("retryqueue/hook/vetoed", None)
    return result, decision, ("retryqueue/hook/replaced", None)
