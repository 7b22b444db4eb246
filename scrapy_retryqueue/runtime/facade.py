"""The facade the Scrapy glue calls for one crawler: park, defer, ack, release, poll.

The downloader middleware, the spider middleware, the extension and the leased
frontier's scheduler queue of one crawler share one :class:`RetryQueueRuntime`
and talk to nothing deeper (its frontier methods are in :mod:`.frontierfacade`,
a base class of it). The path of a failure reads top-down from
:meth:`RetryQueueRuntime.park`:

1. :mod:`.planner` decides (pure): policy, meta overrides, retry hook, envelope;
2. :mod:`.writes` carries the decision to Redis (batched, on the worker
   thread; spooled while Redis is down);
3. :mod:`.reporting` counts, logs, audits and signals what the write did.

Beside them: :mod:`.taskref` (which task a request is), :mod:`.leases` (the
tasks this node holds and the poll that claims them), :mod:`.breaker`
(per-domain cooldowns) and :mod:`.frontier` (the frontier requests this node holds).

The glue reads none of these parts: what it needs of them (counts, the
cooling domains, the decoding of a claimed task, stats and reports) is a
method or property here, so a part can change without touching the glue.
import-linter's contracts (pyproject.toml) hold the glue to this package.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, replace
from functools import partial
from types import MappingProxyType
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

from scrapy.exceptions import NotConfigured
from twisted.internet import defer

from ..config import Config, config_for, redact_url
from ..decision.kinds import MALFORMED as MALFORMED_KIND
from ..decision.kinds import POISON as POISON_KIND
from ..exceptions import ConfigError, EncryptionKeyError, RequestParked
from ..queue.connection import is_outage
from ..queue.delayed import Claimed, Write
from ..queue.domains import DomainCooldowns
from ..queue.envelope import (
    EnvelopeError,
    check_item_replay,
    check_json,
    malformed_envelope,
    request_from_json,
    task_from_json,
)
from ..settings.defaults import (
    FLEET_BUSY_MIN_MS,
    FLEET_HEARTBEAT_MIN_MS,
    FLEET_REGISTERED_POLLS,
    META_FRONTIER,
    META_ITEM,
    META_TASK,
)
from ..values import now_ms
from . import engineview
from .breaker import DomainBreaker
from .frontier import Frontier
from .frontierfacade import FrontierFacade
from .leases import Leases, PollResult
from .outcome import Outcome
from .planner import Plan, Planner, retries_so_far
from .reporting import Reporter
from .retrybudget import RequestCounts
from .startup import mark_logged
from .taskref import (
    TaskRef,
    live_ref,
    ref_created,
    ref_host,
    ref_learning,
    ref_of,
    settle,
    task_ref,
)
from .writes import WritePath

if TYPE_CHECKING:
    from collections.abc import Callable, Container, Mapping

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler

    from ..decision.classify import FailureInfo
    from ..queue.envelope import Task
    from ..queue.frontier import RedisFrontier

__all__ = [
    "Claimed",
    "Outcome",
    "Parking",
    "PollResult",
    "RetryQueueRuntime",
    "is_outage",
    "runtime_for",
    "runtime_if_any",
]

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Parking:
    """A failure on its way into the queue: the decision now, the write's Outcome later."""

    kind: str
    delay: float
    task_id: str
    #: The decision: retry later (True) or dead letter (False).
    retry: bool
    #: Retries of this kind so far, this one included when retried.
    attempt: int
    outcome: defer.Deferred[Outcome]
    #: A dead letter of a request no lease names: given up whatever its write does
    #: (kept, spooled, or refused because another copy of the request is a live
    #: task), so the glue passes the failure on without waiting for Redis.
    final: bool = False

    def parked(self) -> RequestParked:
        """The exception that takes the request out of the crawl until it is due."""
        return RequestParked(self.kind, self.delay, self.task_id)


_RUNTIMES: WeakKeyDictionary[Crawler, RetryQueueRuntime] = WeakKeyDictionary()


