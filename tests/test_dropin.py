"""What a project written for Scrapy's RetryMiddleware relies on: its meta keys, its
stats, its log lines. In-process, without a server: the planner and the reporter."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import scrapy
from scrapy.http import HtmlResponse

from scrapy_retryqueue.decision import kinds
from scrapy_retryqueue.decision.classify import FailureInfo
from scrapy_retryqueue.queue.envelope import Task
from scrapy_retryqueue.runtime import Outcome, RetryQueueRuntime, reporting
from scrapy_retryqueue.runtime.planner import retries_so_far

from .runtimes import plan_of, unopened_runtime

SERVER_ERROR = FailureInfo("server_error", "HttpStatus", "HTTP 503", status=503)
TIMEOUT = FailureInfo("timeout", "twisted.internet.error.TimeoutError", "took too long")
PARSE = FailureInfo("parse", "ValueError", "no title")


class DropInSpider(scrapy.Spider):
    name = "dropin"


def _runtime(tmp_path: Path, **settings: Any) -> RetryQueueRuntime:
    return unopened_runtime(DropInSpider, tmp_path, **settings)


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


def _stat(runtime: RetryQueueRuntime, name: str) -> Any:
    return runtime.crawler.stats.get_value(name)


# -- max_retry_times and retry_times ---------------------------------------------------


def test_max_retry_times_zero_means_never_retry(tmp_path: Path) -> None:
    runtime = _runtime(tmp_path)
    plan = plan_of(
        runtime, scrapy.Request("http://example.com/", meta={"max_retry_times": 0}), SERVER_ERROR
    )
    assert not plan.decision.retry
    assert plan.exhausted
    assert plan.decision.reason == "server_error: gave up after 0 retries"


def test_max_retry_times_caps_the_retries_of_every_kind_together(tmp_path: Path) -> None:
    runtime = _runtime(tmp_path)
    # Two retries already, of two kinds: each kind's own budget (5) is far off.
    request = _retried(runtime, {"server_error": 1, "timeout": 1}, max_retry_times=2)
    assert not plan_of(runtime, request, SERVER_ERROR).decision.retry
    request = _retried(runtime, {"server_error": 1}, max_retry_times=2)
    assert plan_of(runtime, request, TIMEOUT).decision.retry


def test_a_callbacks_get_retry_request_count_goes_on(tmp_path: Path) -> None:
    runtime = _runtime(tmp_path)
    # 503 (our retry 1), then the callback asked for retry 2 with get_retry_request().
    request = _retried(runtime, {"server_error": 1}, max_retry_times=2, retry_times=2)
    assert retries_so_far({"server_error": 1}, request.meta) == 2
    assert not plan_of(runtime, request, SERVER_ERROR).decision.retry


def test_get_retry_request_in_a_callback_stops_where_stock_scrapy_stops(tmp_path: Path) -> None:
    # No max_retry_times anywhere: Scrapy's RETRY_TIMES (default 2) caps a
    # request once its callback counted a retry itself.
    runtime = _runtime(tmp_path)
    request = _retried(runtime, {"server_error": 1}, retry_times=2)
    assert not plan_of(runtime, request, SERVER_ERROR).decision.retry
    # Without the callback's count, the kind's own budget (5) applies.
    assert plan_of(
        runtime, _retried(runtime, {"server_error": 1}, retry_times=1), SERVER_ERROR
    ).decision.retry


def test_deferrals_use_no_retry_budget(tmp_path: Path) -> None:
    assert retries_so_far({"deferred": 4, "timeout": 1}, {}) == 1


def test_retryqueue_max_retries_wins_over_max_retry_times(tmp_path: Path) -> None:
    runtime = _runtime(tmp_path)
    request = scrapy.Request(
        "http://example.com/", meta={"max_retry_times": 0, "retryqueue_max_retries": 1}
    )
    assert plan_of(runtime, request, SERVER_ERROR).decision.retry


def test_a_bad_max_retry_times_is_reported_and_ignored(tmp_path: Path, caplog: Any) -> None:
    runtime = _runtime(tmp_path)
    request = scrapy.Request("http://example.com/", meta={"max_retry_times": "two"})
    with caplog.at_level(logging.ERROR):
        plan = plan_of(runtime, request, SERVER_ERROR)
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
        plan_of(runtime, scrapy.Request("http://example.com/a"), SERVER_ERROR), Outcome.PARKED
    )
    runtime.reporter.planned(
        plan_of(runtime, scrapy.Request("http://example.com/b"), TIMEOUT), Outcome.PARKED
    )
    runtime.reporter.planned(
        plan_of(runtime, scrapy.Request("http://example.com/c"), PARSE), Outcome.PARKED
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
    budget = kinds.POLICIES["server_error"]["max_retries"]
    spent = plan_of(runtime, _retried(runtime, {"server_error": budget}), SERVER_ERROR)
    assert spent.exhausted
    runtime.reporter.planned(spent, Outcome.DEAD)
    not_found = FailureInfo("not_found", "HttpStatus", "HTTP 404", status=404)
    runtime.reporter.planned(
        plan_of(runtime, scrapy.Request("http://example.com/x"), not_found), Outcome.DEAD
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
        runtime.reporter.planned(plan_of(runtime, request, SERVER_ERROR), Outcome.DEAD)
    [record] = [r for r in caplog.records if "dead letter" in r.getMessage()]
    assert record.levelno == logging.DEBUG


def test_a_dead_letter_without_the_meta_key_logs_at_error(tmp_path: Path, caplog: Any) -> None:
    runtime = _runtime(tmp_path)
    with caplog.at_level(logging.DEBUG, logger="scrapy_retryqueue"):
        plan = plan_of(runtime, _retried(runtime, {"server_error": 5}), SERVER_ERROR)
        runtime.reporter.planned(plan, Outcome.DEAD)
    [record] = [r for r in caplog.records if "dead letter" in r.getMessage()]
    assert record.levelno == logging.ERROR


FORBIDDEN = FailureInfo("forbidden", "HttpStatus", "HTTP 403", status=403)


def test_dead_letters_past_the_log_limit_go_to_debug_said_once_and_counted(
    tmp_path: Path, caplog: Any
) -> None:
    runtime = _runtime(tmp_path, RETRYQUEUE_DEAD_LOG_LIMIT=3)
    with caplog.at_level(logging.DEBUG, logger="scrapy_retryqueue"):
        for n in range(10):
            request = scrapy.Request(f"http://example.com/{n}")
            runtime.reporter.planned(plan_of(runtime, request, FORBIDDEN), Outcome.DEAD)
        # Another kind has a limit of its own.
        plan = plan_of(runtime, _retried(runtime, {"server_error": 5}), SERVER_ERROR)
        runtime.reporter.planned(plan, Outcome.DEAD)
        lines = [r for r in caplog.records if "dead letter" in r.getMessage()]
        runtime.reporter.summary()
    loud = [r for r in lines if r.levelno == logging.WARNING]
    assert [r.getMessage().split()[3] for r in loud[:3]] == [
        f"http://example.com/{n}" for n in range(3)
    ]
    [notice] = loud[3:]
    assert "RETRYQUEUE_DEAD_LOG_LIMIT=3" in notice.getMessage()
    assert "forbidden" in notice.getMessage()
    assert sum(r.levelno == logging.DEBUG for r in lines) == 7
    assert [r.levelno for r in lines if "server_error" in r.getMessage()] == [logging.ERROR]
    assert _stat(runtime, "retryqueue/dead/forbidden") == 10
    assert _stat(runtime, "retryqueue/dead_log_debug/forbidden") == 7
    assert _stat(runtime, "retryqueue/dead_log_debug/server_error") is None
    [table] = [r for r in caplog.records if "retries by kind:" in r.getMessage()]
    assert "DEAD_LOG_LIMIT=3 per kind: forbidden 7" in table.getMessage()


class _Kept(logging.Handler):
    def __init__(self, level: int) -> None:
        super().__init__(level)
        self.kept: list[int] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.kept.append(record.levelno)


def test_a_debug_line_no_handler_keeps_is_not_even_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Scrapy's set-up: the logger lets everything through, its one handler
    # filters at LOG_LEVEL. pytest's own handlers take every level, so the
    # reporter logs to a hierarchy of its own here.
    isolated = logging.Logger(reporting.__name__)
    handler = _Kept(logging.WARNING)
    isolated.addHandler(handler)
    built: list[int] = []
    isolated.addFilter(lambda record: built.append(record.levelno) or True)
    monkeypatch.setattr(reporting, "logger", isolated)
    runtime = _runtime(tmp_path, RETRYQUEUE_DEAD_LOG_LIMIT=1)

    def dead(n: int) -> None:
        request = scrapy.Request(f"http://example.com/{n}")
        runtime.reporter.planned(plan_of(runtime, request, FORBIDDEN), Outcome.DEAD)

    for n in range(5):
        dead(n)
    # The line within the limit and the notice past it; no record for the rest.
    assert built == handler.kept == [logging.WARNING, logging.WARNING]
    assert _stat(runtime, "retryqueue/dead_log_debug/forbidden") == 4
    parked = plan_of(runtime, scrapy.Request("http://example.com/parked"), SERVER_ERROR)
    runtime.reporter.planned(parked, Outcome.PARKED)  # its DEBUG line: not built either
    assert built == [logging.WARNING, logging.WARNING]
    assert _stat(runtime, "retryqueue/scheduled") == 1
    handler.setLevel(logging.DEBUG)  # a handler that keeps DEBUG is heard at once
    dead(5)
    assert handler.kept[-1] == logging.DEBUG
    isolated.propagate, isolated.handlers = True, []  # no handler at all: the last resort
    assert not reporting._kept(logging.DEBUG)
    assert reporting._kept(logging.WARNING)
    # A parent's handler counts only while the logger propagates to it.
    parent = logging.Logger("parent")
    parent.addHandler(_Kept(logging.DEBUG))
    isolated.parent, isolated.handlers = parent, [handler]
    handler.setLevel(logging.WARNING)
    assert reporting._kept(logging.DEBUG)
    isolated.propagate = False
    assert not reporting._kept(logging.DEBUG)


def test_a_dead_log_limit_of_zero_logs_every_dead_letter_at_debug(
    tmp_path: Path, caplog: Any
) -> None:
    runtime = _runtime(tmp_path, RETRYQUEUE_DEAD_LOG_LIMIT=0)
    with caplog.at_level(logging.DEBUG, logger="scrapy_retryqueue"):
        plan = plan_of(runtime, scrapy.Request("http://example.com/x"), FORBIDDEN)
        runtime.reporter.planned(plan, Outcome.DEAD)
    assert [r.levelno for r in caplog.records if "dead letter" in r.getMessage()] == [logging.DEBUG]


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


# -- Scrapy's RETRY_* settings -----------------------------------------------------------


def _config(**settings: Any) -> Any:
    from scrapy.settings import Settings

    from scrapy_retryqueue.config import load_config

    return load_config(Settings(settings, priority="project"))


def test_scrapys_defaults_change_nothing() -> None:
    from scrapy.settings import Settings

    from scrapy_retryqueue.config import load_config

    config = load_config(Settings())
    assert config.notices == ()
    assert config.retry_times is None and config.priority_adjust == 0
    budget = kinds.POLICIES["server_error"]["max_retries"]
    assert config.policy_table.policy_for("server_error").max_retries == budget


def test_retry_times_is_the_budget_unless_retryqueue_policies_sets_one() -> None:
    config = _config(
        RETRY_TIMES=1,
        RETRYQUEUE_POLICIES={"timeout": {"max_retries": 4}, "dns": {"base_delay": 1}},
    )
    assert config.policy_table.policy_for("server_error").max_retries == 1
    assert config.policy_table.policy_for("dns").max_retries == 1  # only its delay is its own
    assert config.policy_table.policy_for("dns").base_delay == 1
    assert config.policy_table.policy_for("timeout").max_retries == 4
    assert config.retry_times == 1


def test_retry_times_caps_retries_over_every_kind_but_not_retryqueues_own(tmp_path: Path) -> None:
    runtime = _runtime(tmp_path, RETRY_TIMES=1, RETRYQUEUE_POLICIES={"timeout": {"max_retries": 5}})
    assert not plan_of(runtime, _retried(runtime, {"timeout": 1}), SERVER_ERROR).decision.retry
    assert plan_of(runtime, _retried(runtime, {"server_error": 1}), TIMEOUT).decision.retry


def test_retry_enabled_false_retries_no_download_and_says_so() -> None:
    config = _config(RETRY_ENABLED=False)
    for kind in ("timeout", "connection", "dns", "rate_limited", "server_error", "unknown"):
        assert not config.policy_table.policy_for(kind).retry, kind
    assert config.policy_table.policy_for("parse").retry
    [notice] = config.notices
    assert "RETRY_ENABLED = False" in notice and "dead letters" in notice


def test_retry_http_codes_adds_and_removes_statuses() -> None:
    config = _config(
        RETRY_HTTP_CODES=[500, 503, 520], RETRYQUEUE_STATUS_KINDS={502: "server_error"}
    )
    assert config.status_kinds[520] == "server_error"
    assert config.status_kinds[503] == "server_error"
    assert 504 not in config.status_kinds and 429 not in config.status_kinds
    assert config.status_kinds[502] == "server_error"  # RETRYQUEUE_* wins
    assert config.status_kinds[404] == "not_found"  # never a retry code: untouched


def test_retry_http_codes_with_a_permanent_status_retries_it_and_says_so() -> None:
    config = _config(RETRY_HTTP_CODES=[404, 500])
    assert config.status_kinds[404] == "server_error"
    assert any("404" in n and "not_found" in n for n in config.notices)


def test_retry_exceptions_adds_an_exception_and_names_what_it_leaves_out() -> None:
    config = _config(
        RETRY_EXCEPTIONS=["builtins.LookupError", "twisted.internet.error.TimeoutError"]
    )
    assert config.exception_kinds[LookupError] == "connection"
    [notice] = config.notices
    assert notice.startswith("RETRY_EXCEPTIONS leaves out") and "DNSLookupError" in notice


def test_retry_priority_adjust_and_give_up_log_level_are_honoured() -> None:
    config = _config(RETRY_PRIORITY_ADJUST=-3, RETRY_GIVE_UP_LOG_LEVEL="WARNING")
    assert config.priority_adjust == -3
    assert config.give_up_log_level == logging.WARNING
    assert any("applied once" in n for n in config.notices)
    assert _config(RETRY_PRIORITY_ADJUST=-3, RETRYQUEUE_PRIORITY_ADJUST=2).priority_adjust == 2


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("RETRY_TIMES", "many", "RETRY_TIMES must be a whole number >= 0, got 'many'"),
        ("RETRY_HTTP_CODES", ["5xx"], "RETRY_HTTP_CODES must be a list of HTTP statuses"),
        (
            "RETRY_EXCEPTIONS",
            ["no.such.Error"],
            "RETRY_EXCEPTIONS entry 'no.such.Error' does not import",
        ),
        ("RETRY_GIVE_UP_LOG_LEVEL", "LOUD", "RETRY_GIVE_UP_LOG_LEVEL must be a logging level"),
    ],
)
def test_a_bad_retry_setting_names_itself(setting: str, value: Any, message: str) -> None:
    from scrapy_retryqueue.exceptions import ConfigError

    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("'", "'")):
        _config(**{setting: value})


def test_notices_are_logged_once_as_warnings_at_start(tmp_path: Path, caplog: Any) -> None:
    with caplog.at_level(logging.WARNING):
        _runtime(tmp_path, RETRY_ENABLED=False)
    assert [r.levelno for r in caplog.records if "RETRY_ENABLED" in r.getMessage()] == [
        logging.WARNING
    ]


@pytest.mark.parametrize("value", ["²", "-1", "1.5"])
def test_retry_times_that_only_looks_like_a_number_is_refused(value: str) -> None:
    from scrapy_retryqueue.exceptions import ConfigError

    with pytest.raises(ConfigError, match="RETRY_TIMES must be a whole number >= 0"):
        _config(RETRY_TIMES=value)
