"""RETRYQUEUE_RETRY_HOOK and the retryqueue_* signals, without a crawl.

The planner makes every decision without I/O, so the hook's
contract (keep, replace, veto, broken) is tested on it directly; the reporter
is where the signals are sent once a write's outcome is known.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import scrapy
from scrapy.settings import Settings

from scrapy_retryqueue import signals as rq_signals
from scrapy_retryqueue.config import load_config
from scrapy_retryqueue.decision.classify import FailureInfo
from scrapy_retryqueue.decision.policy import Decision
from scrapy_retryqueue.exceptions import ConfigError
from scrapy_retryqueue.runtime import Outcome, RetryQueueRuntime

from .runtimes import plan_of, unopened_runtime

SERVER_ERROR = FailureInfo("server_error", "HttpStatus", "HTTP 503", status=503)
NOT_FOUND = FailureInfo("not_found", "HttpStatus", "HTTP 404", status=404)

#: What the module-level hooks below saw: (url, decision kind, attempt).
SEEN_CALLS: list[tuple[str, str, int]] = []


class HookSpider(scrapy.Spider):
    name = "hooks"

    def parse(self, response: Any) -> None:
        pass


def keep_hook(request: scrapy.Request, decision: Decision) -> None:
    SEEN_CALLS.append((request.url, decision.kind, decision.attempt))


def proxy_hook(request: scrapy.Request, decision: Decision) -> scrapy.Request:
    return request.replace(
        headers={**request.headers.to_unicode_dict(), "User-Agent": "other-agent"},
        meta={**request.meta, "proxy": "http://proxy.example:3128"},
    )


def veto_hook(request: scrapy.Request, decision: Decision) -> bool:
    return False


def broken_hook(request: scrapy.Request, decision: Decision) -> None:
    raise RuntimeError("the hook is broken")


def wrong_type_hook(request: scrapy.Request, decision: Decision) -> str:
    return "yes"


class ClassHook:
    """A class: built with from_crawler, then called."""

    def __init__(self, agent: str) -> None:
        self.agent = agent

    @classmethod
    def from_crawler(cls, crawler: Any) -> ClassHook:
        return cls(crawler.settings.get("HOOK_AGENT", "class-agent"))

    def __call__(self, request: scrapy.Request, decision: Decision) -> scrapy.Request:
        return request.replace(headers={"User-Agent": self.agent})


def _runtime(tmp_path: Path, **settings: Any) -> RetryQueueRuntime:
    return unopened_runtime(HookSpider, tmp_path, RETRYQUEUE_NODE_ID="n1", **settings)


def _request(url: str = "http://example.com/page/1") -> scrapy.Request:
    return scrapy.Request(url)


# -- config ----------------------------------------------------------------------


def test_hook_defaults_to_none():
    assert load_config(Settings()).retry_hook is None


def test_hook_loads_import_path_or_callable():
    path = f"{__name__}.keep_hook"
    assert load_config(Settings({"RETRYQUEUE_RETRY_HOOK": path})).retry_hook is keep_hook
    assert load_config(Settings({"RETRYQUEUE_RETRY_HOOK": keep_hook})).retry_hook is keep_hook


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("no.such.module.hook", "RETRYQUEUE_RETRY_HOOK 'no.such.module.hook' does not import"),
        (42, "RETRYQUEUE_RETRY_HOOK must be a callable or its import path, got 42"),
        (f"{__name__}.SEEN_CALLS", "RETRYQUEUE_RETRY_HOOK must be a callable or its import path"),
    ],
)
def test_bad_hook_names_setting_and_value(value: Any, message: str):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(Settings({"RETRYQUEUE_RETRY_HOOK": value}))


# -- the hook's contract -----------------------------------------------------------


def test_no_hook_keeps_the_decision(tmp_path: Path):
    runtime = _runtime(tmp_path)
    request = _request()
    plan = plan_of(runtime, request, SERVER_ERROR)
    assert plan.decision.retry and plan.decision.kind == "server_error"
    assert plan.request is request


def test_hook_returning_none_keeps_the_retry(tmp_path: Path):
    SEEN_CALLS.clear()
    runtime = _runtime(tmp_path, RETRYQUEUE_RETRY_HOOK=f"{__name__}.keep_hook")
    request = _request()
    plan = plan_of(runtime, request, SERVER_ERROR)
    assert [(request.url, "server_error", 1)] == SEEN_CALLS
    assert plan.decision.retry and plan.request is request
    assert runtime.crawler.stats.get_value("retryqueue/hook/replaced") is None


def test_hook_is_not_asked_about_dead_letters(tmp_path: Path):
    SEEN_CALLS.clear()
    runtime = _runtime(tmp_path, RETRYQUEUE_RETRY_HOOK=f"{__name__}.keep_hook")
    plan = plan_of(runtime, _request(), NOT_FOUND)
    assert not plan.decision.retry
    assert SEEN_CALLS == []


def test_hook_replacement_is_what_gets_stored(tmp_path: Path):
    runtime = _runtime(tmp_path, RETRYQUEUE_RETRY_HOOK=proxy_hook)
    request = _request()
    plan = plan_of(runtime, request, SERVER_ERROR)
    assert plan.decision.retry
    assert plan.request is not request
    stored = plan.task.request
    assert stored["meta"]["proxy"] == "http://proxy.example:3128"
    assert ["User-Agent", "other-agent"] in stored["headers"]
    # The task keeps the id of the request that failed (one live task per request).
    assert plan.task.id == runtime.fingerprint(request)
    assert runtime.crawler.stats.get_value("retryqueue/hook/replaced") == 1


def test_hook_veto_dead_letters_with_kind_vetoed(tmp_path: Path):
    runtime = _runtime(tmp_path, RETRYQUEUE_RETRY_HOOK=veto_hook)
    plan = plan_of(runtime, _request(), SERVER_ERROR)
    assert plan.decision.retry is False
    assert plan.decision.kind == "vetoed"
    assert plan.decision.reason == "server_error: retry vetoed by RETRYQUEUE_RETRY_HOOK"
    assert plan.task.dead_kind == "vetoed"
    # The failure itself is kept as it was.
    assert plan.task.last_error["kind"] == "server_error"
    assert plan.task.attempts == {}
    assert runtime.crawler.stats.get_value("retryqueue/hook/vetoed") == 1


@pytest.mark.parametrize("hook", [broken_hook, wrong_type_hook])
def test_broken_hook_keeps_the_retry(tmp_path: Path, hook: Any, caplog: Any):
    runtime = _runtime(tmp_path, RETRYQUEUE_RETRY_HOOK=hook)
    request = _request()
    with caplog.at_level(logging.ERROR):
        plan = plan_of(runtime, request, SERVER_ERROR)
    assert plan.decision.retry and plan.request is request
    assert runtime.crawler.stats.get_value("retryqueue/hook/error") == 1
    assert "RETRYQUEUE_RETRY_HOOK failed for http://example.com/page/1" in caplog.text


def test_hook_class_is_built_from_crawler(tmp_path: Path):
    runtime = _runtime(tmp_path, RETRYQUEUE_RETRY_HOOK=f"{__name__}.ClassHook", HOOK_AGENT="x/1")
    plan = plan_of(runtime, _request(), SERVER_ERROR)
    assert plan.request is not None
    assert plan.request.headers[b"User-Agent"] == b"x/1"


def test_hook_class_without_call_is_a_config_error(tmp_path: Path):
    with pytest.raises(ConfigError, match="builds an object that is not callable"):
        _runtime(tmp_path, RETRYQUEUE_RETRY_HOOK=f"{__name__}.HookSpider")


# -- signals -------------------------------------------------------------------------


def _record(runtime: RetryQueueRuntime, signal: object) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []

    def handler(**kwargs: Any) -> None:
        kwargs.pop("signal", None)
        kwargs.pop("sender", None)
        seen.append(kwargs)

    runtime.crawler.signals.connect(handler, signal=signal, weak=False)
    return seen


def test_scheduled_signal_carries_the_replacement(tmp_path: Path):
    runtime = _runtime(tmp_path, RETRYQUEUE_RETRY_HOOK=proxy_hook)
    scheduled = _record(runtime, rq_signals.retryqueue_scheduled)
    dead = _record(runtime, rq_signals.retryqueue_dead)
    plan = plan_of(runtime, _request(), SERVER_ERROR)
    runtime.reporter.planned(plan, Outcome("parked"))
    assert dead == []
    [event] = scheduled
    assert event["request"] is plan.request
    assert event["request"].meta["proxy"] == "http://proxy.example:3128"
    assert event["task_id"] == plan.task.id
    assert event["decision"] is plan.decision
    assert event["outcome"] == "parked"
    assert event["spider"] is runtime.spider


def test_dead_signal_for_a_veto(tmp_path: Path):
    runtime = _runtime(tmp_path, RETRYQUEUE_RETRY_HOOK=veto_hook)
    dead = _record(runtime, rq_signals.retryqueue_dead)
    request = _request()
    plan = plan_of(runtime, request, SERVER_ERROR)
    runtime.reporter.planned(plan, Outcome("dead"))
    [event] = dead
    assert event["kind"] == "vetoed"
    assert event["request"] is request
    assert event["reason"] == "server_error: retry vetoed by RETRYQUEUE_RETRY_HOOK"
    assert event["outcome"] == "dead"


def test_no_signal_for_writes_not_taken(tmp_path: Path):
    runtime = _runtime(tmp_path)
    scheduled = _record(runtime, rq_signals.retryqueue_scheduled)
    dead = _record(runtime, rq_signals.retryqueue_dead)
    for outcome in ("duplicate", "stale", "error"):
        runtime.reporter.planned(plan_of(runtime, _request(), SERVER_ERROR), Outcome(outcome))
    assert scheduled == [] and dead == []


def test_spooled_write_is_signalled_with_its_outcome(tmp_path: Path):
    runtime = _runtime(tmp_path)
    scheduled = _record(runtime, rq_signals.retryqueue_scheduled)
    runtime.reporter.planned(plan_of(runtime, _request(), SERVER_ERROR), Outcome("spooled"))
    assert [e["outcome"] for e in scheduled] == ["spooled"]


def test_a_failing_handler_does_not_break_the_write(tmp_path: Path, caplog: Any):
    runtime = _runtime(tmp_path)

    def bad(**kwargs: Any) -> None:
        raise RuntimeError("alerting is down")

    runtime.crawler.signals.connect(bad, signal=rq_signals.retryqueue_scheduled, weak=False)
    plan = plan_of(runtime, _request(), SERVER_ERROR)
    with caplog.at_level(logging.ERROR):
        assert runtime.reporter.planned(plan, Outcome("parked")) == "parked"
    assert "alerting is down" in caplog.text
