"""load_config and config_for: defaults, command-line strings, one ConfigError per
bad value, and one validated Config per crawler."""

from __future__ import annotations

import logging
import os
import socket

import pytest
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler

from scrapy_retryqueue import config as config_module
from scrapy_retryqueue.config import config_for, load_config, redact_url, redis_url_from_settings
from scrapy_retryqueue.decision import kinds
from scrapy_retryqueue.decision.policy import Policy
from scrapy_retryqueue.exceptions import ConfigError


def _load(values=None, **cmdline):
    settings = Settings(values or {})
    for name, value in cmdline.items():
        # What `scrapy crawl -s NAME=value` does: the value is a string.
        settings.set(name, value, priority="cmdline")
    return load_config(settings)


# -- defaults ---------------------------------------------------------------------


def test_defaults():
    config = _load()
    assert config.enabled is True
    assert config.redis_url is None
    assert config.poll_interval == 1.0
    assert config.lease_time == 60.0
    assert config.max_in_flight == 16
    assert config.idle_timeout == 300.0
    assert config.max_reclaims == 3
    assert config.priority_adjust == 0
    assert config.events_maxlen == 1_000_000
    assert config.audit_log is None
    assert config.audit_rotation == "100 MB"
    assert config.audit_retention == "30 days"
    assert config.embedded_dir is None
    assert config.forbidden_log_level == logging.WARNING
    assert dict(config.status_kinds) == kinds.STATUS_KINDS
    assert config.policy_table.retry_after_max == 3600.0
    assert config.policy_table.domain_policies == {}


def test_every_kind_is_listed_once_and_deferred_is_one():
    table = kinds.BUILTIN_TABLE
    assert len(set(table.names)) == len(table.names) == len(kinds.BUILTIN)
    assert set(table.names) == {*table.policy_names, *table.named("internal")}
    assert not set(table.policy_names) & set(table.named("internal"))
    # Produced for a fresh request to a cooling domain: filters must accept it.
    assert table.is_internal("deferred")
    kinds_named_elsewhere = {
        *kinds.STATUS_KINDS.values(),
        *kinds.EXCEPTION_KINDS.values(),
        *kinds.POLICIES,
    }
    assert kinds_named_elsewhere <= set(table.names)
    assert set(kinds.POLICIES) == set(table.policy_names)


def test_default_policies_cover_every_kind():
    policies = _load().policy_table.policies
    assert set(policies) == set(kinds.BUILTIN_TABLE.policy_names)
    # docs/settings.md, "Default policies" (and "Why these defaults").
    assert policies["timeout"] == Policy(True, 1.0, 2.0, 120.0, 5, "equal")
    assert policies["connection"] == Policy(True, 1.0, 2.0, 120.0, 8, "equal")
    assert policies["server_error"] == Policy(True, 1.0, 2.0, 240.0, 9, "equal")
    assert policies["rate_limited"] == Policy(True, 5.0, 2.0, 240.0, 9, "equal")
    assert policies["parse"] == Policy(True, 2.0, 2.0, 30.0, 2, "equal")
    for kind in ("not_found", "forbidden", "rule"):
        assert policies[kind].retry is False


def test_a_one_shot_crawl_runs_every_default_retry_before_it_gives_up_waiting():
    # The extension closes an idle crawl at once when the next retry is due
    # further away than RETRYQUEUE_IDLE_TIMEOUT: no default delay may be longer.
    from scrapy_retryqueue.decision.backoff import compute_backoff

    config = _load()
    for kind, policy in config.policy_table.policies.items():
        for attempt in range(policy.max_retries if policy.retry else 0):
            delay = compute_backoff(
                attempt,
                base_delay=policy.base_delay,
                multiplier=policy.multiplier,
                max_delay=policy.max_delay,
                jitter="none",
                rand=lambda: 1.0,
            )
            assert delay < config.idle_timeout, (kind, attempt, delay)


