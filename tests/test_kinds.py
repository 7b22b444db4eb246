"""The kinds table, a project's own kinds, RetryLater, and the backoff strategy.

Pure logic is tested without a server (the table, the settings, the policy's
decision, the planner); RetryLater through the spider middleware writes to the
real Redis, as tests/test_components.py does. The last test holds that no
built-in kind's name is spelled outside kinds.py.
"""

from __future__ import annotations

import ast
import logging
import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
import scrapy
from scrapy.http import Request
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler

import scrapy_retryqueue
from scrapy_retryqueue import Addon, ConfigError, RetryLater, RetryQueueError
from scrapy_retryqueue.config import config_for, kinds_setting, load_config
from scrapy_retryqueue.decision import kinds
from scrapy_retryqueue.decision.backoff import BackoffContext, ExponentialBackoff, compute_backoff
from scrapy_retryqueue.decision.classify import FailureInfo
from scrapy_retryqueue.decision.policy import Decision, Policy, PolicyTable
from scrapy_retryqueue.queue.keys import keys_for
from scrapy_retryqueue.runtime import Outcome
from scrapy_retryqueue.store.filters import FilterError, Filters

from .runtimes import plan_of, unopened_runtime
from .test_components import LATER, PAGE, Running, _envelope, _settings, open_components

__all__ = ["open_components"]  # the fixture, shared with tests/test_components.py

PACKAGE = Path(scrapy_retryqueue.__file__).parent
CAPTCHA = {"retry": True, "base_delay": 1.0, "max_delay": 5.0, "max_retries": 3}
ZERO = lambda: 0.0  # noqa: E731


def _config(**settings: Any) -> Any:
    return load_config(Settings({"RETRYQUEUE_KINDS": {"captcha": CAPTCHA}, **settings}))


def _failure(kind: str, retry_after: float | None = None) -> FailureInfo:
    return FailureInfo(kind, "X", "m", retry_after=retry_after)


# -- the table -----------------------------------------------------------------------


def test_the_builtin_table_holds_every_builtin_kind_and_its_traits() -> None:
    table = kinds.BUILTIN_TABLE
    assert table.names == tuple(k.name for k in kinds.BUILTIN)
    assert table.declared == ()
    assert set(table.named("internal")) == {
        "unserializable",
        "malformed",
        "poison",
        "forged",
        "vetoed",
        "deferred",
    }
    assert "deferred" not in table.policy_names and "deferred" in table
    assert table.named("download") == (
        "timeout",
        "connection",
        "dns",
        "rate_limited",
        "server_error",
        "unknown",
    )
    assert table.has("rate_limited", "breaker") and not table.has("rate_limited", "burst")
    assert not table.has("martian", "breaker") and table.get("martian") is None


def test_a_declared_kind_joins_the_table_with_its_policy_and_traits() -> None:
    config = _config(
        RETRYQUEUE_KINDS={
            "captcha": {**CAPTCHA, "breaker": True, "dead_log_level": "warning"},
            "login_wall": {"retry": False},
        }
    )
    table = config.kinds
    assert table.declared == ("captcha", "login_wall")
    assert table.names[-2:] == ("captcha", "login_wall")
    assert table["captcha"].breaker and not table["captcha"].burst
    assert table["captcha"].dead_log_level == "WARNING"
    assert config.dead_log_levels["captcha"] == logging.WARNING
    assert config.dead_log_levels["login_wall"] == logging.ERROR
    policies = config.policy_table.policies
    assert policies["captcha"] == Policy(True, 1.0, 2.0, 5.0, 3, "equal")
    # Fields it leaves out are the defaults of every policy.
    assert policies["login_wall"] == Policy(False, 0.0, 2.0, 0.0, 0, "equal")


