"""The dashboard's API and pages through FastAPI's test client, on the real Redis and
PostgreSQL (see the ``dashboard_data`` fixture for what the queue and store hold)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy import select

from scrapy_retryqueue.dashboard.app import CSRF_COOKIE, SESSION_COOKIE, create_app
from scrapy_retryqueue.dashboard.settings import check_bind, load_dashboard_config
from scrapy_retryqueue.exceptions import ConfigError
from scrapy_retryqueue.queue.delayed import RedisDelayedQueue
from scrapy_retryqueue.queue.keys import keys_for
from scrapy_retryqueue.store.db import Store

from .servers import listens_as
from .storecli import scrapy
from .waiting import wait_for

TOKEN = "s3cret-token-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
#: The dashboard answers only under its own names (its Host check): a loopback one.
BASE = "http://127.0.0.1"


@pytest.fixture
def client(dashboard_data: dict[str, Any]) -> Iterator[TestClient]:
    app = create_app({**dashboard_data["settings"], "RETRYQUEUE_DASHBOARD_TOKEN": TOKEN})
    with TestClient(app, base_url=BASE) as test_client:
        yield test_client


@pytest.fixture
def readonly(dashboard_data: dict[str, Any]) -> Iterator[TestClient]:
    with TestClient(create_app(dashboard_data["settings"]), base_url=BASE) as test_client:
        yield test_client


def rows(data: dict[str, Any], reply: Any) -> set[str]:
    """The fixture's task names in a /api/tasks reply."""
    assert reply.status_code == 200, reply.text
    by_id = {v: k for k, v in data["ids"].items()}
    return {by_id[t["task_id"]] for t in reply.json()["tasks"]}


def store_row(data: dict[str, Any], name: str) -> Any:
    store = Store(data["database_url"])
    try:
        with store.connect() as conn:
            return conn.execute(
                select(store.table).where(store.table.c.task_id == data["ids"][name])
            ).first()
    finally:
        store.close()


# -- reading ---------------------------------------------------------------------


def test_overview_counts_live_state_and_history(
    client: TestClient, dashboard_data: dict[str, Any]
) -> None:
    reply = client.get("/api/overview")
    assert reply.status_code == 200, reply.text
    data = reply.json()
    assert data["notes"] == []
    spider = data["spiders"][dashboard_data["spider"]]
    assert (spider["due"], spider["due_now"], spider["leased"]) == (2, 0, 1)
    assert (spider["dead"], spider["succeeded"]) == (2, 1)
    assert data["by_kind"]["not_found"]["dead"] >= 1
    assert data["by_kind"]["server_error"]["pending"] >= 1
    assert any(n["node"] == "node-b" and n["leased"] >= 1 for n in data["nodes"])
    assert any(d["domain"] == "other.example" for d in data["top_domains"])
    one = client.get("/api/overview", params={"spider": dashboard_data["spider"]}).json()
    assert list(one["spiders"]) == [dashboard_data["spider"]]
    totals = one["totals"]
    assert (totals["pending"], totals["due_now"], totals["leased"]) == (2, 0, 1)
    assert (totals["recovered"], totals["dead"]) == (1, 2)
    # The two dead letters (404, 403) were never retried: 1 of 1 retried task recovered.
    assert totals["success_rate"] == pytest.approx(1.0)
    assert totals["given_up"] == 0
    assert totals["failures_today"] == 6
    assert one["nodes"] == [{"node": "node-b", "leased": 1}]
    timeout = one["by_kind"]["timeout"]
    assert (timeout["pending"], timeout["dead"], timeout["recovered"]) == (2, 0, 1)
    # s1 was scheduled and recovered within the fixture: seconds (the figures themselves
    # are tested in test_dashboard_recovery.py).
    assert timeout["recovery_rate"] == 1.0
    assert 0 <= timeout["recover_median_s"] <= timeout["recover_p90_s"] < 60
    not_found = one["by_kind"]["not_found"]
    assert (not_found["pending"], not_found["dead"], not_found["recovered"]) == (0, 1, 0)
    assert not_found["recovery_rate"] == 0.0 and not_found["recover_median_s"] is None
    # All of the fixture's activity is seconds old: the chart spans a minute, per second,
    # instead of a spike in the last of 60 one-minute buckets.
    for window in ("hour", "day"):
        chart = client.get(
            "/api/overview", params={"spider": dashboard_data["spider"], "window": window}
        ).json()["chart"]
        assert (chart["window"], chart["step_seconds"], chart["span_seconds"]) == (window, 1, 60)
        series = chart["series"]
        assert len(series["scheduled"]) == 61
        assert sum(series["scheduled"][-10:]) == sum(series["scheduled"]) == 4
        assert (sum(series["recovered"]), sum(series["dead"])) == (1, 2)
    # No activity: the whole window, in its coarsest buckets.
    idle = client.get("/api/overview", params={"spider": "nobody-crawled-this"}).json()["chart"]
    assert (idle["step_seconds"], idle["span_seconds"], len(idle["series"]["dead"])) == (
        60,
        3600,
        61,
    )
    day = client.get(
        "/api/overview", params={"spider": "nobody-crawled-this", "window": "day"}
    ).json()["chart"]
    assert (day["step_seconds"], len(day["series"]["dead"])) == (600, 145)
    bad = client.get("/api/overview", params={"window": "year"})
    assert (
        bad.status_code == 400
        and "window 'year': Input should be 'hour' or 'day'" in bad.json()["detail"]
    )


