"""Per-domain cooldowns: settings, and the runtime's pure parts (no Redis, no crawl)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import scrapy
from scrapy.settings import Settings

from scrapy_retryqueue.config import load_config
from scrapy_retryqueue.decision.classify import FailureInfo
from scrapy_retryqueue.exceptions import ConfigError
from scrapy_retryqueue.runtime import RetryQueueRuntime
from scrapy_retryqueue.settings.defaults import PROBE_RECHECK_MS
from scrapy_retryqueue.values import now_ms

from .runtimes import plan_of, unopened_runtime


class Spider(scrapy.Spider):
    name = "glue"


def _runtime(tmp_path: Path, **settings: Any) -> RetryQueueRuntime:
    return unopened_runtime(Spider, tmp_path, **settings)


def test_cooldowns_are_off_by_default():
    config = load_config(Settings())
    assert config.domain_cooldown is False
    assert (config.cooldown_base, config.cooldown_max) == (10.0, 600.0)
    assert (config.burst_threshold, config.burst_window) == (10, 10.0)
    assert config.cooldown_probe_permanent is True


def test_cooldown_settings_from_the_command_line():
    settings = Settings()
    for name, value in {
        "RETRYQUEUE_DOMAIN_COOLDOWN": "true",
        "RETRYQUEUE_COOLDOWN_BASE": "2.5",
        "RETRYQUEUE_COOLDOWN_MAX": "60",
        "RETRYQUEUE_BURST_THRESHOLD": "3",
        "RETRYQUEUE_BURST_WINDOW": "1",
    }.items():
        settings.set(name, value, priority="cmdline")
    config = load_config(settings)
    assert config.domain_cooldown is True
    assert (config.cooldown_base, config.cooldown_max) == (2.5, 60.0)
    assert (config.burst_threshold, config.burst_window) == (3, 1.0)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"RETRYQUEUE_DOMAIN_COOLDOWN": "maybe"}, "RETRYQUEUE_DOMAIN_COOLDOWN must be True or"),
        ({"RETRYQUEUE_COOLDOWN_BASE": 0}, "RETRYQUEUE_COOLDOWN_BASE must be > 0, got 0"),
        ({"RETRYQUEUE_COOLDOWN_MAX": -1}, "RETRYQUEUE_COOLDOWN_MAX must be > 0, got -1"),
        (
            {"RETRYQUEUE_COOLDOWN_BASE": 30, "RETRYQUEUE_COOLDOWN_MAX": 20},
            r"RETRYQUEUE_COOLDOWN_MAX \(20\) is below RETRYQUEUE_COOLDOWN_BASE \(30\)",
        ),
        ({"RETRYQUEUE_BURST_THRESHOLD": 0}, "RETRYQUEUE_BURST_THRESHOLD must be >= 1, got 0"),
        ({"RETRYQUEUE_BURST_THRESHOLD": 2.5}, "RETRYQUEUE_BURST_THRESHOLD must be a whole"),
        ({"RETRYQUEUE_BURST_WINDOW": 0}, "RETRYQUEUE_BURST_WINDOW must be > 0, got 0"),
    ],
)
def test_bad_cooldown_settings_name_setting_and_value(values: dict[str, Any], message: str):
    with pytest.raises(ConfigError, match=message):
        load_config(Settings(values))


def test_a_fresh_request_to_a_cooling_domain_is_deferred_without_budget(tmp_path: Path):
    runtime = _runtime(tmp_path, RETRYQUEUE_DOMAIN_COOLDOWN=True)
    until = now_ms() + 20_000
    runtime.breaker.polled({"shop.test": until})
    request = scrapy.Request("http://Shop.Test:8080/p/1")
    assert runtime.cooling_until(request) == until
    assert runtime.cooling_until(scrapy.Request("http://calm.test/")) is None
    # The glue's gate: a read-only view of what cools, current after each poll.
    assert dict(runtime.cooling) == {"shop.test": until}
    with pytest.raises(TypeError):
        runtime.cooling["calm.test"] = until  # type: ignore[index]
    plan = runtime.planner.plan_deferred(request, until)
    assert plan.decision.kind == "deferred" and plan.decision.retry
    assert plan.task.kind == "deferred"
    assert plan.task.attempts == {"deferred": 1}
    # Due at the end of the cooldown, plus at most a second of spread.
    assert until <= plan.task.due <= until + 1000
    assert plan.decision.reason == "deferred: shop.test cools down"


def test_a_fresh_request_to_a_half_open_domain_waits_for_the_probe(tmp_path: Path):
    runtime = _runtime(tmp_path, RETRYQUEUE_DOMAIN_COOLDOWN=True)
    ended = now_ms() - 1
    plan = runtime.planner.plan_deferred(scrapy.Request("http://shop.test/"), ended)
    assert plan.task.due - plan.now >= PROBE_RECHECK_MS
    assert plan.task.due - plan.now <= PROBE_RECHECK_MS + 1000


def test_deferrals_do_not_touch_other_kinds_budgets(tmp_path: Path):
    runtime = _runtime(tmp_path, RETRYQUEUE_DOMAIN_COOLDOWN=True)
    request = scrapy.Request("http://shop.test/")
    request.meta["retryqueue_task"] = {
        "id": runtime.fingerprint(request),
        "token": "t",
        "kind": "rate_limited",
        "attempts": {"rate_limited": 2},
        "first_error": None,
        "created": 0,
        "due": 0,
        "url": request.url,
        "settled": False,
    }
    plan = runtime.planner.plan_deferred(request, now_ms() + 5_000)
    assert plan.task.attempts == {"rate_limited": 2, "deferred": 1}


def test_the_hook_is_not_asked_about_deferrals(tmp_path: Path):
    calls = []
    runtime = _runtime(
        tmp_path,
        RETRYQUEUE_DOMAIN_COOLDOWN=True,
        RETRYQUEUE_RETRY_HOOK=lambda request, decision: calls.append(decision),
    )
    runtime.planner.plan_deferred(scrapy.Request("http://shop.test/"), now_ms() + 5_000)
    assert calls == []


FORBIDDEN = FailureInfo("forbidden", "HttpStatus", "HTTP 403", status=403)
NOT_FOUND = FailureInfo("not_found", "HttpStatus", "HTTP 404", status=404)


@pytest.mark.parametrize("failure", [FORBIDDEN, NOT_FOUND])
def test_a_403_or_404_while_cooling_gets_one_try_after_the_cooldown(
    tmp_path: Path, failure: FailureInfo
):
    runtime = _runtime(tmp_path, RETRYQUEUE_DOMAIN_COOLDOWN=True)
    until = now_ms() + 8_000
    runtime.breaker.polled({"shop.test": until})
    request = scrapy.Request("http://shop.test/gone")
    plan = plan_of(runtime, request, failure)
    assert plan.decision.retry and plan.decision.kind == failure.kind
    assert plan.decision.attempt == 1
    assert plan.task.due >= until
    assert "cools down: one more try after the cooldown" in plan.decision.reason
    assert runtime.crawler.stats.get_value("retryqueue/domain/permanent_probes") == 1

    # Its one try failed the same way: a dead letter, even if still cooling.
    request.meta["retryqueue_task"] = {
        "id": plan.task.id,
        "token": "t",
        "kind": failure.kind,
        "attempts": plan.task.attempts,
        "first_error": None,
        "created": 0,
        "due": 0,
        "url": request.url,
        "settled": False,
    }
    again = plan_of(runtime, request, failure)
    assert not again.decision.retry and again.task.dead_kind == failure.kind


def test_a_403_of_an_open_domain_is_dead_at_once(tmp_path: Path):
    runtime = _runtime(tmp_path, RETRYQUEUE_DOMAIN_COOLDOWN=True)
    runtime.breaker.polled({"other.test": now_ms() + 8_000})
    plan = plan_of(runtime, scrapy.Request("http://shop.test/"), FORBIDDEN)
    assert not plan.decision.retry and plan.task.dead_kind == "forbidden"


def test_the_permanent_probe_can_be_turned_off(tmp_path: Path):
    runtime = _runtime(
        tmp_path, RETRYQUEUE_DOMAIN_COOLDOWN=True, RETRYQUEUE_COOLDOWN_PROBE_PERMANENT=False
    )
    runtime.breaker.polled({"shop.test": now_ms() + 8_000})
    plan = plan_of(runtime, scrapy.Request("http://shop.test/"), FORBIDDEN)
    assert not plan.decision.retry


def test_deferral_max_wait_setting():
    assert load_config(Settings()).deferral_max_wait is None
    assert load_config(Settings({"RETRYQUEUE_DEFERRAL_MAX_WAIT": "3600"})).deferral_max_wait == 3600
    with pytest.raises(ConfigError, match="RETRYQUEUE_DEFERRAL_MAX_WAIT must be > 0, got 0"):
        load_config(Settings({"RETRYQUEUE_DEFERRAL_MAX_WAIT": 0}))
    with pytest.raises(ConfigError, match="RETRYQUEUE_DEFERRAL_MAX_WAIT must be a number"):
        load_config(Settings({"RETRYQUEUE_DEFERRAL_MAX_WAIT": "a day"}))


def test_a_cooldown_another_node_tripped_stops_this_node_at_once(tmp_path: Path):
    from scrapy_retryqueue.queue.domains import DomainChange

    runtime = _runtime(tmp_path, RETRYQUEUE_DOMAIN_COOLDOWN=True)
    told: list[dict[str, int]] = []
    runtime.on_domain_cooling(lambda: told.append(dict(runtime.cooling)))
    until = now_ms() + 8_000
    # This node's 429 met a domain already cooling: the reply changes nothing in
    # Redis, but says until when it cools.
    runtime.breaker._changed(DomainChange("shop.test", False, "cooling", "cooling", until, 1))
    assert runtime.cooling_until(scrapy.Request("http://shop.test/x")) == until
    assert told == [{"shop.test": until}]
    assert runtime.crawler.stats.get_value("retryqueue/domain/cooldowns") is None
    # The same end again: nothing new to tell the downloader.
    runtime.breaker._changed(DomainChange("shop.test", False, "cooling", "cooling", until, 1))
    assert len(told) == 1


def test_a_poll_that_finds_a_new_cooldown_tells_the_downloader(tmp_path: Path):
    runtime = _runtime(tmp_path, RETRYQUEUE_DOMAIN_COOLDOWN=True)
    told: list[int] = []
    runtime.on_domain_cooling(lambda: told.append(1))
    runtime.breaker.polled({"shop.test": now_ms() + 5_000})
    runtime.breaker.polled({})  # reopened: nothing to take back
    assert told == [1]
    assert not runtime.cooling