def test_kinds_may_come_as_json_text_from_the_command_line() -> None:
    config = load_config(Settings({"RETRYQUEUE_KINDS": '{"captcha": {"retry": true}}'}))
    assert "captcha" in config.kinds


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        ("captcha", "RETRYQUEUE_KINDS must be a dict (or its JSON text), got 'captcha'"),
        (["captcha"], "RETRYQUEUE_KINDS must be a dict of kind name -> fields, got ['captcha']"),
        ({"Captcha": {}}, "RETRYQUEUE_KINDS key 'Captcha' is not a kind name"),
        ({"x" * 33: {}}, "RETRYQUEUE_KINDS key 'xxxxxxxx"),
        ({"cap-tcha": {}}, "RETRYQUEUE_KINDS key 'cap-tcha' is not a kind name"),
        ({"timeout": {}}, "RETRYQUEUE_KINDS['timeout']: 'timeout' is a built-in kind; change"),
        ({"poison": {}}, "RETRYQUEUE_KINDS['poison']: 'poison' is one of the queue's own kinds"),
        ({"captcha": [1]}, "RETRYQUEUE_KINDS['captcha'] must be a dict of policy fields"),
        (
            {"captcha": {"retri": True}},
            "RETRYQUEUE_KINDS['captcha'] has unknown field(s) ['retri']",
        ),
        ({"captcha": {"breaker": "yes"}}, "RETRYQUEUE_KINDS['captcha']['breaker'] must be True or"),
        (
            {"captcha": {"burst": True}},
            "RETRYQUEUE_KINDS['captcha']: burst=True needs breaker=True",
        ),
        ({"captcha": {"internal": True}}, "RETRYQUEUE_KINDS['captcha'] has unknown field(s)"),
        (
            {"captcha": {"dead_log_level": "LOUD"}},
            "RETRYQUEUE_KINDS['captcha']['dead_log_level'] must be one of DEBUG, INFO",
        ),
        (
            {"captcha": {"max_delay": -1}},
            "RETRYQUEUE_KINDS['captcha']['max_delay'] must be a number >= 0, got -1",
        ),
        (
            {"captcha": {"base_delay": 10, "max_delay": 5}},
            "RETRYQUEUE_KINDS['captcha']: max_delay (5.0) is below base_delay (10.0)",
        ),
        (
            {"captcha": {"jitter": "lots"}},
            "RETRYQUEUE_KINDS['captcha']['jitter'] must be one of none, full, equal; got 'lots'",
        ),
    ],
)
def test_a_bad_declaration_is_one_error_naming_the_setting_the_kind_and_the_field(
    declared: Any, message: str
) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(Settings({"RETRYQUEUE_KINDS": declared}))
    assert message in str(error.value)


def test_a_bad_declaration_stops_the_crawl_with_one_error_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    with pytest.raises(ConfigError, match="RETRYQUEUE_KINDS"):
        get_crawler(
            scrapy.Spider,
            _settings(tmp_path, ADDONS={Addon: 0}, RETRYQUEUE_KINDS={"captcha": {"retry": 1}}),
        )
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, errors
    assert "RETRYQUEUE_KINDS['captcha']['retry'] must be True or False, got 1" in errors[0]


# -- settings and meta keys that name a kind -------------------------------------------


def test_every_setting_that_names_a_kind_accepts_a_declared_one() -> None:
    config = _config(
        RETRYQUEUE_POLICIES={"captcha": {"max_retries": 7}},
        RETRYQUEUE_DOMAIN_POLICIES={"shop.example": {"captcha": {"base_delay": 2.0}}},
        RETRYQUEUE_STATUS_KINDS={499: "captcha"},
        RETRYQUEUE_EXCEPTION_KINDS={"builtins.LookupError": "captcha"},
    )
    table = config.policy_table
    assert table.policies["captcha"].max_retries == 7
    assert table.policy_for("captcha", "www.shop.example").base_delay == 2.0
    assert config.status_kinds[499] == "captcha"
    assert config.exception_kinds[LookupError] == "captcha"
    meta = {"captcha": {"max_retries": 1}}
    assert table.check_meta_policy(meta) is meta
    assert table.policy_for("captcha", meta_policy=meta).max_retries == 1


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("RETRYQUEUE_POLICIES", {"capcha": {}}),
        ("RETRYQUEUE_DOMAIN_POLICIES", {"shop.example": {"capcha": {}}}),
        ("RETRYQUEUE_STATUS_KINDS", {499: "capcha"}),
        ("RETRYQUEUE_EXCEPTION_KINDS", {"builtins.LookupError": "capcha"}),
    ],
)
def test_an_undeclared_kind_in_a_setting_is_one_error_naming_the_setting(
    setting: str, value: Any
) -> None:
    with pytest.raises(ConfigError) as error:
        _config(**{setting: value})
    message = str(error.value)
    assert message.startswith(setting) and "capcha" in message
    assert "captcha" in message  # the known ones are listed, the declared one too
    assert "\n" not in message


