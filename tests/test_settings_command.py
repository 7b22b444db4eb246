"""``scrapy retryqueue settings``: each setting's value and source, secrets masked, as a
table or JSON, all of them or only the changed ones; a bad one is the crawl's one line.

The command runs as a person runs it (a subprocess in a project, tests/storecli.py);
the masking and the priority names are also checked in-process.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
from scrapy.settings import Settings

from scrapy_retryqueue.commands import _settings
from scrapy_retryqueue.commands._settings import masked, source_of
from scrapy_retryqueue.config import load_config
from scrapy_retryqueue.exceptions import ConfigError
from scrapy_retryqueue.secure.encryption import generate_key
from scrapy_retryqueue.settings.defaults import SETTINGS

from .storecli import Result, scrapy

ROOT = Path(__file__).resolve().parent.parent
KEY = generate_key()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project whose settings.py sets some settings (a password among them), with a
    spider whose custom_settings set one more."""
    (tmp_path / "scrapy.cfg").write_text("[settings]\ndefault = proj.settings\n")
    (tmp_path / "proj" / "spiders").mkdir(parents=True)
    (tmp_path / "proj" / "__init__.py").write_text("")
    (tmp_path / "proj" / "settings.py").write_text(
        textwrap.dedent(
            """
            BOT_NAME = "shop"
            SPIDER_MODULES = ["proj.spiders"]
            RETRYQUEUE_DATABASE_URL = "postgresql://app:hunter2@db.example/dead?sslpassword=pem2"
            RETRYQUEUE_POLL_INTERVAL = 2.0
            RETRY_TIMES = 5
            REDIS_PARAMS = {"password": "redis-pw", "socket_timeout": 3}
            """
        )
    )
    (tmp_path / "proj" / "spiders" / "__init__.py").write_text(
        textwrap.dedent(
            f"""
            import scrapy

            class One(scrapy.Spider):
                name = "one"
                custom_settings = {{"RETRYQUEUE_LEASE_TIME": 90.0,
                                   "RETRYQUEUE_ENCRYPTION_KEYS": [{KEY!r}]}}
            """
        )
    )
    return tmp_path


SECRETS = ("hunter2", "pem2", "redis-pw", KEY, "tok-en-123456")


def run(project: Path, *args: str, env: dict[str, str] | None = None) -> Result:
    done = scrapy("retryqueue", "settings", *args, cwd=project, env=env)
    for secret in SECRETS:
        assert secret not in done.out + done.err, f"{secret!r} shown"
    return done


def table(out: str) -> dict[str, tuple[str, str]]:
    """The table's rows: setting -> (from, value)."""
    rows = {}
    for line in out.splitlines():
        found = re.fullmatch(r"([A-Z_]+)\s+(\S+)\s+(.*)", line)
        if found and found.group(1) != "setting":
            rows[found.group(1)] = (found.group(2), found.group(3))
    return rows


def test_the_table_says_each_settings_value_and_where_it_came_from(project: Path) -> None:
    done = run(
        project, "-s", "RETRYQUEUE_SPOOL_MAX=5", "-s", "RETRYQUEUE_DASHBOARD_TOKEN=tok-en-123456"
    )
    assert done.code == 0, done.err
    assert done.err == ""
    rows = table(done.out)
    assert set(SETTINGS) <= set(rows)
    assert rows["RETRYQUEUE_ENABLED"] == ("default", "True")
    assert rows["RETRYQUEUE_POLL_INTERVAL"] == ("project", "2.0")
    # -s gives text: shown as Scrapy holds it.
    assert rows["RETRYQUEUE_SPOOL_MAX"] == ("cmdline", "'5'")
    assert rows["RETRYQUEUE_DASHBOARD_TOKEN"] == ("cmdline", "***")
    assert rows["RETRYQUEUE_DATABASE_URL"] == (
        "project",
        "'postgresql://app:***@db.example/dead?sslpassword=***'",
    )
    # What an unset setting means in the crawl is said beside it.
    assert rows["RETRYQUEUE_NAMESPACE"] == ("default", "None  (in use: shop)")
    assert rows["RETRYQUEUE_MAX_IN_FLIGHT"] == ("default", "None  (in use: 16)")
    # Scrapy's and scrapy-redis's settings the add-on reads: those the project set.
    assert rows["RETRY_TIMES"] == ("project", "5")
    assert rows["REDIS_PARAMS"] == ("project", "{'password': '***', 'socket_timeout': 3}")
    assert "RETRY_HTTP_CODES" not in rows  # Scrapy's default, not the project's


