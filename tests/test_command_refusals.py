"""A refused command changes nothing: every subcommand of ``scrapy retryqueue`` and
``scrapy deadletters``, given each argument it refuses, says one line and leaves the disk
as it found it.

Each refusal runs as a person runs it (``python -m scrapy.cmdline``, tests/storecli.py) in
a fresh copy of a minimal project, with no Redis and no database configured: the embedded
server and the SQLite store are what a command would start or create first. The folder
(the project, and the per-user and temporary directories the command is pointed at) is
compared before and after: every file and directory, its type, size, mode and mtime.

The subcommands and their options are read from the commands' own parsers: a new
subcommand, or a new option that takes a value, without a refusal case here fails.
"""

from __future__ import annotations

import argparse
import shutil
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from scrapy_retryqueue.commands import deadletters, retryqueue
from scrapy_retryqueue.commands._common import subparsers_of
from scrapy_retryqueue.queue import embedded

from .storecli import scrapy

PARSERS = {"deadletters": deadletters.build_parser, "retryqueue": retryqueue.build_parser}
#: The project every refusal runs in: the one spider, and settings that name no
#: Redis and no database (the embedded server's and SQLite's defaults).
SPIDER = "one"
PROJECT = {
    "scrapy.cfg": "[settings]\ndefault = proj.settings\n",
    "proj/__init__.py": "",
    "proj/settings.py": 'BOT_NAME = "proj"\nSPIDER_MODULES = ["proj.spiders"]\n',
    "proj/spiders/__init__.py": f"import scrapy\n\n\nclass One(scrapy.Spider):\n    name = {SPIDER!r}\n",
}


@dataclass(frozen=True)
class Refusal:
    #: The arguments after ``scrapy <command> <subcommand>``.
    args: tuple[str, ...]
    #: What the one error line must show: the argument, its value, the reason.
    shows: tuple[str, ...]
    #: Something made in the project before the command runs (a file -o refuses).
    prepare: Callable[[Path], None] | None = None
    #: A value the line must not show (a token, a password).
    secret: str | None = None
    #: A positional argument it refuses (options are found in *args*).
    covers: tuple[str, ...] = ()
    #: stdout may carry the answer (``settings`` shows its table before the error).
    output: bool = False


def _file(name: str, text: str) -> Callable[[Path], None]:
    return lambda project: (project / name).write_text(text)


def _directory(project: Path) -> None:
    (project / "adir").mkdir()


def _symlink(project: Path) -> None:
    (project / "target.csv").write_text("kept\n")
    (project / "link.csv").symlink_to("target.csv")


EMPTY = "holds an empty value"
NO_QUEUE = "cannot name a queue"
#: The filters export, requeue and purge share (one function checks them all).
FILTERS = [
    Refusal(("--spider", "{}"), ("--spider", "'{}'", NO_QUEUE)),
    Refusal(("--kind", "timout"), ("--kind", "'timout'", "is not a kind")),
    Refusal(("--domain", "http://shop.example/"), ("--domain", "'http://shop.example/'")),
    Refusal(("--http-status", "99"), ("--http-status", "'99'", "not an HTTP status")),
    Refusal(("--node", "n1,"), ("--node", "'n1,'", EMPTY)),
    Refusal(("--since", "last tuesday"), ("--since", "'last tuesday'", "not a date")),
    Refusal(("--until", "99999999999d"), ("--until", "'99999999999d'", "out of range")),
    Refusal(("--status", "gone"), ("--status", "'gone'", "is not a status")),
    Refusal(("--id", "x" * 200), ("--id", "x" * 80, "task ids have at most")),
]
#: A setting no crawl accepts: every subcommand refuses it before it opens anything.
BAD_SETTING = ("-s", "RETRYQUEUE_SPOOL_MAX=0")
BAD_SETTING_LINE = "RETRYQUEUE_SPOOL_MAX must be >= 1, got 0"