def test_an_undeclared_kind_in_the_policy_meta_key_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"meta\['retryqueue_policy'\] names unknown kind 'cap"):
        _config().policy_table.check_meta_policy({"capcha": {}})
    # An internal kind has no policy to change, even when it is known.
    with pytest.raises(ConfigError, match="names unknown kind 'deferred'"):
        _config().policy_table.check_meta_policy({"deferred": {}})


def test_a_declared_download_kind_is_covered_by_scrapys_retry_times() -> None:
    config = load_config(
        Settings(
            {
                "RETRY_TIMES": 1,
                "RETRYQUEUE_KINDS": {
                    "soft_block": {"retry": True, "max_delay": 5.0, "download": True},
                    # Its own max_retries wins, as RETRYQUEUE_POLICIES' would.
                    "captcha": {**CAPTCHA, "download": True},
                    "login_wall": {"retry": True, "max_delay": 5.0},
                },
            },
            priority="project",
        )
    )
    policies = config.policy_table.policies
    assert policies["soft_block"].max_retries == 1
    assert policies["captcha"].max_retries == 3
    assert policies["login_wall"].max_retries == 0  # not a download: RETRY_TIMES leaves it
    assert "captcha" in config.own_budget_kinds and "soft_block" not in config.own_budget_kinds


def test_the_commands_and_the_dashboard_filter_on_a_declared_kind() -> None:
    from scrapy_retryqueue.dashboard.backend import Backend, DashboardError, parse_filters

    known = kinds_setting(Settings({"RETRYQUEUE_KINDS": {"captcha": CAPTCHA}})).names
    assert Filters.from_options(kinds=["captcha,timeout"], known_kinds=known).kinds == [
        "captcha",
        "timeout",
    ]
    with pytest.raises(FilterError, match="--kind 'captcha' is not a kind"):
        Filters.from_options(kinds=["captcha"])  # a project that does not declare it
    backend = Backend(Settings({"RETRYQUEUE_KINDS": {"captcha": CAPTCHA}}))
    assert "captcha" in backend.known_kinds
    assert parse_filters({"kind": "captcha"}, known_kinds=backend.known_kinds).kinds == ["captcha"]
    with pytest.raises(DashboardError, match="kind 'capcha' is not a kind"):
        parse_filters({"kind": "capcha"}, known_kinds=backend.known_kinds)


# -- RetryLater ------------------------------------------------------------------------


def test_retry_later_is_a_package_exception_that_names_its_kind() -> None:
    error = RetryLater("captcha", "the page is a captcha")
    assert isinstance(error, RetryQueueError)
    assert (error.kind, str(error)) == ("captcha", "the page is a captcha")
    assert str(RetryLater("captcha")) == "retry later: captcha"
    assert "RetryLater" in scrapy_retryqueue.__all__


class KindSpider(scrapy.Spider):
    name = "kinds"

    def parse(self, response: Any) -> None:
        pass


def test_a_declared_kinds_failure_is_planned_and_counted_under_its_name(tmp_path: Path) -> None:
    runtime = unopened_runtime(
        KindSpider, tmp_path, RETRYQUEUE_KINDS={"captcha": {**CAPTCHA, "jitter": "none"}}
    )
    failure = FailureInfo("captcha", "scrapy_retryqueue.exceptions.RetryLater", "a captcha")
    plan = plan_of(runtime, Request(PAGE), failure)
    assert plan.decision == Decision("captcha", True, 1.0, 1, "captcha: retry 1 of 3")
    assert plan.task.attempts == {"captcha": 1}
    runtime.reporter.planned(plan, Outcome.PARKED)
    stats = runtime.crawler.stats
    assert stats.get_value("retryqueue/scheduled/captcha") == 1
    assert stats.get_value("retryqueue/reason_count/captcha") == 1


def test_a_kind_name_fits_the_stores_kind_columns() -> None:
    from scrapy_retryqueue.store.models import tasks_table

    longest = "k" * kinds.NAME_MAX
    assert longest in load_config(Settings({"RETRYQUEUE_KINDS": {longest: {}}})).kinds
    # A longer name would be cut in the store, and --kind filters would miss it.
    for column in ("kind", "first_error_kind", "last_error_kind"):
        assert tasks_table.c[column].type.length >= kinds.NAME_MAX