def test_default_exception_kinds_import():
    import scrapy.exceptions
    from twisted.internet.error import DNSLookupError, TimeoutError

    kinds = _load().exception_kinds
    assert kinds[TimeoutError] == "timeout"
    # Scrapy's own download errors exist from 2.14 on; older ones are skipped.
    if hasattr(scrapy.exceptions, "DownloadTimeoutError"):
        assert kinds[scrapy.exceptions.DownloadTimeoutError] == "timeout"
    assert kinds[DNSLookupError] == "dns"
    assert kinds[OSError] == "connection"
    assert all(isinstance(cls, type) for cls in kinds)


def test_node_id_default_has_host_and_pid():
    node_id = _load().node_id
    assert node_id == f"{socket.gethostname()}:{os.getpid()}"
    assert str(os.getpid()) in node_id


def test_node_id_setting():
    assert _load({"RETRYQUEUE_NODE_ID": "worker-7"}).node_id == "worker-7"


@pytest.mark.parametrize("concurrent", [1, 7, 64])
def test_max_in_flight_defaults_to_concurrent_requests(concurrent):
    assert _load({"CONCURRENT_REQUESTS": concurrent}).max_in_flight == concurrent


def test_max_in_flight_falls_back_to_scrapys_default_concurrency():
    # A bare BaseSettings has no CONCURRENT_REQUESTS; 0 is no concurrency either.
    from scrapy.settings import BaseSettings, default_settings

    assert load_config(BaseSettings()).max_in_flight == default_settings.CONCURRENT_REQUESTS
    assert _load({"CONCURRENT_REQUESTS": 0}).max_in_flight == default_settings.CONCURRENT_REQUESTS


def test_max_in_flight_setting_wins():
    config = _load({"CONCURRENT_REQUESTS": 64, "RETRYQUEUE_MAX_IN_FLIGHT": 5})
    assert config.max_in_flight == 5


def test_user_policies_merge_key_by_key():
    config = _load({"RETRYQUEUE_POLICIES": {"timeout": {"max_retries": 1}}})
    policies = config.policy_table.policies
    assert policies["timeout"] == Policy(True, 1.0, 2.0, 120.0, 1, "equal")
    assert policies["connection"] == Policy(True, 1.0, 2.0, 120.0, 8, "equal")


def test_status_kinds_merge_add_and_remove():
    config = _load({"RETRYQUEUE_STATUS_KINDS": {"418": "rule", 404: None, "403": "server_error"}})
    assert config.status_kinds[418] == "rule"
    assert 404 not in config.status_kinds
    assert config.status_kinds[403] == "server_error"
    assert config.status_kinds[410] == "not_found"


def test_exception_kinds_merge_add_and_remove():
    config = _load(
        {"RETRYQUEUE_EXCEPTION_KINDS": {"builtins.KeyError": "parse", "builtins.OSError": None}}
    )
    assert config.exception_kinds[KeyError] == "parse"
    assert OSError not in config.exception_kinds


def test_exception_kinds_accept_a_class_object():
    config = _load({"RETRYQUEUE_EXCEPTION_KINDS": {LookupError: "parse"}})
    assert config.exception_kinds[LookupError] == "parse"


def test_other_settings_read():
    config = _load(
        {
            "RETRYQUEUE_ENABLED": False,
            "RETRYQUEUE_POLL_INTERVAL": 0.5,
            "RETRYQUEUE_LEASE_TIME": 1.5,
            "RETRYQUEUE_IDLE_TIMEOUT": 0,
            "RETRYQUEUE_MAX_RECLAIMS": 0,
            "RETRYQUEUE_PRIORITY_ADJUST": -10,
            "RETRYQUEUE_EVENTS_MAXLEN": 1,
            "RETRYQUEUE_RETRY_AFTER_MAX": 60,
            "RETRYQUEUE_FORBIDDEN_LOG_LEVEL": logging.DEBUG,
            "RETRYQUEUE_AUDIT_LOG": "audit.log",
            "RETRYQUEUE_EMBEDDED_DIR": "/tmp/rq",
        }
    )
    assert config.enabled is False
    assert config.poll_interval == 0.5
    assert config.lease_time == 1.5
    assert config.idle_timeout == 0.0
    assert config.max_reclaims == 0
    assert config.priority_adjust == -10
    assert config.events_maxlen == 1
    assert config.policy_table.retry_after_max == 60.0
    assert config.forbidden_log_level == logging.DEBUG
    assert config.audit_log == "audit.log"
    assert config.embedded_dir == "/tmp/rq"


