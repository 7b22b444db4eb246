"""The dashboard's /metrics: the queue and the store as Prometheus metrics.

Made with prometheus_client, read at each scrape: gauges of the Redis queue by
state and of the store by kind and status; counters (``…_total``) of tasks
scheduled, recovered and dead-lettered by spider and kind; a histogram of the
time to recover; and whether each backend answers. The counters are the
store's own totals, so every dashboard reports the same figures and a restart
loses nothing; purging the store lowers them (Prometheus reads that as a reset).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import redis
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from sqlalchemy.exc import SQLAlchemyError

from ..exceptions import RetryQueueError
from ..store.queries import Outcomes, outcomes, recovery_histogram
from ..values import now_ms
from ..view import live as view

if TYPE_CHECKING:
    from .backend import Backend

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
#: Upper bounds (seconds) of the time-to-recover histogram: a second to a day.
RECOVERY_BUCKETS = (1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)


class QueueCollector:
    """Reads Redis and the store through the dashboard's backend at each collect."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def collect(self) -> Iterator[Metric]:
        queue = GaugeMetricFamily(
            "retryqueue_queue_tasks",
            "Tasks in the Redis queue by state.",
            labels=["spider", "state"],
        )
        up_redis = self._queue(queue)
        yield queue
        tasks = GaugeMetricFamily(
            "retryqueue_tasks",
            "Tasks in the store by kind and outcome (status).",
            labels=["spider", "kind", "status"],
        )
        scheduled = CounterMetricFamily(
            "retryqueue_scheduled",
            "Tasks that entered the retry queue, by the kind of their first failure "
            "(a requeue by hand counts again).",
            labels=["spider", "kind"],
        )
        recovered = CounterMetricFamily(
            "retryqueue_recovered",
            "Tasks that recovered (a retry succeeded), by the kind of their last failure.",
            labels=["spider", "kind"],
        )
        dead = CounterMetricFamily(
            "retryqueue_dead_lettered",
            "Tasks dead-lettered, by the kind they died of (requeued ones still count).",
            labels=["spider", "kind"],
        )
        recover = HistogramMetricFamily(
            "retryqueue_time_to_recover_seconds",
            "Time from a task's first failure to its recovery (tasks requeued by hand left out).",
            labels=["spider", "kind"],
        )
        up_store = 0
        try:
            store = self.backend.store()
            with store.connect() as conn:
                counts = outcomes(conn)
                histograms = recovery_histogram(conn, RECOVERY_BUCKETS)
            up_store = 1
        except (RetryQueueError, SQLAlchemyError):
            counts, histograms = Outcomes(), {}
        for (spider, kind, status), n in sorted(counts.by_status.items()):
            tasks.add_metric([spider, kind, status], n)
        for family, values in (
            (scheduled, counts.scheduled),
            (recovered, counts.recovered),
            (dead, counts.dead_lettered),
        ):
            for (spider, kind), n in sorted(values.items()):
                family.add_metric([spider, kind], n)
        for (spider, kind), h in sorted(histograms.items()):
            buckets = [(_bound(b), n) for b, n in zip(RECOVERY_BUCKETS, h.buckets, strict=True)]
            buckets.append(("+Inf", h.count))
            recover.add_metric([spider, kind], buckets, h.total)
        yield from (tasks, scheduled, recovered, dead, recover)
        up = GaugeMetricFamily(
            "retryqueue_up", "Whether the dashboard reaches each backend.", labels=["backend"]
        )
        up.add_metric(["redis"], up_redis)
        up.add_metric(["store"], up_store)
        yield up

    def _queue(self, family: GaugeMetricFamily) -> int:
        """Fill the queue gauges; 1 if Redis answered."""
        try:
            client = self.backend.redis()
        except RetryQueueError:
            return 0
        if client is None:
            return 0
        now = now_ms()
        try:
            project = self.backend.project
            for spider in sorted(view.spiders(client, project)):
                live = view.counts(client, spider, now, project)
                for state, n in (
                    ("due", live.due),
                    ("due_now", live.due_now),
                    ("leased", live.leased),
                    ("dead", live.dead_in_redis),
                ):
                    family.add_metric([spider, state], n)
        except redis.RedisError:
            return 0
        return 1


def _bound(value: float) -> str:
    return str(float(value))


def render(backend: Backend) -> bytes:
    """The metrics in Prometheus' text format 0.0.4."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector(backend))  # type: ignore[arg-type]
    return generate_latest(registry)