def test_retry_later_refuses_a_kind_that_is_not_a_name() -> None:
    with pytest.raises(TypeError, match=r"RetryLater\(kind\) takes a kind's name, got \['a'\]"):
        RetryLater(["a"])  # type: ignore[arg-type]


@pytest.mark.parametrize("raised", ["capcha", "poison", "deferred"])
def test_an_undeclared_kind_at_run_time_is_an_unknown_dead_letter_and_one_error_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, raised: str
) -> None:
    # The queue's own kinds (poison, deferred...) are not the project's to raise either.
    runtime = unopened_runtime(KindSpider, tmp_path)
    failure = FailureInfo(raised, "scrapy_retryqueue.exceptions.RetryLater", "a captcha")
    with caplog.at_level(logging.ERROR):
        plans = [plan_of(runtime, Request(f"{PAGE}?{n}"), failure) for n in range(3)]
    for plan in plans:
        assert not plan.decision.retry and plan.decision.kind == "unknown"
        assert plan.task.dead_kind == "unknown"
        assert f"'{raised}'" in plan.decision.reason and "RETRYQUEUE_KINDS" in plan.decision.reason
        assert plan.task.last_error["kind"] == "unknown"
        assert "a captcha" in plan.task.last_error["message"]
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and f"RetryLater names kind '{raised}'" in errors[0], errors
    assert runtime.crawler.stats.get_value("retryqueue/undeclared_kind") == 3


def test_retry_later_in_a_callback_parks_the_request_by_its_kinds_policy(
    open_components: Callable[..., Running], redis_client: redis.Redis, spider_name: str
) -> None:
    running = open_components(RETRYQUEUE_KINDS={"captcha": {**CAPTCHA, **LATER}})
    request = Request(PAGE, callback=running.spider.parse)
    assert running.callback_error(request, RetryLater("captcha", "a captcha page")) == []
    running.wait_stat("retryqueue/scheduled/captcha", 1)
    keys = keys_for(spider_name)
    (task_id,) = redis_client.hkeys(keys.tasks)
    envelope = _envelope(redis_client, keys.tasks, task_id.decode())
    assert envelope["attempts"] == {"captcha": 1}
    assert envelope["last_error"]["kind"] == "captcha"
    assert envelope["last_error"]["message"] == "a captcha page"
    assert running.stat("retryqueue/scheduled/parse") is None


def test_retry_later_of_a_kind_its_policy_does_not_retry_is_a_dead_letter(
    open_components: Callable[..., Running], redis_client: redis.Redis, spider_name: str
) -> None:
    running = open_components(RETRYQUEUE_KINDS={"login_wall": {"dead_log_level": "INFO"}})
    request = Request(PAGE, callback=running.spider.parse)
    # Given up on purpose: its dead letter's line tells it, not Scrapy (tests/test_retry_later.py).
    assert running.callback_error(request, RetryLater("login_wall")) == []
    running.wait_stat("retryqueue/dead/login_wall", 1)
    keys = keys_for(spider_name)
    (task_id,) = redis_client.zrange(keys.dead, 0, -1)
    assert _envelope(redis_client, keys.deadtasks, task_id.decode())["dead_kind"] == "login_wall"


# -- the backoff strategy --------------------------------------------------------------


class Recording:
    """A strategy that records its contexts and returns what it is told to."""

    def __init__(self, value: Any = 1.0) -> None:
        self.value = value
        self.seen: list[BackoffContext] = []

    def delay(self, ctx: BackoffContext) -> Any:
        self.seen.append(ctx)
        if isinstance(self.value, Exception):
            raise self.value
        return self.value


def _table(strategy: Any, retry_after_max: float = 3600.0) -> PolicyTable:
    config = _config()
    return PolicyTable(
        config.policy_table.policies,
        {},
        retry_after_max=retry_after_max,
        backoff=strategy,
        kind_table=config.kinds,
    )