def test_pages_and_assets_are_served_without_any_external_url(client: TestClient) -> None:
    for path in ("/", "/tasks", "/login"):
        reply = client.get(path)
        assert reply.status_code == 200, path
        assert "default-src 'self'" in reply.headers["content-security-policy"]
        # Every asset is local: no CDN, the dashboard works offline.
        assert not re.search(r"""(src|href)=["']https?://""", reply.text), path
    js = client.get("/static/app.js")
    assert js.status_code == 200 and "textContent" in js.text and "innerHTML" not in js.text
    assert client.get("/static/app.css").status_code == 200


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({}, {"w1", "w2", "w3", "s1", "d1", "d2"}),
        ({"status": "waiting"}, {"w1", "w2"}),
        ({"status": "waiting,retrying"}, {"w1", "w2", "w3"}),
        ({"status": "dead", "kind": "not_found"}, {"d1"}),
        ({"kind": "timeout"}, {"w1", "w3", "s1"}),
        ({"domain": "shop.example"}, {"w1", "w2"}),
        ({"http_status": "503"}, {"w2"}),
        ({"node": "node-b"}, {"w3", "s1"}),
        ({"q": "<script>"}, {"d1"}),
        ({"q": "other.example/"}, {"w3", "s1", "d2"}),
        ({"since": "1h"}, {"w1", "w2", "w3", "s1", "d1", "d2"}),
        ({"until": "2000-01-01"}, set()),
        ({"status": "succeeded"}, {"s1"}),
    ],
)
def test_tasks_filters(
    client: TestClient, dashboard_data: dict[str, Any], params: dict[str, str], expected: set[str]
) -> None:
    params = {"spider": dashboard_data["spider"], **params}
    reply = client.get("/api/tasks", params=params)
    assert rows(dashboard_data, reply) == expected
    assert reply.json()["total"] == len(expected)


def test_tasks_sorting_and_pagination(client: TestClient, dashboard_data: dict[str, Any]) -> None:
    spider = dashboard_data["spider"]
    urls = [
        t["url"]
        for t in client.get(
            "/api/tasks", params={"spider": spider, "sort": "url", "order": "asc"}
        ).json()["tasks"]
    ]
    assert urls == sorted(urls) and len(urls) == 6
    seen: list[int] = []
    for page in (1, 2, 3):
        body = client.get(
            "/api/tasks", params={"spider": spider, "per_page": 2, "page": page}
        ).json()
        assert body["pages"] == 3 and body["total"] == 6
        seen += [t["id"] for t in body["tasks"]]
    assert seen == sorted(dashboard_data["rows"].values(), reverse=True)
    assert client.get("/api/tasks", params={"sort": "envelope"}).status_code == 400
    assert client.get("/api/tasks", params={"per_page": "0"}).status_code == 400


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"kind": "timout"}, "kind 'timout' is not a kind"),
        ({"status": "gone"}, "status 'gone' is not a status"),
        ({"http_status": "99"}, "http_status '99' is not an HTTP status"),
        ({"since": "last tuesday"}, "since 'last tuesday' is not a date or time"),
        ({"page": "x"}, "page must be a positive whole number"),
    ],
)
def test_bad_filters_are_a_400_that_names_them(
    client: TestClient, params: dict[str, str], message: str
) -> None:
    reply = client.get("/api/tasks", params=params)
    assert reply.status_code == 400
    assert message in reply.json()["detail"]
    page = client.get("/tasks", params=params)
    assert page.status_code == 400 and message.replace("'", "&#39;") in page.text