# -- command-line strings ---------------------------------------------------------


def test_json_policies_from_command_line():
    config = _load(RETRYQUEUE_POLICIES='{"timeout": {"max_retries": 1}}')
    assert config.policy_table.policies["timeout"].max_retries == 1
    assert config.policy_table.policies["timeout"].base_delay == 1.0


def test_json_mappings_from_command_line():
    config = _load(
        RETRYQUEUE_DOMAIN_POLICIES='{"example.com": {"dns": {"max_retries": 0}}}',
        RETRYQUEUE_STATUS_KINDS='{"404": null, "599": "server_error"}',
        RETRYQUEUE_EXCEPTION_KINDS='{"builtins.KeyError": "parse"}',
    )
    assert config.policy_table.policy_for("dns", "example.com").max_retries == 0
    assert 404 not in config.status_kinds
    assert config.status_kinds[599] == "server_error"
    assert config.exception_kinds[KeyError] == "parse"


def test_scalars_from_command_line():
    config = _load(
        RETRYQUEUE_ENABLED="false",
        RETRYQUEUE_POLL_INTERVAL="0.25",
        RETRYQUEUE_LEASE_TIME="30",
        RETRYQUEUE_MAX_IN_FLIGHT="8",
        RETRYQUEUE_MAX_RECLAIMS="5",
        RETRYQUEUE_FORBIDDEN_LOG_LEVEL="INFO",
    )
    assert config.enabled is False
    assert config.poll_interval == 0.25
    assert config.lease_time == 30.0
    assert config.max_in_flight == 8
    assert config.max_reclaims == 5
    assert config.forbidden_log_level == logging.INFO


@pytest.mark.parametrize(
    ("raw", "enabled"), [("1", True), ("0", False), ("True", True), (0, False)]
)
def test_enabled_spellings(raw, enabled):
    assert _load({"RETRYQUEUE_ENABLED": raw}).enabled is enabled


# -- bad values -------------------------------------------------------------------

