"""The arguments of ``scrapy deadletters``: its parser, each subcommand's options, the filters.

The options are read here into what the subcommands run with, and refused here
when they cannot be used: before the command opens the store or Redis
(commands/_args.py). Imported with the command, so nothing of the store is
imported at the top: Scrapy imports every command's module whenever it runs.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ..decision.kinds import BUILTIN_TABLE
from ._args import spider_names, split_values
from ._common import ArgumentParser, CommandFailed, exit_codes_text, subcommand_parser

if TYPE_CHECKING:
    from ..config import Config
    from ..store.filters import Filters

#: The command's help: its subcommands, then the filters they share.
DESCRIPTION = """\
    scrapy deadletters export  [filters] [--format csv|jsonl|json] [-o FILE | -O FILE]
                               [--limit N] [--include-secrets]
    scrapy deadletters requeue [filters] [--keep-budget] [--dry-run] [--limit N]
    scrapy deadletters purge   [filters] [--yes]
    scrapy deadletters migrate [--check | --sql]
    scrapy deadletters sync    [--spider NAME ...]

Filters: --spider, --kind, --domain, --http-status, --node (each repeatable or
comma-separated), --since / --until (2024-05-01, 2024-05-01T13:30, today, 7d),
--status (dead by default; all for every task), --id.

