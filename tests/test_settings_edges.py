"""Settings that used to be accepted and then broke the crawl, or failed with a
traceback: each is refused at start in one line naming the setting and its value
(exit status 1, nothing created on disk), and a misspelt RETRYQUEUE_* name is
one WARNING naming the closest setting."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from scrapy import Spider
from scrapy.settings import Settings
from scrapy.utils.misc import build_from_crawler
from scrapy.utils.test import get_crawler

from scrapy_retryqueue.config import load_config, shown, unknown_settings
from scrapy_retryqueue.crawl.middleware import RetryQueueMiddleware
from scrapy_retryqueue.dashboard.settings import load_dashboard_config
from scrapy_retryqueue.exceptions import ConfigError, SpiderNameError
from scrapy_retryqueue.queue.keys import keys_for
from scrapy_retryqueue.runtime.writable import directory_problem, file_problem
from scrapy_retryqueue.settings import defaults
from scrapy_retryqueue.store.config import load_store_config

ROOT = Path(__file__).resolve().parents[1]
DEEP_JSON = "[" * 5000 + "]" * 5000


# -- bounds a real server accepts ------------------------------------------------------

REFUSED = [
    ("RETRYQUEUE_LEASE_TIME", "1e400", ["<= 1000000000", "inf"]),
    ("RETRYQUEUE_IDLE_TIMEOUT", 1e12, ["<= 1000000000"]),
    ("RETRYQUEUE_NODE_ID", "n" * 10_000, ["at most 200", "(10002 characters)"]),
    ("RETRYQUEUE_NODE_ID", "a\nb", ["printable", "'a\\nb'"]),
    ("RETRYQUEUE_MAX_IN_FLIGHT", 2**63, ["<= 9007199254740991", str(2**63)]),
    ("RETRYQUEUE_EVENTS_MAXLEN", str(2**64), ["<= 9007199254740991"]),
    ("RETRYQUEUE_DOMAIN_POLICIES", {"...": {}}, ["'...'"]),
    ("RETRYQUEUE_DOMAIN_POLICIES", {".": {}}, ["'.'"]),
    ("RETRYQUEUE_REDIS_URL", "redis://127.0.0.1:abc/0", ["port", "'redis://127.0.0.1:abc/0'"]),
    ("RETRYQUEUE_REDIS_URL", "redis://127.0.0.1:6379/zero", ["database", "'zero'"]),
    ("RETRYQUEUE_POLICIES", DEEP_JSON, ["nested too deeply"]),
    ("RETRYQUEUE_KINDS", DEEP_JSON, ["nested too deeply"]),
    ("RETRYQUEUE_STATUS_KINDS", DEEP_JSON, ["nested too deeply"]),
    ("REDIS_PARAMS", {"bogus_key": 1}, ["'bogus_key'"]),
    ("REDIS_PARAMS", {"socket_timeot": 1}, ["'socket_timeot'", "did you mean 'socket_timeout'"]),
    ("RETRYQUEUE_ENABLED", "maybe", ["'maybe'"]),
    # Settings of the learned recovery times, the Spidermon monitors, the namespace.
    ("RETRYQUEUE_LEARNED_HALF_LIFE", "1e400", ["got inf"]),
    ("RETRYQUEUE_LEARNED_REFRESH", 1e12, ["<= 1000000000"]),
    ("RETRYQUEUE_LEARNED_MAX_RECORDS", 2**60, ["<= 9007199254740991"]),
    ("RETRYQUEUE_LEARNED_TRY_COST", 0, ["RETRYQUEUE_LEARNED_TRY_COST", "> 0"]),
    ("RETRYQUEUE_LEARNED_TRY_COST", "1e400", ["RETRYQUEUE_LEARNED_TRY_COST", "got inf"]),
    ("RETRYQUEUE_LEARNED_MIN_OUTAGES", 0.5, [">= 1"]),
    ("RETRYQUEUE_MONITOR_MAX_BANS", 2**60, ["<= 9007199254740991"]),
    ("RETRYQUEUE_MONITOR_MAX_PENDING", "lots", ["'lots'"]),
    ("RETRYQUEUE_MONITOR_MIN_RECOVERY", 1.5, ["<= 1"]),
    ("RETRYQUEUE_MONITOR_MAX_DEAD", {"timeout": 2**60}, ["'timeout'", str(2**60)]),
    ("RETRYQUEUE_MONITOR_MAX_DEAD", DEEP_JSON, ["nested too deeply"]),
    ("RETRYQUEUE_NAMESPACE", "a:b", ["'a:b'"]),
]


@pytest.mark.parametrize(
    ("name", "value", "fragments"), REFUSED, ids=[f"{n}-{shown(v, 30)}" for n, v, _ in REFUSED]
)
def test_a_value_no_server_takes_is_refused_naming_it(
    name: str, value: Any, fragments: list[str]
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(Settings({name: value}))
    message = str(info.value)
    assert name in message and "\n" not in message and len(message) < 400
    for fragment in fragments:
        assert fragment in message


def test_the_largest_values_still_accepted() -> None:
    config = load_config(
        Settings(
            {
                "RETRYQUEUE_MAX_IN_FLIGHT": defaults.SETTING_INT_MAX,
                "RETRYQUEUE_IDLE_TIMEOUT": defaults.SETTING_SECONDS_MAX,
                "RETRYQUEUE_NODE_ID": "n" * defaults.NODE_ID_MAX,
                "RETRYQUEUE_DOMAIN_POLICIES": {".example.com": {}},
                "REDIS_PARAMS": {"password": "x", "ssl_cert_reqs": "none", "url": "redis://h"},
            }
        )
    )
    assert config.max_in_flight == 2**53 - 1 and len(config.node_id) == 200


@pytest.mark.parametrize(
    ("name", "value", "fragment"),
    [
        ("RETRYQUEUE_HISTORY_RETENTION", 99_999_999_999, "<= 100000"),
        ("RETRYQUEUE_DEAD_RETENTION", "inf", "got inf"),
        ("RETRYQUEUE_STORE_INTERVAL", 1e300, "<= 1000000000"),
        ("RETRYQUEUE_DATABASE_URL", "sqlite:///", "must name a SQLite file"),
        ("RETRYQUEUE_DATABASE_URL", "sqlite://", "must name a SQLite file"),
        ("RETRYQUEUE_DATABASE_URL", "sqlite:///:memory:", "must name a SQLite file"),
    ],
)
def test_store_settings_have_bounds(name: str, value: Any, fragment: str) -> None:
    with pytest.raises(ConfigError, match=name) as info:
        load_store_config(Settings({name: value}))
    assert fragment in str(info.value)


def test_the_largest_retention_is_a_date_python_holds() -> None:
    from datetime import UTC, datetime, timedelta

    config = load_store_config(
        Settings({"RETRYQUEUE_HISTORY_RETENTION": defaults.SETTING_DAYS_MAX})
    )
    assert config.history_retention is not None
    assert datetime.now(UTC) - timedelta(days=config.history_retention) > datetime.min.replace(
        tzinfo=UTC
    )


def test_a_queue_of_the_largest_max_in_flight_claims(queue: Any, make_task: Any) -> None:
    """Past Redis's integers every poll failed; the bound is what a script takes."""
    assert queue.schedule(make_task("a"), now=0)
    claimed = queue.claim(now=1, limit=defaults.SETTING_INT_MAX, lease_until=10**6, token="t:1")
    assert [task_id for task_id, _ in claimed.tasks] == ["a"]
    with pytest.raises(Exception, match="out of range"):
        queue.claim(now=1, limit=2**63, lease_until=10**6, token="t:2")