def test_json_changed_and_a_spider_s_custom_settings(project: Path) -> None:
    done = run(
        project, "--json", "--changed", "--spider", "one", "-s", "RETRY_PRIORITY_ADJUST=-1",
        env={"RETRYQUEUE_DASHBOARD_TOKEN": "tok-en-123456"},
    )  # fmt: skip
    assert done.code == 0, done.err
    shown = json.loads(done.out)
    assert shown["error"] is None
    assert {name: e["source"] for name, e in shown["settings"].items()} == {
        "RETRYQUEUE_DATABASE_URL": "project",
        "RETRYQUEUE_POLL_INTERVAL": "project",
        "RETRYQUEUE_LEASE_TIME": "spider",
        "RETRYQUEUE_ENCRYPTION_KEYS": "spider",
        # `scrapy retryqueue dashboard` takes the token from the environment first.
        "RETRYQUEUE_DASHBOARD_TOKEN": "environment",
    }
    lease = shown["settings"]["RETRYQUEUE_LEASE_TIME"]
    assert (lease["value"], lease["default"]) == (90.0, SETTINGS["RETRYQUEUE_LEASE_TIME"])
    assert shown["settings"]["RETRYQUEUE_ENCRYPTION_KEYS"]["value"] == ["***"]
    assert shown["settings"]["RETRYQUEUE_DASHBOARD_TOKEN"]["value"] == "***"
    database = shown["settings"]["RETRYQUEUE_DATABASE_URL"]
    assert database["resolved"] == database["value"]
    assert shown["scrapy"]["RETRY_PRIORITY_ADJUST"] == {"source": "cmdline", "value": "-1"}
    assert shown["scrapy"]["RETRY_TIMES"] == {"source": "project", "value": 5}
    # What the add-on does with RETRY_* differently from Scrapy is said.
    assert any(note.startswith("RETRY_PRIORITY_ADJUST = -1") for note in shown["notes"])

    everything = json.loads(run(project, "--json").out)
    assert set(everything["settings"]) == set(SETTINGS)
    assert everything["settings"]["RETRYQUEUE_LEASE_TIME"]["source"] == "default"


def test_a_bad_setting_is_the_crawls_line_after_the_table(project: Path) -> None:
    done = run(project, "-s", "RETRYQUEUE_LEASE_TIME=1")
    with pytest.raises(ConfigError) as crawl:
        # What a crawl of the project with -s RETRYQUEUE_LEASE_TIME=1 says.
        load_config(Settings({"RETRYQUEUE_POLL_INTERVAL": 2.0, "RETRYQUEUE_LEASE_TIME": "1"}))
    assert done.code == 2
    assert done.err == f"error: {crawl.value}\n"
    assert table(done.out)["RETRYQUEUE_LEASE_TIME"] == ("cmdline", "'1'")
    as_json = run(project, "--json", "-s", "RETRYQUEUE_LEASE_TIME=1")
    assert as_json.code == 2
    assert json.loads(as_json.out)["error"] == str(crawl.value)


# -- in-process: the priority names and the masking -------------------------------------------


def test_each_priority_is_named_as_scrapy_names_it() -> None:
    settings = Settings()
    for name in ("default", "command", "addon", "project", "spider", "cmdline"):
        settings.set(f"RETRYQUEUE_{name.upper()}", 1, priority=name)
        assert source_of(settings, f"RETRYQUEUE_{name.upper()}") == name
    settings.set("RETRYQUEUE_ODD", 1, priority=25)
    assert source_of(settings, "RETRYQUEUE_ODD") == "priority 25"
    assert source_of(settings, "RETRYQUEUE_UNSET") == "default"


@pytest.mark.parametrize(
    ("name", "value", "shown"),
    [
        ("RETRYQUEUE_REDIS_URL", "redis://u:p@ss@h:6379/0", "redis://u:***@h:6379/0"),
        ("RETRYQUEUE_REDIS_URL", "redis://:pw@h/0?password=pw2", "redis://:***@h/0?password=***"),
        ("REDIS_URL", "rediss://h/0?db=1&auth_token=t", "rediss://h/0?db=1&auth_token=***"),
        ("RETRYQUEUE_DATABASE_URL", "postgresql://h/db", "postgresql://h/db"),
        ("RETRYQUEUE_DASHBOARD_TOKEN", "long-secret", "***"),
        ("RETRYQUEUE_DASHBOARD_TOKEN", None, None),
        ("RETRYQUEUE_ENCRYPTION_KEYS", "k1,k2", "***"),
        ("RETRYQUEUE_ENCRYPTION_KEYS", ["k1", "k2"], ["***", "***"]),
        ("RETRYQUEUE_ENCRYPTION_KEYS", [], []),
        ("REDIS_PARAMS", {"password": "x", "url": "redis://a:b@h"}, {"password": "***", "url": "redis://a:***@h"}),
        ("REDIS_PARAMS", '{"ssl_password": "x", "db": 2}', {"ssl_password": "***", "db": 2}),
        ("REDIS_PARAMS", "password=x", "***"),
        # Only redis-py's arguments are read as secrets: a host named so is a host.
        ("RETRYQUEUE_DOMAIN_POLICIES", {"bypass.example": {"token": {}}}, {"bypass.example": {"token": {}}}),
        ("RETRYQUEUE_RETRY_HOOK", Settings, "scrapy.settings.Settings"),
        ("RETRYQUEUE_SECRET_HEADERS", {"B", "A"}, ["A", "B"]),
    ],
)  # fmt: skip
def test_what_may_be_shown_of_a_value(name: str, value: Any, shown: Any) -> None:
    assert masked(name, value) == shown


def test_the_scrapy_settings_listed_are_those_the_add_on_maps() -> None:
    source = (ROOT / "scrapy_retryqueue" / "config" / "scrapycompat.py").read_text()
    assert set(_settings.SCRAPY_RETRY_SETTINGS) == set(re.findall(r'"(RETRY_[A-Z_]+)"', source))
