"""The extension: brings due retries back into the crawl and keeps it open.

Every RETRYQUEUE_POLL_INTERVAL (and whenever the spider goes idle) one worker
call reaps expired leases, renews the leases this node holds, and claims as
many due tasks as this node has room for; the claimed requests are re-injected
with ``engine.crawl``. It also turns item pipeline failures (``item_error``)
into ``storage`` retries.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import DontCloseSpider
from scrapy.utils.defer import deferred_from_coro, maybe_deferred_to_future
from scrapy.utils.misc import load_object
from twisted.internet import defer

from .classify import failure_for_kind
from .defaults import META_ITEM, META_TASK
from .domains import PROBE_RECHECK_MS
from .envelope import EnvelopeError, check_json, request_from_json, task_from_json
from .queue import Claimed
from .runtime import CONNECTION_ERRORS, RetryQueueRuntime, now_ms, runtime_for, task_ref
from .signals import retryqueue_dead

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from twisted.internet.base import DelayedCall
    from twisted.python.failure import Failure

logger = logging.getLogger(__name__)

_REAP_BATCH = 500
#: Polls come at most this often (seconds), even when tasks fall due faster.
MIN_POLL = 0.05


@dataclass(slots=True)
class TickResult:
    claimed: Claimed
    reclaimed: list[str] = field(default_factory=list)
    poisoned: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    tokens: str = ""
    #: Domains cooling down (domain -> end, ms); None when cooldowns are off.
    cooling: dict[str, int] | None = None


class RetryQueueExtension:
    def __init__(self, crawler: Crawler, runtime: RetryQueueRuntime) -> None:
        self.crawler = crawler
        self.runtime = runtime
        self.config = runtime.config
        self._timer: DelayedCall | None = None
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
        if ext.config.item_replay:
            crawler.signals.connect(ext.item_scraped, signal=signals.item_scraped)
            crawler.signals.connect(ext.item_dropped, signal=signals.item_dropped)
        return ext

    async def spider_opened(self, spider: Spider) -> None:
        await self.runtime.open(spider)
        self.tick()

    async def spider_closed(self, spider: Spider, reason: str) -> None:
        self._closing = True
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
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
        if self.runtime.down or len(self.runtime.spool):
            # Nothing is claimed until the spool is replayed, to keep writes in order.
            recovering = self.runtime.recover()
            if recovering is not None:
                recovering.addBoth(self._tick_done)
                if not recovering.called:
                    self._ticking = recovering
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
        domains = self.runtime.domains
        max_wait = self.config.deferral_max_wait
        max_wait_ms = 0 if max_wait is None else max(1, int(max_wait * 1000))

        def io() -> TickResult:
            now_ = now_ms()
            reclaimed, poisoned = queue.reap(now=now_, limit=_REAP_BATCH, max_reclaims=max_reclaims)
            lost = queue.renew(leases, lease_until=now_ + lease_ms)
            claimed = queue.claim(
                now=now_,
                limit=room,
                lease_until=now_ + lease_ms,
                token=token,
                cooldowns=domains is not None,
                recheck_ms=PROBE_RECHECK_MS,
                deferral_max_wait_ms=max_wait_ms,
            )
            cooling = domains.cooling() if domains is not None else None
            return TickResult(claimed, reclaimed, poisoned, lost, token, cooling)

        d = self.runtime.call_untracked(io)
        d.addCallbacks(self._after_tick, self._tick_failed, callbackArgs=(writes_seen,))
        d.addBoth(self._tick_done)
        if not d.called:
            self._ticking = d

    def _tick_done(self, _: Any) -> None:
        self._ticking = None
        self._arm(self._next_delay())

    def _next_delay(self) -> float:
        """Seconds until the next poll: the poll interval, or sooner when the
        next task falls due before it (so a retry waits for its due time, not
        for the next round), never more often than every MIN_POLL seconds."""
        poll = self.config.poll_interval
        counts = self._counts
        if counts is None or counts.next_due is None or self.runtime.down:
            return poll
        until = counts.next_due / 1000 - time.time()
        if until > 0:
            return min(poll, max(min(MIN_POLL, poll), until))
        has_room = len(self.runtime.held) < self.config.max_in_flight
        # Due already: the last claim was capped by its batch, or by room.
        return min(MIN_POLL, poll) if has_room else poll

    def _arm(self, delay: float) -> None:
        from twisted.internet import reactor

        if self._closing:
            return
        if self._timer is not None and self._timer.active():
            if self._timer.getTime() <= reactor.seconds() + delay:
                return
            self._timer.cancel()
        self._timer = reactor.callLater(delay, self._wake)

    def _wake(self) -> None:
        self._timer = None
        self.tick()
        if self._ticking is None:
            # Nothing to do this time (not open yet, or a poll could not start).
            self._arm(self.config.poll_interval)

    def _tick_failed(self, failure: Failure) -> None:
        if failure.check(*CONNECTION_ERRORS):
            self.runtime.mark_down(failure.value)
            return
        self.runtime.stats.inc_value("retryqueue/poll_error")
        logger.error("scrapy-retryqueue: poll failed: %s", failure.value)

    def _after_tick(self, result: TickResult, writes_seen: int) -> None:
        stats = self.runtime.stats
        self._counts = result.claimed
        self._counts_writes = writes_seen
        if result.cooling is not None:
            self.runtime.cooling = result.cooling
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
            for task_id in result.poisoned:
                self.runtime.send_signal(
                    retryqueue_dead,
                    request=None,
                    task_id=task_id,
                    kind="poison",
                    reason=f"lease expired more than {self.config.max_reclaims} times",
                    decision=None,
                    outcome="dead",
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
        request.meta[META_TASK] = task_ref(task, token)
        runtime.held[task_id] = token
        runtime.stats.inc_value("retryqueue/reinjected")
        if isinstance(request.meta.get(META_ITEM), dict) and self.config.item_replay:
            deferred_from_coro(self._replay(request)).addErrback(
                lambda f: logger.error(
                    "scrapy-retryqueue: replaying the item of %s failed: %s", request.url, f.value
                )
            )
            return
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
                runtime.send_signal(
                    retryqueue_dead,
                    request=None,
                    task_id=task_id,
                    kind="malformed",
                    reason=str(exc),
                    decision=None,
                    outcome="dead",
                )

        runtime.call(
            queue.deadletter_raw, task_id, envelope, token, now=now_ms(), kind="malformed", url=""
        ).addCallback(counted)

    # -- keeping the spider open --------------------------------------------

    def spider_idle(self, spider: Spider) -> None:
        runtime = self.runtime
        if self._closing or runtime.queue is None:
            return
        self.tick()
        if runtime.busy or runtime.held:
            raise DontCloseSpider
        waiting_for_redis = runtime.down or len(runtime.spool) > 0
        # Counts read before the latest write (a parse retry scheduled after
        # the last poll, say) cannot tell that nothing is pending.
        stale = self._counts is None or self._counts_writes != runtime.writes
        counts = self._counts
        pending = 0 if counts is None else counts.due + counts.leased
        if not (waiting_for_redis or stale or pending):
            return
        now = time.time()
        if self._idle_since is None:
            self._idle_since = now
        timeout = self.config.idle_timeout
        next_due = None if counts is None else counts.next_due
        far = (
            not (waiting_for_redis or stale)
            and counts is not None
            and not counts.leased
            and next_due is not None
            and next_due / 1000 - now > timeout
        )
        if now - self._idle_since >= timeout or far:
            logger.info(
                "scrapy-retryqueue: closing with %d retr%s pending (next due in %s)%s; "
                "RETRYQUEUE_IDLE_TIMEOUT=%ss bounds the wait; the next crawl resumes them",
                pending,
                "y" if pending == 1 else "ies",
                "-" if next_due is None else f"{max(0.0, next_due / 1000 - now):.0f}s",
                " and Redis unreachable" if runtime.down else "",
                timeout,
            )
            return
        raise DontCloseSpider

    # -- other signals -------------------------------------------------------

    def item_error(self, item: Any, response: Any, spider: Spider, failure: Failure) -> None:
        request = getattr(response, "request", None)
        if request is None or request.meta.get("dont_retry", False):
            return
        storage = failure_for_kind("storage", failure.value)
        replay = self._replay_meta(item) if self.config.item_replay else None
        if replay is not None and META_ITEM not in request.meta:
            # Each failed item of a page is a task of its own: fingerprint + item.
            digest = hashlib.sha1(self.runtime.fingerprint(request).encode())
            digest.update(json.dumps(replay, sort_keys=True, default=str).encode())
            replayed = request.replace(meta={**request.meta, META_ITEM: replay})
            plan = self.runtime.plan(replayed, storage, task_id=digest.hexdigest())
            self.runtime.stats.inc_value("retryqueue/item_replay/scheduled")
        else:
            if self.config.item_replay and replay is None:
                self.runtime.stats.inc_value("retryqueue/item_replay/unserializable")
            plan = self.runtime.plan(request, storage)
        self.runtime.persist(plan)

    def _replay_meta(self, item: Any) -> dict[str, Any] | None:
        """The item as JSON, with its class when it can be rebuilt; None when it is not JSON."""
        from itemadapter import ItemAdapter

        try:
            data = check_json(ItemAdapter(item).asdict(), "item")
        except (EnvelopeError, TypeError, ValueError):
            return None
        cls = type(item)
        path = None if cls is dict else f"{cls.__module__}.{cls.__qualname__}"
        return {"item": data, "class": path}

    def item_scraped(self, item: Any, response: Any, spider: Spider) -> None:
        if _is_replay(response):
            self.runtime.stats.inc_value("retryqueue/item_replay/stored")
            self.runtime.ack(response.request)

    def item_dropped(self, item: Any, response: Any, spider: Spider, exception: Any) -> None:
        if _is_replay(response):
            self.runtime.ack(response.request, outcome="ignored")

    async def _replay(self, request: Request) -> None:
        """Send a stored item through the item pipelines again (no download)."""
        from scrapy.http import Response

        replay = request.meta[META_ITEM]
        item: Any = replay["item"]
        if replay.get("class"):
            try:
                item = load_object(replay["class"])(**item)
            except Exception:
                item = dict(replay["item"])  # the class is gone or changed: a dict
        # A stand-in for the page: item_error / item_scraped name its request,
        # whose meta holds the task, so the extension acks or reschedules it.
        response = Response(request.url, request=request, flags=[REPLAY_FLAG])
        self.runtime.stats.inc_value("retryqueue/item_replay/replayed")
        scraper = self.crawler.engine.scraper
        if hasattr(scraper, "start_itemproc_async"):
            await scraper.start_itemproc_async(item, response=response)
        else:  # Scrapy < 2.14
            await maybe_deferred_to_future(scraper.start_itemproc(item, response=response))

    def request_dropped(self, request: Request, spider: Spider) -> None:
        self.runtime.ack(request, outcome="ignored")


#: Flag of the stand-in response of an item replay.
REPLAY_FLAG = "retryqueue_replay"


def _is_replay(response: Any) -> bool:
    return REPLAY_FLAG in (getattr(response, "flags", None) or ())


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