def test_the_strategy_gets_everything_the_decision_knows() -> None:
    strategy = Recording(0.7)
    rand = random.Random(5).random
    decision = _table(strategy).decide(
        _failure("captcha", retry_after=2.5),
        {"captcha": 2, "timeout": 1},
        domain="shop.example",
        rand=rand,
        since_first=12.5,
        url=PAGE,
    )
    (ctx,) = strategy.seen
    assert (ctx.kind, ctx.attempt, ctx.domain, ctx.url) == ("captcha", 2, "shop.example", PAGE)
    assert (ctx.retry_after, ctx.since_first, ctx.rand) == (2.5, 12.5, rand)
    assert ctx.policy == Policy(True, 1.0, 2.0, 5.0, 3, "equal")
    assert decision == Decision("captcha", True, 2.5, 3, "captcha: retry 3 of 3")
    with pytest.raises(AttributeError):
        ctx.attempt = 0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("returned", "retry_after", "retry_after_max", "expected"),
    [
        (0.7, None, 3600.0, 0.7),
        (0, None, 3600.0, 0.0),
        (3, None, 3600.0, 3.0),
        # Clamped to the policy's max_delay (captcha: 5 s).
        (900.0, None, 3600.0, 5.0),
        # The server's Retry-After is a floor, above max_delay too ...
        (0.7, 30.0, 3600.0, 30.0),
        # ... capped by RETRYQUEUE_RETRY_AFTER_MAX.
        (0.7, 30.0, 10.0, 10.0),
        (4.0, 2.0, 3600.0, 4.0),
    ],
)
def test_the_policys_bounds_and_retry_after_hold_around_the_strategy(
    returned: float, retry_after: float | None, retry_after_max: float, expected: float
) -> None:
    table = _table(Recording(returned), retry_after_max=retry_after_max)
    decision = table.decide(_failure("captcha", retry_after), {}, rand=ZERO)
    assert decision.delay == expected


@pytest.mark.parametrize(
    ("returned", "shown"),
    [
        (math.nan, "returned nan"),
        (math.inf, "returned inf"),
        (-1.0, "returned -1.0"),
        ("3", "returned '3'"),
        (True, "returned True"),
        (None, "returned None"),
        pytest.param(10**400, "returned 1000000000000000", id="int-past-float"),
        pytest.param(10**5000, "returned a huge int", id="huge-int"),
        (RuntimeError("no model"), "raised RuntimeError: no model"),
    ],
)
def test_a_bad_delay_is_one_error_naming_the_class_and_the_policys_delay_is_used(
    returned: Any, shown: str
) -> None:
    errors: list[str] = []
    decision = _table(Recording(returned)).decide(
        _failure("captcha"), {"captcha": 1}, rand=ZERO, on_error=errors.append
    )
    # The policy's exponential delay: base 1 s x 2 for the second retry, equal jitter at 0.
    assert decision.retry and decision.delay == 1.0
    (message,) = errors
    assert message.startswith(f"RETRYQUEUE_BACKOFF {__name__}.Recording.delay() {shown}")
    assert "captcha" in message


def test_without_a_listener_a_bad_delay_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR):
        decision = _table(Recording(math.nan)).decide(_failure("captcha"), {}, rand=ZERO)
    assert decision.delay == 0.5
    assert "RETRYQUEUE_BACKOFF" in caplog.text and "Recording" in caplog.text


def test_the_default_strategy_is_the_policys_exponential_backoff() -> None:
    policy = Policy(True, 3.0, 2.0, 120.0, 5, "equal")
    for attempt in range(6):
        rand = random.Random(attempt).random
        ctx = BackoffContext("timeout", attempt, policy, None, None, 0.0, rand)
        assert ExponentialBackoff().delay(ctx) == compute_backoff(
            attempt,
            base_delay=3.0,
            multiplier=2.0,
            max_delay=120.0,
            jitter="equal",
            rand=random.Random(attempt).random,
        )


