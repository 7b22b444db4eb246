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
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar
from weakref import WeakKeyDictionary

import redis
from scrapy.exceptions import NotConfigured
from scrapy.utils.httpobj import urlparse_cached
from twisted.internet import defer, threads
from twisted.python.threadpool import ThreadPool

from . import defaults
from . import signals as rq_signals
from .audit import AuditLog
from .classify import FailureInfo
from .config import Config, load_config, redact_url
from .connection import client_for, embedded_dir
from .domains import BURST_KINDS, PROBE_RECHECK_MS, DomainChange, DomainCooldowns
from .envelope import Task, request_to_json
from .exceptions import ConfigError, EnvelopeError
from .policy import Decision
from .queue import RedisDelayedQueue, Write
from .spool import Spool, SpoolFull

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from twisted.python.failure import Failure

logger = logging.getLogger(__name__)
T = TypeVar("T")

#: What an outage looks like from redis-py (BusyLoadingError: a restarted
#: server still loading its append-only file).
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.BusyLoadingError,
    ConnectionError,
)
#: Outcome of a write by its op, when refused (False) or applied (True); a
#: refused write without a lease token met a live task: a duplicate.
_OUTCOMES = {
    "schedule": {False: "duplicate", True: "parked"},
    "reschedule": {False: "stale", True: "parked"},
    "ack": {False: "stale", True: "acked"},
    "deadletter": {False: "stale", True: "dead"},
}
REPLAY_BATCH = 500
RECONNECT_MIN_DELAY = 0.5
RECONNECT_MAX_DELAY = 30.0


class RedisDown(redis.ConnectionError):
    """Raised instead of trying Redis while it is known to be unreachable."""


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


def runtime_if_any(crawler: Crawler) -> RetryQueueRuntime | None:
    """The crawler's runtime when a component created one, without creating it."""
    return _RUNTIMES.get(crawler)


def now_ms() -> int:
    return int(time.time() * 1000)


def task_ref(task: Task, token: str) -> dict[str, Any]:
    """The meta value of a re-injected request: which task it is, and its lease.

    Plain JSON on purpose: a shared frontier (scrapy-redis) may serialize the
    request, and another node may run it; its ack then still names the lease.
    """
    return {
        "id": task.id,
        "token": token,
        "kind": task.kind,
        "attempts": dict(task.attempts),
        "first_error": task.first_error,
        "created": task.created,
        "due": task.due,
        "url": task.url,
        # True once acked, rescheduled or dead-lettered: a later failure of the
        # same response (its callback, an item) starts a new task.
        "settled": False,
    }


def _ref_of(request: Request) -> dict[str, Any] | None:
    ref = request.meta.get(defaults.META_TASK)
    if (
        isinstance(ref, dict)
        and isinstance(ref.get("id"), str)
        and isinstance(ref.get("token"), str)
    ):
        return ref
    return None


