"""The leased frontier's part of the runtime facade: push, pop, its round trip, its close.

:class:`FrontierFacade` is a base of :class:`~scrapy_retryqueue.runtime.RetryQueueRuntime`:
frontier.py's scheduler queue calls these methods on the crawler's one runtime, and
:mod:`.frontier` holds the requests this node has and builds each round trip.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

from ..exceptions import EncryptionKeyError, SignatureError
from ..queue.connection import is_outage
from ..queue.envelope import EnvelopeError
from ..queue.frontier import Finished
from ..settings.defaults import FLEET_HEARTBEAT_MIN_MS, META_FRONTIER, SCRAPY_FINISHED
from ..values import now_ms
from .frontier import FrontierResult, close_io, entry_for, finished_line
from .refusals import check_frontier, forged_stats, signed_frontier_text
from .taskref import live_ref

if TYPE_CHECKING:
    from scrapy import Request

    from .attemptfacade import Parking


logger = logging.getLogger("scrapy_retryqueue.runtime")


class FrontierFacade:
    """The frontier methods of the runtime facade. They work on the runtime's own
    state (its frontier, write path, reporter, config, spider), which
    RetryQueueRuntime sets up: this class is only ever its base."""

    def frontier_start(self, *, order: str, seeds: bool = True) -> None:
        """A scheduler queue of the leased frontier serves this crawl (no I/O).
        *seeds*: the spider seeds it with start requests (not a scrapy-redis spider
        fed from Redis), so a crawl that finished is not seeded again."""
        self.frontier.in_use = True
        self.frontier.order = order
        self.frontier.seeds = seeds

    @property
    def frontier_finished(self) -> bool:
        """The fleet's crawl on the frontier finished before this node joined it: the
        node crawls nothing (one WARNING line said so) and should close."""
        return self.frontier.refused is not None

    @property
    def frontier_in_use(self) -> bool:
        """A scheduler queue of the leased frontier serves this crawl: its seen
        fingerprints, in Redis, are a shared dupefilter."""
        return self.frontier.in_use

    @property
    def frontier_size(self) -> int:
        """Requests the frontier can still give this node (its scheduler's length)."""
        return len(self.frontier)

    @property
    def frontier_pending(self) -> int:
        """Frontier requests anywhere in the fleet, waiting or leased, at the last
        round trip, and this node's own not yet written: the crawl is not over."""
        f = self.frontier
        return f.waiting + f.leased + len(f.outbox) + len(f.local) + len(f.ready)

    @property
    def frontier_busy(self) -> bool:
        """This node holds frontier work that Redis has not settled yet."""
        return self.frontier.holds or self._frontier_call is not None

    def frontier_push(self, request: Request) -> None:
        """Add a request to the frontier (written with the next round trip)."""
        from ..queue.envelope import frontier_request_to_json

        request.meta.pop(META_FRONTIER, None)
        if self.frontier.refused is not None:
            return  # the crawl is over: this node adds nothing to it
        if live_ref(request) is not None:
            # A re-injected retry is leased already, by the retry queue: it stays
            # on this node, whose lease brings it back if the node dies. Through
            # the shared frontier, a copy could outlive a lease handed back.
            self.frontier.local.append(request)
            return
        try:
            text = frontier_request_to_json(
                request,
                self.spider,
                cipher=self.config.encryption,
                recomputed=self.planner.recomputed_meta,
            )
        except EnvelopeError as exc:
            # Crawled from this node's memory: a node that dies loses it.
            self.frontier.local.append(request)
            self.reporter.count("retryqueue/frontier/unstorable")
            logger.warning(
                "scrapy-retryqueue: %s cannot be stored in the leased frontier (%s); crawled "
                "from this node's memory, lost if the node dies",
                request.url,
                exc,
            )
            return
        fingerprint = self.fingerprint(request)
        if request.dont_filter:
            import uuid

            # Not filtered, so not one per fingerprint: an id of its own.
            request_id, fingerprint = f"{fingerprint}:{uuid.uuid4().hex[:12]}", ""
        else:
            request_id = fingerprint
        spider = self.spider.name if self.spider is not None else ""
        text = signed_frontier_text(self.config, spider, request_id, text)
        self.frontier.outbox.append(entry_for(request_id, fingerprint, request, text))
        self._frontier_kick_soon()

    def frontier_pop(self) -> Request | None:
        """The next request for the engine, marked with its lease; None when none is here
        now (a batch is asked for: the engine is woken when it lands)."""
        frontier = self.frontier
        if frontier.local:
            return frontier.local.popleft()
        request = None
        while request is None and frontier.ready:
            request_id, raw, token = frontier.ready.popleft()
            request = self._frontier_request(request_id, raw, token)
        if frontier.wants_lease:
            self._frontier_kick_soon()
        return request

    def _frontier_request(self, request_id: str, raw: str | bytes, token: str) -> Request | None:
        from ..queue.envelope import frontier_request_from_json

        try:
            check_frontier(self.config, self.spider.name if self.spider else "", request_id, raw)
            request = frontier_request_from_json(raw, self.spider, cipher=self.config.encryption)
        except SignatureError as exc:
            self.frontier.bad[request_id] = token
            self.frontier.forged.add(request_id)
            for stat in forged_stats(exc):
                self.reporter.count(stat)
            self.reporter.count("retryqueue/frontier/forged")
            logger.warning(
                "scrapy-retryqueue: frontier request %s is forged (%s); not fetched, "
                "quarantined as forged",
                ascii(request_id),
                exc,
            )
            return None
        except EncryptionKeyError as exc:
            # Sound, only not for this node: held, handed back when the crawl closes.
            self.frontier.kept[request_id] = token
            logger.error("scrapy-retryqueue: frontier request %s: %s", ascii(request_id), exc)
            return None
        except EnvelopeError as exc:
            self.frontier.bad[request_id] = token
            self.reporter.count("retryqueue/frontier/malformed")
            logger.error(
                "scrapy-retryqueue: frontier request %s is malformed (%s); quarantined",
                ascii(request_id),
                exc,
            )
            return None
        request.meta[META_FRONTIER] = {"id": request_id, "token": token}
        self.frontier.running[request_id] = (token, request)
        return request

    def frontier_clear(self) -> None:
        """Forget the frontier (scrapy-redis's flush: SCHEDULER_PERSIST False, or
        SCHEDULER_FLUSH_ON_START): every node's requests and its seen fingerprints."""
        from ..queue.keys import frontier_keys

        queue = self.writes.queue
        if self.frontier.refused is not None:
            return  # a node that crawled nothing deletes nothing (nor the mark)
        self.frontier.outbox.clear()
        self.frontier.ready.clear()
        if queue is None or self.spider is None:
            self._frontier_clear_on_open = True  # the scheduler opens before the runtime
            return
        # During the crawl (SCHEDULER_PERSIST False at close): no mark of a finished
        # crawl is left behind it, the next crawl starts afresh.
        self.frontier.cleared = True
        keys = frontier_keys(queue.keys)  # the project's namespace, as the retry queue's
        self.writes.call(queue.client.delete, *keys).addErrback(
            lambda f: logger.error("scrapy-retryqueue: clearing the frontier failed: %s", f.value)
        )

    def _frontier_waits_for(self, request: Request, parking: Parking) -> None:
        """A frontier request's failure is acknowledged once its park is written."""
        ref = request.meta.get(META_FRONTIER)
        request_id = ref.get("id") if isinstance(ref, dict) else None
        if isinstance(request_id, str) and self.frontier.park_started(request_id):

            def written(result: Any) -> Any:
                self.frontier.park_finished(request_id)
                return result

            parking.outcome.addBoth(written)

    def _frontier_kick_soon(self) -> None:
        """A round trip at the end of this reactor turn: the pushes and pops of one
        callback's output travel together."""
        from twisted.internet import reactor

        if self._frontier_kick_armed or not self.is_open:
            return
        self._frontier_kick_armed = True

        def kick() -> None:
            self._frontier_kick_armed = False
            self._frontier_kick()

        reactor.callLater(0, kick)

    async def _frontier_open(self) -> None:
        """As the runtime opens: the first round trip, waited for, joins the fleet's
        crawl before a start request is pushed, or finds it finished
        (:attr:`frontier_finished`). Redis down: the first round trip once it answers."""
        from scrapy.utils.defer import maybe_deferred_to_future

        if self._frontier_clear_on_open:
            # SCHEDULER_FLUSH_ON_START: the mark of a finished crawl goes with the
            # rest, and this new crawl may be marked finished in its turn.
            self._frontier_clear_on_open = False
            self.frontier_clear()
            self.frontier.cleared = False
        self._frontier_kick()
        if self._frontier_call is not None:
            with contextlib.suppress(Exception):
                await maybe_deferred_to_future(self._frontier_call)

    def _frontier_kick(self, *, maintain: bool = False) -> None:
        """One frontier round trip now, or right after the one on its way."""
        store, writes = self._frontier_store, self.writes
        if store is None or writes.down or writes.spooled or self.frontier.refused is not None:
            return
        if self._frontier_call is not None:
            self._frontier_again = True
            self._frontier_maintain |= maintain
            return
        self.frontier.settle(self._in_progress())
        io = self.frontier.io(store, maintain=maintain, lease=not self._closing)
        d = writes.call_untracked(io)
        self._frontier_call = d
        d.addCallbacks(self._frontier_landed, self._frontier_failed)
        d.addBoth(self._frontier_done)

    def _frontier_landed(self, result: FrontierResult) -> None:
        frontier, count = self.frontier, self.reporter.count
        before = len(frontier)
        frontier.landed(result)
        joined = result.joined
        if joined is not None and joined.finished is not None:
            name = self.spider.name if self.spider is not None else "?"
            line = finished_line(name, joined, frontier.started, self.config.frontier_restart)
            if joined.refused:
                count("retryqueue/frontier/refused")
                logger.warning("scrapy-retryqueue: %s", line)
                self._wake()  # idle now: the engine closes it (at open, the extension)
                return
            count("retryqueue/frontier/restarted")
            logger.info("scrapy-retryqueue: %s", line)
        for stat, value in (
            ("pushed", result.pushed),
            ("duplicates", result.duplicates),
            ("leased", len(result.leased.requests)),
            ("acked", result.acked),
            ("reclaimed", len(result.reclaimed)),
            ("lease_lost", len(result.lost)),
            ("ghosts", len(result.leased.ghosts)),
        ):
            if value:
                count(f"retryqueue/frontier/{stat}", value)
        if result.poisoned:
            count("retryqueue/frontier/poison", len(result.poisoned))
            logger.error(
                "scrapy-retryqueue: %d frontier request(s) quarantined as poison (lease expired "
                "more than RETRYQUEUE_MAX_RECLAIMS=%d times): %s",
                len(result.poisoned),
                self.config.max_reclaims,
                ", ".join(ascii(x) for x in result.poisoned[:5]),
            )
        if result.leased.requests or result.acked or (before and not len(frontier)):
            # A batch to crawl; or requests finished, or the frontier ran dry: the
            # engine may find itself idle now rather than at its next 5-second
            # heartbeat.
            self._wake()

    def _frontier_failed(self, failure: Any) -> None:
        self.frontier.failed()
        if is_outage(failure.value):
            self.writes.mark_down(failure.value)
            return
        self.reporter.count("retryqueue/frontier/error")
        logger.error("scrapy-retryqueue: frontier round trip failed: %s", failure.value)

    def _frontier_done(self, _: Any) -> None:
        self._frontier_call = None
        if self._frontier_again:
            maintain, self._frontier_again, self._frontier_maintain = (
                self._frontier_maintain,
                False,
                False,
            )
            self._frontier_kick(maintain=maintain)

    async def _frontier_close(self, reason: str | None) -> None:
        """Write what this node pushed and finished; hand back what it holds. A spider
        that ran out of work (*reason* Scrapy's ``finished``) marks the crawl
        finished if the fleet has nothing left."""
        from scrapy.utils.defer import maybe_deferred_to_future

        self._closing = True
        while self._frontier_call is not None:
            with contextlib.suppress(Exception):
                await maybe_deferred_to_future(self._frontier_call)
        store, writes, frontier = self._frontier_store, self.writes, self.frontier
        if store is None or frontier.refused is not None:
            return
        self.frontier.settle(self._in_progress())
        entries, acks, bad, release = self.frontier.take_all()
        if writes.down:
            logger.warning(
                "scrapy-retryqueue: Redis is down at close: %d frontier request(s) this node "
                "held return when their leases expire; %d it pushed are lost",
                len(release) + len(acks),
                len(entries),
            )
            return
        finishes = reason == SCRAPY_FINISHED and frontier.seeds and not frontier.cleared
        mark = Finished(now_ms(), self.config.node_id) if finishes else None
        try:
            poll_ms = int(self.config.poll_interval * 1000)
            alive_after = now_ms() - max(3 * poll_ms, FLEET_HEARTBEAT_MIN_MS)
            pushed, acked, released, finished = await maybe_deferred_to_future(
                writes.call(
                    close_io,
                    store,
                    entries,
                    acks,
                    bad,
                    release,
                    alive_after=alive_after,
                    mark=mark,
                    forged=frozenset(self.frontier.forged),
                )
            )
        except Exception as exc:
            logger.warning(
                "scrapy-retryqueue: could not hand back %d frontier request(s) (%s); their "
                "leases expire and other nodes take them",
                len(release),
                exc,
            )
            return
        name = self.spider.name if self.spider is not None else "?"
        if finished and mark is not None:
            self.reporter.count("retryqueue/frontier/finished")
            logger.info(
                "scrapy-retryqueue: the crawl's frontier is done: the crawl of %r is marked "
                "finished; a node started later crawls nothing unless "
                "RETRYQUEUE_FRONTIER_RESTART = True",
                name,
            )
        elif finished:
            logger.info(
                "scrapy-retryqueue: the crawl's frontier is done; the next crawl of %r starts "
                "afresh",
                name,
            )
        if acked:
            self.reporter.count("retryqueue/frontier/acked", acked)
        if pushed:
            self.reporter.count("retryqueue/frontier/pushed", pushed)
        if released:
            self.reporter.count("retryqueue/frontier/released", released)
            logger.info("scrapy-retryqueue: released %d unfinished frontier request(s)", released)
