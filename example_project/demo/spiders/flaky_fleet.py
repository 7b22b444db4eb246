"""The flaky-site crawl for a fleet: several processes share one frontier.

scrapy-redis's scheduler shares the frontier, with scrapy-retryqueue's leased
frontier as its queue and dupefilter: every page is fetched by one node of the
fleet, and the pages a node had taken when it died are taken over by another
once their leases expire. scrapy-retryqueue holds the failures too. Both read
REDIS_URL, so one setting points the whole fleet at one Redis::

    scrapy crawl flaky_fleet -a site=http://127.0.0.1:8765 -s REDIS_URL=redis://host:6379/0

That Redis is one server: scrapy-redis's frontier cannot live on a Redis
Cluster. To keep the retry queue on a cluster, add
``-s RETRYQUEUE_REDIS_URL=redis://node:7000 -s RETRYQUEUE_REDIS_CLUSTER=True``
(docs/fleet.md, "On a Redis Cluster").

Start it on as many machines (or terminals) as you like, at the same moment or
one after another: a node whose frontier runs dry stays while the fleet holds
frontier requests (waiting or leased to any node), pending retries, or a node
that registered a moment ago (docs/fleet.md, "Nodes that start together"). A node
started after the fleet's crawl finished crawls nothing and says so; add
``-s RETRYQUEUE_FRONTIER_RESTART=True`` to crawl the site again (docs/fleet.md, "The
end of a fleet's crawl"). ``python example_project/run_fleet.py`` starts the
site and three nodes at once and prints what each did.
"""

from __future__ import annotations

from typing import Any, ClassVar

from .flaky import FlakySpider


class FlakyFleetSpider(FlakySpider):
    name = "flaky_fleet"
    custom_settings: ClassVar[dict[str, Any]] = {
        "SCHEDULER": "scrapy_redis.scheduler.Scheduler",
        # Leased, not popped: nothing is lost when a node dies (docs/fleet.md).
        "SCHEDULER_QUEUE_CLASS": "scrapy_retryqueue.crawl.frontier.LeasedPriorityQueue",
        # The frontier keeps each fingerprint once itself, as it stores the request.
        "DUPEFILTER_CLASS": "scrapy_retryqueue.crawl.frontier.FrontierDupeFilter",
        # False would flush the shared frontier when the first node closes,
        # under the feet of the others.
        "SCHEDULER_PERSIST": True,
    }
