"""The extension: brings due retries back into the crawl and keeps it open.

Every RETRYQUEUE_POLL_INTERVAL (and whenever the spider goes idle) one worker
call reaps expired leases, renews the leases this node holds, and claims as
many due tasks as this node has room for; the claimed requests are re-injected
with ``engine.crawl``. It also turns item pipeline failures (``item_error``)
into ``storage`` retries.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import DontCloseSpider
from scrapy.utils.defer import maybe_deferred_to_future
from twisted.internet import defer
from twisted.internet.task import LoopingCall

from .classify import failure_for_kind
from .defaults import META_TASK
from .envelope import EnvelopeError, request_from_json, task_from_json
from .queue import Claimed
from .runtime import RetryQueueRuntime, TaskHandle, now_ms, runtime_for

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from twisted.python.failure import Failure

logger = logging.getLogger(__name__)

_REAP_BATCH = 500


@dataclass(slots=True)
class TickResult:
    claimed: Claimed
    reclaimed: list[str] = field(default_factory=list)
    poisoned: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    tokens: str = ""


class RetryQueueExtension:
    def __init__(self, crawler: Crawler, runtime: RetryQueueRuntime) -> None:
        self.crawler = crawler
        self.runtime = runtime
        self.config = runtime.config
        self._loop: LoopingCall | None = None
        self._ticking: defer.Deferred[Any] | None = None
        self._last_renew = 0.0
        self._idle_since: float | None = None
        self._counts: Claimed | None = None
        #: runtime.writes when the poll that read _counts started.
        self._counts_writes = -1
        self._closing = False

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> RetryQueueExtension:
        ext = cls(crawler, runtime_for(crawler))
        crawler.signals.connect(ext.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(ext.spider_idle, signal=signals.spider_idle)
        crawler.signals.connect(ext.spider_closed, signal=signals.spider_closed)
        crawler.signals.connect(ext.item_error, signal=signals.item_error)
        crawler.signals.connect(ext.request_dropped, signal=signals.request_dropped)
        return ext

    async def spider_opened(self, spider: Spider) -> None:
        await self.runtime.open(spider)
        self._loop = LoopingCall(self.tick)
        self._loop.start(self.config.poll_interval, now=True).addErrback(self._loop_failed)

    def _loop_failed(self, failure: Failure) -> None:
        logger.error("scrapy-retryqueue: poll loop stopped: %s", failure.getTraceback())

    async def spider_closed(self, spider: Spider, reason: str) -> None:
        self._closing = True
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        if self._ticking is not None:
            # Its claims must be known before the node releases what it holds.
            await maybe_deferred_to_future(self._ticking)
        await self.runtime.close()
        if self._counts is not None and (self._counts.due or self._counts.leased):
            logger.info(
                "scrapy-retryqueue: %d retr%s still pending; the next crawl of %r resumes them",
                self._counts.due + self._counts.leased,
                "y" if self._counts.due + self._counts.leased == 1 else "ies",
                spider.name,
            )

    # -- polling -------------------------------------------------------------

    def tick(self) -> None:
        queue = self.runtime.queue
        if self._ticking is not None or self._closing or queue is None:
            return
        now = time.time()
        room = max(0, self.config.max_in_flight - len(self.runtime.held))
        leases: dict[str, str] = {}
        if now - self._last_renew >= self.config.lease_time / 3:
            leases = dict(self.runtime.held)
            self._last_renew = now
        writes_seen = self.runtime.writes
        token = self.runtime.new_lease_token()
        lease_ms = int(self.config.lease_time * 1000)
        max_reclaims = self.config.max_reclaims

        def io() -> TickResult:
            now_ = now_ms()
            reclaimed, poisoned = queue.reap(now=now_, limit=_REAP_BATCH, max_reclaims=max_reclaims)
            lost = queue.renew(leases, lease_until=now_ + lease_ms)
            claimed = queue.claim(now=now_, limit=room, lease_until=now_ + lease_ms, token=token)
            return TickResult(claimed, reclaimed, poisoned, lost, token)

        d = self.runtime.call_untracked(io)
        d.addCallbacks(self._after_tick, self._tick_failed, callbackArgs=(writes_seen,))
        d.addBoth(self._tick_done)
        if not d.called:
            self._ticking = d

    def _tick_done(self, _: Any) -> None:
        self._ticking = None

    def _tick_failed(self, failure: Failure) -> None:
        self.runtime.stats.inc_value("retryqueue/poll_error")
        logger.error("scrapy-retryqueue: poll failed: %s", failure.value)

    def _after_tick(self, result: TickResult, writes_seen: int) -> None:
        stats = self.runtime.stats
        self._counts = result.claimed
        self._counts_writes = writes_seen
        if result.reclaimed:
            stats.inc_value("retryqueue/reclaimed", len(result.reclaimed))
        if result.poisoned:
            stats.inc_value("retryqueue/dead", len(result.poisoned))
            stats.inc_value("retryqueue/dead/poison", len(result.poisoned))
            logger.error(
                "scrapy-retryqueue: %d task(s) dead-lettered as poison (lease expired more than "
                "RETRYQUEUE_MAX_RECLAIMS=%d times)",
                len(result.poisoned),
                self.config.max_reclaims,
            )
        for task_id in result.lost:
            self.runtime.held.pop(task_id, None)
        if result.lost:
            stats.inc_value("retryqueue/lease_lost", len(result.lost))
        if result.claimed.tasks:
            self._idle_since = None
        for task_id, raw in result.claimed.tasks:
            if self._closing:
                # Claimed while the spider closes: held only to be released.
                self.runtime.held[task_id] = result.tokens
            else:
                self._reinject(task_id, raw, result.tokens)

    def _reinject(self, task_id: str, raw: str, token: str) -> None:
        runtime = self.runtime
        try:
            task = task_from_json(raw)
            request = request_from_json(task.request, runtime.spider)
        except EnvelopeError as exc:
            self._dead_malformed(task_id, raw, token, exc)
            return
        request.meta[META_TASK] = TaskHandle(task, token)
        request.priority += self.config.priority_adjust
        runtime.held[task_id] = token
        runtime.stats.inc_value("retryqueue/reinjected")
        self.crawler.engine.crawl(request)

    def _dead_malformed(self, task_id: str, raw: str, token: str, exc: Exception) -> None:
        runtime = self.runtime
        queue = runtime.queue
        assert queue is not None
        logger.error("scrapy-retryqueue: task %s is malformed (%s); dead-lettered", task_id, exc)
        # The raw text is kept as it is, so a person can see what was wrong.
        envelope = _json_wrap_malformed(task_id, raw, str(exc), runtime.config.node_id)

        def counted(written: bool) -> None:
            if written:
                runtime.stats.inc_value("retryqueue/dead")
                runtime.stats.inc_value("retryqueue/dead/malformed")

        runtime.call(
            queue.deadletter_raw, task_id, envelope, token, now=now_ms(), kind="malformed", url=""
        ).addCallback(counted)

    # -- keeping the spider open --------------------------------------------

    def spider_idle(self, spider: Spider) -> None:
        runtime = self.runtime
        if self._closing or runtime.queue is None:
            return
        self.tick()
        # Counts read before the latest write (a parse retry scheduled after
        # the last poll, say) cannot tell that nothing is pending.
        stale = self._counts is None or self._counts_writes != runtime.writes
        if runtime.busy or runtime.held or stale:
            raise DontCloseSpider
        pending = self._counts.due + self._counts.leased
        if not pending:
            return
        now = time.time()
        if self._idle_since is None:
            self._idle_since = now
        idle_for = now - self._idle_since
        timeout = self.config.idle_timeout
        next_due = self._counts.next_due
        far = next_due is not None and not self._counts.leased and next_due / 1000 - now > timeout
        if idle_for >= timeout or far:
            logger.info(
                "scrapy-retryqueue: closing with %d retr%s pending (next due in %s); "
                "RETRYQUEUE_IDLE_TIMEOUT=%ss bounds the wait; the next crawl resumes them",
                pending,
                "y" if pending == 1 else "ies",
                "-" if next_due is None else f"{max(0.0, next_due / 1000 - now):.0f}s",
                timeout,
            )
            return
        raise DontCloseSpider

    # -- other signals -------------------------------------------------------

    def item_error(self, item: Any, response: Any, spider: Spider, failure: Failure) -> None:
        request = getattr(response, "request", None)
        if request is None:
            return
        plan = self.runtime.plan(request, failure_for_kind("storage", failure.value))
        self.runtime.persist(plan)

    def request_dropped(self, request: Request, spider: Spider) -> None:
        self.runtime.ack(request, outcome="ignored")


def _json_wrap_malformed(task_id: str, raw: str, error: str, node: str) -> str:
    import json

    from .defaults import ENVELOPE_VERSION

    return json.dumps(
        {
            "v": ENVELOPE_VERSION,
            "id": task_id,
            "dead_kind": "malformed",
            "kind": "malformed",
            "node": node,
            "last_error": {"kind": "malformed", "type": "EnvelopeError", "message": error},
            "raw": raw,
        },
        separators=(",", ":"),
    )
