"""The flaky-site crawl on the leased frontier: stop it anywhere, run it again, nothing lost.

Its requests wait in the retry queue's Redis (the embedded server by default)
instead of the crawl's memory, leased to the crawl while it runs them. Ctrl-C
stops it gracefully: what it had not finished is handed back, what it had not
fetched yet stays. Running it again resumes both, the pending retries with
them. Once a crawl has run out of work it is marked finished, and the next
one starts afresh (RETRYQUEUE_FRONTIER_RESTART below; a fleet's nodes leave it
off, so that a node started after the end crawls nothing: docs/fleet.md)::

    scrapy crawl flaky_resumable -O first.jsonl    # press Ctrl-C part way
    scrapy crawl flaky_resumable -O second.jsonl   # the rest, none twice
"""

from __future__ import annotations

from typing import Any, ClassVar

from .flaky import FlakySpider


class FlakyResumableSpider(FlakySpider):
    name = "flaky_resumable"
    custom_settings: ClassVar[dict[str, Any]] = {
        "SCHEDULER": "scrapy_retryqueue.crawl.frontier.LeasedScheduler",
        # One machine, run by hand: a crawl started after the last one finished is
        # a new crawl (an interrupted one is resumed whatever this says).
        "RETRYQUEUE_FRONTIER_RESTART": True,
    }
