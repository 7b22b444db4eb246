"""The retry budget's state, seen: each domain's retries against its limit on the
dashboard's /recovery page (server-side SVG bars) and in /api/recovery, over budget
records written by the real claim.lua; a record that does not read is one note,
a budget key of the wrong type is one note, and a budget that is off is one line.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from scrapy.settings import Settings

from scrapy_retryqueue.commands._status import render_table, report
from scrapy_retryqueue.dashboard.app import CSP, create_app
from scrapy_retryqueue.dashboard.charts import BAR_PAD, BAR_WIDTH, budget_bar
from scrapy_retryqueue.queue.delayed import RedisDelayedQueue, RetryBudget, Write
from scrapy_retryqueue.queue.envelope import Task
from scrapy_retryqueue.values import now_ms
from scrapy_retryqueue.view.sources import Sources

BASE = "http://127.0.0.1"
#: A long window (slices of 100 s): what the claim counts is still counted when the
#: test reads it, however loaded the machine. floor x window = 10 retries.
SHARE, FLOOR, WINDOW = 0.2, 0.01, 1000.0
BUDGET = RetryBudget(share=SHARE, floor=FLOOR, window=WINDOW)
BUSY, QUIET = "busy.example", "quiet.example"


@pytest.fixture
def settings(redis_url: str, tmp_path: Any) -> dict[str, Any]:
    return {
        "RETRYQUEUE_REDIS_URL": redis_url,
        "RETRYQUEUE_DATABASE_URL": f"sqlite:///{tmp_path / 'store.db'}",
        "RETRYQUEUE_RETRY_BUDGET": SHARE,
        "RETRYQUEUE_RETRY_BUDGET_FLOOR": FLOOR,
        "RETRYQUEUE_RETRY_BUDGET_WINDOW": WINDOW,
    }


def _client(settings: dict[str, Any]) -> Iterator[TestClient]:
    with TestClient(create_app(settings), base_url=BASE) as test_client:
        yield test_client


@pytest.fixture
def client(settings: dict[str, Any]) -> Iterator[TestClient]:
    yield from _client(settings)


@pytest.fixture
def seeded(
    queue: RedisDelayedQueue, make_task: Callable[..., Task], spider_name: str
) -> dict[str, Any]:
    """busy.example: 100 fresh requests reported and 40 retries due, of which its limit
    (10 + 0.2 x 100 = 30) is claimed; quiet.example: 3 retries due, all claimed."""
    now = now_ms()
    writes = [
        Write.for_task(
            "schedule", make_task(f"{host}-{i}", url=f"https://{host}/{i}", due=now), None, now
        )
        for host, n in ((BUSY, 40), (QUIET, 3))
        for i in range(n)
    ]
    assert all(queue.apply(writes))
    claimed = queue.claim(
        now=now + 1,
        limit=500,
        lease_until=now + 10**9,
        token="t",
        budget=BUDGET,
        requests={BUSY: 100},
    )
    assert len(claimed.tasks) == 33 and claimed.budget_deferred == {BUSY: 10}
    return {"spider": spider_name, "key": queue.keys.budget}


def test_the_api_gives_each_domains_retries_limit_and_allowance(
    client: TestClient, seeded: dict[str, Any], settings: dict[str, Any]
) -> None:
    spider = seeded["spider"]
    reply = client.get("/api/recovery", params={"spider": spider})
    assert reply.status_code == 200, reply.text
    data = reply.json()
    assert data["budget"] == {"share": SHARE, "floor": FLOOR, "window": WINDOW}
    assert data["notes"] == []
    budget = data["spiders"][spider]["budget"]
    assert budget == {
        "domains": [
            {"domain": BUSY, "requests": 100, "retries": 30, "limit": 30, "allowance": 0},
            {"domain": QUIET, "requests": 0, "retries": 3, "limit": 10, "allowance": 7},
        ],
        "unreadable": 0,
    }
    # The domain filter keeps some domains; a kind leaves the budget (per domain) whole.
    only = client.get("/api/recovery", params={"spider": spider, "domain": QUIET}).json()
    assert [d["domain"] for d in only["spiders"][spider]["budget"]["domains"]] == [QUIET]
    kind = client.get("/api/recovery", params={"spider": spider, "kind": "timeout"}).json()
    assert kind["spiders"][spider]["budget"] == budget
    # `status` reads the same state (one reader for both).
    shown = report(Sources(Settings(settings)), [spider], Settings(settings))
    assert shown["spiders"][spider]["budget"]["domains"] == budget["domains"]


def test_the_page_draws_a_bar_of_retries_against_the_limit_per_domain(
    client: TestClient, seeded: dict[str, Any]
) -> None:
    reply = client.get("/recovery", params={"spider": seeded["spider"]})
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-security-policy"] == CSP
    html = reply.text
    assert "style=" not in html and "<script>" not in html.split("<footer>")[0]
    assert 'id="budget-on"' in html and "0.2 of its fresh requests + 0.01 retries/s" in html
    rows = re.findall(r'<tr class="budget-domain" data-domain="([^"]+)">(.*?)</tr>', html, re.S)
    assert [domain for domain, _ in rows] == [BUSY, QUIET]
    span = BAR_WIDTH - 2 * BAR_PAD
    for (_, row), (retries, limit) in zip(rows, ((30, 30), (3, 10)), strict=True):
        (used,) = re.findall(r'width="([\d.]+)" height="\d+" class="used[^"]*"', row)
        (track,) = re.findall(r'width="([\d.]+)" height="\d+" class="track"', row)
        full = max(retries, limit)
        assert float(used) == pytest.approx(span * retries / full, abs=0.2)
        assert float(track) == pytest.approx(span * limit / full, abs=0.2)
    busy, quiet = rows[0][1], rows[1][1]
    assert 'class="used over"' in busy and "over budget" in busy
    assert 'class="used"' in quiet and "7 more allowed" in quiet


def test_a_bar_past_its_limit_marks_the_limit_inside_it() -> None:
    bar = budget_bar(retries=40, limit=20)
    assert bar.over and bar.start < bar.limit_x < bar.used_x == BAR_WIDTH - BAR_PAD
    assert budget_bar(0, 0).used_x == budget_bar(0, 0).start  # nothing drawn, no division
    assert not budget_bar(5, 10).over


def test_records_that_do_not_read_are_one_note_and_a_wrong_key_another(
    client: TestClient,
    seeded: dict[str, Any],
    redis_client: redis.Redis,
    settings: dict[str, Any],
) -> None:
    spider, key = seeded["spider"], seeded["key"]
    redis_client.hset(key, "bad.example", "not a record")
    redis_client.hset(key, "<script>alert(1)</script>.example", "1 2 3")
    redis_client.hset(key, b"\xff.example", b"\xff" * 10)
    data = client.get("/api/recovery", params={"spider": spider}).json()
    (note,) = data["notes"]
    assert note.startswith(f"{spider}: 3 retry budget record(s) do not read")
    assert "'bad.example'" in note
    budget = data["spiders"][spider]["budget"]
    assert budget["unreadable"] == 3
    assert [d["domain"] for d in budget["domains"]] == [BUSY, QUIET]
    page = client.get("/recovery", params={"spider": spider})
    assert page.status_code == 200 and "3 unreadable record(s) not shown" in page.text
    assert "<script>alert(1)</script>" not in page.text
    # A budget key of another type: a note, the rest of the answer, no failure.
    redis_client.delete(key)
    redis_client.set(key, "not a hash")
    data = client.get("/api/recovery", params={"spider": spider}).json()
    (note,) = data["notes"]
    assert "budget cannot be read as a hash" in note
    assert data["spiders"][spider]["budget"]["domains"] == []
    assert client.get("/recovery", params={"spider": spider}).status_code == 200
    shown = report(Sources(Settings(settings)), [spider], Settings(settings))
    assert sum("budget cannot be read as a hash" in n for n in shown["notes"]) == 1
    assert "budget cannot be read as a hash" in render_table(shown)


def test_a_budget_that_is_off_is_one_line(settings: dict[str, Any], seeded: dict[str, Any]) -> None:
    off = {k: v for k, v in settings.items() if not k.startswith("RETRYQUEUE_RETRY_BUDGET")}
    for client in _client(off):
        data = client.get("/api/recovery", params={"spider": seeded["spider"]}).json()
        assert data["budget"] is None
        assert data["spiders"][seeded["spider"]]["budget"] is None
        html = client.get("/recovery", params={"spider": seeded["spider"]}).text
        assert html.count('id="budget-off"') == 1 and "budget-domain" not in html


def test_a_bad_budget_setting_is_one_error_naming_it(settings: dict[str, Any]) -> None:
    for client in _client({**settings, "RETRYQUEUE_RETRY_BUDGET_WINDOW": "a while"}):
        reply = client.get("/api/recovery")
        assert reply.status_code == 500
        assert "RETRYQUEUE_RETRY_BUDGET_WINDOW" in reply.json()["detail"], reply.text
        assert "a while" in reply.json()["detail"]