def runtime_for(crawler: Crawler) -> RetryQueueRuntime:
    """The crawler's runtime, created on first use; NotConfigured when disabled.

    The first call also checks that the queue's Redis answers (or starts the
    embedded server): Scrapy ends a crawl with a non-zero exit status only when
    building its components fails, so this is where a crawl that cannot keep
    its failures must stop.
    """
    runtime = _RUNTIMES.get(crawler)
    if runtime is None:
        runtime = RetryQueueRuntime(crawler)
        if runtime.config.enabled:
            preflight(runtime.config, crawler.settings)
        _RUNTIMES[crawler] = runtime
    if not runtime.config.enabled:
        raise NotConfigured("RETRYQUEUE_ENABLED is False")
    return runtime


def preflight(config: Config, settings: Any = None) -> None:
    """Stop the crawl with one error line when its Redis cannot be reached at start,
    or a path it will write cannot be written."""
    from ..exceptions import EmbeddedServerError
    from ..queue import embedded
    from ..queue.connection import check_reachable, embedded_dir
    from ..settings.defaults import REDIS_START_TIMEOUT
    from .startup import stop_at_start
    from .writable import directory_problem, file_problem

    if settings is not None:
        from ..store.config import load_store_config

        # The store's extension reads them again when it is built; a bad one is
        # said here, before anything (the project's .scrapy/ folder) is made.
        try:
            load_store_config(settings)
        except ConfigError as exc:
            stop_at_start(str(exc))
    if config.audit_log:
        problem = file_problem(config.audit_log)
        if problem:
            stop_at_start(f"RETRYQUEUE_AUDIT_LOG {config.audit_log!r} cannot be written: {problem}")
    # The local state (the spool, the embedded server's data and the SQLite
    # store) needs a directory with a configured Redis too: found wanting
    # mid-crawl, every failure would be lost with Scrapy's RetryMiddleware
    # already removed. It is looked at first without creating anything (a
    # refused path leaves the disk as it was), then made and written to.
    directory = embedded_dir(config.embedded_dir)
    problem = directory_problem(directory)
    if problem:
        stop_at_start(
            f"the local state has no directory: RETRYQUEUE_EMBEDDED_DIR {str(directory)!r} "
            f"cannot hold the spool and the embedded server's data: {problem}"
        )
    try:
        embedded.check_directory(directory)
    except EmbeddedServerError as exc:
        stop_at_start(f"the local state has no directory: {exc}")
    if config.embedded_dir is None and embedded.user_directory_in_use(directory):
        logger.info(
            "scrapy-retryqueue: no scrapy.cfg in reach (as under Scrapyd); local state in %s "
            "(RETRYQUEUE_EMBEDDED_DIR)",
            directory,
        )
    if config.redis_url is None:
        # Whether it can run here at all; it is started when the spider opens,
        # so that building a crawler starts no process.
        try:
            embedded.server_binary()
        except EmbeddedServerError as exc:
            stop_at_start(f"the embedded Redis-compatible server cannot start: {exc}")
        return
    if config.start_without_redis:
        return  # an outage at start is spooled like any other
    try:
        check_reachable(config, timeout=REDIS_START_TIMEOUT)
    except Exception as exc:
        if not (is_outage(exc) or isinstance(exc, OSError)):
            raise
        stop_at_start(
            f"Redis at {redact_url(config.redis_url)} ({config.redis_url_setting}) does not "
            f"answer ({exc}); the crawl stops before it fetches anything. Fix the address, or "
            "set RETRYQUEUE_START_WITHOUT_REDIS = True to crawl anyway and keep failures in "
            "the local spool until Redis answers"
        )


def _recomputed_meta(crawler: Crawler) -> dict[str, Any]:
    """The meta values Scrapy's middlewares set by default in this crawl: a stored
    request does not keep them, so a later crawl's settings apply to its retry."""
    from ..settings.defaults import SCRAPY_META_DOWNLOAD_TIMEOUT

    return {SCRAPY_META_DOWNLOAD_TIMEOUT: crawler.settings.getfloat("DOWNLOAD_TIMEOUT")}


def runtime_if_any(crawler: Crawler) -> RetryQueueRuntime | None:
    """The crawler's runtime when a component created one, without creating it."""
    return _RUNTIMES.get(crawler)


