"""What a project written for Scrapy's RetryMiddleware relies on: its meta keys, its
stats, its log lines. In-process, without a server: the planner and the reporter."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import scrapy
from scrapy.http import HtmlResponse
from scrapy.utils.test import get_crawler

from scrapy_retryqueue.classify import FailureInfo
from scrapy_retryqueue.envelope import Task
from scrapy_retryqueue.runtime import Outcome, RetryQueueRuntime
from scrapy_retryqueue.runtime.planner import Plan, retries_so_far

SERVER_ERROR = FailureInfo("server_error", "HttpStatus", "HTTP 503", status=503)
TIMEOUT = FailureInfo("timeout", "twisted.internet.error.TimeoutError", "took too long")
PARSE = FailureInfo("parse", "ValueError", "no title")


class DropInSpider(scrapy.Spider):
    name = "dropin"


def _runtime(tmp_path: Path, **settings: Any) -> RetryQueueRuntime:
    crawler = get_crawler(DropInSpider, {"RETRYQUEUE_EMBEDDED_DIR": str(tmp_path), **settings})
    crawler.spider = crawler._create_spider()
    runtime = RetryQueueRuntime(crawler)
    runtime.spider = runtime.planner.spider = runtime.reporter.spider = crawler.spider
    return runtime


def _retried(runtime: RetryQueueRuntime, attempts: dict[str, int], **meta: Any) -> scrapy.Request:
    """A request as re-injected for a task with these *attempts* (its lease still open)."""
    request = scrapy.Request("http://example.com/page", meta=meta)
    request.meta["retryqueue_task"] = {
        "id": runtime.fingerprint(request),
        "token": "t",
        "kind": next(iter(attempts), "server_error"),
        "attempts": attempts,
        "first_error": None,
        "created": 0,
        "due": 0,
        "url": request.url,
        "settled": False,
    }
    return request


def _plan(runtime: RetryQueueRuntime, request: scrapy.Request, failure: FailureInfo) -> Plan:
    plan = runtime.planner.plan(request, failure)
    runtime.reporter.notes(plan.notes)
    return plan


def _stat(runtime: RetryQueueRuntime, name: str) -> Any:
    return runtime.crawler.stats.get_value(name)


# -- max_retry_times and retry_times ---------------------------------------------------


def test_max_retry_times_zero_means_never_retry(tmp_path: Path) -> None:
    runtime = _runtime(tmp_path)
    plan = _plan(
        runtime, scrapy.Request("http://example.com/", meta={"max_retry_times": 0}), SERVER_ERROR
    )
    assert not plan.decision.retry
    assert plan.exhausted
    assert "max_retry_times=0" in plan.decision.reason


def test_max_retry_times_caps_the_retries_of_every_kind_together(tmp_path: Path) -> None:
    runtime = _runtime(tmp_path)
    # Two retries already, of two kinds: each kind's own budget (5) is far off.
    request = _retried(runtime, {"server_error": 1, "timeout": 1}, max_retry_times=2)
    assert not _plan(runtime, request, SERVER_ERROR).decision.retry
    request = _retried(runtime, {"server_error": 1}, max_retry_times=2)
    assert _plan(runtime, request, TIMEOUT).decision.retry


def test_a_callbacks_get_retry_request_count_goes_on(tmp_path: Path) -> None:
    runtime = _runtime(tmp_path)
    # 503 (our retry 1), then the callback asked for retry 2 with get_retry_request().
    request = _retried(runtime, {"server_error": 1}, max_retry_times=2, retry_times=2)
    assert retries_so_far({"server_error": 1}, request.meta) == 2
    assert not _plan(runtime, request, SERVER_ERROR).decision.retry


def test_deferrals_use_no_retry_budget(tmp_path: Path) -> None:
    assert retries_so_far({"deferred": 4, "timeout": 1}, {}) == 1


def test_retryqueue_max_retries_wins_over_max_retry_times(tmp_path: Path) -> None:
    runtime = _runtime(tmp_path)
    request = scrapy.Request(
        "http://example.com/", meta={"max_retry_times": 0, "retryqueue_max_retries": 1}
    )
    assert _plan(runtime, request, SERVER_ERROR).decision.retry


def test_a_bad_max_retry_times_is_reported_and_ignored(tmp_path: Path, caplog: Any) -> None:
    runtime = _runtime(tmp_path)
    request = scrapy.Request("http://example.com/", meta={"max_retry_times": "two"})
    with caplog.at_level(logging.ERROR):
        plan = _plan(runtime, request, SERVER_ERROR)
    assert plan.decision.retry
    assert "meta['max_retry_times'] must be a whole number >= 0, got 'two'" in caplog.text
    assert _stat(runtime, "retryqueue/meta_error") == 1


def test_a_reinjected_request_carries_scrapys_retry_count(tmp_path: Path) -> None:
    runtime = _runtime(tmp_path)
    task = Task(
        id="t1",
        spider="dropin",
        request={"url": "http://example.com/"},
        attempts={"server_error": 2, "deferred": 3, "parse": 1},
        kind="parse",
    )
    request = runtime.claimed_request(task, "tok", scrapy.Request("http://example.com/"))
    assert request.meta["retry_times"] == 3
    assert request.meta["retryqueue_task"]["token"] == "tok"


# -- Scrapy's retry stats --------------------------------------------------------------


def test_a_parked_retry_counts_scrapys_retry_stats(tmp_path: Path) -> None:
    runtime = _runtime(tmp_path)
    runtime.reporter.planned(
        _plan(runtime, scrapy.Request("http://example.com/a"), SERVER_ERROR), Outcome.PARKED
    )
    runtime.reporter.planned(
        _plan(runtime, scrapy.Request("http://example.com/b"), TIMEOUT), Outcome.PARKED
    )
    runtime.reporter.planned(
        _plan(runtime, scrapy.Request("http://example.com/c"), PARSE), Outcome.PARKED
    )
    assert _stat(runtime, "retry/count") == 3
    assert _stat(runtime, "retry/reason_count/503 Service Unavailable") == 1
    assert _stat(runtime, "retry/reason_count/twisted.internet.error.TimeoutError") == 1
    assert _stat(runtime, "retry/reason_count/builtins.ValueError") == 1


def test_a_deferral_is_not_a_retry(tmp_path: Path) -> None:
    runtime = _runtime(tmp_path, RETRYQUEUE_DOMAIN_COOLDOWN=True)
    plan = runtime.planner.plan_deferred(scrapy.Request("http://example.com/"), 0)
    runtime.reporter.planned(plan, Outcome.PARKED)
    assert _stat(runtime, "retry/count") is None
    assert _stat(runtime, "retryqueue/scheduled/deferred") == 1


def test_max_reached_counts_budgets_run_out_not_permanent_kinds(tmp_path: Path) -> None:
    runtime = _runtime(tmp_path)
    spent = _plan(runtime, _retried(runtime, {"server_error": 5}), SERVER_ERROR)
    assert spent.exhausted
    runtime.reporter.planned(spent, Outcome.DEAD)
    not_found = FailureInfo("not_found", "HttpStatus", "HTTP 404", status=404)
    runtime.reporter.planned(
        _plan(runtime, scrapy.Request("http://example.com/x"), not_found), Outcome.DEAD
    )
    assert _stat(runtime, "retry/max_reached") == 1
    assert _stat(runtime, "retryqueue/dead") == 2


# -- log levels and callback errors ------------------------------------------------------


@pytest.mark.parametrize("level", ["DEBUG", logging.DEBUG])
def test_give_up_log_level_meta_sets_the_dead_letters_level(
    tmp_path: Path, caplog: Any, level: Any
) -> None:
    runtime = _runtime(tmp_path)
    request = _retried(runtime, {"server_error": 5}, give_up_log_level=level)
    with caplog.at_level(logging.DEBUG, logger="scrapy_retryqueue"):
        runtime.reporter.planned(_plan(runtime, request, SERVER_ERROR), Outcome.DEAD)
    [record] = [r for r in caplog.records if "dead letter" in r.getMessage()]
    assert record.levelno == logging.DEBUG


def test_a_dead_letter_without_the_meta_key_logs_at_error(tmp_path: Path, caplog: Any) -> None:
    runtime = _runtime(tmp_path)
    with caplog.at_level(logging.DEBUG, logger="scrapy_retryqueue"):
        plan = _plan(runtime, _retried(runtime, {"server_error": 5}), SERVER_ERROR)
        runtime.reporter.planned(plan, Outcome.DEAD)
    [record] = [r for r in caplog.records if "dead letter" in r.getMessage()]
    assert record.levelno == logging.ERROR


def _raise_in_callback() -> ValueError:
    try:
        raise ValueError("no title on the page")
    except ValueError as exc:
        return exc


def test_a_parked_callback_error_is_logged_once_with_its_traceback_and_counted(
    tmp_path: Path, caplog: Any
) -> None:
    runtime = _runtime(tmp_path)
    errors: list[Any] = []
    runtime.crawler.signals.connect(
        lambda failure, **_: errors.append(failure), signal=scrapy.signals.spider_error, weak=False
    )
    response = HtmlResponse(
        "http://example.com/p",
        body=b"<html></html>",
        request=scrapy.Request("http://example.com/p"),
    )
    with caplog.at_level(logging.DEBUG):
        runtime.reporter.callback_error(_raise_in_callback(), response, first=True, due_in=30)
        runtime.reporter.callback_error(_raise_in_callback(), response, first=False, due_in=60)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    [warning] = warnings
    assert warning.getMessage().startswith("Spider error processing <GET http://example.com/p>")
    assert "parked for a retry (parse) due in 30s" in warning.getMessage()
    assert warning.exc_info is not None and warning.exc_info[0] is ValueError
    assert "no title on the page" in caplog.text
    assert _stat(runtime, "spider_exceptions/count") == 2
    assert _stat(runtime, "spider_exceptions/ValueError") == 2
    assert [f.value.args[0] for f in errors] == ["no title on the page"] * 2
