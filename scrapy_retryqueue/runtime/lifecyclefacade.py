"""The runtime facade's open and close: connect, then the last writes and what was left.

Open connects and starts the breaker and the frontier; close lands the last
writes, hands back the leases, reads what Redis still holds; a crawl closing
with work left says how much, where, and how to resume it.

:class:`LifecycleFacade` is a base of :class:`~.facade.RetryQueueRuntime`, as
:class:`~.frontierfacade.FrontierFacade` is: it works on the runtime's own parts,
which RetryQueueRuntime.__init__ sets up.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

from twisted.internet import defer

from ..config import redact_url
from ..queue.domains import DomainCooldowns
from ..values import now_ms

if TYPE_CHECKING:
    from scrapy import Spider

    from ..config import Config
    from ..queue.frontier import RedisFrontier
    from .breaker import DomainBreaker
    from .frontier import Frontier
    from .leases import Leases
    from .planner import Planner
    from .reporting import Reporter
    from .writes import WritePath

#: The facade's logger: its lines keep the name they had before the facade was split.
logger = logging.getLogger(f"{__package__}.facade")


class LifecycleFacade:
    """The open and close of the runtime facade; only ever a base of RetryQueueRuntime."""

    # Set up by RetryQueueRuntime.__init__.
    config: Config
    reporter: Reporter
    writes: WritePath
    breaker: DomainBreaker
    leases: Leases
    planner: Planner
    frontier: Frontier
    spider: Spider | None
    closed: defer.Deferred[None]
    pending_at_close: int | None
    _opening: defer.Deferred[None] | None
    _registered: int
    _frontier_store: RedisFrontier | None

    async def open(self, spider: Spider) -> None:
        self._opening = defer.Deferred()
        try:
            self.spider = self.planner.spider = spider
            self.reporter.open(spider)
            queue = await self.writes.open(spider.name)
            self._registered = now_ms()
            if self.frontier.in_use:
                from ..queue.frontier import RedisFrontier

                self._frontier_store = RedisFrontier(
                    queue.client,
                    spider.name,
                    order=self.frontier.order,
                    project=self.config.namespace,
                )
            if self.config.domain_cooldown:
                self.breaker.open(
                    DomainCooldowns(
                        queue.client,
                        spider.name,
                        node_id=self.config.node_id,
                        events_maxlen=self.config.events_maxlen,
                        project=self.config.namespace,
                    )
                )
        finally:
            self._opening.callback(None)
        if self.frontier.in_use:
            await self._frontier_open()

    async def close(self, reason: str | None = None) -> None:
        from scrapy.utils.defer import maybe_deferred_to_future

        writes = self.writes
        try:
            if self._opening is not None and not self._opening.called:
                # Closed while it opens (Ctrl-C as the spider opens): what open()
                # sets up (the worker thread, a spool adopted from an earlier
                # crawl) must be closed too, not abandoned half-made. Its waits
                # are bounded by the Redis connection timeouts.
                await maybe_deferred_to_future(self._opening)
            # The engine has finished every request by now (or cancelled it: released).
            self.settle_finished()
            if writes.queue is not None and not writes.down:
                # The others stop waiting for this node at once.
                with contextlib.suppress(Exception):
                    await maybe_deferred_to_future(writes.call(writes.queue.leave))
            await writes.flush_for_close()
            if writes.queue is not None and self.leases.doubtful and not writes.down:
                with contextlib.suppress(Exception):  # else their leases expire
                    await maybe_deferred_to_future(
                        writes.call(
                            writes.queue.unclaim, sorted(self.leases.doubtful), now=now_ms()
                        )
                    )
            await self._frontier_close(reason)
            if writes.queue is not None and self.leases.held and not writes.down:
                leases = self.leases.take_all()
                try:
                    released = await maybe_deferred_to_future(
                        writes.call(writes.queue.release, leases, now=now_ms())
                    )
                    self.reporter.count("retryqueue/released", released)
                    logger.info("scrapy-retryqueue: released %d unfinished task(s)", released)
                except Exception as exc:
                    logger.warning(
                        "scrapy-retryqueue: could not release %d task(s) (%s); "
                        "their leases expire and other nodes take them",
                        len(leases),
                        exc,
                    )
            if writes.queue is not None and not writes.down:
                # What is left, read after the last write: the last poll's count
                # misses what was acked or parked since.
                with contextlib.suppress(Exception):
                    counts = await maybe_deferred_to_future(
                        writes.call(writes.queue.counts, now=now_ms())
                    )
                    self.pending_at_close = counts.due + counts.leased
            await writes.shutdown()
            self.reporter.close()
        finally:
            if not self.closed.called:
                self.closed.callback(None)

    def left_behind(self, pending: int, reason: str) -> None:
        """The crawl's last lines when it closes with work left: how much, where, how to resume."""
        writes = self.writes
        spooled = writes.left_in_spool
        if not (pending or spooled):
            return
        name = self.spider.name if self.spider is not None else "?"
        self.reporter.count("retryqueue/left/pending", pending)
        self.reporter.count("retryqueue/left/spooled", spooled)
        if pending:
            queue = writes.queue.keys.due if writes.queue is not None else ""
            logger.warning(
                "scrapy-retryqueue: closing (%s) with %s in Redis (%s at %s); "
                "run the same crawl of spider %r again to resume them",
                reason,
                _retries(pending),
                queue,
                redact_url(writes.redis_url or ""),
                name,
            )
        if spooled and writes.spool is not None:
            logger.error(
                "scrapy-retryqueue: closing (%s) with %d write(s) Redis did not take, kept in "
                "%s; the next crawl of %r against the same Redis replays them",
                reason,
                spooled,
                writes.spool.path,
                name,
            )


def _retries(count: int) -> str:
    return f"{count} pending retr{'y' if count == 1 else 'ies'}"