class RetryQueueRuntime(FrontierFacade):
    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        try:
            self.config: Config = config_for(crawler)
        except ConfigError as exc:
            # A bad setting stops the crawl before it fetches anything, with
            # this one line and no traceback after it.
            logger.error("scrapy-retryqueue: %s", exc)
            raise mark_logged(exc) from None
        for notice in self.config.notices:
            logger.warning("scrapy-retryqueue: %s", notice)
        self.reporter = Reporter(crawler, self.config)
        self.writes = WritePath(self.config, self.reporter)
        self.breaker = DomainBreaker(self.config, self.writes, self.reporter)
        self.leases = Leases(self.config)
        #: Fresh requests per domain for the fleet's retry budget, until the next poll.
        self.requests = RequestCounts(self.config)
        #: The leased frontier's requests this node holds (when a scheduler queue
        #: of the leased frontier uses this crawler: frontier.py).
        self.frontier = Frontier(self.config, self.leases.new_token)
        self._frontier_store: RedisFrontier | None = None
        #: The engine's requests in progress (None: this Scrapy does not tell), and
        #: a call that asks the engine for requests now.
        self._in_progress: Callable[[], Container[Request] | None] = partial(
            engineview.in_progress, crawler
        )
        self._wake: Callable[[], None] = partial(engineview.wake, crawler)
        #: Re-injected tasks the site answered, acknowledged once the engine has
        #: finished their request (callback run, items through the pipelines):
        #: task id -> (request, its live task reference). Until then the lease
        #: holds, so a node killed in between leaves the page to another node.
        self._finishing: dict[str, tuple[Request, TaskRef]] = {}
        self._frontier_call: defer.Deferred[Any] | None = None
        self._frontier_again = False
        self._frontier_maintain = False
        self._frontier_kick_armed = False
        self._frontier_clear_on_open = False
        #: When this node registered with the fleet (its first heartbeat, ms).
        self._registered = 0
        self._closing = False
        try:
            hook = self._build_hook(self.config.retry_hook)
        except ConfigError as exc:
            logger.error("scrapy-retryqueue: %s", exc)
            raise mark_logged(exc) from None
        self.planner = Planner(
            self.config,
            fingerprint=self.fingerprint,
            retry_hook=hook,
            cooling=self.breaker.cooling,
            recomputed_meta=_recomputed_meta(crawler),
        )
        #: The domains cooling down (domain -> end of the cooldown, ms), read-only:
        #: a view of the breaker's dict, so empty in a healthy crawl, and a truth
        #: test of it is all a fresh request's gate costs.
        self.cooling: Mapping[str, int] = MappingProxyType(self.breaker.cooling)
        self.spider: Spider | None = None
        #: What the last poll read of the fleet: node -> (heartbeat ms, last busy ms,
        #: registered ms).
        self.fleet: dict[str, tuple[int, int, int]] = {}
        #: Fires once close() has finished: every write of this crawl is in
        #: Redis (or in the spool), released leases included.
        self.closed: defer.Deferred[None] = defer.Deferred()
        #: Fires once open() has finished (connected or not); None before it starts.
        self._opening: defer.Deferred[None] | None = None
        #: Tasks left in Redis (due or leased) as close() read them after its last
        #: write; None when it could not (Redis down): the last poll's count stands.
        self.pending_at_close: int | None = None

    def _build_hook(self, hook: Any) -> Callable[..., Any] | None:
        """The retry hook to call: a class is instantiated (from_crawler when it has one)."""
        if hook is None or not isinstance(hook, type):
            return hook
        from scrapy.utils.misc import build_from_crawler

        try:
            instance = build_from_crawler(hook, self.crawler)
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

    def fingerprint(self, request: Request) -> str:
        return self.crawler.request_fingerprinter.fingerprint(request).hex()

    # -- lifecycle ---------------------------------------------------------------

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
            if self._frontier_clear_on_open:
                self._frontier_clear_on_open = False
                self.frontier_clear()
            self._frontier_kick()

    async def close(self) -> None:
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
            await self._frontier_close()
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

    # -- state the extension reads -------------------------------------------------------

    @property
    def busy(self) -> bool:
        """Writes are on their way to Redis: the spider must not close yet."""
        return self.writes.busy

    def written(self) -> defer.Deferred[None]:
        """Fires once every write submitted so far has landed (or been spooled)."""
        from scrapy.utils.defer import deferred_from_coro

        return deferred_from_coro(self.writes.drain())

    @property
    def is_open(self) -> bool:
        return self.writes.queue is not None

    @property
    def started(self) -> bool:
        """open() was called, finished or not: :attr:`closed` fires once the spider closes."""
        return self._opening is not None

    @property
    def down(self) -> bool:
        return self.writes.down

    @property
    def writes_submitted(self) -> int:
        """Writes submitted so far: queue counts read before the latest one are stale."""
        return self.writes.writes

    @property
    def spooled(self) -> int:
        """Writes waiting in the local spool until Redis answers."""
        return self.writes.spooled

    @property
    def held(self) -> int:
        """Tasks this node holds under lease: claimed, not finished yet."""
        return len(self.leases)

    @property
    def room(self) -> int:
        """How many more tasks this node may claim now (RETRYQUEUE_MAX_IN_FLIGHT)."""
        return self.leases.room

    # -- telling ---------------------------------------------------------------------------

    def count(self, stat: str, value: int = 1) -> None:
        self.reporter.count(stat, value)

    def summary(self) -> None:
        """The end-of-crawl lines: per kind, retries scheduled, recovered and dead."""
        self.reporter.summary()

    def callback_error(
        self, exception: BaseException, response: Any, *, first: bool, due_in: float
    ) -> None:
        """A callback's exception parked for a retry: counted, signalled, logged as Scrapy does."""
        self.reporter.callback_error(exception, response, first=first, due_in=due_in)

    # -- domains ---------------------------------------------------------------------------

    def cooling_until(self, request: Request) -> int | None:
        """End of the cooldown (ms) of the request's domain, None when it is open."""
        return self.breaker.cooling_until(request)

    def on_domain_cooling(self, callback: Callable[[], None]) -> None:
        """Have *callback* called when a domain starts to cool or cools longer.

        The downloader glue takes that domain's requests back out of Scrapy's
        download queue then: the breaker knows nothing of Scrapy's downloader.
        """
        self.breaker.on_cooling = callback

    # -- failures --------------------------------------------------------------------------

    def park(
        self, request: Request, failure: FailureInfo, *, task_id: str | None = None
    ) -> Parking:
        """Plan a failed attempt and write it: a retry parked for later, or a dead letter."""
        self._take_lease_back(request)
        parking = self._carry_out(self.planner.plan(request, failure, task_id=task_id))
        self._frontier_waits_for(request, parking)
        return parking

    def download_failed(self, request: Request, failure: FailureInfo) -> Parking:
        """A download failed: the domain's breaker hears of it, then the request is parked."""
        self._downloaded(request)
        self.breaker.downloaded(request, failure)
        return self.park(request, failure)

    def download_succeeded(self, request: Request) -> None:
        """A download the site answered: the breaker hears of it; a re-injected task is
        acknowledged once the engine has finished its request (:meth:`settle_finished`)."""
        self._downloaded(request)
        self.breaker.downloaded(request, None)
        ref = live_ref(request)
        if ref is not None:
            # The callback and the requests it makes with meta=response.meta see the
            # task settled, as new requests are no attempt of it; a failure of the
            # page itself takes the lease back (_take_lease_back).
            request.meta[META_TASK] = {**ref, "settled": True}
            self._finishing[ref["id"]] = (request, ref)

    def _take_lease_back(self, request: Request) -> None:
        """The page of a re-injected task failed after its download (its callback, its
        items): that failure is the task's own, written under its lease."""
        ref = ref_of(request) if self._finishing else None
        held = None if ref is None else self._finishing.get(ref["id"])
        if held is not None and held[0] is request:
            del self._finishing[ref["id"]]
            request.meta[META_TASK] = held[1]

    def settle_finished(self) -> None:
        """Acknowledge the re-injected tasks whose request the engine has finished.

        Called at each poll, when the spider is idle and when it closes. A page
        that failed meanwhile has rescheduled its task under the lease already.
        """
        if not self._finishing:
            return
        in_progress = self._in_progress()
        if in_progress is None:
            in_progress = frozenset()  # this Scrapy does not tell: as finished
        for task_id, (request, ref) in list(self._finishing.items()):
            if request not in in_progress:
                del self._finishing[task_id]
                self._acknowledge(request, ref, ignored=False)

    def _downloaded(self, request: Request) -> None:
        """A fresh request (not a retry) counts toward its domain's retry budget."""
        if self.requests.budget is not None and ref_of(request) is None:
            self.requests.sent(request)

    def defer(self, request: Request, *, held: bool = False) -> Parking | None:
        """Park a fresh request whose domain cools down (kind ``deferred``, no budget used).

        *held*: the request was taken back from Scrapy's download queue, where
        it waited when its domain started to cool; a re-injected task is
        deferred then too (its claim let it through before the cooldown).
        None when its domain is open, or when it cannot be stored: it goes now.
        """
        until = self.breaker.cooling_until(request)
        if until is None or (ref_of(request) is not None and not held):
            return None  # open, or re-injected: its claim let it through
        plan = self.planner.plan_deferred(request, until)
        if not plan.decision.retry:
            return None
        parking = self._carry_out(plan)
        parking.outcome.addCallback(self._count_deferred)
        self._frontier_waits_for(request, parking)
        return parking

    def _count_deferred(self, outcome: Outcome) -> Outcome:
        if outcome.request_parked:
            self.reporter.count("retryqueue/domain/deferred")
        return outcome

    def _carry_out(self, plan: Plan) -> Parking:
        self.reporter.notes(plan.notes)
        # The write names the lease before the lease is marked used.
        write = Write.for_task(plan.op, plan.task, plan.token, plan.now, host=plan.host)
        if write.token is not None and plan.ref is not None:
            # A task's attempt failed again (or gave up): its outage lasts on.
            write = self._learning(write, plan.ref)
        if plan.ref is not None:
            settle(plan.ref)
        d = self.writes.submit(write)
        if write.token is not None:
            self.leases.written_by(plan.task.id, d)
        d.addCallbacks(
            lambda outcome: self.reporter.planned(plan, outcome),
            lambda f: self.reporter.planned(plan, Outcome.ERROR, f.value),
        )
        decision = plan.decision
        return Parking(
            decision.kind,
            decision.delay,
            plan.task.id,
            decision.retry,
            decision.attempt,
            d,
            final=not decision.retry and write.token is None,
        )

    # -- successes and hand-backs --------------------------------------------------------------

    def ack(self, request: Request, *, ignored: bool = False) -> None:
        """The re-injected request is done: it succeeded, or was dropped on purpose (*ignored*)."""
        ref = live_ref(request)
        if ref is not None:
            self._acknowledge(request, ref, ignored=ignored)

    def _acknowledge(self, request: Request, ref: TaskRef, *, ignored: bool) -> None:
        if self.writes.queue is None:
            return
        settle(ref)
        task_id, now = ref["id"], now_ms()
        write = Write(
            *("ack", task_id, now, ref["token"]),
            kind=ref["kind"],
            url=ref["url"],
            created=ref_created(ref),
            host=ref_host(ref),
        )
        if not ignored:
            write = self._learning(write, ref)
        how = "ignored" if ignored else "recovered"
        d = self.writes.submit(write)
        self.leases.written_by(task_id, d)
        d.addCallbacks(
            lambda result: self.reporter.acked(request, ref, how, result, now),
            lambda f: self.reporter.ack_failed(ref, f.value),
        )

    def _learning(self, write: Write, ref: dict[str, Any]) -> Write:
        """*write* with the learning update of its task's outage (recovery.py), when
        RETRYQUEUE_LEARNED_STATS is on and the outage is of a kind a policy retries."""
        if not self.config.learned_stats:
            return write
        kind, prior = ref_learning(ref)
        if not kind or kind not in self.config.policy_table.policies:
            return write  # an internal kind (deferred, malformed...) is no outage
        return replace(write, learn=kind, prior=prior)

    def release(self, request: Request) -> None:
        """Hand a re-injected request's task back, due now (its download was cancelled);
        a frontier request is handed back too, when the node closes, not acknowledged."""
        frontier_ref = request.meta.get(META_FRONTIER)
        if isinstance(frontier_ref, dict):
            self.frontier.hand_back(frontier_ref.get("id"))
        ref = live_ref(request)
        queue = self.writes.queue
        if ref is None or queue is None or self.writes.down:
            return  # not a task, or its lease simply expires
        settle(ref)
        d = self.writes.call(queue.release, {ref["id"]: ref["token"]}, now=now_ms())
        self.leases.written_by(ref["id"], d)
        d.addCallbacks(
            lambda count: self.reporter.count("retryqueue/released", count),
            lambda f: logger.debug("release failed: %s", f.value),
        )

    # -- polling -----------------------------------------------------------------------------

    def fleet_working(self) -> list[str]:
        """Other nodes of the spider that were working at their last heartbeat: they may
        still push requests to a shared frontier or fail pages into the queue."""
        now = now_ms()
        poll_ms = int(self.config.poll_interval * 1000)
        alive_after = now - max(3 * poll_ms, FLEET_HEARTBEAT_MIN_MS)
        busy_after = now - max(2 * poll_ms, FLEET_BUSY_MIN_MS)
        # A node that registered a moment ago may not have pushed its start
        # requests yet: it counts as working for a few polls.
        new_after = now - max(FLEET_REGISTERED_POLLS * poll_ms, FLEET_HEARTBEAT_MIN_MS)
        return sorted(
            node
            for node, (beat, busy, registered) in self.fleet.items()
            if node != self.config.node_id
            and beat >= alive_after
            and (busy >= busy_after or registered >= new_after)
        )

    def poll(self, *, last_busy: int = 0) -> defer.Deferred[Any] | None:
        """One round trip: renew, reap, claim, read cooldowns; or replay the spool first.

        Fires with a :class:`PollResult` (its claimed tasks are held; the
        caller re-injects or releases them), or with a bool after a spool
        replay (nothing is claimed until the spool is written, to keep writes
        in order). None when there is nothing to do yet.
        """
        writes = self.writes
        queue = writes.queue
        if queue is None:
            return None
        self.settle_finished()
        if writes.down or writes.spooled:
            return writes.recover()
        if self.frontier.in_use:
            self._frontier_kick(maintain=True)
        learns = callable(getattr(self.config.policy_table.backoff, "learned", None))
        io, token = self.leases.poll_io(
            queue,
            self.breaker.domains,
            last_busy=last_busy,
            registered=self._registered,
            learns=learns,
            budget=self.requests.budget,
            requests=self.requests.take(),
        )
        d = writes.call_untracked(io)
        d.addCallbacks(self._polled, self._poll_failed, errbackArgs=(token,))
        return d

    def _polled(self, result: PollResult) -> PollResult:
        reporter = self.reporter
        self.fleet = result.nodes
        if result.settled:
            self.leases.settle(result.settled)
        if result.unclaimed:
            reporter.count("retryqueue/unclaimed", len(result.unclaimed))
            logger.info(
                "scrapy-retryqueue: %d task(s) a poll whose reply was lost had claimed are "
                "due again",
                len(result.unclaimed),
            )
        if result.recovery is not None:
            stats, malformed = result.recovery
            if malformed:
                reporter.malformed_records(malformed)
            strategy = self.config.policy_table.backoff
            try:
                strategy.learned(stats)  # type: ignore[attr-defined]
            except Exception as exc:  # a strategy's bug must not stop the polls
                reporter.count("retryqueue/backoff_error")
                logger.error("scrapy-retryqueue: RETRYQUEUE_BACKOFF learned() raised %r", exc)
        if result.cooling is not None:
            self.breaker.polled(result.cooling)
        if result.reclaimed:
            reporter.count("retryqueue/reclaimed", len(result.reclaimed))
        if result.poisoned:
            reason = f"lease expired more than {self.config.max_reclaims} times"
            logger.error(
                "scrapy-retryqueue: %d task(s) dead-lettered as poison (lease expired more than "
                "RETRYQUEUE_MAX_RECLAIMS=%d times)",
                len(result.poisoned),
                self.config.max_reclaims,
            )
            reporter.dead_without_request(POISON_KIND, result.poisoned, reason)
        # Ghosts (due ids without an envelope): claim.lua dead-lettered them.
        reporter.ghosts(result.claimed)
        reporter.budget(result.claimed)
        lost = self.leases.lost(result.lost) if result.lost else []
        if lost:
            reporter.count("retryqueue/lease_lost", len(lost))
        for task_id, _ in result.claimed.tasks:
            self.leases.hold(task_id, result.token)
        return result

    def _poll_failed(self, failure: Any, token: str) -> None:
        if is_outage(failure.value):
            # A timeout or a lost connection: its claim may have run (not retried:
            # the next poll hands back whatever it leased under this token).
            self.leases.doubt(token)
            self.writes.mark_down(failure.value)
            return
        self.reporter.count("retryqueue/poll_error")
        logger.error("scrapy-retryqueue: poll failed: %s", failure.value)

    def claimed(self, task_id: str, raw: str | bytes, token: str) -> Request | None:
        """The request of a task a poll claimed, marked as that task's attempt under *token*.

        None when the stored task cannot be read: it is dead-lettered as
        malformed. Raises EncryptionKeyError when no listed key decrypts it:
        it is not malformed, a node with the key can run it (encryption.py).
        """
        try:
            task = task_from_json(raw)
            request = request_from_json(task.request, self.spider, cipher=self.config.encryption)
            check_item_replay(request.meta.get(META_ITEM))
            return self.claimed_request(task, token, request)
        except EncryptionKeyError:
            raise  # not malformed: it goes on up
        except EnvelopeError as exc:
            self._dead_letter_malformed(task_id, raw, token, exc)
            return None
        except Exception as exc:
            # The readers turn any stored value into a task or an EnvelopeError
            # (tests/test_fuzz_entries.py); should one still escape, this task
            # is isolated all the same, or it would stay leased and renewed by
            # this node for as long as the crawl lasts.
            error = EnvelopeError(f"cannot be read ({type(exc).__name__}: {str(exc)[:200]})")
            self._dead_letter_malformed(task_id, raw, token, error)
            return None

    def claimed_request(self, task: Task, token: str, request: Request) -> Request:
        """Mark a claimed task's rebuilt request as that task's attempt under *token*."""
        from ..settings.defaults import SCRAPY_META_DONT_CACHE, SCRAPY_META_RETRY_TIMES

        request.meta[META_TASK] = task_ref(task, token)
        request.meta[SCRAPY_META_DONT_CACHE] = True
        # Scrapy's count, so a callback's get_retry_request() goes on from it.
        request.meta[SCRAPY_META_RETRY_TIMES] = retries_so_far(task.attempts, request.meta)
        self.reporter.count("retryqueue/reinjected")
        return request

    def _dead_letter_malformed(
        self, task_id: str, raw: str | bytes, token: str, error: Exception
    ) -> None:
        """A claimed task that cannot be read: kept as it is, for a person to look at.

        *raw* is bytes when the stored envelope is not UTF-8 text (kept as base64).
        """
        writes = self.writes
        assert writes.queue is not None
        # ascii(): an id that is not UTF-8 (read with surrogateescape) stays loggable.
        logger.error(
            "scrapy-retryqueue: task %s is malformed (%s); dead-lettered", ascii(task_id), error
        )
        envelope = malformed_envelope(task_id, raw, str(error), self.config.node_id)
        write = Write(
            "deadletter", task_id, now_ms(), token, envelope=envelope, kind=MALFORMED_KIND
        )

        def written(outcome: Outcome) -> None:
            if outcome is Outcome.DEAD:
                self.reporter.dead_without_request(MALFORMED_KIND, [task_id], str(error))

        d = writes.submit(write)
        self.leases.written_by(task_id, d)
        d.addCallbacks(
            written, lambda f: logger.error("could not dead-letter task %s: %s", task_id, f.value)
        )

    def replayed_item(self, replay: Mapping[str, Any]) -> Any:
        """The item an item replay carries, as its class when that class is loaded and is
        an item class (envelope.item_class), else as a dict: the class is gone or
        changed, or the stored name is none the crawl may build (one WARNING per name)."""
        from ..queue.envelope import item_class

        fields = replay["item"]
        path = replay.get("class")
        if not path:
            return fields
        cls = item_class(path)
        if cls is not None:
            try:
                return cls(**fields)
            except Exception:
                return dict(fields)  # the class changed since the item was stored
        self.reporter.item_class_unknown(path)
        return dict(fields)

    @staticmethod
    def replay_meta(item: Any) -> dict[str, Any] | None:
        """An item as its task's envelope keeps it for a replay (RETRYQUEUE_ITEM_REPLAY):
        its fields as JSON, and its class when it can be rebuilt; None when it is not JSON."""
        from itemadapter import ItemAdapter

        try:
            data = check_json(ItemAdapter(item).asdict(), "item")
        except (EnvelopeError, TypeError, ValueError):
            return None
        cls = type(item)
        path = None if cls is dict else f"{cls.__module__}.{cls.__qualname__}"
        return {"item": data, "class": path}


def _retries(count: int) -> str:
    return f"{count} pending retr{'y' if count == 1 else 'ies'}"