def test_the_deferred_kind_is_a_kind_to_filter_by(client: TestClient) -> None:
    # Produced by the runtime for requests parked while their domain cools down.
    reply = client.get("/api/tasks", params={"kind": "deferred"})
    assert reply.status_code == 200, reply.text
    assert reply.json()["total"] == 0
    count = client.get("/api/actions/cancel/count", params={"kind": "deferred"})
    assert count.status_code == 200 and count.json()["matched"] == 0


def test_task_detail(client: TestClient, dashboard_data: dict[str, Any]) -> None:
    rows_ = dashboard_data["rows"]
    dead = client.get(f"/api/tasks/{rows_['d1']}").json()
    assert dead["task"]["status"] == "dead"
    assert dead["request"]["url"].endswith("<script>alert(1)</script>")
    assert dead["request"]["headers"] == [["User-Agent", "test <agent>"]]
    assert dead["request"]["meta"] == {"depth": 1}
    assert dead["errors"]["last"]["status"] == 404
    assert [e["type"] for e in dead["events"]] == ["dead"]
    assert "dead letter" in dead["next"]
    waiting = client.get(f"/api/tasks/{dashboard_data['ids']['w1']}").json()  # by task id
    assert waiting["task"]["id"] == rows_["w1"]
    assert waiting["live"]["due_at"] is not None
    assert waiting["events"][0]["type"] == "scheduled"
    assert waiting["events"][0]["delay_s"] == pytest.approx(3600, abs=1)
    held = client.get(f"/api/tasks/{rows_['w3']}").json()
    assert held["live"]["held_by"] == "node-b"
    assert [e["type"] for e in held["events"]] == ["scheduled", "claimed"]
    assert "being retried by node-b" in held["next"]
    assert client.get("/api/tasks/999999999").status_code == 404
    page = client.get(f"/tasks/{rows_['w3']}")
    assert page.status_code == 200 and "being retried by node-b" in page.text


def test_html_and_script_from_urls_and_errors_render_as_text(
    client: TestClient, dashboard_data: dict[str, Any]
) -> None:
    client.get("/login")
    client.post("/login", data={"token": TOKEN, "csrf": client.cookies.get(CSRF_COOKIE)})
    assert client.cookies.get(SESSION_COOKIE)  # signed in: the rows have their checkboxes
    listing = client.get("/tasks", params={"spider": dashboard_data["spider"]})
    detail = client.get(f"/tasks/{dashboard_data['rows']['d1']}")
    for reply in (listing, detail):
        assert reply.status_code == 200
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in reply.text
        assert "&lt;img src=x onerror=alert(1)&gt;" in reply.text
        assert "<script>alert" not in reply.text
        assert "<img src=x" not in reply.text
    assert "test &lt;agent&gt;" in detail.text
    # A filter value is echoed back escaped too, in the form and in the embedded JSON.
    echo = client.get("/tasks", params={"q": '"><script>alert(2)</script>'})
    assert "<script>alert(2)" not in echo.text
    assert "&#34;&gt;&lt;script&gt;alert(2)" in echo.text
    assert "\\u003cscript\\u003ealert(2)" in echo.text


# -- actions -----------------------------------------------------------------------


