"""The extension: brings due retries back into the crawl and keeps it open.

Every RETRYQUEUE_POLL_INTERVAL (and whenever the spider goes idle) one worker
call reaps expired leases, renews the leases this node holds, and claims as
many due tasks as this node has room for; the claimed requests are re-injected
with ``engine.crawl``. It also turns item pipeline failures (``item_error``)
into ``storage`` retries, and holds the process's heap frozen while the engine
runs (RETRYQUEUE_FREEZE_HEAP, heap.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import CloseSpider, DontCloseSpider
from scrapy.utils.defer import deferred_from_coro, maybe_deferred_to_future
from twisted.internet import defer

from ..decision import kinds
from ..decision.classify import failure_for_kind
from ..decision.pollshare import jittered
from ..exceptions import EncryptionKeyError
from ..heap import hold as hold_heap
from ..runtime import PollResult, RetryQueueRuntime, ShutdownTrigger, runtime_for
from ..settings.defaults import (
    FINISH_REASON_FLEET_FINISHED,
    FINISH_REASON_KEY_MISSING,
    FINISH_REASON_WORK_LEFT,
    META_ITEM,
    MIN_POLL_INTERVAL,
)
from ..values import now_ms

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from twisted.internet.base import DelayedCall
    from twisted.python.failure import Failure

    from ..runtime import Claimed

logger = logging.getLogger(__name__)


class RetryQueueExtension:
    def __init__(self, crawler: Crawler, runtime: RetryQueueRuntime) -> None:
        self.crawler = crawler
        self.runtime = runtime
        self.config = runtime.config
        self._timer: DelayedCall | None = None
        self._ticking: defer.Deferred[Any] | None = None
        self._idle_since: float | None = None
        self._counts: Claimed | None = None
        #: runtime.writes_submitted when the poll that read _counts started.
        self._counts_writes = -1
        self._closing = False
        #: When the next "waiting for retries" line is due (time.time()).
        self._next_wait_log = 0.0
        #: Since when this node waits, idle, for other nodes still working.
        self._fleet_idle_since: float | None = None
        #: When the last poll started (time.monotonic()).
        self._last_poll = 0.0
        #: An idle check is asked for once the writes in flight land (spider_idle).
        self._recheck_armed = False
        #: When this node last had work in flight (ms): its heartbeat tells the fleet.
        self._last_busy = now_ms()
        #: Closes the spider when the reactor stops with it open (see _reactor_stops).
        self._shutdown = ShutdownTrigger("before", self._reactor_stops)
        #: Releases the heap freeze held while the engine runs (RETRYQUEUE_FREEZE_HEAP).
        self._release_heap: Callable[[], None] | None = None

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
        if ext.config.freeze_heap:
            crawler.signals.connect(ext.engine_started, signal=signals.engine_started)
            crawler.signals.connect(ext.engine_stopped, signal=signals.engine_stopped)
        return ext

    def engine_started(self) -> None:
        # What exists now (the modules, the spider, the components, the runtime)
        # lives as long as the crawl: its full collections need not walk it.
        if self._release_heap is None:
            self._release_heap = hold_heap()

    def engine_stopped(self) -> None:
        if self._release_heap is not None:
            self._release_heap()
            self._release_heap = None

    async def spider_opened(self, spider: Spider) -> None:
        from twisted.internet import reactor

        if not reactor.running:
            # Stopped (Ctrl-C) before the spider got here: the process is about to
            # exit, and a worker thread started now would keep it from exiting.
            return
        self._shutdown.arm()
        await self.runtime.open(spider)
        if self.runtime.frontier_finished:  # the fleet's crawl is over: crawl nothing
            raise CloseSpider(FINISH_REASON_FLEET_FINISHED)
        self.tick()

    def _reactor_stops(self) -> defer.Deferred[None] | None:
        """Close the spider before the reactor stops, when Scrapy's stop left it open.

        Scrapy stops a crawl by closing its spider, but only once the engine
        runs: a Ctrl-C while the spider opens (the "Spider opened" line, then
        the spider_opened handlers, this runtime connecting among them) finds
        no engine running, and Scrapy stops the reactor with the spider open.
        Nothing would then close the runtime: its worker thread would keep the
        process from exiting, and a spool adopted from an earlier crawl would
        be lost. The reactor waits for the Deferred returned here.
        """
        try:
            engine = self.crawler.engine
        except RuntimeError:  # no crawl: the components were opened by hand
            return None
        slot = getattr(engine, "_slot", None)
        if (
            engine is None
            or engine.spider is None  # closed already
            or getattr(slot, "closing", None) is not None  # closing: Scrapy finishes it
            or self.crawler.crawling  # not asked to stop (CrawlerProcess stops it now)
        ):
            return None
        logger.info(
            "scrapy-retryqueue: stopped while the spider opens; closing it before the process exits"
        )
        d = deferred_from_coro(engine.close_async(reason="shutdown"))
        d.addErrback(
            lambda f: logger.error("scrapy-retryqueue: closing the spider failed: %s", f.value)
        )
        return d

    async def spider_closed(self, spider: Spider, reason: str) -> None:
        self._closing = True
        self._shutdown.disarm()
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        if self._ticking is not None:
            # Its claims must be known before the node releases what it holds.
            await maybe_deferred_to_future(self._ticking)
        await self.runtime.close(reason)
        self.runtime.summary()
        pending = self.runtime.pending_at_close
        if pending is None:
            pending = 0 if self._counts is None else self._counts.due + self._counts.leased
        self.runtime.left_behind(pending, reason)

    # -- polling -------------------------------------------------------------

    def tick(self) -> None:
        if self._ticking is not None or self._closing:
            return
        writes_seen = self.runtime.writes_submitted
        if not self._engine_idle():
            self._last_busy = now_ms()
            self._fleet_idle_since = None
        d = self.runtime.poll(last_busy=self._last_busy)
        if d is None:
            # Nothing to do yet (Redis down and its next probe not due): look again.
            # The timer is the only caller left when the engine never goes idle (a
            # leased frontier that holds requests it cannot fetch while Redis is down).
            self._arm(self.config.poll_interval)
            return
        self._last_poll = time.monotonic()
        d.addCallback(self._after_poll, writes_seen)
        d.addBoth(self._tick_done)
        if not d.called:
            self._ticking = d

    def _tick_done(self, _: Any) -> None:
        self._ticking = None
        self._arm(self._next_delay())

    def _next_delay(self) -> float:
        """Seconds until the next poll: the poll interval, jittered; or the next task's
        due time when that is sooner and this node is the one of the fleet to poll for
        it (decision/pollshare; a lone node always is), so a retry waits for its due
        time, not for the next round; never more often than every MIN_POLL_INTERVAL s."""
        poll = self.config.poll_interval
        floor = min(MIN_POLL_INTERVAL, poll)
        regular = max(floor, jittered(poll))
        counts = self._counts
        if counts is None or counts.next_due is None or self.runtime.down:
            return regular
        until = counts.next_due / 1000 - time.time()
        if until > 0:
            if until < regular and self.runtime.polls_early(counts.next_due):
                return max(floor, until)
            return regular
        # Due already: the last claim was capped by its batch, or by room.
        return floor if self.runtime.room else regular

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

    def _after_poll(self, result: PollResult | bool | None, writes_seen: int) -> None:
        if not isinstance(result, PollResult):
            return  # a spool replay, or a failed poll (already reported)
        if self._counts is None:
            self._say_if_a_resume_may_parse_twice(result.claimed)
        self._counts = result.claimed
        self._counts_writes = writes_seen
        if self._fleet_idle_since is not None or self._may_close_now(result):
            self._look_for_work()
        if result.claimed.tasks:
            self._idle_since = None
            self._next_wait_log = 0.0
        if self._closing:
            return  # claimed while the spider closes: held only to be released
        for task_id, raw in result.claimed.tasks:
            self._reinject(task_id, raw, result.token)

    def _say_if_a_resume_may_parse_twice(self, found: Claimed) -> None:
        """At the first poll: retries left by an earlier crawl (or another node), with
        nothing that remembers which requests that crawl made, is one WARNING line.

        A spider that starts from its start URLs again then requests afresh the pages
        whose retries it resumes, and parses each twice. Scrapy's JOBDIR (its
        dupefilter persisted) or a shared dupefilter (scrapy-redis's, or the leased
        frontier's seen fingerprints) filters the fresh request out; a re-injected
        retry passes (dont_filter) and is parsed once.
        """
        pending = found.due + found.leased
        settings = self.crawler.settings
        if not pending or settings.get("JOBDIR"):
            return
        if "scrapy_redis" in str(settings.get("DUPEFILTER_CLASS") or ""):
            return
        if self.runtime.frontier_in_use:
            return  # the leased frontier's seen fingerprints are a shared dupefilter
        logger.warning(
            "scrapy-retryqueue: this crawl resumes %d pending retries without JOBDIR or a "
            "shared dupefilter: if the spider requests its start URLs again, a page whose "
            "retry is pending is parsed twice (set JOBDIR; docs/guarantees.md)",
            pending,
        )

    def _reinject(self, task_id: str, raw: str | bytes, token: str) -> None:
        if self._closing:
            return  # held: handed back when the spider closes
        try:
            request = self.runtime.claimed(task_id, raw, token)
        except EncryptionKeyError as exc:
            # Not malformed: a node with the key can run it. Keep it (held,
            # then handed back at close) and stop this crawl (encryption.py).
            self._stop_without_key(task_id, exc)
            return
        if request is None:
            return  # malformed: dead-lettered
        if isinstance(request.meta.get(META_ITEM), dict) and self.config.item_replay:
            deferred_from_coro(self._replay(request)).addErrback(
                lambda f: logger.error(
                    "scrapy-retryqueue: replaying the item of %s failed: %s", request.url, f.value
                )
            )
            return
        self.crawler.engine.crawl(request)

    def _stop_without_key(self, task_id: str, error: EncryptionKeyError) -> None:
        """A claimed task no listed key decrypts: one ERROR line, then the crawl stops.

        The task (and whatever this node holds) is handed back when the spider
        closes, due at once, for a node that has its key.
        """
        self._closing = True
        self.runtime.count("retryqueue/encryption/key_missing")
        logger.error(
            "scrapy-retryqueue: task %s: %s. The task stays in Redis, handed back due now; "
            "the crawl stops (finish reason %s)",
            ascii(task_id),
            error,
            FINISH_REASON_KEY_MISSING,
        )
        engine = self.crawler.engine
        deferred_from_coro(engine.close_spider_async(reason=FINISH_REASON_KEY_MISSING))

    # -- keeping the spider open --------------------------------------------

    def spider_idle(self, spider: Spider) -> None:
        runtime = self.runtime
        if self._closing or not runtime.is_open:
            return
        # Idle: the engine has finished every re-injected request it had.
        runtime.settle_finished()
        if time.monotonic() - self._last_poll >= self.config.poll_interval:
            # Fresh counts; not when a poll just ran, since polls themselves
            # wake the engine, which calls this handler.
            self.tick()
        if runtime.busy or runtime.held or runtime.frontier_busy:
            if runtime.busy and not self._recheck_armed:
                # Ask again once the writes land (acks of the last pages, a dead
                # letter), not at Scrapy's next idle check 5 s later.
                self._recheck_armed = True
                runtime.written().addBoth(self._recheck_idle)
            raise DontCloseSpider
        waiting_for_redis = runtime.down or runtime.spooled > 0
        # Counts read before the latest write (a parse retry scheduled after
        # the last poll, say) cannot tell that nothing is pending.
        stale = self._counts is None or self._counts_writes != runtime.writes_submitted
        counts = self._counts
        # The leased frontier's requests, anywhere in the fleet: a request leased
        # to another node may push more, or come back when that node dies.
        frontier = runtime.frontier_pending
        pending = (0 if counts is None else counts.due + counts.leased) + frontier
        if not (waiting_for_redis or stale or pending):
            self._wait_for_fleet()
            return
        self._fleet_idle_since = None
        now = time.time()
        if self._idle_since is None:
            self._idle_since = now
        timeout = self.config.idle_timeout
        next_due = None if counts is None else counts.next_due
        far = (
            not (waiting_for_redis or stale)
            and counts is not None
            and not counts.leased
            and not frontier
            and next_due is not None
            and next_due / 1000 - now > timeout
        )
        if now - self._idle_since >= timeout or far:
            logger.info(
                "scrapy-retryqueue: closing with work left (%s); RETRYQUEUE_IDLE_TIMEOUT=%ss "
                "bounds the wait",
                "the next retry is due after that bound" if far else "the wait ran out",
                timeout,
            )
            # What is left, where, and how to resume it: said by spider_closed.
            raise CloseSpider(FINISH_REASON_WORK_LEFT)
        if (waiting_for_redis or not stale) and now >= self._next_wait_log:
            self._next_wait_log = now + self.config.wait_log_interval
            logger.info(
                "scrapy-retryqueue: waiting for %s; next due in %s; the crawl waits at most "
                "%.0fs more (RETRYQUEUE_IDLE_TIMEOUT), then leaves the rest for the next crawl",
                "Redis to answer" if waiting_for_redis else _work(pending - frontier, frontier),
                "-" if next_due is None else f"{max(0.0, next_due / 1000 - now):.0f}s",
                max(0.0, timeout - (now - self._idle_since)),
            )
        raise DontCloseSpider

    def _recheck_idle(self, _: Any) -> None:
        self._recheck_armed = False
        if not self._closing:
            self._look_for_work()

    def _wait_for_fleet(self) -> None:
        """Keep an idle node in the crawl while another node of the spider still works:
        with a shared frontier (scrapy-redis), its next links may be this node's work.
        Bounded by RETRYQUEUE_FLEET_WAIT."""
        working = self.runtime.fleet_working()
        if not working or self.config.fleet_wait <= 0:
            self._fleet_idle_since = None
            return
        now = time.time()
        if self._fleet_idle_since is None:
            self._fleet_idle_since = now
        left = self.config.fleet_wait - (now - self._fleet_idle_since)
        if left <= 0:
            logger.info(
                "scrapy-retryqueue: leaving the fleet although %s still work%s "
                "(RETRYQUEUE_FLEET_WAIT=%ss)",
                ", ".join(working),
                "s" if len(working) == 1 else "",
                self.config.fleet_wait,
            )
            return
        if now >= self._next_wait_log:
            self._next_wait_log = now + self.config.wait_log_interval
            logger.info(
                "scrapy-retryqueue: nothing to do here, waiting for the fleet: %s still "
                "work%s; this node waits at most %.0fs more (RETRYQUEUE_FLEET_WAIT)",
                ", ".join(working),
                "s" if len(working) == 1 else "",
                left,
            )
        raise DontCloseSpider

    def _may_close_now(self, result: PollResult) -> bool:
        """Nothing is left for this node: ask Scrapy to check now whether the spider can
        close, rather than at its next 5-second idle check (a prompt close)."""
        runtime = self.runtime
        return (
            not (result.claimed.due or result.claimed.leased or result.claimed.tasks)
            and not (runtime.busy or runtime.held or runtime.down)
            and not (runtime.frontier_busy or runtime.frontier_pending)
            and not runtime.fleet_working()
            and self._engine_idle()
        )

    def _engine_idle(self) -> bool:
        engine = getattr(self.crawler, "engine", None)
        try:
            return bool(engine is None or engine.spider_is_idle())
        except Exception:  # no slot yet (opening) or already gone (closing)
            return True

    def _look_for_work(self) -> None:
        """While this node is idle and kept open, ask its scheduler for requests now,
        not at the engine's next 5-second heartbeat: a shared frontier may have
        received some from another node."""
        slot = getattr(getattr(self.crawler, "engine", None), "_slot", None)
        nextcall = getattr(slot, "nextcall", None)
        if nextcall is not None:
            nextcall.schedule()

    # -- other signals -------------------------------------------------------

    def item_error(self, item: Any, response: Any, spider: Spider, failure: Failure) -> None:
        request = getattr(response, "request", None)
        if request is None or request.meta.get("dont_retry", False):
            return
        storage = failure_for_kind(kinds.STORAGE, failure.value)
        replay = self.runtime.replay_meta(item) if self.config.item_replay else None
        if replay is not None and META_ITEM not in request.meta:
            # Each failed item of a page is a task of its own: fingerprint + item.
            digest = hashlib.sha1(self.runtime.fingerprint(request).encode())
            digest.update(json.dumps(replay, sort_keys=True, default=str).encode())
            replayed = request.replace(meta={**request.meta, META_ITEM: replay})
            self.runtime.count("retryqueue/item_replay/scheduled")
            self.runtime.park(replayed, storage, task_id=digest.hexdigest())
        else:
            if self.config.item_replay and replay is None:
                self.runtime.count("retryqueue/item_replay/unserializable")
            self.runtime.park(request, storage)

    def item_scraped(self, item: Any, response: Any, spider: Spider) -> None:
        if _is_replay(response):
            self.runtime.count("retryqueue/item_replay/stored")
            self.runtime.ack(response.request)

    def item_dropped(self, item: Any, response: Any, spider: Spider, exception: Any) -> None:
        if _is_replay(response):
            self.runtime.ack(response.request, ignored=True)

    async def _replay(self, request: Request) -> None:
        """Send a stored item through the item pipelines again (no download)."""
        from scrapy.http import Response

        item = self.runtime.replayed_item(request.meta[META_ITEM])
        # A stand-in for the page: item_error / item_scraped name its request,
        # whose meta holds the task, so the extension acks or reschedules it.
        response = Response(request.url, request=request, flags=[REPLAY_FLAG])
        self.runtime.count("retryqueue/item_replay/replayed")
        scraper = self.crawler.engine.scraper
        await scraper.start_itemproc_async(item, response=response)

    def request_dropped(self, request: Request, spider: Spider) -> None:
        self.runtime.ack(request, ignored=True)


#: Flag of the stand-in response of an item replay.
REPLAY_FLAG = "retryqueue_replay"


def _is_replay(response: Any) -> bool:
    return REPLAY_FLAG in (getattr(response, "flags", None) or ())


def _retries(count: int) -> str:
    return f"{count} pending retr{'y' if count == 1 else 'ies'}"


def _work(retries: int, frontier: int) -> str:
    if not frontier:
        return _retries(retries)
    requests = f"{frontier} frontier request{'' if frontier == 1 else 's'}"
    return f"{_retries(retries)} and {requests}" if retries else requests
