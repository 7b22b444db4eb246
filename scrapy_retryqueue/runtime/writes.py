"""The write path to Redis: one worker thread, batched writes, and the spool during outages.

Every Redis call of a crawler runs on one worker thread, in submission order.
Order matters: a task's ack must reach Redis before a new failure of the same
request is scheduled, and one thread guarantees that without locks. While a
batch is on the thread, new writes gather and go together in the next one.
While Redis does not answer, writes wait in the local spool and are replayed,
in order, once it answers again; nothing is claimed meanwhile.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import redis
from twisted.internet import defer, threads
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool

from ..config import redact_url
from ..exceptions import RetryQueueError
from ..queue import embedded
from ..queue.connection import client_for, embedded_dir, is_outage, queue_identity, same_queue
from ..queue.delayed import RedisDelayedQueue, Write
from ..queue.keys import keys_for
from ..queue.spool import Spool, SpoolFull
from ..settings.defaults import QUEUE_BATCH, RECONNECT_MAX_DELAY, RECONNECT_MIN_DELAY
from .outcome import WRITE_OUTCOMES, Outcome
from .shutdown import ShutdownTrigger

if TYPE_CHECKING:
    from pathlib import Path

    from ..config import Config
    from .planner import Plan
    from .reporting import Reporter

logger = logging.getLogger(__name__)
T = TypeVar("T")


class RedisDown(RetryQueueError, redis.ConnectionError):
    """Raised instead of trying Redis while it is known to be unreachable."""


class WritePath:
    def __init__(self, config: Config, reporter: Reporter) -> None:
        self.config = config
        self.reporter = reporter
        self.queue: RedisDelayedQueue | None = None
        self.redis_url: str | None = None
        self.spool: Spool | None = None
        self._pool: ThreadPool | None = None
        #: Stops the worker if the reactor stops before shutdown() ran (see _stop_worker).
        self._pool_stopper = ShutdownTrigger("during", self._stop_worker)
        self._pending: set[defer.Deferred[Any]] = set()
        self._buffer: list[tuple[Write, defer.Deferred[Outcome], Plan | None]] = []
        self._flushing = False
        #: Writes the spool still held when the crawl closed (the next crawl replays them).
        self.left_in_spool = 0
        #: Writes submitted so far: queue counts read before the latest write are stale.
        self.writes = 0
        #: True while Redis does not answer: writes go to the spool.
        self.down = False
        self._down_since = 0.0
        self._reconnect_delay = RECONNECT_MIN_DELAY
        self._next_probe = 0.0
        #: Spooled writes replayed before Redis went away again, in this outage.
        self._replayed_while_down = 0
        #: The embedded server's directory while this crawl holds it (embedded.hold).
        self._held_server: Path | None = None

    # -- lifecycle ---------------------------------------------------------------

    async def open(self, spider_name: str) -> RedisDelayedQueue:
        """Start the worker, connect (or start the embedded server), adopt a left spool."""
        from scrapy.utils.defer import maybe_deferred_to_future

        config = self.config
        self._pool = ThreadPool(minthreads=1, maxthreads=1, name="retryqueue")
        self._pool.start()
        self._pool_stopper.arm()
        directory = embedded_dir(config.embedded_dir)
        if config.redis_url is None:
            # Held before it starts: a crawl of the project that ends meanwhile
            # leaves it running for this one (embedded.hold).
            await maybe_deferred_to_future(
                self.call(embedded.hold, directory, keep=config.embedded_keep)
            )
            self._held_server = directory
        client, url = await maybe_deferred_to_future(
            self.call(client_for, config, embedded_directory=directory)
        )
        self.redis_url = url
        self.queue = RedisDelayedQueue(
            client,
            spider_name,
            node_id=config.node_id,
            events_maxlen=config.events_maxlen,
            learned_half_life=config.learned_half_life,
            learned_max_records=config.learned_max_records,
            project=config.namespace,
            signing=config.signing,
            finished_keep=config.replay_window,
            finished_max=config.replay_records,
        )
        outage: BaseException | None = None
        try:
            await maybe_deferred_to_future(self.call(self.queue.probe))
        except Exception as exc:
            if not is_outage(exc):
                raise
            outage = exc  # the crawl goes on; failures wait in the spool until Redis answers
        # A cluster is named by its nodes, known once one answered (queue_identity).
        identity = queue_identity(client, url)
        self.spool = Spool(
            directory,
            spider_name,
            config.node_id,
            queue=identity,
            memory_limit=config.spool_memory,
            limit=config.spool_max,
            same_queue=lambda other: same_queue(identity, other),
            project=config.namespace,
        )
        adopted = self.spool.open()
        for path, count, other in self.spool.elsewhere():
            logger.warning(
                "scrapy-retryqueue: %d write(s) spooled for %s wait in %s; this crawl uses "
                "%s and does not replay them (a crawl against that Redis does)",
                count,
                other,
                path,
                identity,
            )
        if adopted:
            self.spool.put_back(adopted)
            logger.warning(
                "scrapy-retryqueue: %d write(s) spooled by an earlier crawl of %r will be replayed",
                len(adopted),
                spider_name,
            )
        if outage is not None:
            self.mark_down(outage)
        else:
            await self._adopt_unnamespaced(spider_name)
        logger.info(
            "scrapy-retryqueue: node %s, queue %s at %s",
            config.node_id,
            self.queue.keys.namespace,
            redact_url(url),
        )
        return self.queue

    async def _adopt_unnamespaced(self, spider_name: str) -> None:
        """Find the spider's queue of before namespaces: moved into the project's once."""
        from scrapy.utils.defer import maybe_deferred_to_future

        assert self.queue is not None
        try:
            moved = await maybe_deferred_to_future(self.call(self.queue.adopt_unnamespaced))
        except Exception as exc:
            if not is_outage(exc):
                raise
            self.mark_down(exc)
            return
        old = keys_for(spider_name).namespace
        if moved > 0:
            logger.info(
                "scrapy-retryqueue: the queue of spider %r without a namespace (%s:*) is now "
                "this project's (%s:*)",
                spider_name,
                old,
                self.queue.keys.namespace,
            )
        elif moved < 0:
            logger.warning(
                "scrapy-retryqueue: spider %r also has a queue without a namespace (%s:*), left "
                "alone since this project's (%s:*) exists; set RETRYQUEUE_NAMESPACE = '' to run "
                "it (docs/redis.md)",
                spider_name,
                old,
                self.queue.keys.namespace,
            )

    async def flush_for_close(self) -> None:
        """Wait for every write, and try the spool once more before the crawl ends."""
        from scrapy.utils.defer import maybe_deferred_to_future

        await self.drain()
        if self.queue is not None and self.spooled:
            self._next_probe = 0.0
            replay = self.recover()
            if replay is not None:
                await maybe_deferred_to_future(replay)

    async def shutdown(self) -> None:
        """Keep what Redis did not take in the spool file, close the client, stop the worker."""
        from scrapy.utils.defer import maybe_deferred_to_future

        self.left_in_spool = self.spool.close() if self.spool is not None else 0
        if self.queue is not None:
            await maybe_deferred_to_future(self.call(self.queue.client.close))
        if self._held_server is not None:
            directory, self._held_server = self._held_server, None
            await maybe_deferred_to_future(
                self.call(embedded.let_go, directory, keep=self.config.embedded_keep)
            )
        self._pool_stopper.disarm()
        if self._pool is not None:
            self._pool.stop()
            self._pool = None

    def _stop_worker(self) -> None:
        """The reactor stops before :meth:`shutdown` ran (a forced shutdown: Ctrl-C
        twice): stop the worker, whose thread would keep the process from exiting,
        as the reactor stops its own pool; what the spool holds in memory goes to
        its file, for the next crawl."""
        if self._pool is not None:
            self._pool.stop()  # joins the thread: the spool is the reactor's alone now
            self._pool = None
        if self.spool is not None:
            self.left_in_spool = self.spool.close()

    async def drain(self) -> None:
        """Wait until every Redis call submitted so far has finished."""
        from scrapy.utils.defer import maybe_deferred_to_future

        while self._pending:
            await maybe_deferred_to_future(
                defer.DeferredList(list(self._pending), consumeErrors=True)
            )

    @property
    def busy(self) -> bool:
        return bool(self._pending)

    @property
    def spooled(self) -> int:
        return len(self.spool) if self.spool is not None else 0

    # -- calls on the worker ---------------------------------------------------------

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> defer.Deferred[T]:
        """Run a blocking write on the worker thread, in submission order.

        The spider stays open while such calls are pending (see :attr:`busy`).
        """
        d = self.call_untracked(fn, *args, **kwargs)
        self._track(d)
        return d

    def call_untracked(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> defer.Deferred[T]:
        """Like :meth:`call`, for reads and polls that need not hold the spider open."""
        from twisted.internet import reactor

        if self._pool is None:
            return defer.fail(RuntimeError("scrapy-retryqueue is not open"))
        return threads.deferToThreadPool(reactor, self._pool, fn, *args, **kwargs)

    def _track(self, d: defer.Deferred[Any]) -> None:
        self.writes += 1
        self._pending.add(d)
        d.addBoth(self._forget_pending, d)

    def _forget_pending(self, result: Any, d: defer.Deferred[Any]) -> Any:
        self._pending.discard(d)
        return result

    # -- batched writes ------------------------------------------------------------------

    def submit(self, write: Write, plan: Plan | None = None) -> defer.Deferred[Outcome]:
        """Queue one write; it goes to Redis with whatever else is waiting.

        Fires with the write's Outcome (SPOOLED while Redis is unreachable).
        Under load, one round trip carries many writes; when quiet, a write
        goes alone at once. Order is kept across and within batches.

        *plan*: the write carries it out; the reporter hears what the write did
        (:meth:`Reporter.planned`, Outcome.ERROR with the error when it failed)
        before any callback of the Deferred, which fires with what it returns.
        """
        d: defer.Deferred[Outcome] = defer.Deferred()
        self._buffer.append((write, d, plan))
        # Tracked as _track does, let go by _flush before it fires (no callbacks of
        # its own: each costs the write a tuple or three and a turn of the chain).
        self.writes += 1
        self._pending.add(d)
        if not self._flushing:
            self._flush()
        return d

    def _flush(self) -> None:
        batch, self._buffer = self._buffer, []
        if not batch:
            return
        self._flushing = True
        writes = [write for write, _, _ in batch]
        done = self.call_untracked(self._apply_batch, writes)

        pending = self._pending

        def delivered(outcomes: list[Outcome]) -> None:
            for (_, d, plan), outcome in zip(batch, outcomes, strict=True):
                pending.discard(d)
                if plan is None:
                    d.callback(outcome)
                else:
                    self._told(d, plan, outcome)

        def failed(failure: Failure) -> None:
            for write, d, plan in batch:
                pending.discard(d)
                try:
                    result = self._spool_if_down(failure, write)
                except Exception:
                    result = Failure()  # SpoolFull, or a spool that could not take it
                if plan is not None:
                    if isinstance(result, Failure):
                        self._told(d, plan, Outcome.ERROR, result.value)
                    else:
                        self._told(d, plan, result)
                elif isinstance(result, Failure):
                    d.errback(result)
                else:
                    d.callback(result)

        def next_batch(_: Any) -> None:
            self._flushing = False
            if self._buffer:
                self._flush()

        done.addCallbacks(delivered, failed)
        done.addBoth(next_batch)

    def _told(
        self,
        d: defer.Deferred[Outcome],
        plan: Plan,
        outcome: Outcome,
        error: BaseException | None = None,
    ) -> None:
        """The reporter hears of *plan*'s write, then *d* fires with what it says (its
        error, as a callback's would be, when it raises)."""
        try:
            result = self.reporter.planned(plan, outcome, error)
        except BaseException:
            d.errback()
            return
        d.callback(result)

    def _apply_batch(self, writes: list[Write]) -> list[Outcome]:
        """Apply writes on the worker thread (raises while Redis is down)."""
        if self.down:
            raise RedisDown("Redis is unreachable")
        return self._apply(writes)

    def _apply(self, writes: list[Write]) -> list[Outcome]:
        queue = self.queue
        if queue is None:
            raise RuntimeError("scrapy-retryqueue is not open")
        return [
            WRITE_OUTCOMES[write.op][applied] if applied or write.token else Outcome.DUPLICATE
            for write, applied in zip(writes, queue.apply(writes), strict=True)
        ]

    def _spool_if_down(self, failure: Failure, write: Write) -> Outcome | Failure:
        if not is_outage(failure.value) or self.spool is None:
            return failure  # not an outage: the caller reports it
        if not failure.check(RedisDown):
            # A real error from Redis; RedisDown only echoes an outage already
            # known (and perhaps just over: the spool is replayed on next poll).
            self.mark_down(failure.value)
        try:
            self.spool.add(write)
        except SpoolFull as exc:
            self.reporter.count("retryqueue/spool_full")
            raise exc from None
        self.reporter.count("retryqueue/spooled")
        return Outcome.SPOOLED

    # -- outages ------------------------------------------------------------------------

    def mark_down(self, error: BaseException) -> None:
        if self.down:
            return
        self.down = True
        self._down_since = time.monotonic()
        self._reconnect_delay = RECONNECT_MIN_DELAY
        self._next_probe = time.monotonic() + self._reconnect_delay
        self.reporter.count("retryqueue/redis_down")
        logger.error(
            "scrapy-retryqueue: Redis is unreachable (%s); failures wait in the local spool "
            "(%s) and are written when it answers again",
            error,
            self.spool.path if self.spool is not None else "-",
        )

    def recover(self) -> defer.Deferred[bool] | None:
        """While down, probe Redis with backoff; when it answers, replay the spool.

        Returns None when no probe is due yet, else a Deferred firing True once
        the spool has been replayed (False: still down).
        """
        if not self.down and not self.spooled:
            return None
        if self.down and time.monotonic() < self._next_probe:
            return None
        d = self.call_untracked(self._replay_spool)
        d.addCallbacks(self._recovered, self._still_down)
        return d

    def _replay_spool(self) -> tuple[list[tuple[Write, Outcome]], BaseException | None]:
        """Probe the spider's slot, then write the spool in order.

        Returns what was written and, when Redis went away again on the way,
        that error: the writes from the failed chunk on are back in the spool
        (those of the chunk that had run replay safely: duplicate or stale).
        """
        queue, spool = self.queue, self.spool
        assert queue is not None and spool is not None
        queue.probe()
        writes = spool.take()
        outcomes: list[tuple[Write, Outcome]] = []
        for start in range(0, len(writes), QUEUE_BATCH):
            chunk = writes[start : start + QUEUE_BATCH]
            try:
                outcomes += zip(chunk, self._apply(chunk), strict=True)
            except BaseException as exc:
                if is_outage(exc) or not isinstance(exc, Exception):
                    spool.put_back(writes[start:])
                    if not isinstance(exc, Exception):
                        raise
                    return outcomes, exc
                # Redis refuses these for good (a script error): keep going.
                logger.error("scrapy-retryqueue: %d spooled write(s) failed: %s", len(chunk), exc)
        return outcomes, None

    def _recovered(self, result: tuple[list[tuple[Write, Outcome]], BaseException | None]) -> bool:
        outcomes, outage = result
        if outcomes:
            self.reporter.count("retryqueue/spool_replayed", len(outcomes))
            self.reporter.replayed((write.kind, outcome) for write, outcome in outcomes)
        if outage is not None:
            self._replayed_while_down += len(outcomes)
            self._backoff(outage)
            return False
        was_down = self.down
        self.down = False
        if was_down:
            logger.warning(
                "scrapy-retryqueue: Redis answers again after %.0fs; %d spooled write(s) replayed",
                time.monotonic() - self._down_since,
                len(outcomes) + self._replayed_while_down,
            )
        self._replayed_while_down = 0
        return True

    def _still_down(self, failure: Failure) -> bool:
        if not is_outage(failure.value):
            logger.error("scrapy-retryqueue: replaying the spool failed: %s", failure.value)
        self._backoff(failure.value)
        return False

    def _backoff(self, error: BaseException) -> None:
        self.mark_down(error)
        self._reconnect_delay = min(self._reconnect_delay * 2, RECONNECT_MAX_DELAY)
        self._next_probe = time.monotonic() + self._reconnect_delay