@dataclass(slots=True)
class Plan:
    """A decision about one failure, and the task to write for it."""

    decision: Decision
    failure: FailureInfo
    task: Task
    ref: dict[str, Any] | None
    now: int
    #: The request to retry: the failed one, or the retry hook's replacement.
    request: Request | None = None

    @property
    def token(self) -> str | None:
        return None if self.ref is None or self.ref["settled"] else self.ref["token"]


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
        self._buffer: list[tuple[Write, defer.Deferred[str]]] = []
        self._flushing = False
        #: Writes submitted so far: queue counts read before the latest write are stale.
        self.writes = 0
        self._meta_errors_logged: set[str] = set()
        #: Fires once close() has finished: every write of this crawl is in
        #: Redis (or in the spool), released leases included.
        self.closed: defer.Deferred[None] = defer.Deferred()
        #: True while Redis does not answer: writes go to the spool.
        self.down = False
        self._down_since = 0.0
        self._reconnect_delay = RECONNECT_MIN_DELAY
        self._next_probe = 0.0
        self.spool = Spool(
            embedded_dir(self.config.embedded_dir),
            crawler.spidercls.name or "spider",
            self.config.node_id,
            memory_limit=self.config.spool_memory,
            limit=self.config.spool_max,
        )
        self.retry_hook: Callable[..., Any] | None = self._build_hook(self.config.retry_hook)
        #: Per-domain cooldowns in Redis (RETRYQUEUE_DOMAIN_COOLDOWN), set on open.
        self.domains: DomainCooldowns | None = None
        #: What the last poll read of them: domain -> end of its cooldown (ms);
        #: a domain whose end has passed is half-open.
        self.cooling: dict[str, int] = {}
        self.audit: AuditLog | None = None
        if self.config.audit_log:
            self.audit = AuditLog(
                self.config.audit_log,
                rotation=self.config.audit_rotation,
                retention=self.config.audit_retention,
            )

    def _build_hook(self, hook: Any) -> Callable[..., Any] | None:
        """The retry hook to call: a class is instantiated (from_crawler when it has one)."""
        if hook is None or not isinstance(hook, type):
            return hook
        from scrapy.utils.misc import build_from_crawler

        instance = build_from_crawler(hook, self.crawler)
        if not callable(instance):
            raise ConfigError(
                f"RETRYQUEUE_RETRY_HOOK {hook!r} builds an object that is not callable "
                f"(it needs a __call__(request, decision) method)"
            )
        return instance

    def send_signal(self, signal: object, **kwargs: Any) -> None:
        """Send one of :mod:`scrapy_retryqueue.signals` (handler errors are logged)."""
        self.crawler.signals.send_catch_log(signal=signal, spider=self.spider, **kwargs)

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
            self.call(
                client_for,
                self.config.redis_url,
                embedded_directory=directory,
                cluster=self.config.redis_cluster,
            )
        )
        self.redis_url = url
        self.queue = RedisDelayedQueue(
            client,
            spider.name,
            node_id=self.config.node_id,
            events_maxlen=self.config.events_maxlen,
        )
        if self.config.domain_cooldown:
            self.domains = DomainCooldowns(
                client,
                spider.name,
                node_id=self.config.node_id,
                events_maxlen=self.config.events_maxlen,
            )
        adopted = self.spool.open()
        if adopted:
            self.spool.put_back(adopted)
            logger.warning(
                "scrapy-retryqueue: %d write(s) spooled by an earlier crawl of %r will be replayed",
                len(adopted),
                spider.name,
            )
        try:
            await maybe_deferred_to_future(self.call(client.ping))
        except CONNECTION_ERRORS as exc:
            # The crawl goes on; failures wait in the spool until Redis answers.
            self.mark_down(exc)
        logger.info(
            "scrapy-retryqueue: node %s, queue %s at %s",
            self.config.node_id,
            self.queue.keys.due.rsplit(":", 1)[0],
            redact_url(url),
        )

    async def close(self) -> None:
        from scrapy.utils.defer import maybe_deferred_to_future

        try:
            await self.drain()
            if self.queue is not None and len(self.spool):
                self._next_probe = 0.0
                replay = self.recover()
                if replay is not None:
                    await maybe_deferred_to_future(replay)
            if self.queue is not None and self.held and not self.down:
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
            waiting = self.spool.close()
            if waiting:
                logger.error(
                    "scrapy-retryqueue: Redis still does not answer; %d write(s) wait in %s "
                    "and the next crawl of this spider replays them",
                    waiting,
                    self.spool.path,
                )
            if self.queue is not None:
                await maybe_deferred_to_future(self.call(self.queue.client.close))
            if self._pool is not None:
                self._pool.stop()
                self._pool = None
            if self.audit is not None:
                self.audit.close()
        finally:
            if not self.closed.called:
                self.closed.callback(None)

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

    def plan(
        self,
        request: Request,
        failure: FailureInfo,
        *,
        decision: Decision | None = None,
        task_id: str | None = None,
    ) -> Plan:
        """Decide what to do with a failed attempt (no I/O).

        *decision*, when given, is taken as it is (a ``deferred`` request):
        neither the policy nor the retry hook is asked.
        """
        now = now_ms()
        ref = _ref_of(request)
        if ref is not None and ref["settled"] and ref["id"] != self.fingerprint(request):
            # A new request that copied a re-injected one's meta
            # (meta=response.meta): it is not that task.
            ref = None
        attempts = {k: int(v) for k, v in ref["attempts"].items()} if ref else {}
        if ref is not None and not ref["settled"]:
            task_id = ref["id"]  # a failure of the task itself
        elif task_id is None:
            task_id = ref["id"] if ref else self.fingerprint(request)
        if decision is not None:
            if decision.retry:
                decision = replace(decision, attempt=attempts.get(decision.kind, 0) + 1)
        else:
            decision = self._decide(request, failure, attempts)
            if not decision.retry:
                decision = self._maybe_probe_permanent(request, failure, attempts, decision)
            if decision.retry and self.retry_hook is not None:
                # The task keeps the failed request's id, whatever the hook returns.
                request, decision = self._run_hook(request, decision)
        error = failure.as_dict()
        try:
            request_json = request_to_json(request, self.spider)
        except EnvelopeError as exc:
            request_json = {"url": request.url, "method": request.method}
            if decision.retry:
                # It cannot be parked, so this failure is its last one.
                error = {"kind": "unserializable", "type": "EnvelopeError", "message": str(exc)}
                decision = Decision(
                    "unserializable", False, 0.0, attempts.get(failure.kind, 0), str(exc)
                )
        if ref is None and self.config.priority_adjust:
            # Adjusted once, when the task is created; the envelope keeps it.
            request_json["priority"] = request.priority + self.config.priority_adjust
        if decision.retry:
            attempts[decision.kind] = decision.attempt
            error["delay"] = round(decision.delay, 3)
        task = Task(
            id=task_id,
            spider=self.spider.name if self.spider else "",
            request=request_json,
            attempts=attempts,
            kind=decision.kind,
            first_error=(ref["first_error"] if ref else None) or error,
            last_error=error,
            node=self.config.node_id,
            created=ref["created"] if ref else now,
            updated=now,
            due=now + int(decision.delay * 1000),
            dead_kind=None if decision.retry else decision.kind,
        )
        return Plan(decision, failure, task, ref, now, request)

    def _maybe_probe_permanent(
        self,
        request: Request,
        failure: FailureInfo,
        attempts: dict[str, int],
        decision: Decision,
    ) -> Decision:
        """A 403 / 404 while its domain cools down may be the site's overload:
        one retry after the cooldown (RETRYQUEUE_COOLDOWN_PROBE_PERMANENT)."""
        if (
            not self.cooling
            or not self.config.cooldown_probe_permanent
            or failure.kind not in ("forbidden", "not_found")
            or attempts.get(failure.kind, 0) > 0
        ):
            return decision
        domain = urlparse_cached(request).hostname or ""
        until = self.cooling.get(domain)
        if until is None:
            return decision
        wait_ms = max(until - now_ms(), 0) + PROBE_RECHECK_MS
        self.stats.inc_value("retryqueue/domain/permanent_probes")
        return Decision(
            failure.kind,
            True,
            wait_ms / 1000,
            1,
            f"{failure.kind} while {domain} cools down: one more try after the cooldown",
        )

    def _decide(self, request: Request, failure: FailureInfo, attempts: dict[str, int]) -> Decision:
        meta_policy, max_retries = self._meta_overrides(request)
        domain = urlparse_cached(request).hostname
        table = self.config.policy_table
        try:
            return table.decide(
                failure,
                attempts,
                domain=domain,
                meta_policy=meta_policy,
                meta_max_retries=max_retries,
                rand=self.rand.random,
            )
        except ConfigError as exc:
            # Valid against the project's policy, not against the domain's one.
            self.stats.inc_value("retryqueue/meta_error")
            logger.error("scrapy-retryqueue: %s (using the settings' policy instead)", exc)
            return table.decide(failure, attempts, domain=domain, rand=self.rand.random)

    def _run_hook(self, request: Request, decision: Decision) -> tuple[Request, Decision]:
        """Ask RETRYQUEUE_RETRY_HOOK about a retry: keep, replace or veto it."""
        from scrapy import Request as ScrapyRequest

        assert self.retry_hook is not None
        try:
            result = self.retry_hook(request, decision)
            if result is not None and result is not False and not isinstance(result, ScrapyRequest):
                raise TypeError(f"it returned {result!r}; expected None, False or a scrapy.Request")
        except Exception as exc:
            # A broken hook must not lose the request: the retry goes ahead as decided.
            self.stats.inc_value("retryqueue/hook/error")
            logger.error(
                "scrapy-retryqueue: RETRYQUEUE_RETRY_HOOK failed for %s (%s: %s); "
                "retrying it unchanged",
                request.url,
                type(exc).__name__,
                exc,
            )
            return request, decision
        if result is None:
            return request, decision
        if result is False:
            self.stats.inc_value("retryqueue/hook/vetoed")
            return request, Decision(
                "vetoed",
                False,
                0.0,
                decision.attempt - 1,
                f"{decision.kind}: retry vetoed by RETRYQUEUE_RETRY_HOOK",
            )
        self.stats.inc_value("retryqueue/hook/replaced")
        return result, decision

    def persist(self, plan: Plan) -> defer.Deferred[str]:
        """Write *plan* to Redis.

        Fires with parked, dead, duplicate, stale, spooled (Redis is
        unreachable: the write waits in the local spool) or error.
        """
        token = plan.token
        if plan.ref is not None:
            plan.ref["settled"] = True
        if token is not None:
            self.held.pop(plan.task.id, None)
        task = plan.task
        if plan.decision.retry:
            op = "reschedule" if token is not None else "schedule"
        else:
            op = "deadletter"
        d = self.submit(Write.for_task(op, task, token, plan.now))
        d.addCallbacks(
            lambda outcome: self._report(plan, outcome),
            lambda f: self._report(plan, "error", f.value),
        )
        return d

    def submit(self, write: Write) -> defer.Deferred[str]:
        """Queue one write; it goes to Redis with whatever else is waiting.

        Fires with the outcome (parked, dead, acked, duplicate, stale), or
        spooled when Redis is unreachable. While a batch is on the worker
        thread, new writes gather here and go together in the next one: under
        load, one round trip carries many writes; when quiet, a write goes
        alone at once. Order is kept across and within batches.
        """
        d: defer.Deferred[str] = defer.Deferred()
        self._buffer.append((write, d))
        self.writes += 1
        self._pending.add(d)
        d.addBoth(self._forget_pending, d)
        if not self._flushing:
            self._flush()
        d.addErrback(self._spool_if_down, write)
        return d

    def _forget_pending(self, result: Any, d: defer.Deferred[Any]) -> Any:
        self._pending.discard(d)
        return result

    def _flush(self) -> None:
        batch, self._buffer = self._buffer, []
        if not batch:
            return
        self._flushing = True
        writes = [write for write, _ in batch]
        done = self.call_untracked(self._apply_batch, writes)

        def delivered(outcomes: list[str]) -> None:
            for (_, d), outcome in zip(batch, outcomes, strict=True):
                d.callback(outcome)

        def failed(failure: Failure) -> None:
            for _, d in batch:
                d.errback(failure)

        def next_batch(_: Any) -> None:
            self._flushing = False
            if self._buffer:
                self._flush()

        done.addCallbacks(delivered, failed)
        done.addBoth(next_batch)

    def _apply_batch(self, writes: list[Write]) -> list[str]:
        """Apply writes on the worker thread (raises while Redis is down)."""
        if self.down:
            raise RedisDown("Redis is unreachable")
        return self._apply(writes)

    def _apply(self, writes: list[Write]) -> list[str]:
        queue = self.queue
        if queue is None:
            raise RuntimeError("scrapy-retryqueue is not open")
        return [
            _OUTCOMES[write.op][applied] if applied or write.token else "duplicate"
            for write, applied in zip(writes, queue.apply(writes), strict=True)
        ]

    def _spool_if_down(self, failure: Failure, write: Write) -> str:
        if not failure.check(*CONNECTION_ERRORS):
            return failure  # type: ignore[return-value]  # not an outage: report it
        if not failure.check(RedisDown):
            # A real error from Redis; RedisDown only echoes an outage already
            # known (and perhaps just over: the spool is replayed on next poll).
            self.mark_down(failure.value)
        try:
            self.spool.add(write)
        except SpoolFull as exc:
            self.stats.inc_value("retryqueue/spool_full")
            raise exc from None
        self.stats.inc_value("retryqueue/spooled")
        return "spooled"

    # -- per-domain cooldowns --------------------------------------------------

    def cooling_until(self, request: Request) -> int | None:
        """End of the cooldown (ms) of the request's domain, None when it is open."""
        if not self.cooling:
            return None
        return self.cooling.get(urlparse_cached(request).hostname or "")

    def plan_deferred(self, request: Request, until: int) -> Plan:
        """Park a fresh request to a cooling domain: kind ``deferred``, no budget used."""
        domain = urlparse_cached(request).hostname or ""
        now = now_ms()
        # Half-open (the end has passed): look again once the probe had a moment.
        wait_ms = until - now if until > now else PROBE_RECHECK_MS
        wait_ms += int(self.rand.random() * min(1000, max(wait_ms // 10, 1)))
        failure = FailureInfo("deferred", "DomainCooldown", f"{domain} cools down")
        decision = Decision("deferred", True, wait_ms / 1000, 0, f"deferred: {domain} cools down")
        return self.plan(request, failure, decision=decision)

    def note_outcome(self, request: Request, failure: FailureInfo | None) -> None:
        """Tell the domain's circuit breaker how a download went (no-op when off).

        A throttling answer (429; 503 with Retry-After) or a failure of a burst
        kind counts against the domain; any other answer of the site (a 200, a
        404) counts as a success, which reopens a half-open domain.
        """
        domains = self.domains
        if domains is None or self.down:
            return
        domain = urlparse_cached(request).hostname
        if not domain:
            return
        now = now_ms()
        if failure is None or (
            failure.status is not None
            and failure.kind
            not in (
                "rate_limited",
                *BURST_KINDS,
            )
        ):
            until = self.cooling.get(domain)
            if until is None or until > now:
                return  # open, or cooling: a success in flight changes nothing
            d = self.call(domains.ok, domain, now=now)
        else:
            if failure.kind == "rate_limited" and (
                failure.status == 429 or failure.retry_after is not None
            ):
                cause = "throttle"
            elif failure.kind in BURST_KINDS:
                cause = "burst"
            else:
                return
            config = self.config
            retry_after = min(failure.retry_after or 0.0, config.policy_table.retry_after_max)
            d = self.call(
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
        d.addCallbacks(self._domain_changed, self._domain_error)

    def _domain_changed(self, change: DomainChange) -> None:
        if not change.changed:
            return
        stats = self.stats
        if change.state == "open":
            self.cooling.pop(change.domain, None)
            stats.inc_value("retryqueue/domain/reopened")
            logger.info("scrapy-retryqueue: domain %s reopened (probe succeeded)", change.domain)
            reason = "probe succeeded"
        else:
            self.cooling[change.domain] = change.until
            if change.previous == "open":
                stats.inc_value("retryqueue/domain/cooldowns")
            else:
                stats.inc_value("retryqueue/domain/extended")
            logger.warning(
                "scrapy-retryqueue: domain %s cools down for %.1fs (level %d, was %s)",
                change.domain,
                max(0, change.until - now_ms()) / 1000,
                change.level,
                change.previous,
            )
            reason = "cooldown"
        self.send_signal(
            rq_signals.retryqueue_domain_state,
            domain=change.domain,
            state=change.state,
            previous=change.previous,
            until=change.until,
            level=change.level,
            reason=reason,
        )

    def _domain_error(self, failure: Failure) -> None:
        if failure.check(*CONNECTION_ERRORS):
            self.mark_down(failure.value)
            return
        self.stats.inc_value("retryqueue/domain/error")
        logger.error("scrapy-retryqueue: could not update a domain's state: %s", failure.value)

    # -- outages -------------------------------------------------------------

    def mark_down(self, error: BaseException) -> None:
        if self.down:
            return
        self.down = True
        self._down_since = time.monotonic()
        self._reconnect_delay = RECONNECT_MIN_DELAY
        self._next_probe = time.monotonic() + self._reconnect_delay
        self.stats.inc_value("retryqueue/redis_down")
        logger.error(
            "scrapy-retryqueue: Redis is unreachable (%s); failures wait in the local spool "
            "(%s) and are written when it answers again",
            error,
            self.spool.path,
        )

    def recover(self) -> defer.Deferred[bool] | None:
        """While down, probe Redis with backoff; when it answers, replay the spool.

        Returns None when no probe is due yet, else a Deferred firing True once
        the spool has been replayed (False: still down).
        """
        if not self.down and not len(self.spool):
            return None
        if self.down and time.monotonic() < self._next_probe:
            return None
        d = self.call_untracked(self._replay_spool)
        d.addCallbacks(self._recovered, self._still_down)
        return d

    def _replay_spool(self) -> list[tuple[Write, str]]:
        queue = self.queue
        assert queue is not None
        queue.client.ping()
        writes = self.spool.take()
        outcomes: list[tuple[Write, str]] = []
        for start in range(0, len(writes), REPLAY_BATCH):
            chunk = writes[start : start + REPLAY_BATCH]
            try:
                outcomes += zip(chunk, self._apply(chunk), strict=True)
            except CONNECTION_ERRORS:
                self.spool.put_back(writes[start:])
                raise
            except Exception as exc:  # Redis refuses these for good: keep going
                logger.error("scrapy-retryqueue: %d spooled write(s) failed: %s", len(chunk), exc)
        return outcomes

    def _recovered(self, outcomes: list[tuple[Write, str]]) -> bool:
        was_down = self.down
        self.down = False
        replayed = len(outcomes)
        self.stats.inc_value("retryqueue/spool_replayed", replayed)
        # Counted now that they are written, like writes that never waited.
        for write, outcome in outcomes:
            if outcome == "parked":
                self.stats.inc_value("retryqueue/scheduled")
                self.stats.inc_value(f"retryqueue/scheduled/{write.kind}")
            elif outcome == "dead":
                self.stats.inc_value("retryqueue/dead")
                self.stats.inc_value(f"retryqueue/dead/{write.kind}")
            elif outcome == "acked":
                self.stats.inc_value("retryqueue/recovered")
            else:
                self.stats.inc_value(f"retryqueue/{outcome}")
        if was_down:
            logger.warning(
                "scrapy-retryqueue: Redis answers again after %.0fs; %d spooled write(s) replayed",
                time.monotonic() - self._down_since,
                replayed,
            )
        return True

    def _still_down(self, failure: Failure) -> bool:
        if not failure.check(*CONNECTION_ERRORS):
            logger.error("scrapy-retryqueue: replaying the spool failed: %s", failure.value)
        self.mark_down(failure.value)
        self._reconnect_delay = min(self._reconnect_delay * 2, RECONNECT_MAX_DELAY)
        self._next_probe = time.monotonic() + self._reconnect_delay
        return False

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
            elif decision.kind not in (*defaults.PERMANENT_KINDS, "vetoed"):
                level = logging.ERROR
            logger.log(level, "scrapy-retryqueue: dead letter %s (%s)", url, decision.reason)
        elif outcome == "spooled":
            logger.debug("scrapy-retryqueue: %s spooled while Redis is down", url)
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
        if outcome in ("parked", "dead", "spooled"):
            self._signal_plan(plan, outcome)
        return outcome

    def _signal_plan(self, plan: Plan, outcome: str) -> None:
        decision = plan.decision
        if decision.retry:
            self.send_signal(
                rq_signals.retryqueue_scheduled,
                request=plan.request,
                task_id=plan.task.id,
                decision=decision,
                outcome=outcome,
            )
        else:
            self.send_signal(
                rq_signals.retryqueue_dead,
                request=plan.request,
                task_id=plan.task.id,
                kind=decision.kind,
                reason=decision.reason,
                decision=decision,
                outcome=outcome,
            )

    def release(self, request: Request) -> None:
        """Hand a re-injected request's task back, due now (its download was cancelled)."""
        ref = _ref_of(request)
        if ref is None or ref["settled"] or self.queue is None or self.down:
            return  # not a task, or its lease simply expires
        ref["settled"] = True
        self.held.pop(ref["id"], None)
        queue = self.queue

        def released(count: int) -> None:
            self.stats.inc_value("retryqueue/released", count)

        d = self.call(queue.release, {ref["id"]: ref["token"]}, now=now_ms())
        d.addCallbacks(released, lambda f: logger.debug("release failed: %s", f.value))

    def ack(self, request: Request, *, outcome: str = "recovered") -> None:
        """The re-injected request is done (it succeeded, or was dropped on purpose)."""
        ref = _ref_of(request)
        if ref is None or ref["settled"] or self.queue is None:
            return
        ref["settled"] = True
        task_id, token, now = ref["id"], ref["token"], now_ms()
        self.held.pop(task_id, None)
        write = Write("ack", task_id, now, token, kind=ref["kind"], url=ref["url"])

        def reported(result: str) -> None:
            if outcome == "recovered" and result in ("acked", "spooled"):
                self.send_signal(
                    rq_signals.retryqueue_recovered,
                    request=request,
                    task_id=task_id,
                    kind=ref["kind"],
                    attempts=dict(ref.get("attempts") or {}),
                    outcome=result,
                )
            if result == "spooled":
                return
            if result != "acked":
                self.stats.inc_value("retryqueue/stale")
                return
            self.stats.inc_value(f"retryqueue/{outcome}")
            if self.audit is not None:
                self.audit.write(
                    outcome,
                    task=task_id,
                    url=ref["url"],
                    kind=ref["kind"],
                    node=self.config.node_id,
                    ts=now,
                )

        def failed(failure: Failure) -> None:
            self.stats.inc_value("retryqueue/write_error")
            logger.error(
                "scrapy-retryqueue: could not ack %s (%s); its lease expires and it runs again",
                ref["url"],
                failure.value,
            )

        self.submit(write).addCallbacks(reported, failed)