class CrawlerBackoff:
    """A strategy with from_crawler: built per crawler."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    @classmethod
    def from_crawler(cls, crawler: Any) -> CrawlerBackoff:
        return cls(crawler.settings.getfloat("CONSTANT_DELAY"))

    def delay(self, ctx: BackoffContext) -> float:
        return self.seconds


class PlainBackoff:
    def delay(self, ctx: BackoffContext) -> float:
        return 0.25


def test_the_backoff_setting_builds_the_class_per_crawler(tmp_path: Path) -> None:
    assert isinstance(_config().policy_table.backoff, ExponentialBackoff)
    crawler = get_crawler(
        KindSpider,
        _settings(tmp_path, RETRYQUEUE_BACKOFF=f"{__name__}.CrawlerBackoff", CONSTANT_DELAY=0.7),
    )
    strategy = config_for(crawler).policy_table.backoff
    assert isinstance(strategy, CrawlerBackoff) and strategy.seconds == 0.7
    plain = get_crawler(KindSpider, _settings(tmp_path, RETRYQUEUE_BACKOFF=PlainBackoff))
    assert isinstance(config_for(plain).policy_table.backoff, PlainBackoff)
    ready = PlainBackoff()
    assert load_config(Settings({"RETRYQUEUE_BACKOFF": ready})).policy_table.backoff is ready


def test_a_crawls_strategy_sets_the_planned_delay(tmp_path: Path) -> None:
    runtime = unopened_runtime(KindSpider, tmp_path, RETRYQUEUE_BACKOFF=PlainBackoff)
    plan = plan_of(runtime, Request(PAGE), FailureInfo("server_error", "HttpStatus", "HTTP 503"))
    assert plan.decision.delay == 0.25
    assert plan.task.due == plan.now + 250


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("no.such.Backoff", "RETRYQUEUE_BACKOFF 'no.such.Backoff' does not import"),
        (42, "RETRYQUEUE_BACKOFF must be a class (or its import path) or an object with a "),
        (f"{__name__}.KindSpider", f"got <class '{__name__}.KindSpider'>"),
        (f"{__name__}.CAPTCHA", "RETRYQUEUE_BACKOFF must be a class"),
    ],
)
def test_a_bad_backoff_setting_is_one_error_naming_it_and_its_value(
    value: Any, message: str
) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(Settings({"RETRYQUEUE_BACKOFF": value}))
    assert message in str(error.value)


class BrokenBackoff:
    def __init__(self) -> None:
        raise RuntimeError("no model file")

    def delay(self, ctx: BackoffContext) -> float:
        return 1.0


def test_a_strategy_that_cannot_be_built_is_a_config_error(tmp_path: Path) -> None:
    crawler = get_crawler(KindSpider, _settings(tmp_path, RETRYQUEUE_BACKOFF=BrokenBackoff))
    with pytest.raises(ConfigError, match=r"RETRYQUEUE_BACKOFF .*BrokenBackoff could not be built"):
        config_for(crawler)


# -- a delay set by the retry hook -----------------------------------------------------


#: What delay_hook returns (not in the request's meta: NaN cannot be stored as JSON).
HOOK_RETURNS: dict[str, Any] = {}


def delay_hook(request: scrapy.Request, decision: Decision) -> Any:
    return HOOK_RETURNS[request.url]


SERVER_ERROR = FailureInfo("server_error", "HttpStatus", "HTTP 503", status=503)


def _hooked_plan(tmp_path: Path, returns: Any, failure: FailureInfo = SERVER_ERROR) -> Any:
    runtime = unopened_runtime(
        KindSpider,
        tmp_path,
        RETRYQUEUE_RETRY_HOOK=f"{__name__}.delay_hook",
        RETRYQUEUE_POLICIES={"server_error": {"max_delay": 60.0}},
    )
    HOOK_RETURNS.clear()
    HOOK_RETURNS[PAGE] = returns
    return runtime, plan_of(runtime, Request(PAGE), failure)


@pytest.mark.parametrize(("returns", "expected"), [(4.5, 4.5), (7, 7.0), (0, 0.0), (1e9, 60.0)])
def test_a_hook_that_returns_a_number_sets_the_delay_within_the_bounds(
    tmp_path: Path, returns: float, expected: float
) -> None:
    runtime, plan = _hooked_plan(tmp_path, returns)
    assert plan.decision.retry and plan.decision.delay == expected
    assert plan.task.due == plan.now + int(expected * 1000)
    assert plan.task.last_error["delay"] == expected
    assert runtime.crawler.stats.get_value("retryqueue/hook/delayed") == 1


def test_a_hook_delay_keeps_the_servers_retry_after_as_a_floor(tmp_path: Path) -> None:
    throttled = FailureInfo("rate_limited", "HttpStatus", "HTTP 429", status=429, retry_after=20.0)
    _, plan = _hooked_plan(tmp_path, 1.0, throttled)
    assert plan.decision.delay == 20.0


@pytest.mark.parametrize("returns", [-1.0, math.nan, math.inf, True, "5"])
def test_a_hook_that_returns_a_bad_delay_is_an_error_and_the_retry_goes_on_unchanged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, returns: Any
) -> None:
    with caplog.at_level(logging.ERROR):
        runtime, plan = _hooked_plan(tmp_path, returns)
    # server_error's own first delay (1 s before equal jitter).
    assert plan.decision.retry and 0.5 <= plan.decision.delay <= 1.0
    assert runtime.crawler.stats.get_value("retryqueue/hook/error") == 1
    assert f"it returned {returns!r}" in caplog.text


# -- no kind literal outside kinds.py --------------------------------------------------

#: Strings equal to a kind's name that mean something else, by file and value.
NOT_KINDS = {
    # SQLite's connect_args={"timeout": 30}: seconds to wait for a lock.
    ("store/db.py", "timeout"),
    # Alembic's config.attributes["connection"]: the connection migrations run on.
    ("store/db.py", "connection"),
    ("store/migrations/env.py", "connection"),
    # The store writer's counter of dead letters it cannot store ("malformed"),
    # a name of its own stats, not the kind it writes.
    ("store/sync.py", "malformed"),
}


def _kind_literals(root: Path) -> list[tuple[str, int, str]]:
    """Every string constant under *root* (docstrings included) that is a built-in
    kind's name, outside kinds.py and the NOT_KINDS exceptions."""
    names = set(kinds.BUILTIN_BY_NAME)
    found = []
    for path in sorted(root.rglob("*.py")):
        where = path.relative_to(root).as_posix()
        if where == "decision/kinds.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Constant)
                and node.value in names
                and (where, node.value) not in NOT_KINDS
            ):
                found.append((where, node.lineno, node.value))
    return found


