"""The facade the Scrapy glue calls for one crawler: one runtime per crawler, its parts.

The downloader middleware, the spider middleware, the extension and the leased
frontier's scheduler queue of one crawler share one :class:`RetryQueueRuntime`
and talk to nothing deeper. It builds its parts here; its methods are in base
classes, one concern each:

- :mod:`.attemptfacade`: one attempt's way, read top-down from ``park``:
  :mod:`.planner` decides (pure: policy, meta overrides, retry hook, envelope),
  :mod:`.writes` carries the decision to Redis (batched, on the worker thread;
  spooled while Redis is down), :mod:`.reporting` counts, logs, audits and
  signals what the write did; ``defer``, ``ack`` and ``release`` beside it;
- :mod:`.pollfacade`: the poll that claims due tasks (:mod:`.leases`), and a
  claimed task read back as its request;
- :mod:`.lifecyclefacade`: open and close;
- :mod:`.frontierfacade`: the leased frontier (:mod:`.frontier`).

Beside them: :mod:`.taskref` (which task a request is), :mod:`.breaker`
(per-domain cooldowns), :mod:`.preflight` (the checks before a crawl starts).

The glue reads none of these parts: what it needs of them (counts, the
cooling domains, the decoding of a claimed task, stats and reports) is a
method or property of the runtime, so a part can change without touching the
glue. import-linter's contracts (pyproject.toml) hold the glue to this package.
"""

from __future__ import annotations

import logging
from functools import partial
from types import MappingProxyType
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

from scrapy.exceptions import NotConfigured
from twisted.internet import defer

from ..config import Config, config_for
from ..exceptions import ConfigError
from ..queue.connection import is_outage
from ..queue.delayed import Claimed
from . import engineview
from .attemptfacade import AttemptFacade, Parking
from .breaker import DomainBreaker
from .frontier import Frontier
from .frontierfacade import FrontierFacade
from .leases import Leases, PollResult
from .lifecyclefacade import LifecycleFacade
from .outcome import Outcome
from .planner import Planner
from .pollfacade import PollFacade
from .preflight import preflight
from .refusals import Offsite, Record
from .reporting import Reporter
from .retrybudget import RequestCounts
from .retryhook import build_hook
from .startup import mark_logged
from .taskref import TaskRef
from .writes import WritePath

if TYPE_CHECKING:
    from collections.abc import Callable, Container, Mapping

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler

    from ..queue.frontier import RedisFrontier

__all__ = [
    "Claimed",
    "Outcome",
    "Parking",
    "PollResult",
    "RetryQueueRuntime",
    "is_outage",
    "preflight",
    "runtime_for",
    "runtime_if_any",
]

logger = logging.getLogger(__name__)


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
            preflight(runtime.config, crawler.settings, _spider_name(crawler))
        _RUNTIMES[crawler] = runtime
    if not runtime.config.enabled:
        raise NotConfigured("RETRYQUEUE_ENABLED is False")
    return runtime


def _spider_name(crawler: Crawler) -> str | None:
    """The crawl's spider name when it is known already (Scrapy 2.19 makes the spider
    before the components), else None."""
    try:
        name = getattr(crawler.spider, "name", None)
    except (AttributeError, RuntimeError):
        return None
    return name if isinstance(name, str) else None


def _recomputed_meta(crawler: Crawler) -> dict[str, Any]:
    """The meta values Scrapy's middlewares set by default in this crawl: a stored
    request does not keep them, so a later crawl's settings apply to its retry."""
    from ..settings.defaults import SCRAPY_META_DOWNLOAD_TIMEOUT

    return {SCRAPY_META_DOWNLOAD_TIMEOUT: crawler.settings.getfloat("DOWNLOAD_TIMEOUT")}


def runtime_if_any(crawler: Crawler) -> RetryQueueRuntime | None:
    """The crawler's runtime when a component created one, without creating it."""
    return _RUNTIMES.get(crawler)


class RetryQueueRuntime(LifecycleFacade, AttemptFacade, PollFacade, FrontierFacade):
    """The one object the glue calls for a crawler: it builds the parts, and its bases
    (one concern each, module docstring) do the work on them."""

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
            hook = build_hook(self.config.retry_hook, crawler)
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
        #: What the last polls' claims read beside each task they leased, until it is
        #: re-injected (claimed()): the records a replay is told by (signing keys).
        self._records: dict[str, Record] = {}
        #: The spider's offsite rule, which a re-injected request is held to.
        self._offsite = Offsite(crawler, self.reporter.count)

    def fingerprint(self, request: Request) -> str:
        return self.crawler.request_fingerprinter.fingerprint(request).hex()

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
        self, exception: BaseException, response: Any, *, first: bool, due_in: float, kind: str
    ) -> None:
        """A callback's exception parked for a retry as *kind*: counted, signalled, logged
        as Scrapy does (not a RetryLater nor a PermanentFailure: Parking.asked)."""
        self.reporter.callback_error(exception, response, first=first, due_in=due_in, kind=kind)

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