Each subcommand describes its options: scrapy deadletters SUBCOMMAND -h."""

GLOBAL_OPTIONS = (
    "Scrapy's options go with any subcommand: -s NAME=VALUE sets a setting (e.g.\n"
    "-s RETRYQUEUE_DATABASE_URL=postgresql://user@host/db), -L LEVEL and --logfile FILE\n"
    "turn the log on. See scrapy deadletters -h."
)


def _filter_options(
    parser: argparse.ArgumentParser, *, ids: bool = True, statuses: str = "export"
) -> None:
    group = parser.add_argument_group(
        "filters",
        "Which rows of the store: every filter given must match. Repeat an option, or\n"
        "separate values with commas, to match any of several values.",
    )
    group.add_argument("--spider", action="append", default=[], metavar="NAME",
                       help="the spider (default: every spider)")  # fmt: skip
    group.add_argument("--kind", action="append", default=[], metavar="KIND",
                       help="the failure kind, one of: " + ", ".join(BUILTIN_TABLE.names)
                       + ", or one the project declares in RETRYQUEUE_KINDS "
                       "(default: every kind)")  # fmt: skip
    group.add_argument("--domain", action="append", default=[], metavar="HOST",
                       help="the host or any of its subdomains: shop.example matches "
                       "www.shop.example (default: every host)")  # fmt: skip
    group.add_argument("--http-status", action="append", default=[], metavar="CODE",
                       help="the HTTP status of the last failure, e.g. 503 (default: any, "
                       "and none)")  # fmt: skip
    group.add_argument("--node", action="append", default=[], metavar="NODE",
                       help="the node that wrote the task's last event (default: any)")  # fmt: skip
    group.add_argument("--since", metavar="WHEN",
                       help="died at or after WHEN (other statuses: last updated): 2024-05-01, "
                       "2024-05-01T13:30 (local time), 2024-05-01T13:30Z, today, yesterday, or "
                       "7d / 12h / 30m / 2w ago (default: no lower bound)")  # fmt: skip
    group.add_argument("--until", metavar="WHEN",
                       help="died before WHEN, same forms as --since (default: no upper "
                       "bound)")  # fmt: skip
    if statuses == "export":
        status_help = (
            "the task's status: dead (the default), waiting, retrying, succeeded, cancelled, or all"
        )
    else:
        status_help = "dead (the default): only dead letters can be requeued"
    group.add_argument("--status", action="append", default=[], metavar="STATUS",
                       help=status_help)  # fmt: skip
    if ids:
        group.add_argument("--id", action="append", default=[], metavar="ID",
                           help="a row id (the store's id column) or a task id, the request "
                           "fingerprint (default: any)")  # fmt: skip


def build_parser() -> ArgumentParser:
    from ..store.export import FORMATS

    parser = ArgumentParser(
        prog="scrapy deadletters",
        description=DESCRIPTION,
        epilog=exit_codes_text(),
    )
    sub = parser.add_subparsers(
        dest="action", metavar="{export,requeue,purge,migrate,sync}", parser_class=ArgumentParser
    )
    sub.required = True

    export = subcommand_parser(
        sub,
        "export",
        summary="Write the store's dead letters (or other tasks) as CSV, JSON lines or JSON.",
        description=(
            "Rows come in id order (oldest first) and stream in constant memory. Without\n"
            "-o or -O they go to stdout. CSV cells a spreadsheet would run as a formula\n"
            "get a leading '. The values of secret request headers are masked (***)\n"
            "unless --include-secrets is given."
        ),
        epilog=GLOBAL_OPTIONS,
    )
    _filter_options(export)
    output = export.add_argument_group("output")
    target = output.add_mutually_exclusive_group()
    target.add_argument("-o", "--output", metavar="FILE",
                        help="append to FILE, created if missing: csv rows go after the "
                        "existing ones without a second header, jsonl lines after the last "
                        "line; json cannot be appended to (use -O). - is stdout. "
                        "(default: stdout)")  # fmt: skip
    target.add_argument("-O", "--overwrite-output", metavar="FILE",
                        help="write FILE, replacing it: written to a temporary file beside "
                        "it and renamed when complete, so FILE is never half written. FILE "
                        "(with -o too) must be a regular file or not exist: a symlink, FIFO, "
                        "device or directory is refused")  # fmt: skip
    output.add_argument("--format", choices=FORMATS,
                        help="csv (one row per task, a header first), jsonl (one JSON "
                        "object per line) or json (one array) (default: from the file "
                        "name's extension, .csv, .jsonl or .json, else csv)")  # fmt: skip
    output.add_argument("--limit", type=int, metavar="N",
                        help="export at most N rows, the oldest first (default: every "
                        "matching row)")  # fmt: skip
    output.add_argument("--include-secrets", action="store_true",
                        help="write the values of secret request headers (the "
                        "RETRYQUEUE_SECRET_HEADERS setting: Authorization, Cookie, "
                        "Proxy-Authorization, X-Api-Key... by default) and cookies as "
                        "stored; by "
                        "default they read ***")  # fmt: skip

    requeue = subcommand_parser(
        sub,
        "requeue",
        summary="Put dead letters back in the Redis queue, due now.",
        description=(
            "Each goes back through the queue's own schedule operation; its row becomes\n"
            "waiting and keeps its failure history. A request that already has a live\n"
            "retry in the queue is left alone; a malformed dead letter (no request to\n"
            "rebuild) is skipped and named; a forged one (an entry the crawl refused,\n"
            "RETRYQUEUE_SIGNING_KEYS) is skipped unless asked with --kind forged --force."
        ),
        epilog=GLOBAL_OPTIONS,
    )
    _filter_options(requeue, statuses="requeue")
    requeue.add_argument("--keep-budget", action="store_true",
                         help="keep the retries the task already spent, so it gets only "
                         "what is left of its retry budget (the policy's max_retries for "
                         "its kind): a task that died of an exhausted budget dies again at "
                         "its next failure (default: a fresh budget, its attempts reset to "
                         "0)")  # fmt: skip
    requeue.add_argument("--force", action="store_true",
                         help="with --kind forged only: put back the entries the crawl "
                         "refused as forged (RETRYQUEUE_SIGNING_KEYS), each as the task it "
                         "claims to be, signed now: you vouch for them (default: forged "
                         "dead letters are never requeued)")  # fmt: skip
    requeue.add_argument("--dry-run", action="store_true",
                         help="list what would be requeued (row id, spider, kind, url; one "
                         "per line on stdout) and change nothing")  # fmt: skip
    requeue.add_argument("--limit", type=int, metavar="N",
                         help="requeue at most N dead letters, the oldest first (default: "
                         "every match)")  # fmt: skip

    purge = subcommand_parser(
        sub,
        "purge",
        summary="Delete matching rows from the store, after a confirmation.",
        description=(
            "Asks `Delete 12 dead letter(s) (status=dead kind=not_found)? [y/N]` on a\n"
            "terminal; anything but y or yes, or the end of input (Ctrl-D), deletes nothing\n"
            "(exit code 5). Without a terminal it needs --yes."
        ),
        epilog=GLOBAL_OPTIONS,
    )
    _filter_options(purge)
    purge.add_argument("-y", "--yes", action="store_true",
                       help="delete without asking; needed when stdin is not a terminal "
                       "(default: ask)")  # fmt: skip

    migrate = subcommand_parser(
        sub,
        "migrate",
        summary="Create or upgrade the store's schema (its Alembic migrations).",
        description="Without an option: apply the migrations the database lacks.",
        epilog=GLOBAL_OPTIONS,
    )
    migrate.add_argument("--check", action="store_true",
                         help="only say whether the schema is up to date (exit code 1 when "
                         "it is not) and change nothing")  # fmt: skip
    migrate.add_argument("--sql", action="store_true",
                         help="print the SQL the migrations run on an empty database, for a "
                         "DBA, and change nothing")  # fmt: skip

    sync = subcommand_parser(
        sub,
        "sync",
        summary="Write the events waiting in Redis into the store now.",
        description=(
            "For spiders whose crawl did not (the store was disabled, or its database was\n"
            "down when the crawl ended); their leftover dead letters are stored too."
        ),
        epilog=GLOBAL_OPTIONS,
    )
    sync.add_argument("--spider", action="append", default=[], metavar="NAME",
                      help="only this spider; repeat, or separate names with commas "
                      "(default: every spider with events in Redis)")  # fmt: skip
    return parser


#: The filter options that repeat (or take comma-separated values).
_LISTED = ("spider", "kind", "domain", "http_status", "node", "status", "id")


def filters_from(ns: Any, config: Config) -> Filters:
    """The filters the options ask for; CommandFailed or FilterError for one that
    cannot be used. Reads nothing but the options and the project's kinds."""
    from ..store.filters import Filters

    for option in _LISTED:
        # An empty value is an error: dropped, it would match everything
        # (``purge --spider "$UNSET" --yes`` would delete every spider's dead letters).
        split_values("--" + option.replace("_", "-"), getattr(ns, option, None) or [])
    # A name no queue can have was never crawled: said as such, not as "no match".
    spider_names(ns.spider)
    for option in ("since", "until"):
        value = getattr(ns, option, None)
        if value is not None and not value.strip():
            raise CommandFailed(f"--{option} is empty; give a time, or leave --{option} out")
    return Filters.from_options(
        # The project's own kinds (RETRYQUEUE_KINDS) are kinds here too.
        known_kinds=config.kinds.names,
        spiders=ns.spider,
        kinds=ns.kind,
        domains=ns.domain,
        http_statuses=ns.http_status,
        nodes=ns.node,
        since=ns.since,
        until=ns.until,
        statuses=ns.status or ["dead"],
        ids=getattr(ns, "id", []),
    )