REFUSALS: dict[tuple[str, str], list[Refusal]] = {
    ("deadletters", "export"): [
        *FILTERS,
        Refusal(("--format", "xml"), ("--format", "'xml'")),
        Refusal(("--limit", "0"), ("--limit", "got 0")),
        Refusal(("-o", "a.csv", "-O", "b.csv"), ("-o/--output", "-O/--overwrite-output")),
        Refusal(("-o", ""), ("--output", "is empty")),
        Refusal(
            ("-o", "dead.json"),
            ("-o", "dead.json", "cannot take more rows"),
            prepare=_file("dead.json", '[{"kept": true}]\n'),
        ),
        Refusal(
            ("-o", "other.csv"),
            ("-o", "other.csv", "csv header"),
            prepare=_file("other.csv", "a,b\n1,2\n"),
        ),
        Refusal(("-O", "adir"), ("-O", "adir", "is a directory"), prepare=_directory),
        Refusal(("-O", "link.csv"), ("-O", "link.csv", "symbolic link"), prepare=_symlink),
        Refusal(("-O", "missing/dead.csv"), ("-O", "missing/dead.csv", "does not exist")),
    ],
    ("deadletters", "requeue"): [
        Refusal(("--spider", ""), ("--spider", "''", EMPTY)),
        Refusal(("--status", "all"), ("--status", "'all'", "dead letters only")),
        Refusal(("--limit", "-1"), ("--limit", "got -1")),
        Refusal(("--force",), ("--force", "forged dead letters only", "--kind forged")),
    ],
    ("deadletters", "purge"): [
        Refusal(("--kind", "timeout,"), ("--kind", "'timeout,'", EMPTY)),
        Refusal(("--status", "waiting", "--yes"), ("--status", "waiting", "still live")),
    ],
    ("deadletters", "migrate"): [
        Refusal(("--check", "--sql"), ("--check", "--sql", "do not go together")),
    ],
    ("deadletters", "sync"): [
        Refusal(("--spider", "a{b}c"), ("--spider", "'a{b}c'", NO_QUEUE)),
        Refusal(("--spider", f"{SPIDER},"), ("--spider", f"'{SPIDER},'", EMPTY)),
    ],
    ("retryqueue", "server"): [
        Refusal(("frob",), ("server_action", "'frob'"), covers=("server_action",)),
    ],
    ("retryqueue", "status"): [
        Refusal(("--spider", "{}"), ("--spider", "'{}'", NO_QUEUE)),
        Refusal(("--spider", f"{SPIDER},,two"), ("--spider", EMPTY)),
    ],
    ("retryqueue", "dashboard"): [
        Refusal(("--host", "a..b"), ("--host", "'a..b'")),
        Refusal(("--host", "0.0.0.0"), ("0.0.0.0", "without a token", "--token")),
        Refusal(("--port", "70000"), ("--port", "70000")),
        Refusal(("--token", "sh0rt"), ("--token", "8 characters"), secret="sh0rt"),
        Refusal(
            ("--redis-url", "ftp://me:hunter2@cache"),
            ("--redis-url", "'ftp://me:***@cache'"),
            secret="hunter2",
        ),
        Refusal(("--database-url", "mysql://db/x"), ("--database-url", "'mysql://db/x'")),
    ],
    ("retryqueue", "writer"): [
        Refusal(("--spider", "{}"), ("--spider", "'{}'", NO_QUEUE)),
        Refusal(("--rescan", "nan"), ("--rescan", "got nan")),
        Refusal(("--consumer", ""), ("--consumer", "is empty")),
    ],
    ("retryqueue", "settings"): [
        Refusal(("--spider", "{}"), ("--spider", "'{}'", NO_QUEUE)),
        Refusal(("--spider", "nobody"), ("--spider", "'nobody'", f"its spiders: {SPIDER}")),
        Refusal(("--spider", f"{SPIDER},two"), ("--spider", "one spider at a time")),
    ],
    # No option; a bad setting is refused as by every subcommand (below).
    ("retryqueue", "keygen"): [],
}
#: Subcommands whose filter options are checked by the same code as export's, before
#: anything is opened: a few of their own cases show the order, export's show the rest.
SAME_FILTERS = {("deadletters", "requeue"), ("deadletters", "purge")}
FILTER_OPTIONS = frozenset(
    {"--spider", "--kind", "--domain", "--http-status", "--node", "--since", "--until",
     "--status", "--id"}
)  # fmt: skip


