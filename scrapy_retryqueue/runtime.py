"""Shared state of one crawler's retry-queue components.

The downloader middleware, the spider middleware and the extension of one
crawler share one :class:`RetryQueueRuntime`: the validated config, the queue,
the tasks this node holds, and one worker thread that runs every Redis call in
submission order. Order matters: a task's ack must reach Redis before a new
failure of the same request is scheduled, and one thread guarantees that
without locks. Decisions are made on the reactor thread (pure, fast); only the
Redis I/O runs on the worker.
"""

from __future__ import annotations

import itertools
import logging
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar
from weakref import WeakKeyDictionary

from scrapy.exceptions import NotConfigured
from scrapy.utils.httpobj import urlparse_cached
from twisted.internet import defer, threads
from twisted.python.threadpool import ThreadPool

from . import defaults
from .audit import AuditLog
from .classify import FailureInfo
from .config import Config, load_config, redact_url
from .connection import client_for, embedded_dir
from .envelope import Task, request_to_json
from .exceptions import ConfigError, EnvelopeError
from .policy import Decision
from .queue import RedisDelayedQueue

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)
T = TypeVar("T")

_RUNTIMES: WeakKeyDictionary[Crawler, RetryQueueRuntime] = WeakKeyDictionary()


def runtime_for(crawler: Crawler) -> RetryQueueRuntime:
    """The crawler's runtime, created on first use; NotConfigured when disabled."""
    runtime = _RUNTIMES.get(crawler)
    if runtime is None:
        runtime = RetryQueueRuntime(crawler)
        _RUNTIMES[crawler] = runtime
    if not runtime.config.enabled:
        raise NotConfigured("RETRYQUEUE_ENABLED is False")
    return runtime


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(slots=True)
class TaskHandle:
    """Carried in a re-injected request's meta: which task it is and its lease."""

    task: Task
    token: str
    #: True once the task was acked, rescheduled or dead-lettered; a later
    #: failure of the same response (its callback, an item) starts a new task.
    settled: bool = False


@dataclass(slots=True)
class Plan:
    """A decision about one failure, and the task to write for it."""

    decision: Decision
    failure: FailureInfo
    task: Task
    handle: TaskHandle | None
    now: int

    @property
    def token(self) -> str | None:
        return None if self.handle is None or self.handle.settled else self.handle.token