BAD = [
    # RETRYQUEUE_POLICIES
    ("RETRYQUEUE_POLICIES", {"bogus": {"max_retries": 1}}, ["'bogus'"]),
    ("RETRYQUEUE_POLICIES", {"timeout": {"speed": 1}}, ["'timeout'", "'speed'"]),
    ("RETRYQUEUE_POLICIES", {"timeout": {"jitter": "wild"}}, ["['jitter']", "'wild'"]),
    ("RETRYQUEUE_POLICIES", {"timeout": {"base_delay": -1}}, ["['base_delay']", "-1"]),
    ("RETRYQUEUE_POLICIES", {"timeout": {"max_delay": -5.5}}, ["['max_delay']", "-5.5"]),
    ("RETRYQUEUE_POLICIES", {"timeout": {"retry": "yes"}}, ["['retry']", "'yes'"]),
    ("RETRYQUEUE_POLICIES", {"timeout": {"max_retries": 1.5}}, ["['max_retries']", "1.5"]),
    ("RETRYQUEUE_POLICIES", {"timeout": {"multiplier": 0.5}}, ["['multiplier']", "0.5"]),
    ("RETRYQUEUE_POLICIES", {"timeout": {"base_delay": 500}}, ["max_delay (120.0)", "500.0"]),
    ("RETRYQUEUE_POLICIES", {"timeout": 5}, ["['timeout']", "got 5"]),
    ("RETRYQUEUE_POLICIES", [1, 2], ["[1, 2]"]),
    ("RETRYQUEUE_POLICIES", "{not json", ["'{not json'"]),
    ("RETRYQUEUE_POLICIES", "[3]", ["[3]"]),
    ("RETRYQUEUE_POLICIES", '{"timeout": {"base_delay": NaN}}', ["['base_delay']", "nan"]),
    # RETRYQUEUE_DOMAIN_POLICIES
    ("RETRYQUEUE_DOMAIN_POLICIES", {"example.com": {"bogus": {}}}, ["'example.com'", "'bogus'"]),
    (
        "RETRYQUEUE_DOMAIN_POLICIES",
        {"example.com": {"timeout": {"jitter": "x"}}},
        ["['example.com']['timeout']['jitter']", "'x'"],
    ),
    (
        "RETRYQUEUE_DOMAIN_POLICIES",
        {"example.com": {"timeout": {"speed": 2}}},
        ["'example.com'", "'speed'"],
    ),
    ("RETRYQUEUE_DOMAIN_POLICIES", {"https://example.com/": {}}, ["'https://example.com/'"]),
    ("RETRYQUEUE_DOMAIN_POLICIES", {"": {}}, ["''"]),
    ("RETRYQUEUE_DOMAIN_POLICIES", {"example.com": 5}, ["'example.com'", "got 5"]),
    ("RETRYQUEUE_DOMAIN_POLICIES", ["example.com"], ["['example.com']"]),
    ("RETRYQUEUE_DOMAIN_POLICIES", "example.com", ["'example.com'"]),
    # RETRYQUEUE_STATUS_KINDS
    ("RETRYQUEUE_STATUS_KINDS", {"abc": "timeout"}, ["'abc'"]),
    ("RETRYQUEUE_STATUS_KINDS", {"700": "server_error"}, ["'700'"]),
    ("RETRYQUEUE_STATUS_KINDS", {99: "server_error"}, ["99"]),
    ("RETRYQUEUE_STATUS_KINDS", {"404": "boom"}, ["'404'", "'boom'"]),
    ("RETRYQUEUE_STATUS_KINDS", {"404": "poison"}, ["'404'", "'poison'"]),
    ("RETRYQUEUE_STATUS_KINDS", [404], ["[404]"]),
    # RETRYQUEUE_EXCEPTION_KINDS
    ("RETRYQUEUE_EXCEPTION_KINDS", {"nope.missing.Error": "timeout"}, ["'nope.missing.Error'"]),
    ("RETRYQUEUE_EXCEPTION_KINDS", {"builtins.NoSuchError": "timeout"}, ["'builtins.NoSuchError'"]),
    ("RETRYQUEUE_EXCEPTION_KINDS", {"NoDots": "timeout"}, ["'NoDots'"]),
    ("RETRYQUEUE_EXCEPTION_KINDS", {"os.path.join": "timeout"}, ["'os.path.join'"]),
    ("RETRYQUEUE_EXCEPTION_KINDS", {"builtins.dict": "timeout"}, ["'builtins.dict'"]),
    ("RETRYQUEUE_EXCEPTION_KINDS", {"builtins.ValueError": "boom"}, ["ValueError", "'boom'"]),
    ("RETRYQUEUE_EXCEPTION_KINDS", ["builtins.ValueError"], ["['builtins.ValueError']"]),
    # Scalars
    ("RETRYQUEUE_POLL_INTERVAL", 0, ["> 0", "got 0"]),
    ("RETRYQUEUE_POLL_INTERVAL", -1, ["got -1"]),
    ("RETRYQUEUE_POLL_INTERVAL", "abc", ["'abc'"]),
    ("RETRYQUEUE_POLL_INTERVAL", "nan", ["nan"]),
    ("RETRYQUEUE_POLL_INTERVAL", True, ["True"]),
    ("RETRYQUEUE_LEASE_TIME", 2, ["RETRYQUEUE_POLL_INTERVAL", "(2)"]),
    ("RETRYQUEUE_LEASE_TIME", 0, ["got 0"]),
    ("RETRYQUEUE_MAX_IN_FLIGHT", 0, [">= 1", "got 0"]),
    ("RETRYQUEUE_MAX_IN_FLIGHT", 1.5, ["whole number", "1.5"]),
    ("RETRYQUEUE_MAX_IN_FLIGHT", "many", ["'many'"]),
    ("RETRYQUEUE_IDLE_TIMEOUT", -1, ["got -1"]),
    ("RETRYQUEUE_IDLE_TIMEOUT", "soon", ["'soon'"]),
    ("RETRYQUEUE_MAX_RECLAIMS", -1, ["got -1"]),
    ("RETRYQUEUE_MAX_RECLAIMS", 2.5, ["2.5"]),
    ("RETRYQUEUE_MAX_RECLAIMS", "x", ["'x'"]),
    ("RETRYQUEUE_EVENTS_MAXLEN", 0, [">= 1", "got 0"]),
    ("RETRYQUEUE_RETRY_AFTER_MAX", -5, ["got -5"]),
    ("RETRYQUEUE_PRIORITY_ADJUST", "high", ["'high'"]),
    ("RETRYQUEUE_ENABLED", "maybe", ["'maybe'"]),
    ("RETRYQUEUE_ENABLED", 2, ["got 2"]),
    ("RETRYQUEUE_FORBIDDEN_LOG_LEVEL", "LOUD", ["'LOUD'"]),
    ("RETRYQUEUE_FORBIDDEN_LOG_LEVEL", 1.5, ["1.5"]),
    ("RETRYQUEUE_DEAD_LOG_LIMIT", -1, ["RETRYQUEUE_DEAD_LOG_LIMIT", "got -1"]),
    ("RETRYQUEUE_DEAD_LOG_LIMIT", 2.5, ["whole number", "2.5"]),
    ("RETRYQUEUE_NODE_ID", 42, ["42"]),
    ("RETRYQUEUE_REDIS_URL", "http://x", ["'http://x'"]),
    ("RETRYQUEUE_REDIS_URL", "localhost:6379", ["'localhost:6379'"]),
]


