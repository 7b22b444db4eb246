"""Spidermon monitors of the retry queue: bans, dead letters per kind, retries left pending, recovery.

A project adds them to its own Spidermon suite, or names the suite here, and
keeps its actions (Slack, e-mail, ...) in Spidermon::

    SPIDERMON_ENABLED = True
    EXTENSIONS = {"spidermon.contrib.scrapy.extensions.Spidermon": 500}
    SPIDERMON_ENGINE_STOP_MONITORS = ["scrapy_retryqueue.crawl.monitors.RetryQueueMonitorSuite"]

Engine-stop rather than spider-close monitors: the queue's last counts (what
it left pending) are known only once the spider has closed. They read the
crawl's stats (docs/stats.md) and their thresholds from settings
(``RETRYQUEUE_MONITOR_*``, docs/settings.md); they need no Redis.
"""

from __future__ import annotations

from typing import Any

from spidermon import Monitor, MonitorSuite, monitors

from ..config import kinds_setting, monitor_thresholds
from ..decision import kinds

#: The stat prefix of dead letters, per kind (docs/stats.md).
_DEAD = "retryqueue/dead/"


class _RetryQueueMonitor(Monitor):  # type: ignore[misc]
    @property
    def stats(self) -> Any:
        return self.data.stats or {}

    @property
    def settings(self) -> Any:
        return self.data.crawler.settings

    def dead_by_kind(self) -> dict[str, int]:
        return {
            name[len(_DEAD) :]: int(value)
            for name, value in self.stats.items()
            if name.startswith(_DEAD) and "/" not in name[len(_DEAD) :]
        }


@monitors.name("Retry queue: bans")
class BanMonitor(_RetryQueueMonitor):
    """A site that answers 401/403 (the forbidden kind) more than RETRYQUEUE_MONITOR_MAX_BANS times."""

    @monitors.name("Forbidden (401/403) dead letters within RETRYQUEUE_MONITOR_MAX_BANS")
    def test_bans(self) -> None:
        limit = monitor_thresholds(self.settings).max_bans
        bans = int(self.stats.get(f"{_DEAD}{kinds.FORBIDDEN}", 0))
        self.assertLessEqual(
            bans,
            limit,
            msg=f"{bans} request(s) answered 401/403 and were given up (a ban?); "
            f"RETRYQUEUE_MONITOR_MAX_BANS is {limit}",
        )


@monitors.name("Retry queue: dead letters per kind")
class DeadLetterMonitor(_RetryQueueMonitor):
    """Dead letters of a kind over its limit in RETRYQUEUE_MONITOR_MAX_DEAD."""

    @monitors.name("Dead letters of each kind within RETRYQUEUE_MONITOR_MAX_DEAD")
    def test_dead_letters(self) -> None:
        limits = _dead_limits(self.settings)
        over = {
            kind: (count, limits.get(kind, limits.get("*")))
            for kind, count in sorted(self.dead_by_kind().items())
        }
        over = {k: (n, m) for k, (n, m) in over.items() if m is not None and n > m}
        self.assertFalse(
            over,
            msg="dead letters over RETRYQUEUE_MONITOR_MAX_DEAD: "
            + ", ".join(f"{kind} {n} (max {m})" for kind, (n, m) in over.items()),
        )


@monitors.name("Retry queue: retries left pending")
class PendingRetriesMonitor(_RetryQueueMonitor):
    """Retries the crawl left in Redis when it closed, over RETRYQUEUE_MONITOR_MAX_PENDING."""

    @monitors.name("Retries left pending within RETRYQUEUE_MONITOR_MAX_PENDING")
    def test_pending(self) -> None:
        limit = monitor_thresholds(self.settings).max_pending
        pending = int(self.stats.get("retryqueue/left/pending", 0))
        self.assertLessEqual(
            pending,
            limit,
            msg=f"{pending} retries were left pending in Redis (the next crawl resumes them); "
            f"RETRYQUEUE_MONITOR_MAX_PENDING is {limit}",
        )


@monitors.name("Retry queue: recovery rate")
class RecoveryRateMonitor(_RetryQueueMonitor):
    """The share of retried failures that recovered, under RETRYQUEUE_MONITOR_MIN_RECOVERY.

    Counted over the kinds the queue retries: a 404 that was never retried is
    neither a recovery nor a failure to recover.
    """

    @monitors.name("Recovered share of retried failures at least RETRYQUEUE_MONITOR_MIN_RECOVERY")
    def test_recovery(self) -> None:
        minimum = monitor_thresholds(self.settings).min_recovery
        table = kinds_setting(self.settings)
        recovered = int(self.stats.get("retryqueue/recovered", 0))
        given_up = sum(
            count
            for kind, count in self.dead_by_kind().items()
            if (record := table.get(kind)) is not None and record.retry
        )
        if recovered + given_up == 0:
            return  # nothing was retried
        rate = recovered / (recovered + given_up)
        self.assertGreaterEqual(
            rate,
            minimum,
            msg=f"{rate:.0%} of retried failures recovered ({recovered} recovered, "
            f"{given_up} given up); RETRYQUEUE_MONITOR_MIN_RECOVERY is {minimum:.0%}",
        )


class RetryQueueMonitorSuite(MonitorSuite):  # type: ignore[misc]
    """Every retry-queue monitor, for SPIDERMON_ENGINE_STOP_MONITORS."""

    monitors = [BanMonitor, DeadLetterMonitor, PendingRetriesMonitor, RecoveryRateMonitor]


def _dead_limits(settings: Any) -> dict[str, int]:
    """RETRYQUEUE_MONITOR_MAX_DEAD: kind (or "*", every kind not named) -> most dead letters."""
    return dict(monitor_thresholds(settings).max_dead)