class RetryQueueRuntime:
    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        try:
            self.config: Config = load_config(crawler.settings)
        except ConfigError as exc:
            # A bad setting stops the crawl before it fetches anything.
            logger.error("scrapy-retryqueue: %s", exc)
            raise
        self.stats = crawler.stats
        self.queue: RedisDelayedQueue | None = None
        self.redis_url: str | None = None
        self.spider: Spider | None = None
        #: Tasks this node holds: task id -> lease token.
        self.held: dict[str, str] = {}
        self.rand = random.Random()
        self._lease_prefix = f"{self.config.node_id}:{uuid.uuid4().hex[:12]}"
        self._claims = itertools.count()
        self._pool: ThreadPool | None = None
        self._pending: set[defer.Deferred[Any]] = set()
        #: Writes submitted so far: queue counts read before the latest write are stale.
        self.writes = 0
        self._meta_errors_logged: set[str] = set()
        self.audit: AuditLog | None = None
        if self.config.audit_log:
            self.audit = AuditLog(
                self.config.audit_log,
                rotation=self.config.audit_rotation,
                retention=self.config.audit_retention,
            )

    # -- lifecycle ---------------------------------------------------------

    async def open(self, spider: Spider) -> None:
        from scrapy.utils.defer import maybe_deferred_to_future

        self.spider = spider
        self._pool = ThreadPool(minthreads=1, maxthreads=1, name="retryqueue")
        self._pool.start()
        if self.audit is not None:
            self.audit.open()
        directory = embedded_dir(self.config.embedded_dir)
        client, url = await maybe_deferred_to_future(
            self.call(client_for, self.config.redis_url, embedded_directory=directory)
        )
        self.redis_url = url
        self.queue = RedisDelayedQueue(
            client,
            spider.name,
            node_id=self.config.node_id,
            events_maxlen=self.config.events_maxlen,
        )
        await maybe_deferred_to_future(self.call(client.ping))
        logger.info(
            "scrapy-retryqueue: node %s, queue %s at %s",
            self.config.node_id,
            self.queue.keys.due.rsplit(":", 1)[0],
            redact_url(url),
        )

    async def close(self) -> None:
        from scrapy.utils.defer import maybe_deferred_to_future

        await self.drain()
        if self.queue is not None and self.held:
            leases = dict(self.held)
            try:
                released = await maybe_deferred_to_future(
                    self.call(self.queue.release, leases, now=now_ms())
                )
                self.stats.inc_value("retryqueue/released", released)
                logger.info("scrapy-retryqueue: released %d unfinished task(s)", released)
            except Exception as exc:
                logger.warning(
                    "scrapy-retryqueue: could not release %d task(s) (%s); "
                    "their leases expire and other nodes take them",
                    len(leases),
                    exc,
                )
            self.held.clear()
        if self.queue is not None:
            await maybe_deferred_to_future(self.call(self.queue.client.close))
        if self._pool is not None:
            self._pool.stop()
            self._pool = None
        if self.audit is not None:
            self.audit.close()

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

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> defer.Deferred[T]:
        """Run a blocking write on the worker thread, in submission order.

        The spider stays open while such calls are pending (see :attr:`busy`).
        """
        d = self.call_untracked(fn, *args, **kwargs)
        self.writes += 1
        self._pending.add(d)

        def done(result: Any) -> Any:
            self._pending.discard(d)
            return result

        d.addBoth(done)
        return d

    def call_untracked(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> defer.Deferred[T]:
        """Like :meth:`call`, for reads and polls that need not hold the spider open."""
        from twisted.internet import reactor

        if self._pool is None:
            return defer.fail(RuntimeError("scrapy-retryqueue is not open"))
        return threads.deferToThreadPool(reactor, self._pool, fn, *args, **kwargs)

    def new_lease_token(self) -> str:
        return f"{self._lease_prefix}:{next(self._claims)}"

    # -- failures ------------------------------------------------------------

    def fingerprint(self, request: Request) -> str:
        return self.crawler.request_fingerprinter.fingerprint(request).hex()

    def _meta_overrides(self, request: Request) -> tuple[Any, int | None]:
        meta_policy = request.meta.get(defaults.META_POLICY)
        max_retries = request.meta.get(defaults.META_MAX_RETRIES)
        table = self.config.policy_table
        try:
            if meta_policy is not None:
                table.check_meta_policy(meta_policy)
            if max_retries is not None and (
                isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0
            ):
                raise ConfigError(
                    f"meta['{defaults.META_MAX_RETRIES}'] must be a whole number >= 0, "
                    f"got {max_retries!r}"
                )
        except ConfigError as exc:
            # A bad meta value must not lose the request: fall back to settings.
            self.stats.inc_value("retryqueue/meta_error")
            if str(exc) not in self._meta_errors_logged:
                self._meta_errors_logged.add(str(exc))
                logger.error("scrapy-retryqueue: %s (using the settings' policy instead)", exc)
            return None, None
        return meta_policy, max_retries

    def plan(self, request: Request, failure: FailureInfo) -> Plan:
        """Decide what to do with a failed attempt (no I/O)."""
        now = now_ms()
        handle = request.meta.get(defaults.META_TASK)
        if not isinstance(handle, TaskHandle):
            handle = None
        previous = handle.task if handle is not None else None
        attempts = dict(previous.attempts) if previous else {}
        meta_policy, max_retries = self._meta_overrides(request)
        decision = self.config.policy_table.decide(
            failure,
            attempts,
            domain=urlparse_cached(request).hostname,
            meta_policy=meta_policy,
            meta_max_retries=max_retries,
            rand=self.rand.random,
        )
        error = failure.as_dict()
        try:
            request_json = request_to_json(request, self.spider)
        except EnvelopeError as exc:
            request_json = {"url": request.url, "method": request.method}
            error = {"kind": "unserializable", "type": "EnvelopeError", "message": str(exc)}
            decision = Decision(
                "unserializable", False, 0.0, attempts.get(failure.kind, 0), str(exc)
            )
        if decision.retry:
            attempts[decision.kind] = decision.attempt
            error["delay"] = round(decision.delay, 3)
        task = Task(
            id=previous.id if previous else self.fingerprint(request),
            spider=self.spider.name if self.spider else "",
            request=request_json,
            attempts=attempts,
            kind=decision.kind,
            first_error=(previous.first_error if previous else None) or error,
            last_error=error,
            node=self.config.node_id,
            created=previous.created if previous else now,
            updated=now,
            due=now + int(decision.delay * 1000),
            dead_kind=None if decision.retry else decision.kind,
        )
        return Plan(decision, failure, task, handle, now)

    def persist(self, plan: Plan) -> defer.Deferred[str]:
        """Write *plan* to Redis; fires with parked, dead, duplicate, stale or error."""
        queue = self.queue
        token = plan.token
        if plan.handle is not None:
            plan.handle.settled = True
        if token is not None:
            self.held.pop(plan.task.id, None)
        if queue is None:
            return defer.succeed(self._report(plan, "error", RuntimeError("queue not open")))

        def write() -> str:
            task, now = plan.task, plan.now
            if plan.decision.retry:
                if token is not None:
                    return "parked" if queue.reschedule(task, token, now=now) else "stale"
                return "parked" if queue.schedule(task, now=now) else "duplicate"
            if queue.deadletter(task, token, now=now):
                return "dead"
            return "stale" if token is not None else "duplicate"

        d = self.call(write)
        d.addCallbacks(
            lambda outcome: self._report(plan, outcome),
            lambda f: self._report(plan, "error", f.value),
        )
        return d

    def _report(self, plan: Plan, outcome: str, error: BaseException | None = None) -> str:
        decision, task = plan.decision, plan.task
        stats = self.stats
        stats.inc_value(f"retryqueue/reason_count/{plan.failure.kind}")
        url = task.url
        if outcome == "parked":
            stats.inc_value("retryqueue/scheduled")
            stats.inc_value(f"retryqueue/scheduled/{decision.kind}")
            logger.debug(
                "scrapy-retryqueue: parked %s (%s), due in %.1fs",
                url,
                decision.reason,
                decision.delay,
            )
        elif outcome == "dead":
            stats.inc_value("retryqueue/dead")
            stats.inc_value(f"retryqueue/dead/{decision.kind}")
            level = logging.INFO
            if decision.kind == "forbidden":
                level = self.config.forbidden_log_level
            elif (
                decision.kind in defaults.RETRYABLE_KINDS
                or decision.kind in defaults.INTERNAL_KINDS
            ):
                level = logging.ERROR
            logger.log(level, "scrapy-retryqueue: dead letter %s (%s)", url, decision.reason)
        elif outcome in ("duplicate", "stale"):
            stats.inc_value(f"retryqueue/{outcome}")
            logger.debug("scrapy-retryqueue: %s not written (%s task)", url, outcome)
        else:
            stats.inc_value("retryqueue/write_error")
            logger.error(
                "scrapy-retryqueue: could not write the %s of %s to Redis: %s",
                "retry" if decision.retry else "dead letter",
                url,
                error,
            )
        if self.audit is not None:
            self.audit.write(
                {"parked": "scheduled"}.get(outcome, outcome),
                task=task.id,
                url=url,
                kind=decision.kind,
                attempt=decision.attempt,
                delay=round(decision.delay, 3),
                node=self.config.node_id,
                reason=decision.reason,
                ts=plan.now,
            )
        return outcome

    def ack(self, request: Request, *, outcome: str = "recovered") -> None:
        """The re-injected request is done (it succeeded, or was dropped on purpose)."""
        handle = request.meta.get(defaults.META_TASK)
        if not isinstance(handle, TaskHandle) or handle.settled or self.queue is None:
            return
        handle.settled = True
        self.held.pop(handle.task.id, None)
        queue, task, token, now = self.queue, handle.task, handle.token, now_ms()

        def reported(acked: bool) -> None:
            if not acked:
                self.stats.inc_value("retryqueue/stale")
                return
            self.stats.inc_value(f"retryqueue/{outcome}")
            if self.audit is not None:
                self.audit.write(
                    outcome,
                    task=task.id,
                    url=task.url,
                    kind=task.kind,
                    node=self.config.node_id,
                    ts=now,
                )

        def failed(failure: Any) -> None:
            self.stats.inc_value("retryqueue/write_error")
            logger.error(
                "scrapy-retryqueue: could not ack %s (%s); its lease expires and it runs again",
                task.url,
                failure.value,
            )

        self.call(queue.ack, task.id, token, now=now, kind=task.kind, url=task.url).addCallbacks(
            reported, failed
        )