# -- the dashboard's address and a spider name ---------------------------------------------


@pytest.mark.parametrize("host", ["a" * 70, "a..b", "x y", "", "-bad.example", "é" * 300])
def test_a_dashboard_host_that_is_no_name_is_one_error(host: str) -> None:
    with pytest.raises(ConfigError, match=r"RETRYQUEUE_DASHBOARD_HOST \(--host\)"):
        load_dashboard_config({}, host=host, token="12345678")


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "[::1]", "0.0.0.0", "dash.internal."])
def test_a_dashboard_host_that_is_an_address_or_a_name(host: str) -> None:
    assert load_dashboard_config({}, host=host, token="12345678").host == host.strip("[]")


@pytest.mark.parametrize("spider", ["{}", "", "a}b"])
def test_a_spider_name_no_queue_can_have_is_the_packages_error(spider: str) -> None:
    with pytest.raises(SpiderNameError, match="cannot name a queue"):
        keys_for(spider)
    with pytest.raises(SpiderNameError, match="cannot name a queue"):
        keys_for(spider, "proj")


def test_a_namespace_no_key_can_hold_is_a_setting_error() -> None:
    # A spider name is checked first; a namespace is RETRYQUEUE_NAMESPACE's.
    with pytest.raises(ConfigError, match=r"RETRYQUEUE_NAMESPACE") as info:
        keys_for("spider", "p" * 5000)
    assert "(5000 characters)" in str(info.value) and len(str(info.value)) < 300
    assert keys_for("spider", "proj").due == "retryqueue:proj:{spider}:due"