def test_no_kind_is_spelled_as_a_string_outside_kinds_py() -> None:
    assert _kind_literals(PACKAGE) == []


def test_the_literal_scan_finds_a_kind_spelled_out(tmp_path: Path) -> None:
    (tmp_path / "decision").mkdir()
    (tmp_path / "decision" / "kinds.py").write_text('TIMEOUT = "timeout"\n')
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "db.py").write_text('ARGS = {"timeout": 30}\n')
    (tmp_path / "glue.py").write_text(
        '"""Retries a timeout."""\nLABEL = "a timeout"\n\n\ndef f():\n    return "parse"\n'
    )
    assert _kind_literals(tmp_path) == [("glue.py", 6, "parse")]


def test_distinct_bad_delays_log_a_bounded_number_of_lines(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A strategy returning a new bad number each time names it in each message:
    # the lines stop after a few, the stat goes on counting.
    from scrapy_retryqueue.runtime.planner import Note

    runtime = unopened_runtime(KindSpider, tmp_path)
    with caplog.at_level(logging.ERROR):
        for n in range(12):
            runtime.reporter.notes([Note("retryqueue/backoff_error", f"returned {-n - 1}")])
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 6, lines
    assert "only counted in the stat retryqueue/backoff_error" in lines[-1]
    assert runtime.crawler.stats.get_value("retryqueue/backoff_error") == 12


class _Writes:
    """The write path as the breaker sees it: records each call, sends nothing."""

    down = False

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        from twisted.internet import defer

        self.calls.append({"fn": fn.__name__, **kwargs})
        return defer.Deferred()  # never answers: the test reads what was asked


@pytest.mark.parametrize(
    ("traits", "cause"),
    [({"breaker": True}, "throttle"), ({"breaker": True, "burst": True}, "burst"), ({}, None)],
)
def test_a_declared_kinds_traits_decide_what_its_failure_tells_the_breaker(
    traits: dict[str, bool], cause: str | None
) -> None:
    from scrapy_retryqueue.runtime.breaker import DomainBreaker

    config = load_config(Settings({"RETRYQUEUE_KINDS": {"softban": {"retry": True, **traits}}}))
    writes = _Writes()
    breaker = DomainBreaker(config, writes, None)  # type: ignore[arg-type]
    # On: the fake write path only records which of the cooldowns' calls it was asked.
    breaker.open(type("Cooldowns", (), {"fail": lambda *a, **k: None, "ok": lambda *a: None})())  # type: ignore[arg-type]
    # A callback's soft ban: no HTTP status, no Retry-After. A breaker kind that is
    # no burst kind trips its domain on this one failure.
    breaker.downloaded(Request(PAGE), FailureInfo("softban", "RetryLater", "soft ban"))
    assert [c.get("cause") for c in writes.calls] == ([cause] if cause else [])