@pytest.mark.parametrize(
    ("name", "value", "fragments"), BAD, ids=[f"{n}-{v!r}"[:60] for n, v, _ in BAD]
)
def test_bad_value_names_the_setting_and_value(name, value, fragments):
    with pytest.raises(ConfigError) as info:
        _load({name: value})
    message = str(info.value)
    assert name in message
    for fragment in fragments:
        assert fragment in message


def test_lease_shorter_than_three_polls_names_both():
    with pytest.raises(ConfigError) as info:
        _load({"RETRYQUEUE_POLL_INTERVAL": 30})
    message = str(info.value)
    assert "RETRYQUEUE_LEASE_TIME (60.0)" in message
    assert "RETRYQUEUE_POLL_INTERVAL (30)" in message


def test_lease_of_exactly_three_polls_is_fine():
    config = _load({"RETRYQUEUE_POLL_INTERVAL": 2, "RETRYQUEUE_LEASE_TIME": 6})
    assert config.lease_time == 6.0


def test_bad_redis_url_password_is_redacted():
    with pytest.raises(ConfigError) as info:
        _load({"RETRYQUEUE_REDIS_URL": "http://admin:hunter2@cache:6379/0"})
    message = str(info.value)
    assert "hunter2" not in message
    assert "'http://admin:***@cache:6379/0'" in message
    assert "RETRYQUEUE_REDIS_URL" in message


# -- redis_url_from_settings --------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({}, None),
        ({"RETRYQUEUE_REDIS_URL": "redis://a:1/0", "REDIS_URL": "redis://b:2/0"}, "redis://a:1/0"),
        (
            {"RETRYQUEUE_REDIS_URL": "redis://a:1/0", "REDIS_HOST": "h", "REDIS_PORT": 3},
            "redis://a:1/0",
        ),
        ({"REDIS_URL": "rediss://b:2/0", "REDIS_HOST": "h", "REDIS_PORT": 3}, "rediss://b:2/0"),
        ({"REDIS_HOST": "h", "REDIS_PORT": 6380}, "redis://h:6380"),
        ({"REDIS_HOST": "h"}, "redis://h:6379"),
        ({"REDIS_PORT": 7000}, "redis://localhost:7000"),
        ({"RETRYQUEUE_REDIS_URL": "unix:///tmp/redis.sock"}, "unix:///tmp/redis.sock"),
        ({"RETRYQUEUE_REDIS_URL": ""}, None),
    ],
)
def test_redis_url_fallbacks(values, expected):
    assert redis_url_from_settings(Settings(values)) == expected
    assert _load(values).redis_url == expected


def test_bad_scrapy_redis_url_names_redis_url():
    with pytest.raises(ConfigError) as info:
        redis_url_from_settings(Settings({"REDIS_URL": "mysql://u:pw@db/x"}))
    message = str(info.value)
    assert message.startswith("REDIS_URL ")
    assert "'mysql://u:***@db/x'" in message
    assert "pw@" not in message


