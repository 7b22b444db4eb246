"""This node's part of the fleet's retry budget: its fresh requests per domain since the last poll.

The budget itself (the fleet's counts, and the claims it holds back) is in
Redis, kept by claim.lua (retrybudget.py). What a node adds is how many fresh
requests (not retries of the queue) it sent to each domain: counted here, in
memory, one dict update per download, and carried to Redis by the next poll's
claim, so that a healthy page costs no Redis call. Off (every method a no-op)
unless RETRYQUEUE_RETRY_BUDGET is set.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from scrapy.utils.httpobj import urlparse_cached

from ..queue.delayed import RetryBudget

if TYPE_CHECKING:
    from scrapy import Request

    from ..config import Config


class RequestCounts:
    def __init__(self, config: Config) -> None:
        #: What claim.lua enforces; None when the budget is off.
        self.budget: RetryBudget | None = None
        if config.retry_budget > 0:
            self.budget = RetryBudget(
                config.retry_budget, config.retry_budget_floor, config.retry_budget_window
            )
        self._counts: Counter[str] = Counter()

    def sent(self, request: Request) -> None:
        """A fresh request of this node got its answer (or its download failed)."""
        if self.budget is None:
            return
        domain = urlparse_cached(request).hostname
        if domain:
            self._counts[domain] += 1

    def take(self) -> dict[str, int]:
        """The counts since the last take, forgotten here: the next poll carries them.

        A poll that fails loses them: the budget then counts fewer requests, so
        it allows fewer retries, never more.
        """
        counts, self._counts = dict(self._counts), Counter()
        return counts