def value_options(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    """The arguments of *parser* that take a value: what a person can get wrong."""
    for action in parser._actions:
        if not isinstance(action, argparse._HelpAction) and action.nargs != 0:
            yield action


def _uncovered(command: str, name: str, parser: argparse.ArgumentParser) -> list[str]:
    cases = REFUSALS.get((command, name), [])
    missing = []
    for action in value_options(parser):
        if any(action.dest in case.covers for case in cases):
            continue
        if any(option in case.args for option in action.option_strings for case in cases):
            continue
        if (command, name) in SAME_FILTERS and set(action.option_strings) & FILTER_OPTIONS:
            continue
        missing.append("/".join(action.option_strings) or action.dest)
    return missing


def _cases() -> Iterator[object]:
    for command, build in PARSERS.items():
        for name, parser in subparsers_of(build()).items():
            where = (command, name)
            missing = _uncovered(command, name, parser)
            if where not in REFUSALS or missing:
                yield pytest.param(where, None, id=f"{command}-{name}-MISSING")
                continue
            server = ("status",) if name == "server" else ()  # needs its action
            bad = Refusal((*server, *BAD_SETTING), (BAD_SETTING_LINE,), output=name == "settings")
            for n, case in enumerate([*REFUSALS[where], bad]):
                yield pytest.param(where, case, id=f"{command}-{name}-{n}")


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("refusal-project")
    for name, text in PROJECT.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def snapshot(root: Path) -> dict[str, tuple[int, int, int, int]]:
    """Every entry under *root* (itself included): type and mode, size, mtime."""
    entries = {}
    for path in [root, *sorted(root.rglob("*"))]:
        st = path.lstat()
        size = 0 if stat.S_ISDIR(st.st_mode) else st.st_size
        entries[str(path.relative_to(root))] = (st.st_mode, size, st.st_mtime_ns, st.st_nlink)
    return entries


@pytest.mark.parametrize(("where", "case"), list(_cases()))
def test_a_refused_command_says_one_line_and_changes_nothing(
    where: tuple[str, str], case: Refusal | None, template: Path, tmp_path: Path
) -> None:
    command, name = where
    if case is None:
        parser = subparsers_of(PARSERS[command]())[name]
        missing = _uncovered(command, name, parser) or ["any argument"]
        pytest.fail(f"no refusal case for `scrapy {command} {name}`: {', '.join(missing)}")
    project = tmp_path / "project"
    shutil.copytree(template, project, symlinks=True)
    # Where a command could write outside the project: the per-user directory (no
    # scrapy.cfg in reach) and the temporary one (a long socket path).
    (tmp_path / "data").mkdir()
    (tmp_path / "tmp").mkdir()
    if case.prepare is not None:
        case.prepare(project)
    env = {
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "TMPDIR": str(tmp_path / "tmp"),
        # Python's bytecode cache of the project's modules is Python's, not the command's.
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    before = snapshot(tmp_path)
    try:
        done = scrapy(command, name, *case.args, cwd=project, env=env)
    finally:
        # A command that started the embedded server after all: stop it, then fail.
        state = project / ".scrapy" / "retryqueue"
        if (state / embedded.PID_NAME).exists():
            embedded.stop_server(state)
    shown = f"`scrapy {command} {name} {' '.join(case.args)}`"
    assert done.code == 2, f"{shown} exited with {done.code}: {done.err}"
    assert done.err.startswith("error: ") and done.err.count("\n") == 1, f"{shown}: {done.err!r}"
    assert "Traceback" not in done.err
    for text in case.shows:
        assert text in done.err, f"{shown}: {text!r} not in {done.err!r}"
    if case.secret is not None:
        assert case.secret not in done.err + done.out
    if not case.output:
        assert done.out == "", f"{shown} wrote to stdout: {done.out!r}"
    assert snapshot(tmp_path) == before, f"{shown} changed the disk"


def test_every_subcommand_is_enumerated_from_the_parsers() -> None:
    """The cases above come from the parsers: a subcommand the parsers have and the
    table lacks is a failing case, and so is a table entry no parser has."""
    subcommands = {(c, n) for c, build in PARSERS.items() for n in subparsers_of(build())}
    assert set(REFUSALS) == subcommands
    ids = [where for where, _case in (p.values for p in _cases())]  # type: ignore[attr-defined]
    assert set(ids) == subcommands