def test_retry_now_makes_a_waiting_task_due_and_the_store_shows_it(
    client: TestClient, dashboard_data: dict[str, Any], redis_client: redis.Redis
) -> None:
    keys = keys_for(dashboard_data["spider"])
    w1 = dashboard_data["ids"]["w1"]
    before = redis_client.zscore(keys.due, w1)
    dry = client.post("/api/actions/retry_now", json={"ids": [w1], "dry_run": True}, headers=AUTH)
    assert dry.json()["matched"] == 1 and dry.json()["changed"] == 0
    assert redis_client.zscore(keys.due, w1) == before
    started = int(time.time() * 1000)
    done = client.post("/api/actions/retry_now", json={"ids": [w1]}, headers=AUTH)
    assert done.status_code == 200, done.text
    assert done.json()["changed"] == 1
    assert started <= redis_client.zscore(keys.due, w1) <= int(time.time() * 1000)
    row = store_row(dashboard_data, "w1")
    assert row.status == "waiting"
    assert row.next_retry_at.timestamp() * 1000 == pytest.approx(started, abs=5000)
    assert row.attempts == {"timeout": 1}  # the envelope is untouched
    events = client.get(f"/api/tasks/{w1}").json()["events"]
    assert events[-1]["manual"] == "retry_now" and events[-1]["delay_s"] == 0
    # A dead letter is not "waiting": retry now does not apply to it.
    d1 = dashboard_data["ids"]["d1"]
    assert (
        client.post("/api/actions/retry_now", json={"ids": [d1]}, headers=AUTH).json()["matched"]
        == 0
    )


def test_cancel_by_filter_and_a_leased_task_cannot_be_acked_after(
    client: TestClient, dashboard_data: dict[str, Any], redis_client: redis.Redis
) -> None:
    spider, ids = dashboard_data["spider"], dashboard_data["ids"]
    keys = keys_for(spider)
    count = client.get("/api/actions/cancel/count", params={"spider": spider, "http_status": "503"})
    assert count.json() == {"action": "cancel", "matched": 1}
    done = client.post(
        "/api/actions/cancel",
        json={"filters": {"spider": spider, "http_status": "503"}},
        headers=AUTH,
    ).json()
    assert (done["matched"], done["changed"]) == (1, 1)
    assert redis_client.zscore(keys.due, ids["w2"]) is None
    assert not redis_client.hexists(keys.tasks, ids["w2"])
    assert store_row(dashboard_data, "w2").status == "cancelled"
    assert store_row(dashboard_data, "w2").url == "https://www.shop.example/b"
    # The leased one: node-b loses its lease, so its late ack changes nothing.
    client.post("/api/actions/cancel", json={"ids": [ids["w3"]]}, headers=AUTH)
    assert redis_client.zscore(keys.leased, ids["w3"]) is None
    holder = RedisDelayedQueue(redis_client, spider, node_id="node-b")
    assert not holder.ack(ids["w3"], "node-b:abc123:1", now=int(time.time() * 1000))
    assert store_row(dashboard_data, "w3").status == "cancelled"
    assert store_row(dashboard_data, "w1").status == "waiting"  # not matched: untouched


def test_requeue_puts_a_dead_letter_back_with_a_fresh_budget(
    client: TestClient, dashboard_data: dict[str, Any], redis_client: redis.Redis
) -> None:
    spider, ids = dashboard_data["spider"], dashboard_data["ids"]
    done = client.post(
        "/api/actions/requeue",
        json={"filters": {"spider": spider, "kind": "forbidden", "status": "dead"}},
        headers=AUTH,
    ).json()
    assert (done["matched"], done["changed"]) == (1, 1)
    keys = keys_for(spider)
    assert redis_client.zscore(keys.due, ids["d2"]) is not None
    assert b'"attempts":{}' in redis_client.hget(keys.tasks, ids["d2"])
    row = store_row(dashboard_data, "d2")
    assert (row.status, row.requeues, len(row.history)) == ("waiting", 1, 1)
    assert row.history[0]["status"] == "dead"
    assert store_row(dashboard_data, "d1").status == "dead"


def test_purge_deletes_only_finished_tasks(
    client: TestClient, dashboard_data: dict[str, Any]
) -> None:
    spider = dashboard_data["spider"]
    everything = {"spider": spider, "status": "all"}
    assert client.get("/api/actions/purge/count", params=everything).json()["matched"] == 3
    done = client.post("/api/actions/purge", json={"filters": everything}, headers=AUTH).json()
    assert (done["matched"], done["changed"]) == (3, 3)
    left = client.get("/api/tasks", params={"spider": spider})
    assert rows(dashboard_data, left) == {"w1", "w2", "w3"}


