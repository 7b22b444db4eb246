"""What recovered and how fast, on SQLite and PostgreSQL: the overview's "By kind"
figures (recovery rate, median and 90th percentile time to recover), the counters
and histogram of /metrics, and the chart's buckets, which follow the activity."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from scrapy.settings import Settings
from sqlalchemy import insert

from scrapy_retryqueue.dashboard.app import create_app
from scrapy_retryqueue.dashboard.backend import Backend, percentile
from scrapy_retryqueue.queue.keys import keys_for
from scrapy_retryqueue.store.db import Store

BASE = "http://127.0.0.1"
T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def row(spider: str, n: int, kind: str, status: str, seconds: float | None, **kw: Any) -> dict:
    finished = T0 + timedelta(seconds=seconds) if seconds is not None else None
    return {
        "spider": spider, "task_id": f"{spider}-{n}", "url": f"https://a.example/{n}",
        "domain": "a.example", "status": status, "kind": kind,
        "first_error_kind": kw.pop("first_kind", kind), "created_at": T0,
        "updated_at": finished or T0, "finished_at": finished, "requeues": 0, **kw,
    }  # fmt: skip


@pytest.fixture
def store_of(database_url: str, spider_name: str, redis_url: str) -> Iterator[dict[str, Any]]:
    """A store holding one spider's finished tasks with known times to recover."""
    s = spider_name
    rows = [row(s, n, "timeout", "succeeded", float(n)) for n in range(1, 11)]  # 1..10 s
    rows += [
        # Requeued by hand: it recovered, but its wait includes its time as a dead letter.
        row(s, 11, "timeout", "succeeded", 10_000.0, requeues=1),
        row(s, 12, "server_error", "succeeded", 100.0, first_kind="timeout"),
        row(s, 13, "server_error", "succeeded", 300.0),
        row(s, 14, "server_error", "dead", 50.0),
        row(s, 15, "server_error", "dead", 60.0),
        row(s, 16, "not_found", "dead", 0.0),
        row(s, 17, "timeout", "waiting", None),
    ]
    store = Store(database_url)
    store.ensure_schema()
    with store.begin() as conn:
        conn.execute(insert(store.table), rows)
    store.close()
    yield {
        "RETRYQUEUE_REDIS_URL": redis_url,
        "RETRYQUEUE_DATABASE_URL": database_url,
        "RETRYQUEUE_NODE_ID": "recovery-test",
    }


def test_by_kind_recovery_rate_and_time_to_recover(
    store_of: dict[str, Any], spider_name: str
) -> None:
    backend = Backend(Settings(store_of))
    try:
        by_kind = backend.overview("hour", [spider_name])["by_kind"]
    finally:
        backend.close()
    timeout = by_kind["timeout"]
    assert (timeout["pending"], timeout["recovered"], timeout["dead"]) == (1, 11, 0)
    assert timeout["recovery_rate"] == 1.0
    # 1..10 s (the requeued task's 10,000 s left out): median 5.5, p90 9.1.
    assert timeout["recover_median_s"] == pytest.approx(5.5, abs=0.01)
    assert timeout["recover_p90_s"] == pytest.approx(9.1, abs=0.01)
    server = by_kind["server_error"]
    assert (server["recovered"], server["dead"], server["recovery_rate"]) == (2, 2, 0.5)
    assert server["recover_median_s"] == pytest.approx(200, abs=0.01)
    assert server["recover_p90_s"] == pytest.approx(280, abs=0.01)
    assert by_kind["not_found"]["recovery_rate"] == 0.0
    assert by_kind["not_found"]["recover_median_s"] is None
    assert next(iter(by_kind)) == "timeout"  # the busiest kind first


def test_metrics_counters_and_histogram(store_of: dict[str, Any], spider_name: str) -> None:
    with TestClient(create_app(store_of), base_url=BASE) as client:
        text = client.get("/metrics").text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.labels.get("spider") == spider_name
    }

    def value(name: str, kind: str, **labels: str) -> float | None:
        key = tuple(sorted({"spider": spider_name, "kind": kind, **labels}.items()))
        return samples.get((name, key))

    # Entered the queue, by the kind of the first failure (13 rows); the requeue counts again.
    assert value("retryqueue_scheduled_total", "timeout") == 14
    assert value("retryqueue_scheduled_total", "server_error") == 3
    assert value("retryqueue_scheduled_total", "not_found") == 1
    assert value("retryqueue_recovered_total", "timeout") == 11
    assert value("retryqueue_recovered_total", "server_error") == 2
    # The requeued task was a dead letter once.
    assert value("retryqueue_dead_lettered_total", "timeout") == 1
    assert value("retryqueue_dead_lettered_total", "server_error") == 2
    assert value("retryqueue_dead_lettered_total", "not_found") == 1
    h = "retryqueue_time_to_recover_seconds"
    assert value(h + "_count", "timeout") == 10
    assert value(h + "_sum", "timeout") == pytest.approx(55, abs=0.01)
    assert value(h + "_bucket", "timeout", le="1.0") == 1
    assert value(h + "_bucket", "timeout", le="5.0") == 5
    assert value(h + "_bucket", "timeout", le="10.0") == 10
    assert value(h + "_bucket", "timeout", le="+Inf") == 10
    assert value(h + "_bucket", "server_error", le="60.0") == 0
    assert value(h + "_bucket", "server_error", le="120.0") == 1
    assert value(h + "_bucket", "server_error", le="300.0") == 2
    assert value("retryqueue_tasks", "server_error", status="dead") == 2


def test_percentile() -> None:
    assert percentile([], 0.5) is None
    assert percentile([7.0], 0.9) == 7.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert percentile([float(n) for n in range(1, 101)], 0.9) == pytest.approx(90.1)


# -- the chart ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spread_s", "window", "step", "span"),
    [
        (3, "hour", 1, 60),  # one burst: a minute, per second
        (50, "hour", 1, 60),
        (150, "hour", 5, 150),
        (20 * 60, "hour", 30, 1200),
        (50 * 60, "hour", 60, 3000),
        (20 * 60, "day", 10, 1200),
        (20 * 3600, "day", 600, 72000),
    ],
)
def test_the_chart_buckets_fit_the_activity(
    redis_client: redis.Redis, spider_name: str, spread_s: int, window: str, step: int, span: int
) -> None:
    now = 1_800_000_000_000
    events = keys_for(spider_name).events
    # Three scheduled events spread over spread_s seconds before now, and one dead.
    for i, ago in enumerate((spread_s, spread_s // 2, 1)):
        redis_client.xadd(events, {"type": "scheduled"}, id=f"{now - ago * 1000}-{i}")
    redis_client.xadd(events, {"type": "dead"}, id=f"{now - 500}-0")
    chart = Backend(Settings()).chart(redis_client, [spider_name], window, now)
    assert (chart["step_seconds"], chart["span_seconds"]) == (step, span)
    buckets = len(chart["series"]["scheduled"])
    assert buckets <= (60 if window == "hour" else 144) + 1
    assert buckets >= 30  # never a couple of buckets: a readable line
    assert sum(chart["series"]["scheduled"]) == 3 and sum(chart["series"]["dead"]) == 1
    first = now - spread_s * 1000
    assert chart["start"] <= first  # every event is charted
    if span == spread_s:  # no more than the activity: its first event in the first bucket
        assert first < chart["start"] + step * 1000
