"""Per-domain cooldowns seen from one crawler: which domains cool, and how downloads went.

It keeps what the last poll (or this node's own report) said of the cooling
domains, and tells the shared circuit breaker in Redis (:mod:`..queue.domains`) how
each download of a domain went. Off (every method a no-op) unless
RETRYQUEUE_DOMAIN_COOLDOWN is set.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scrapy.utils.httpobj import urlparse_cached

from ..queue.connection import is_outage
from ..queue.domains import DomainChange, DomainCooldowns
from ..values import now_ms

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request
    from twisted.python.failure import Failure

    from ..config import Config
    from ..decision.classify import FailureInfo
    from .reporting import Reporter
    from .writes import WritePath

logger = logging.getLogger(__name__)


class DomainBreaker:
    def __init__(self, config: Config, writes: WritePath, reporter: Reporter) -> None:
        self.config = config
        self.writes = writes
        self.reporter = reporter
        self.domains: DomainCooldowns | None = None
        #: Domain -> end of its cooldown (ms); a domain whose end has passed is
        #: half-open. Updated in place, never replaced: the planner reads the
        #: same dict, the glue a read-only view of it (RetryQueueRuntime.cooling).
        self.cooling: dict[str, int] = {}
        #: Called when a domain starts to cool or cools longer: the downloader
        #: glue takes that domain's waiting requests back out of Scrapy's queue
        #: (set through RetryQueueRuntime.on_domain_cooling).
        self.on_cooling: Callable[[], None] | None = None

    def open(self, domains: DomainCooldowns | None) -> None:
        self.domains = domains

    def cooling_until(self, request: Request) -> int | None:
        """End of the cooldown (ms) of the request's domain, None when it is open."""
        if not self.cooling:
            return None
        return self.cooling.get(urlparse_cached(request).hostname or "")

    def polled(self, cooling: dict[str, int]) -> None:
        """What the latest poll read of the cooling domains."""
        if cooling != self.cooling:
            longer = any(until > self.cooling.get(domain, 0) for domain, until in cooling.items())
            self.cooling.clear()
            self.cooling.update(cooling)
            if longer:
                self._cooling_changed()

    def _cooling_changed(self) -> None:
        if self.on_cooling is not None:
            self.on_cooling()

    def downloaded(self, request: Request, failure: FailureInfo | None) -> None:
        """Tell the domain's circuit breaker how a download went.

        A throttling answer (429; 503 with Retry-After: a breaker kind that is
        no burst kind) or a failure of a burst kind counts against the domain;
        any other answer of the site (a 200, a 404) counts as a success, which
        reopens a half-open domain. Which kind is which: the kinds' records.
        """
        domains = self.domains
        if domains is None or self.writes.down:
            return
        domain = urlparse_cached(request).hostname
        if not domain:
            return
        now = now_ms()
        kinds = self.config.kinds
        if failure is None or (
            failure.status is not None and not kinds.has(failure.kind, "breaker")
        ):
            until = self.cooling.get(domain)
            if until is None or until > now:
                return  # open, or cooling: a success in flight changes nothing
            d = self.writes.call(domains.ok, domain, now=now)
        else:
            burst = kinds.has(failure.kind, "burst")
            if kinds.has(failure.kind, "breaker") and not burst:
                # What the trait means: one such answer (a 429, a project's
                # "soft ban") is the site asking us to stop, not a blip to count.
                cause = "throttle"
            elif burst:
                cause = "burst"
            else:
                return
            config = self.config
            retry_after = min(failure.retry_after or 0.0, config.policy_table.retry_after_max)
            d = self.writes.call(
                domains.fail,
                domain,
                now=now,
                cause=cause,
                wait_ms=int(retry_after * 1000),
                base_ms=int(config.cooldown_base * 1000),
                max_ms=int(config.cooldown_max * 1000),
                burst_threshold=config.burst_threshold,
                burst_window_ms=int(config.burst_window * 1000),
                reason=f"{failure.kind}: {failure.message}"[:200],
            )
        d.addCallbacks(self._changed, self._failed)

    def _changed(self, change: DomainChange) -> None:
        if change.state != "open" and change.until > self.cooling.get(change.domain, 0):
            # Cooling, perhaps tripped by another node: this node stops sending
            # at once, not at its next poll, even when this call changed nothing.
            self.cooling[change.domain] = change.until
            self._cooling_changed()
        if not change.changed:
            return
        if change.state == "open":
            self.cooling.pop(change.domain, None)
        self.reporter.domain_changed(change)

    def _failed(self, failure: Failure) -> None:
        if is_outage(failure.value):
            self.writes.mark_down(failure.value)
            return
        self.reporter.count("retryqueue/domain/error")
        logger.error("scrapy-retryqueue: could not update a domain's state: %s", failure.value)