def test_bad_action_requests(client: TestClient) -> None:
    assert client.post("/api/actions/explode", json={"ids": ["1"]}, headers=AUTH).status_code == 404
    unknown = client.post("/api/actions/purge", json={"filters": {"colour": "red"}}, headers=AUTH)
    assert unknown.status_code == 400 and "unknown filter(s): colour" in unknown.text
    empty = client.post("/api/actions/purge", json={}, headers=AUTH)
    assert empty.status_code == 400 and "give ids or filters" in empty.text
    bad = client.post("/api/actions/purge", json={"filters": {"kind": "nope"}}, headers=AUTH)
    assert bad.status_code == 400 and "kind 'nope' is not a kind" in bad.text


# -- the token, sessions and cross-site requests ---------------------------------


def test_without_a_token_the_dashboard_is_read_only(
    readonly: TestClient, dashboard_data: dict[str, Any], redis_client: redis.Redis
) -> None:
    w1 = dashboard_data["ids"]["w1"]
    before = redis_client.zscore(keys_for(dashboard_data["spider"]).due, w1)
    for headers in ({}, AUTH):
        reply = readonly.post("/api/actions/retry_now", json={"ids": [w1]}, headers=headers)
        assert reply.status_code == 403
        assert "read-only" in reply.json()["detail"]
    assert redis_client.zscore(keys_for(dashboard_data["spider"]).due, w1) == before
    page = readonly.get("/tasks")
    assert "read-only" in page.text and 'data-action="retry_now"' not in page.text
    assert readonly.get("/api/tasks").status_code == 200  # reading needs nothing


def test_writes_need_the_right_token(client: TestClient, dashboard_data: dict[str, Any]) -> None:
    body = {"ids": [dashboard_data["ids"]["w1"]], "dry_run": True}
    assert client.post("/api/actions/retry_now", json=body).status_code == 401
    wrong = client.post(
        "/api/actions/retry_now", json=body, headers={"Authorization": "Bearer nope-nope-nope"}
    )
    assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"
    assert client.post("/api/actions/retry_now", json=body, headers=AUTH).status_code == 200


def test_sign_in_sets_a_session_that_needs_the_csrf_header(
    client: TestClient, dashboard_data: dict[str, Any]
) -> None:
    form = client.get("/login")
    csrf = client.cookies.get(CSRF_COOKIE)
    assert csrf and f'value="{csrf}"' in form.text
    # A cross-site form post cannot know the CSRF cookie's value.
    forged = client.post("/login", data={"token": TOKEN, "csrf": "guess"})
    assert forged.status_code == 403
    wrong = client.post("/login", data={"token": "not-the-token", "csrf": csrf})
    assert wrong.status_code == 401 and client.cookies.get(SESSION_COOKIE) is None
    ok = client.post("/login", data={"token": TOKEN, "csrf": csrf}, follow_redirects=False)
    assert ok.status_code == 303
    assert "httponly" in ok.headers["set-cookie"].lower()
    assert "samesite=strict" in ok.headers["set-cookie"].lower()
    body = {"ids": [dashboard_data["ids"]["w1"]], "dry_run": True}
    # The session cookie alone (what a cross-site request would carry) is refused.
    no_header = client.post("/api/actions/retry_now", json=body)
    assert no_header.status_code == 403 and "cross-site" in no_header.json()["detail"]
    bad_header = client.post("/api/actions/retry_now", json=body, headers={"X-CSRF-Token": "x"})
    assert bad_header.status_code == 403
    good = client.post("/api/actions/retry_now", json=body, headers={"X-CSRF-Token": csrf})
    assert good.status_code == 200 and good.json()["matched"] == 1
    page = client.get("/tasks")
    assert 'data-action="retry_now"' in page.text and "Sign out" in page.text
    client.post("/logout", data={"csrf": csrf})
    assert (
        client.post("/api/actions/retry_now", json=body, headers={"X-CSRF-Token": csrf}).status_code
        == 401
    )


