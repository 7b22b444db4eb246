"""The flaky-site crawl on the leased frontier: stop it anywhere, run it again, nothing lost.

Its requests wait in the retry queue's Redis (the embedded server by default)
instead of the crawl's memory, leased to the crawl while it runs them. Ctrl-C
stops it gracefully: what it had not finished is handed back, what it had not
fetched yet stays. Running it again resumes both, the pending retries with
them. Once a crawl has nothing left, the next one starts afresh::

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
    }
