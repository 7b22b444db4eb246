"""The commands as a person meets them: each subcommand's -h, errors on stderr, one table of
exit codes, a busy dashboard port, and the status of a spider that was never crawled.

Run as a person runs them (``python -m scrapy.cmdline`` in a subprocess, see
tests/storecli.py); the parsers are also read in-process to list every option.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import socket
import subprocess
import sys
import textwrap
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
import redis

from scrapy_retryqueue.commands import deadletters, retryqueue
from scrapy_retryqueue.commands._common import (
    EXIT_CODES,
    CommandFailed,
    one_line_errors,
    subparsers_of,
)
from scrapy_retryqueue.queue.keys import all_keys, keys_for

from .storecli import scrapy
from .waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent
PARSERS = {"deadletters": deadletters.build_parser, "retryqueue": retryqueue.build_parser}
SUBCOMMANDS = [
    (command, name) for command, build in PARSERS.items() for name in subparsers_of(build())
]


def options_of(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]


# -- errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "line"),
    [
        (redis.ConnectionError("Error 111 connecting"), "ConnectionError: Error 111 connecting"),
        (ConnectionRefusedError("refused"), "ConnectionRefusedError: refused"),
    ],
)
def test_a_redis_or_socket_error_becomes_one_line(error: Exception, line: str) -> None:
    with pytest.raises(CommandFailed) as caught, one_line_errors():
        raise error
    assert str(caught.value) == line


def test_a_bug_is_not_turned_into_a_line() -> None:
    with pytest.raises(KeyError), one_line_errors():
        raise KeyError("bug")


# -- help ------------------------------------------------------------------------------


def test_every_subcommand_is_listed() -> None:
    assert SUBCOMMANDS == [
        ("deadletters", "export"),
        ("deadletters", "requeue"),
        ("deadletters", "purge"),
        ("deadletters", "migrate"),
        ("deadletters", "sync"),
        ("retryqueue", "server"),
        ("retryqueue", "status"),
        ("retryqueue", "dashboard"),
        ("retryqueue", "writer"),
        ("retryqueue", "settings"),
        ("retryqueue", "keygen"),
    ]


@pytest.mark.parametrize(("command", "name"), SUBCOMMANDS)
def test_each_option_is_described_with_its_default(command: str, name: str) -> None:
    parser = subparsers_of(PARSERS[command]())[name]
    assert parser.description, f"{command} {name} has no description"
    for action in options_of(parser):
        what = "/".join(action.option_strings) or action.dest
        assert action.help and len(action.help) >= 20, f"{command} {name} {what}: no help"
        takes_value = action.option_strings and action.nargs != 0
        if takes_value and action.dest != "overwrite_output":
            assert "default" in action.help, f"{command} {name} {what}: no default said"


@pytest.mark.parametrize(("command", "name"), SUBCOMMANDS)
def test_scrapy_subcommand_h_shows_that_subcommands_options(
    command: str, name: str, tmp_path: Path
) -> None:
    done = scrapy(command, name, "-h", cwd=tmp_path)
    assert done.code == 0, done.err
    assert done.err == ""
    assert done.out.startswith(f"usage: scrapy {command} {name} ")
    # argparse wraps the help: compare with whitespace folded.
    text = " ".join(done.out.split())
    for action in options_of(subparsers_of(PARSERS[command]())[name]):
        for option in action.option_strings:
            assert option in text, f"{option} missing from `scrapy {command} {name} -h`"
        assert " ".join((action.help or "").split()) in text
    assert "Scrapy's options go with any subcommand" in text


@pytest.mark.parametrize("command", list(PARSERS))
def test_scrapy_command_h_lists_the_subcommands_and_the_exit_codes(
    command: str, tmp_path: Path
) -> None:
    done = scrapy(command, "-h", cwd=tmp_path)
    assert done.code == 0, done.err
    for other, name in SUBCOMMANDS:
        if other == command:
            assert f"scrapy {command} {name}" in done.out
    text = " ".join(done.out.split())
    for code, meaning in EXIT_CODES:
        assert f"{code} {meaning.replace('`', '')}" in text
    assert f"scrapy {command} SUBCOMMAND -h" in done.out
    # Scrapy's global options are still there: "-s NAME=VALUE, --set NAME=VALUE" up to
    # Python 3.12, "-s, --set NAME=VALUE" from 3.13 on.
    assert re.search(r"-s( NAME=VALUE)?, --set NAME=VALUE", done.out), done.out


def test_the_options_the_issue_names_are_explained() -> None:
    export = subparsers_of(deadletters.build_parser())["export"]
    requeue = subparsers_of(deadletters.build_parser())["requeue"]
    purge = subparsers_of(deadletters.build_parser())["purge"]
    helps = {
        (parser.prog.split()[-1], option): " ".join((action.help or "").split())
        for parser in (export, requeue, purge)
        for action in options_of(parser)
        for option in action.option_strings
    }
    assert "retry budget" in helps[("requeue", "--keep-budget")]
    assert "fresh budget" in helps[("requeue", "--keep-budget")]
    assert "without asking" in helps[("purge", "--yes")]
    assert "not a terminal" in helps[("purge", "--yes")]
    assert "at most N rows, the oldest first" in helps[("export", "--limit")]
    assert "at most N dead letters" in helps[("requeue", "--limit")]
    for fmt in ("csv", "jsonl", "json", ".csv", ".jsonl", ".json"):
        assert fmt in helps[("export", "--format")]
    assert "RETRYQUEUE_SECRET_HEADERS" in helps[("export", "--include-secrets")]


# -- exit codes: one table, in the docs and in the code ----------------------------------------


def test_the_docs_list_the_exit_codes_the_code_uses() -> None:
    text = (ROOT / "docs" / "commands.md").read_text()
    section = text[text.index("### Exit codes") :]
    rows = re.findall(r"^\| (\d+) \| (.+) \|$", section, flags=re.M)
    assert [(int(code), meaning) for code, meaning in rows] == list(EXIT_CODES)


# -- errors go to stderr, one line, in every command ---------------------------------------
# (A bad setting, and every argument a subcommand refuses: tests/test_command_refusals.py.)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["retryqueue"], "error: scrapy retryqueue: the following arguments are required"),
        (["retryqueue", "server", "frob"], "argument server_action: invalid choice: 'frob'"),
        (["retryqueue", "status", "--frob"], "unrecognized arguments: --frob"),
        (["deadletters"], "error: scrapy deadletters: the following arguments are required"),
    ],
)
def test_a_usage_error_is_one_line_on_stderr_with_exit_code_2(
    args: list[str], message: str, tmp_path: Path
) -> None:
    done = scrapy(*args, cwd=tmp_path)
    assert done.code == 2
    assert done.out == ""
    assert message in done.err and done.err.count("\n") == 1
    assert "-h)" in done.err  # says where the help is


def test_server_status_of_a_server_that_does_not_run_is_exit_code_3(tmp_path: Path) -> None:
    done = scrapy("retryqueue", "server", "status", cwd=tmp_path)
    assert done.code == 3
    assert done.out == "not running (data in .scrapy/retryqueue)\n"
    assert done.err == ""


# -- the dashboard: a busy port has its own exit code -------------------------------------------


@pytest.fixture
def busy_port() -> Iterator[int]:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    yield taken.getsockname()[1]
    taken.close()


def test_a_busy_dashboard_port_is_one_line_and_exit_code_4(busy_port: int, tmp_path: Path) -> None:
    done = scrapy("retryqueue", "dashboard", "--port", str(busy_port), cwd=tmp_path)
    assert done.code == 4
    assert done.out == ""
    assert done.err == (
        f"error: the dashboard cannot listen on 127.0.0.1:{busy_port}: address already in use "
        "(another dashboard, or another program); choose another port with --port\n"
    )


def test_the_dashboard_on_port_0_says_the_port_it_listens_on_and_stops_on_ctrl_c(
    tmp_path: Path,
) -> None:
    command = [sys.executable, "-m", "scrapy.cmdline", "retryqueue", "dashboard", "--port", "0"]
    server = subprocess.Popen(command, cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    assert server.stderr is not None
    try:
        line = server.stderr.readline()
        found = re.fullmatch(
            r"dashboard on http://127\.0\.0\.1:(\d+)/ \(read-only: no token\)\n", line
        )
        assert found, line
        url = f"http://127.0.0.1:{found.group(1)}/static/app.css"

        def answers() -> bool:
            try:
                with urllib.request.urlopen(url, timeout=2) as reply:
                    return bool(reply.status == 200)
            except OSError:
                return False

        wait_for(answers, "the dashboard to answer", timeout=30)
        server.send_signal(signal.SIGINT)
        assert server.wait(30) == 0
        assert server.stderr.read() == "dashboard stopped\n"
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(10)


# -- status of a spider that was never crawled ----------------------------------------------


@pytest.fixture
def project(tmp_path: Path, redis_client: redis.Redis) -> Iterator[dict[str, Any]]:
    """A Scrapy project with two spiders that were never crawled; its settings point at the
    test Redis and at a SQLite store that does not exist yet."""
    names = [f"one{uuid4().hex[:8]}", f"two{uuid4().hex[:8]}"]
    (tmp_path / "scrapy.cfg").write_text("[settings]\ndefault = proj.settings\n")
    package = tmp_path / "proj"
    (package / "spiders").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "settings.py").write_text('SPIDER_MODULES = ["proj.spiders"]\n')
    (package / "spiders" / "__init__.py").write_text(
        textwrap.dedent(
            f"""
            import scrapy

            class One(scrapy.Spider):
                name = {names[0]!r}

            class Two(scrapy.Spider):
                name = {names[1]!r}
            """
        )
    )
    yield {"dir": tmp_path, "spiders": names}
    for name in names:
        redis_client.delete(*all_keys(keys_for(name)))


def test_status_of_a_spider_of_the_project_that_was_never_crawled_says_nothing_yet(
    project: dict[str, Any], redis_url: str
) -> None:
    one = project["spiders"][0]
    settings = {"RETRYQUEUE_REDIS_URL": redis_url}
    table = scrapy("retryqueue", "status", "--spider", one, cwd=project["dir"], settings=settings)
    assert table.code == 0, table.err
    lines = table.out.splitlines()
    # Zeros from Redis; "-" where nothing can be said (no store yet, no events stream).
    assert lines[1].split() == [one, "0", "0", "0", "0", "-", "-"]
    assert f"note: {one}: nothing recorded yet: it was never crawled with the retry queue" in (
        table.out
    )
    assert "no spider found" not in table.out + table.err

    as_json = scrapy(
        "retryqueue", "status", "--spider", one, "--json", cwd=project["dir"], settings=settings
    )
    assert as_json.code == 0, as_json.err
    shown = json.loads(as_json.out)
    assert shown["nothing_yet"] == [one]
    entry = shown["spiders"][one]
    assert (entry["due"], entry["leased"], entry["dead"], entry["dead_in_redis"]) == (0, 0, 0, 0)
    assert entry["dead_in_store"] is None  # the store does not exist yet: said in a note
    assert any("no store database here" in note for note in shown["notes"])


def test_status_of_a_name_that_is_no_spider_of_the_project_is_exit_code_1(
    project: dict[str, Any], redis_url: str
) -> None:
    one, two = project["spiders"]
    done = scrapy(
        "retryqueue", "status", "--spider", "onne", cwd=project["dir"],
        settings={"RETRYQUEUE_REDIS_URL": redis_url},
    )  # fmt: skip
    assert done.code == 1
    assert done.out == ""
    assert done.err == (
        f"error: no spider named 'onne' in this project (its spiders: {', '.join(sorted([one, two]))})"
        ", and nothing is recorded for it in the queue or the store\n"
    )

    # Asked together with a known one: the known one is shown, the other named in a note.
    both = scrapy(
        "retryqueue", "status", "--spider", f"{one},onne", cwd=project["dir"],
        settings={"RETRYQUEUE_REDIS_URL": redis_url},
    )  # fmt: skip
    assert both.code == 0, both.err
    assert both.out.splitlines()[1].split()[0] == one
    assert "note: no spider named 'onne' in this project" in both.out