@pytest.mark.parametrize(
    ("host", "token", "ok"),
    [
        ("127.0.0.1", None, True),
        ("::1", None, True),
        ("localhost", None, True),
        ("0.0.0.0", None, False),
        ("192.168.1.5", None, False),
        ("0.0.0.0", TOKEN, True),
    ],
)
def test_a_non_loopback_address_needs_a_token(host: str, token: str | None, ok: bool) -> None:
    config = load_dashboard_config({}, host=host, token=token)
    if ok:
        check_bind(config)
    else:
        with pytest.raises(ConfigError, match=f"will not listen on {re.escape(host)}"):
            check_bind(config)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"RETRYQUEUE_DASHBOARD_TOKEN": "short"}, "at least 8 characters"),
        ({"RETRYQUEUE_DASHBOARD_PORT": "http"}, "RETRYQUEUE_DASHBOARD_PORT must be a port"),
        ({"RETRYQUEUE_DASHBOARD_PAGE_SIZE": 0}, "RETRYQUEUE_DASHBOARD_PAGE_SIZE must be 1-500"),
        ({"RETRYQUEUE_DASHBOARD_REFRESH": 0}, "RETRYQUEUE_DASHBOARD_REFRESH must be"),
    ],
)
def test_bad_settings_are_named(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_dashboard_config(settings)


def test_the_command_refuses_a_public_address_without_a_token(tmp_path: Path) -> None:
    done = scrapy("retryqueue", "dashboard", "--host", "0.0.0.0", cwd=tmp_path)
    assert done.code == 2
    assert done.err.startswith("error: the dashboard will not listen on 0.0.0.0")
    assert done.err.count("\n") == 1


# -- metrics, OpenAPI, failures ------------------------------------------------------


def test_metrics_in_prometheus_text_format(
    client: TestClient, dashboard_data: dict[str, Any]
) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    reply = client.get("/metrics")
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/plain; version=0.0.4")
    # Prometheus' own parser reads all of it (it raises on a malformed line).
    families = {f.name: f for f in text_string_to_metric_families(reply.text)}
    spider = dashboard_data["spider"]

    def value(family: str, sample: str | None = None, **labels: str) -> float | None:
        found = [
            s.value
            for s in families[family].samples
            if s.name == (sample or family) and s.labels == labels
        ]
        return found[0] if found else None

    assert families["retryqueue_queue_tasks"].type == "gauge"
    assert value("retryqueue_queue_tasks", spider=spider, state="due") == 2
    assert value("retryqueue_queue_tasks", spider=spider, state="leased") == 1
    assert value("retryqueue_tasks", spider=spider, kind="not_found", status="dead") == 1
    assert value("retryqueue_tasks", spider=spider, kind="timeout", status="succeeded") == 1
    assert value("retryqueue_up", backend="redis") == value("retryqueue_up", backend="store") == 1
    # Counters (…_total) by spider and kind: w1, w3, s1 first failed with a timeout.
    for name in ("retryqueue_scheduled", "retryqueue_recovered", "retryqueue_dead_lettered"):
        assert families[name].type == "counter", name
    total = "retryqueue_scheduled_total"
    assert value("retryqueue_scheduled", total, spider=spider, kind="timeout") == 3
    assert value("retryqueue_scheduled", total, spider=spider, kind="server_error") == 1
    recovered = "retryqueue_recovered_total"
    assert value("retryqueue_recovered", recovered, spider=spider, kind="timeout") == 1
    assert value("retryqueue_recovered", recovered, spider=spider, kind="not_found") is None
    dead = "retryqueue_dead_lettered_total"
    assert value("retryqueue_dead_lettered", dead, spider=spider, kind="not_found") == 1
    assert value("retryqueue_dead_lettered", dead, spider=spider, kind="forbidden") == 1
    histogram = "retryqueue_time_to_recover_seconds"
    assert families[histogram].type == "histogram"
    assert value(histogram, histogram + "_count", spider=spider, kind="timeout") == 1
    assert value(histogram, histogram + "_bucket", spider=spider, kind="timeout", le="+Inf") == 1


def test_openapi_describes_the_api(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    for path in (
        "/api/overview",
        "/api/tasks",
        "/api/tasks/{ident}",
        "/api/actions/{action}",
        "/api/actions/{action}/count",
        "/metrics",
    ):
        assert path in schema["paths"], path
    assert "dry_run" in schema["components"]["schemas"]["ActionRequest"]["properties"]
    assert "/" not in schema["paths"]  # pages are not API
    # Swagger UI and ReDoc load scripts from a CDN: not served, the dashboard works offline.
    assert client.get("/docs").status_code == 404
    assert client.get("/redoc").status_code == 404


def test_a_store_that_does_not_answer(redis_url: str) -> None:
    started = time.monotonic()
    app = create_app(
        {
            "RETRYQUEUE_REDIS_URL": redis_url,
            "RETRYQUEUE_DATABASE_URL": "postgresql://postgres@127.0.0.1:9/none",
        }
    )
    assert time.monotonic() - started < 1  # create_app opens nothing
    with TestClient(app, base_url=BASE) as client:
        tasks = client.get("/api/tasks")
        assert tasks.status_code == 503 and "does not answer" in tasks.json()["detail"]
        overview = client.get("/api/overview")
        assert overview.status_code == 200
        assert any("does not answer" in note for note in overview.json()["notes"])
        assert 'retryqueue_up{backend="store"} 0' in client.get("/metrics").text
        page = client.get("/tasks")
        assert page.status_code == 503 and "does not answer" in page.text


def test_the_command_serves_the_dashboard(tmp_path: Path, dashboard_data: dict[str, Any]) -> None:
    settings = dashboard_data["settings"]
    env = {**os.environ, "RETRYQUEUE_DASHBOARD_TOKEN": TOKEN}

    # Port 0: the command opens a free port itself and says which one.
    command = [sys.executable, "-m", "scrapy.cmdline", "retryqueue", "dashboard", "--port", "0"]
    command += ["--redis-url", settings["RETRYQUEUE_REDIS_URL"]]
    command += ["--database-url", settings["RETRYQUEUE_DATABASE_URL"]]
    server = subprocess.Popen(command, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    assert server.stderr is not None
    line = server.stderr.readline().strip()
    found = re.fullmatch(
        r"dashboard on http://127\.0\.0\.1:(\d+)/ \(actions need the token\)", line
    )
    if found is None:
        server.kill()
        server.wait(10)
        pytest.fail(f"the dashboard said {line!r}")
    port = int(found[1])
    wait_for(lambda: listens_as(server.pid, port), "the dashboard to listen", timeout=15)
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}/api/overview?spider={dashboard_data['spider']}",
            # The first request opens the store and Redis: slow on a loaded machine.
            timeout=30,
        ) as reply:
            overview = json.load(reply)
        assert overview["totals"]["pending"] == 2
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/actions/retry_now",
            data=json.dumps({"ids": [dashboard_data["ids"]["w1"]], "dry_run": True}).encode(),
            headers={"Content-Type": "application/json", **AUTH},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as reply:
            assert json.load(reply)["matched"] == 1
    finally:
        server.terminate()
        server.wait(10)


def test_a_cooling_domain_shows_on_the_overview_and_in_the_status_command(
    client: TestClient, dashboard_data: dict[str, Any], redis_client: Any, tmp_path: Path
) -> None:
    from scrapy_retryqueue.queue.domains import DomainCooldowns

    now = int(time.time() * 1000)
    cooldowns = DomainCooldowns(redis_client, dashboard_data["spider"], node_id="node-a")
    change = cooldowns.fail(
        "throttled.example",
        now=now,
        cause="throttle",
        wait_ms=60_000,
        base_ms=10_000,
        max_ms=600_000,
        burst_threshold=10,
        burst_window_ms=10_000,
        reason="HTTP 429",
    )
    assert change.state == "cooling"

    # Only this spider: other tests' spiders on the shared Redis may cool domains too.
    spider = dashboard_data["spider"]
    cooling = client.get("/api/overview", params={"spider": spider}).json()["cooling"]
    assert [(c["domain"], c["spider"], c["state"]) for c in cooling] == [
        ("throttled.example", dashboard_data["spider"], "cooling")
    ]
    assert cooling[0]["until"] >= now + 60_000
    assert 'id="by-cooling"' in client.get("/").text

    settings = {k: v for k, v in dashboard_data["settings"].items() if k.startswith("RETRYQUEUE_")}
    only = ("--spider", spider)
    status = scrapy("retryqueue", "status", "--json", *only, cwd=tmp_path, settings=settings)
    assert status.code == 0, status.err
    report = json.loads(status.out)
    (entry,) = report["spiders"][dashboard_data["spider"]]["cooling"]
    assert (entry["domain"], entry["reason"]) == ("throttled.example", "HTTP 429")
    table = scrapy("retryqueue", "status", *only, cwd=tmp_path, settings=settings)
    assert "cooling:     throttled.example until" in table.out
