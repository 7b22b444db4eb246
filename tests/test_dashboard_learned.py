"""The learned recovery times, seen: the dashboard's /recovery page (server-side SVG
charts) and /api/recovery, and the learned part of ``scrapy retryqueue status``, over
records in the real Redis; malformed records and a key of the wrong type are one
note each, never a failed page or command.

Records are written as the scripts write them (recovery.Record.encode; test_learned
holds the scripts and Record.add equal).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from redis.backoff import NoBackoff
from redis.retry import Retry
from scrapy.settings import Settings

from scrapy_retryqueue.commands._status import learned_lines, render_table, report
from scrapy_retryqueue.config import load_config
from scrapy_retryqueue.dashboard.app import CSP, create_app
from scrapy_retryqueue.decision.recovery import Record, empty_record, field_name, observation
from scrapy_retryqueue.queue.keys import keys_for
from scrapy_retryqueue.view.sources import Sources
from scrapy_retryqueue.view.status import learned_recovery, learned_strategy

BASE = "http://127.0.0.1"
#: server_error: the policy LearnedBackoff keeps within (1 s base, 60 s max, 4 retries).
POLICY = {"base_delay": 1.0, "multiplier": 2.0, "max_delay": 60.0, "max_retries": 4}
FAST, SLOW = "fast.example", "slow.example"


def outages(seconds: float, n: int = 30) -> Record:
    """*n* outages that each failed once at once and succeeded after about *seconds*:
    a reschedule at half of it, an ack at it (recovered midway in between)."""
    now = int(time.time() * 1000)
    record = empty_record(now)
    for i in range(n):
        length = int(seconds * 1000 * (0.9 + 0.2 * i / n))
        half = length // 2
        first, last = observation(None, half)
        record = record.add(first, last, False, now=now, half_life=1e9)
        first, last = observation(half, length, recovered=True)
        record = record.add(first, last, True, now=now, half_life=1e9)
    return record


@pytest.fixture
def learned(redis_client: redis.Redis, spider_name: str) -> dict[str, Any]:
    key = keys_for(spider_name).recovery
    redis_client.hset(key, field_name("server_error", FAST), outages(4).encode())
    redis_client.hset(key, field_name("server_error", SLOW), outages(60).encode())
    return {"key": key, "spider": spider_name}


@pytest.fixture
def settings(redis_url: str, tmp_path: Any) -> dict[str, Any]:
    return {
        "RETRYQUEUE_REDIS_URL": redis_url,
        "RETRYQUEUE_DATABASE_URL": f"sqlite:///{tmp_path / 'store.db'}",
        "RETRYQUEUE_POLICIES": {"server_error": POLICY},
    }


@pytest.fixture
def client(settings: dict[str, Any]) -> Iterator[TestClient]:
    with TestClient(create_app(settings), base_url=BASE) as test_client:
        yield test_client


def test_the_api_gives_each_domains_curve_its_figures_and_the_next_pick(
    client: TestClient, learned: dict[str, Any]
) -> None:
    reply = client.get("/api/recovery", params={"spider": learned["spider"]})
    assert reply.status_code == 200, reply.text
    data = reply.json()
    assert data["notes"] == []
    spider = data["spiders"][learned["spider"]]
    assert spider["records"] == spider["shown"] == 2 and spider["unreadable"] == 0
    assert spider["in_use"] is False  # RETRYQUEUE_BACKOFF is the default
    curves = {c["domain"]: c for c in spider["curves"]}
    fast, slow = curves[FAST], curves[SLOW]
    for c in (fast, slow):
        assert c["kind"] == "server_error" and c["outages"] == pytest.approx(30)
        assert c["recovered"] == pytest.approx(30)
        shares = [share for _, share in c["points"]]
        assert shares == sorted(shares) and shares[-1] == pytest.approx(1.0)
        assert c["updated_at"] is not None
    # Recovered midway between the failure at half and the success: 3/4 of the length.
    assert 2 < fast["median_s"] < 5 < 30 < slow["median_s"] < 60
    assert fast["median_s"] <= fast["p90_s"] and slow["median_s"] <= slow["p90_s"]
    # LearnedBackoff waits longer for the slow domain, within the policy's bounds.
    assert 1.0 <= fast["next"]["delay_s"] < slow["next"]["delay_s"] <= 60.0
    assert fast["next"]["reason"].startswith("learned: ")
    assert "server_error at slow.example (30 outages)" in slow["next"]["reason"]
    plan = slow["next"]["plan_s"]
    assert plan == sorted(plan) and len(plan) == POLICY["max_retries"]
    (kind,) = spider["kinds"]
    assert kind["kind"] == "server_error" and kind["domains"] == 2
    assert kind["outages"] == pytest.approx(60)
    # Filters: a domain (its subdomains match), a kind.
    only = client.get("/api/recovery", params={"domain": "slow.example"}).json()
    assert [c["domain"] for c in only["spiders"][learned["spider"]]["curves"]] == [SLOW]
    none = client.get(
        "/api/recovery", params={"spider": learned["spider"], "kind": "timeout"}
    ).json()
    assert none["spiders"][learned["spider"]]["curves"] == []


def test_the_page_draws_each_curve_as_svg_under_the_csp(
    client: TestClient, learned: dict[str, Any], redis_client: redis.Redis
) -> None:
    hostile = "<script>alert(1)</script>.example"
    redis_client.hset(learned["key"], field_name("timeout", hostile), outages(2, 25).encode())
    reply = client.get("/recovery", params={"spider": learned["spider"]})
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-security-policy"] == CSP
    html = reply.text
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;" in html
    assert html.count('<svg viewBox="0 0 360 150"') == 3
    lines = re.findall(r'<polyline points="([^"]+)" class="curve-line"', html)
    assert len(lines) == 3
    for points in lines:
        xs = [float(p.split(",")[0]) for p in points.split()]
        ys = [float(p.split(",")[1]) for p in points.split()]
        assert xs == sorted(xs) and ys == sorted(ys, reverse=True)  # share only rises
    assert html.count('class="pick"') == 3  # the next pick's mark on each chart
    assert "style=" not in html  # the CSP allows no inline style
    assert 'href="/recovery"' in html  # the navigation links the page


def test_malformed_records_and_a_wrong_key_are_one_note_each(
    client: TestClient,
    learned: dict[str, Any],
    redis_client: redis.Redis,
    settings: dict[str, Any],
) -> None:
    key, spider = learned["key"], learned["spider"]
    redis_client.hset(key, "no-space", "1 1 0")
    redis_client.hset(key, field_name("server_error", "bad.example"), "1 2 5")  # 5 > 2
    redis_client.hset(key, b"\xff\xfe kind", "1 1 0")
    redis_client.hset(key, field_name("server_error", "nan.example"), "1 nan 0")
    data = client.get("/api/recovery", params={"spider": spider}).json()
    (note,) = data["notes"]
    assert note.startswith(f"{spider}: 4 learned recovery record(s) are malformed and ignored")
    assert data["spiders"][spider]["unreadable"] == 4
    assert {c["domain"] for c in data["spiders"][spider]["curves"]} == {FAST, SLOW}
    page = client.get("/recovery", params={"spider": spider})
    assert page.status_code == 200 and "4 unreadable ignored" in page.text
    shown = report(Sources(Settings(settings)), [spider], Settings(settings))
    assert sum("malformed and ignored" in n for n in shown["notes"]) == 1
    # The key of another type: a note, and the rest of the answer.
    redis_client.delete(key)
    redis_client.set(key, "not a hash")
    data = client.get("/api/recovery", params={"spider": spider}).json()
    (note,) = data["notes"]
    assert "cannot be read as a hash" in note
    assert data["spiders"][spider]["curves"] == []
    assert client.get("/recovery", params={"spider": spider}).status_code == 200
    shown = report(Sources(Settings(settings)), [spider], Settings(settings))
    assert any("cannot be read as a hash" in n for n in shown["notes"])
    assert "cannot be read as a hash" in render_table(shown)


def test_a_kind_that_is_none_is_refused_by_name(client: TestClient) -> None:
    reply = client.get("/api/recovery", params={"kind": "frob"})
    assert reply.status_code == 400
    assert reply.json()["detail"].startswith("kind 'frob' is not a kind; known: ")


def test_status_summarises_each_domain_in_text(
    learned: dict[str, Any], settings: dict[str, Any]
) -> None:
    scrapy_settings = Settings(
        {**settings, "RETRYQUEUE_BACKOFF": "scrapy_retryqueue.LearnedBackoff"}
    )
    shown = report(Sources(scrapy_settings), [learned["spider"]], scrapy_settings)
    entry = shown["spiders"][learned["spider"]]["learned"]
    assert entry["in_use"] is True
    lines = learned_lines(entry)
    assert lines[0] == "  learned recovery (LearnedBackoff in use):"
    (slow,) = [line for line in lines if line.startswith("    server_error at slow.example")]
    assert re.search(
        r": 30 outages \(30 seen to end\), median \d+\.\d (s|min), p90 \d+\.\d (s|min); ", slow
    )
    assert "next: waits " in slow and "then tries at " in slow
    assert sum(line.startswith("      why: learned: ") for line in lines) == 2
    table = render_table(shown)
    assert "learned recovery (LearnedBackoff in use):" in table
    assert learned_lines(None) == [] and learned_lines({"curves": []}) == []


def test_a_redis_that_stops_answering_is_a_note_not_a_failure(settings: dict[str, Any]) -> None:
    config = load_config(Settings(settings))
    # Nothing listens on port 1; no retries of the client's own.
    gone = redis.Redis(port=1, socket_connect_timeout=2, retry=Retry(NoBackoff(), 0))
    try:
        out = learned_recovery(gone, "s", config=config, strategy=learned_strategy(config, None))
    finally:
        gone.close()
    assert out["curves"] == [] and out["records"] == 0
    (note,) = out["notes"]
    assert note.startswith("s: Redis does not answer (") and "nothing learned is shown" in note