# -- redact_url -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://h:6379/0", "redis://h:6379/0"),
        ("redis://user:secret@h:6379/0", "redis://user:***@h:6379/0"),
        ("redis://:secret@h/0", "redis://:***@h/0"),
        ("rediss://user:p%40ss@h", "rediss://user:***@h"),
        ("unix:///tmp/r.sock", "unix:///tmp/r.sock"),
        ("redis://user@h", "redis://user@h"),
    ],
)
def test_redact_url(url, expected):
    assert redact_url(url) == expected


# -- config_for ---------------------------------------------------------------------


def test_config_for_validates_once_per_crawler(monkeypatch):
    calls = []
    real = config_module.load_config
    monkeypatch.setattr(config_module, "load_config", lambda s: calls.append(s) or real(s))
    crawler = get_crawler(settings_dict={"RETRYQUEUE_NODE_ID": "n1"})
    other = get_crawler(settings_dict={"RETRYQUEUE_NODE_ID": "n2"})

    first = config_for(crawler)
    assert config_for(crawler) is first
    assert first.node_id == "n1"
    assert config_for(other).node_id == "n2"
    assert len(calls) == 2


def test_config_for_raises_the_same_error_on_every_call(monkeypatch):
    calls = []
    real = config_module.load_config
    monkeypatch.setattr(config_module, "load_config", lambda s: calls.append(s) or real(s))
    crawler = get_crawler(settings_dict={"RETRYQUEUE_POLL_INTERVAL": -1})

    for _ in range(3):
        with pytest.raises(ConfigError, match=r"RETRYQUEUE_POLL_INTERVAL must be > 0, got -1"):
            config_for(crawler)
    assert len(calls) == 1


def test_cluster_nodes_are_read_as_a_list_or_comma_separated_text() -> None:
    as_list = load_config(
        Settings(
            {
                "RETRYQUEUE_REDIS_CLUSTER": True,
                "RETRYQUEUE_REDIS_CLUSTER_NODES": ["10.0.0.2:7000", "node-3.internal:7001"],
            }
        )
    )
    assert as_list.redis_cluster_nodes == (("10.0.0.2", 7000), ("node-3.internal", 7001))
    from_command_line = load_config(
        Settings(
            {
                "RETRYQUEUE_REDIS_CLUSTER": "true",
                "RETRYQUEUE_REDIS_CLUSTER_NODES": "10.0.0.2:7000, 10.0.0.3:7000",
            }
        )
    )
    assert from_command_line.redis_cluster_nodes == (("10.0.0.2", 7000), ("10.0.0.3", 7000))
    as_json = load_config(
        Settings(
            {
                "RETRYQUEUE_REDIS_CLUSTER": True,
                "RETRYQUEUE_REDIS_CLUSTER_NODES": '["10.0.0.2:7000"]',
            }
        )
    )
    assert as_json.redis_cluster_nodes == (("10.0.0.2", 7000),)
    assert load_config(Settings({})).redis_cluster_nodes == ()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"RETRYQUEUE_REDIS_CLUSTER_NODES": ["a:7000"]}, "RETRYQUEUE_REDIS_CLUSTER is False"),
        (
            {"RETRYQUEUE_REDIS_CLUSTER": True, "RETRYQUEUE_REDIS_CLUSTER_NODES": ["a"]},
            "'a' is not a 'host:port' address",
        ),
        (
            {"RETRYQUEUE_REDIS_CLUSTER": True, "RETRYQUEUE_REDIS_CLUSTER_NODES": ["a:99999"]},
            "'a:99999' is not",
        ),
        (
            {"RETRYQUEUE_REDIS_CLUSTER": True, "RETRYQUEUE_REDIS_CLUSTER_NODES": {"a": 1}},
            "must be a list",
        ),
    ],
)
def test_bad_cluster_nodes_are_one_error_naming_the_setting(
    settings: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match="RETRYQUEUE_REDIS_CLUSTER_NODES") as caught:
        load_config(Settings(settings))
    assert message in str(caught.value)