def test_the_per_user_directory_without_scrapy_cfg_is_accepted_and_proc_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from scrapy_retryqueue.queue import embedded

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    fallback = embedded.user_directory("proj")
    # Not made yet: its nearest existing part is a writable directory, and looking made nothing.
    assert directory_problem(fallback) is None
    assert not (tmp_path / "data").exists()
    monkeypatch.setenv("XDG_DATA_HOME", "/proc/self")
    assert "proc" in (directory_problem(embedded.user_directory("proj")) or "")


@pytest.mark.parametrize(
    "args",
    [
        ["retryqueue", "status", "--spider", "{}"],
        ["deadletters", "sync", "--spider", "{}"],
        ["retryqueue", "dashboard", "--host", "a" * 70, "--token", "12345678"],
        ["retryqueue", "dashboard", "--host", "a..b", "--token", "12345678"],
    ],
)
def test_commands_say_a_bad_argument_in_one_line(
    args: list[str], tmp_path: Path, redis_url: str
) -> None:
    settings = {
        "RETRYQUEUE_REDIS_URL": redis_url,
        "RETRYQUEUE_DATABASE_URL": f"sqlite:///{tmp_path}/store.sqlite3",
    }
    command = [sys.executable, "-m", "scrapy.cmdline", *args]
    for name, value in settings.items():
        command += ["-s", f"{name}={value}"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: "), done.stderr
    assert "Traceback" not in done.stderr
    assert ("cannot name a queue" in done.stderr) or ("--host" in done.stderr)


# -- paths that cannot be written ---------------------------------------------------------


def test_paths_that_cannot_be_written(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    assert "is a directory" in (file_problem(tmp_path) or "")
    assert "proc filesystem" in (file_problem("/proc/self/status") or "")
    assert "does not exist" in (file_problem(tmp_path / "missing" / "x.log") or "")
    assert "not a regular file" in (file_problem("/dev/null") or "")
    assert "bytes long" in (file_problem(tmp_path / ("x" * 300)) or "")
    assert "NUL" in (file_problem(f"{tmp_path}/a\0b") or "")
    assert file_problem(tmp_path / "new.log") is None
    assert file_problem(tmp_path / "file") is None
    assert "proc filesystem" in (directory_problem("/proc/x/y") or "")
    assert "not a directory" in (directory_problem(tmp_path / "file" / "sub") or "")
    assert directory_problem(tmp_path / "a" / "b" / "c") is None
    # Only looked at: nothing was made.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


# -- a crawl stops at start: one ERROR line, exit 1, nothing on disk ----------------------


def _crawl_cases(tmp: str) -> list[tuple[str, str, str]]:
    return [
        ("RETRYQUEUE_ENABLED", "maybe", "RETRYQUEUE_ENABLED must be True or False, got 'maybe'"),
        ("RETRYQUEUE_RETRY_HOOK", "builtins.int", "RETRYQUEUE_RETRY_HOOK builtins.int builds"),
        ("RETRYQUEUE_REDIS_URL", "redis://127.0.0.1:abc/0", "its port is not a number"),
        ("RETRYQUEUE_LEASE_TIME", "1e400", "RETRYQUEUE_LEASE_TIME must be <= 1000000000"),
        ("RETRYQUEUE_AUDIT_LOG", tmp, f"RETRYQUEUE_AUDIT_LOG '{tmp}' cannot be written"),
        ("RETRYQUEUE_AUDIT_LOG", f"{tmp}/no/x.log", "its directory"),
        ("RETRYQUEUE_AUDIT_LOG", "/proc/self/status", "proc filesystem"),
        ("RETRYQUEUE_EMBEDDED_DIR", "/proc/retryqueue", "RETRYQUEUE_EMBEDDED_DIR '/proc/"),
        ("RETRYQUEUE_DATABASE_URL", "sqlite:///", "RETRYQUEUE_DATABASE_URL must name a SQLite"),
        ("RETRYQUEUE_HISTORY_RETENTION", "99999999999", "RETRYQUEUE_HISTORY_RETENTION must be"),
        ("RETRYQUEUE_POLICIES", DEEP_JSON, "RETRYQUEUE_POLICIES is nested too deeply"),
    ]


@pytest.mark.parametrize("case", range(len(_crawl_cases("T"))))
def test_a_broken_setting_stops_the_crawl_in_one_line(case: int, tmp_path: Path) -> None:
    setting, value, message = _crawl_cases(str(tmp_path))[case]
    embedded = tmp_path / "embedded"
    settings = {"RETRYQUEUE_EMBEDDED_DIR": str(embedded), setting: value}
    command = [sys.executable, "-m", "scrapy.cmdline", "crawl", "flaky", "-a", "site=http://x"]
    for name, text in settings.items():
        command += ["-s", f"{name}={text}"]
    done = subprocess.run(
        command, cwd=ROOT / "example_project", capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1, done.stderr[-2000:]
    [error] = [line for line in done.stderr.splitlines() if " ERROR: " in line]
    assert message in error
    assert "Traceback" not in done.stderr
    assert "Crawled" not in done.stderr
    # Nothing was made for it: not the embedded dir, not an audit log's directory.
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# -- a misspelt setting ---------------------------------------------------------------------


def test_a_misspelt_setting_names_the_closest_one() -> None:
    notices = unknown_settings(
        ["RETRYQUEUE_BACKOF", "RETRYQUEUE_POLL_INTERVALL", "RETRYQUEUE_XYZZY", "OTHER_SETTING"]
    )
    assert notices == [
        "'RETRYQUEUE_BACKOF' is not a scrapy-retryqueue setting; did you mean RETRYQUEUE_BACKOFF?",
        "'RETRYQUEUE_POLL_INTERVALL' is not a scrapy-retryqueue setting; did you mean "
        "RETRYQUEUE_POLL_INTERVAL?",
        "'RETRYQUEUE_XYZZY' is not a scrapy-retryqueue setting; it is not read",
    ]
    # Every known setting, however it was added to defaults.SETTINGS, is known.
    assert unknown_settings(defaults.SETTINGS) == []


def test_a_setting_added_to_the_defaults_is_known(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(defaults.SETTINGS, "RETRYQUEUE_FRONTIER", None)
    assert unknown_settings(["RETRYQUEUE_FRONTIER"]) == []
    assert "RETRYQUEUE_FRONTIER" in unknown_settings(["RETRYQUEUE_FRONTEIR"])[0]


class _Spider(Spider):
    name = "edges"


def test_a_crawl_warns_once_of_a_misspelt_setting(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from scrapy_retryqueue.crawl.addon import Addon

    crawler = get_crawler(
        _Spider,
        {
            "ADDONS": {Addon: 0},
            "RETRYQUEUE_EMBEDDED_DIR": str(tmp_path),
            "RETRYQUEUE_REDIS_URL": "redis://127.0.0.1:1/0",
            "RETRYQUEUE_START_WITHOUT_REDIS": True,
            "RETRYQUEUE_POLL_INTERVALL": 0.2,
        },
    )
    with caplog.at_level(logging.WARNING):
        build_from_crawler(RetryQueueMiddleware, crawler)
        build_from_crawler(RetryQueueMiddleware, crawler)
    warnings = [r.getMessage() for r in caplog.records if "INTERVALL" in r.getMessage()]
    assert warnings == [
        "scrapy-retryqueue: 'RETRYQUEUE_POLL_INTERVALL' is not a scrapy-retryqueue setting; "
        "did you mean RETRYQUEUE_POLL_INTERVAL?"
    ]
    assert all(r.levelno == logging.WARNING for r in caplog.records if "INTERVALL" in r.message)


def test_shown_bounds_any_value() -> None:
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    assert "nested too deeply" in shown(deep)
    assert shown("x" * 1000).endswith("(1002 characters)")
    assert shown("ok") == "'ok'"


def test_a_command_warns_of_a_misspelt_setting(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "scrapy.cmdline", "retryqueue", "server", "status",
         "-s", f"RETRYQUEUE_EMBEDDED_DIR={tmp_path}", "-s", "RETRYQUEUE_DASHBOARD_TOKN=x",
         "-s", "RETRYQUEUE_LEARNED_EARLY_AT=0.9"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert done.stderr.splitlines() == [
        "warning: 'RETRYQUEUE_DASHBOARD_TOKN' is not a scrapy-retryqueue setting; did you "
        "mean RETRYQUEUE_DASHBOARD_TOKEN?",
        # A retired setting: not called misspelt, said to be ignored and what replaced it.
        "warning: RETRYQUEUE_LEARNED_EARLY_AT is ignored: "
        + defaults.RETIRED_SETTINGS["RETRYQUEUE_LEARNED_EARLY_AT"],
    ]
