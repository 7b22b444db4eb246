"""The leased frontier for scrapy-redis fleets: the scheduler queue and dupefilter a project names.

scrapy-redis's own queues pop a request destructively: a node killed with
requests popped and not finished loses them, and its shared dupefilter keeps
every other node from fetching them again. These classes keep scrapy-redis's
scheduler and replace its queue and dupefilter::

    SCHEDULER = "scrapy_redis.scheduler.Scheduler"
    SCHEDULER_QUEUE_CLASS = "scrapy_retryqueue.crawl.frontier.LeasedPriorityQueue"
    DUPEFILTER_CLASS = "scrapy_retryqueue.crawl.frontier.FrontierDupeFilter"
    SCHEDULER_PERSIST = True

Or, on one machine as in a fleet, the scheduler alone, which needs no Redis of
scrapy-redis's own (the frontier is in the retry queue's Redis, the embedded
server by default) and keeps the frontier when the crawl stops::

    SCHEDULER = "scrapy_retryqueue.crawl.frontier.LeasedScheduler"

A popped request is leased to the node, not deleted; it is acknowledged once
the engine has finished it (its callback ran and its output went to the
pipelines and the scheduler, or its failure was parked or dead-lettered), handed
back when the node stops, and taken over by another node when its lease
expires. The requests live in the retry queue's Redis (RETRYQUEUE_REDIS_URL, or
scrapy-redis's REDIS_URL), in the spider's namespace, as JSON. Thin glue: the
work is done behind the crawler's runtime facade.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy.dupefilters import BaseDupeFilter
from scrapy_redis.scheduler import Scheduler as RedisScheduler
from scrapy_redis.spiders import RedisMixin

from ..runtime import RetryQueueRuntime, runtime_for

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler


class LeasedPriorityQueue:
    """scrapy-redis's queue interface over the leased frontier, best priority first
    (the order of scrapy-redis's default PriorityQueue)."""

    order = "priority"

    def __init__(self, server: Any, spider: Spider, key: str, serializer: Any = None) -> None:
        # scrapy-redis's connection, key and serializer are not used: the
        # frontier is in the retry queue's Redis and namespace, as JSON.
        self.spider = spider
        crawler: Crawler = spider.crawler
        self.runtime: RetryQueueRuntime = runtime_for(crawler)
        settings = crawler.settings
        dupefilter = settings.get("DUPEFILTER_CLASS")
        if not (_is_ours(settings.get("SCHEDULER")) or _is_ours(dupefilter)):
            # LeasedScheduler brings its own dupefilter; scrapy-redis's takes the setting.
            logger.warning(
                "scrapy-retryqueue: the leased frontier runs with DUPEFILTER_CLASS %s, which "
                "marks a request seen before the frontier stores it: a node killed between "
                "the two loses it for good. Set DUPEFILTER_CLASS = %r",
                dupefilter,
                f"{__name__}.{FrontierDupeFilter.__name__}",
            )
        # A scrapy-redis spider takes its start URLs from a Redis list, not from a
        # start() that would seed a finished crawl again: no finish mark is its.
        self.runtime.frontier_start(order=self.order, seeds=not isinstance(spider, RedisMixin))

    def __len__(self) -> int:
        return self.runtime.frontier_size

    def push(self, request: Request) -> None:
        self.runtime.frontier_push(request)

    def pop(self, timeout: float = 0) -> Request | None:
        # Never blocks (scrapy-redis's timeout would hold the reactor): the
        # engine is woken when a leased batch lands.
        return self.runtime.frontier_pop()

    def clear(self) -> None:
        self.runtime.frontier_clear()


class LeasedFifoQueue(LeasedPriorityQueue):
    """The leased frontier in the order requests were pushed (scrapy-redis's FifoQueue)."""

    order = "fifo"


class FrontierDupeFilter(BaseDupeFilter):
    """The dupefilter to name with the leased frontier: it lets every request through.

    The frontier's push keeps each fingerprint once, in the same Lua script that
    stores the request: a dupefilter that marked a request seen before it was
    stored would lose it for good when a node died between the two.
    """

    @classmethod
    def from_spider(cls, spider: Spider) -> FrontierDupeFilter:
        # scrapy-redis builds its dupefilter with from_spider when it has one.
        return cls()

    def request_seen(self, request: Request) -> bool:
        return False

    def clear(self) -> None:
        """scrapy-redis's flush clears its dupefilter, then its queue: the queue's
        clear forgets the frontier's seen fingerprints with the rest."""


class LeasedScheduler(RedisScheduler):
    """scrapy-redis's scheduler over the leased frontier, without a Redis of its own.

    Its queue is :class:`LeasedPriorityQueue` (SCHEDULER_QUEUE_CLASS may name
    :class:`LeasedFifoQueue`), its dupefilter :class:`FrontierDupeFilter`, and
    SCHEDULER_PERSIST is True unless set: a crawl that stops (Ctrl-C, a node
    that leaves) keeps what is left for the next crawl or the other nodes.
    """

    @classmethod
    def from_settings(cls, settings: Any) -> LeasedScheduler:
        queue_cls = settings.get("SCHEDULER_QUEUE_CLASS")
        leased = f"{__name__}.{LeasedPriorityQueue.__name__}"
        if not _is_ours(queue_cls):
            if queue_cls:
                logger.warning(
                    "scrapy-retryqueue: LeasedScheduler runs on the leased frontier; "
                    "SCHEDULER_QUEUE_CLASS %s is not one of its queues and is not used (%s "
                    "is; %s.LeasedFifoQueue keeps push order)",
                    queue_cls,
                    leased,
                    __name__,
                )
            queue_cls = leased
        elif not isinstance(queue_cls, str):
            queue_cls = f"{__name__}.{queue_cls.__name__}"
        return cls(
            server=None,
            persist=settings.getbool("SCHEDULER_PERSIST", True),
            flush_on_start=settings.getbool("SCHEDULER_FLUSH_ON_START"),
            queue_cls=queue_cls,
            dupefilter=FrontierDupeFilter(),
        )

    def next_request(self) -> Request | None:
        # scrapy-redis's SCHEDULER_IDLE_BEFORE_CLOSE would block the reactor in a
        # pop; the leased frontier never blocks, so it is not passed.
        request = self.queue.pop()
        if request is not None and self.stats:
            self.stats.inc_value("scheduler/dequeued/redis")
        return request

    def enqueue_request(self, request: Request) -> bool:
        if self.stats:
            self.stats.inc_value("scheduler/enqueued/redis")
        self.queue.push(request)
        return True


def _is_ours(component: Any) -> bool:
    """*component* (a class or its import path) is one of this module's."""
    if isinstance(component, str):
        return component.startswith(f"{__name__}.")
    return getattr(component, "__module__", None) == __name__
