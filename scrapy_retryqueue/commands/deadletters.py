"""``scrapy deadletters``: export, requeue and purge dead letters; migrate the store.

    scrapy deadletters export  [filters] [--format csv|jsonl|json] [-o FILE] [--limit N]
    scrapy deadletters requeue [filters | --id ID ...] [--keep-budget] [--dry-run] [--limit N]
    scrapy deadletters purge   [filters] [--yes]
    scrapy deadletters migrate [--check | --sql]
    scrapy deadletters sync    [--spider NAME ...]

Filters: --spider, --kind, --domain, --http-status, --node (each repeatable or
comma-separated), --since / --until (2024-05-01, 2024-05-01T13:30, today, 7d),
--status (dead by default; all for every task), --id.

Exit codes: 0 done; 1 nothing matched the filters; 2 bad input, or the database
or Redis does not answer (one line on stderr, ``error: ...``).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from scrapy.commands import ScrapyCommand
from sqlalchemy import delete, select

from ..queue import RedisDelayedQueue
from ..store.queries import (
    EXPORT_COLUMNS,
    JSON_COLUMNS,
    TIME_COLUMNS,
    Filters,
    count,
    stream_rows,
)
from ..store.requeue import requeue_columns, requeue_rows
from ..store.sync import EventSync
from ._common import (
    EXIT_NO_MATCH,
    ArgumentParser,
    CommandFailed,
    Context,
    Progress,
    fail_line,
    one_line_errors,
)

FORMATS = ("csv", "jsonl", "json")
#: A cell starting with one of these is a formula to a spreadsheet.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_CHUNK = 500


def escape_cell(value: str) -> str:
    """*value* made inert for spreadsheets (OWASP CSV injection): a leading quote."""
    return "'" + value if value.startswith(_FORMULA_START) else value


_json_str = json.encoder.encode_basestring  # the C string encoder


def _kind(name: str) -> str:
    if name in JSON_COLUMNS:
        return "json"
    if name in TIME_COLUMNS:
        return "time"
    return "value"


_KINDS = [_kind(name) for name in EXPORT_COLUMNS]


def csv_cell(value: Any) -> Any:
    """A value as a CSV cell: text made inert for spreadsheets, None empty."""
    if value is None:
        return ""
    if isinstance(value, str):
        return escape_cell(value)
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def json_value(value: Any, kind: str) -> str:
    """A value as JSON text; JSON columns arrive as JSON text already."""
    if value is None:
        return "null"
    if kind == "json":
        return value
    if isinstance(value, str):
        return _json_str(value)
    if isinstance(value, datetime):
        return f'"{value.isoformat()}"'
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


_KEYS = [_json_str(name) + ":" for name in EXPORT_COLUMNS]


def json_object(row: tuple[Any, ...]) -> str:
    return (
        "{"
        + ",".join(
            key + json_value(value, kind)
            for key, value, kind in zip(_KEYS, row, _KINDS, strict=True)
        )
        + "}"
    )


def write_rows(rows: Iterator[tuple[Any, ...]], fmt: str, out: IO[str], progress: Progress) -> int:
    """Write rows (EXPORT_COLUMNS order) as csv, jsonl or json; returns how many."""
    n = 0
    if fmt == "csv":
        writer = csv.writer(out)
        writer.writerow(EXPORT_COLUMNS)
        for row in rows:
            writer.writerow([csv_cell(value) for value in row])
            n += 1
            progress.advance()
    elif fmt == "jsonl":
        for row in rows:
            out.write(json_object(row))
            out.write("\n")
            n += 1
            progress.advance()
    else:
        out.write("[")
        for row in rows:
            out.write(",\n" if n else "\n")
            out.write(json_object(row))
            n += 1
            progress.advance()
        out.write("\n]\n" if n else "]\n")
    return n


def _filter_options(parser: ArgumentParser, *, ids: bool = True) -> None:
    group = parser.add_argument_group("filters (repeat an option or separate values with commas)")
    group.add_argument("--spider", action="append", default=[], metavar="NAME")
    group.add_argument("--kind", action="append", default=[], metavar="KIND")
    group.add_argument("--domain", action="append", default=[], metavar="HOST",
                       help="the host or any of its subdomains")  # fmt: skip
    group.add_argument("--http-status", action="append", default=[], metavar="CODE")
    group.add_argument("--node", action="append", default=[], metavar="NODE")
    group.add_argument("--since", metavar="WHEN", help="2024-05-01, 2024-05-01T13:30, today, 7d")
    group.add_argument("--until", metavar="WHEN")
    group.add_argument("--status", action="append", default=[], metavar="STATUS",
                       help="dead (default), waiting, retrying, succeeded, cancelled or all")  # fmt: skip
    if ids:
        group.add_argument("--id", action="append", default=[], metavar="ID",
                           help="a row id or a task id (request fingerprint)")  # fmt: skip


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="scrapy deadletters", add_help=False)
    sub = parser.add_subparsers(dest="action", metavar="{export,requeue,purge,migrate,sync}")
    sub.required = True

    export = sub.add_parser("export", add_help=False)
    _filter_options(export)
    export.add_argument("--format", choices=FORMATS, help="default: from the file name, else csv")
    export.add_argument("-o", "--output", default="-", metavar="FILE", help="- for stdout")
    export.add_argument("--limit", type=int, metavar="N")

    requeue = sub.add_parser("requeue", add_help=False)
    _filter_options(requeue)
    requeue.add_argument("--keep-budget", action="store_true")
    requeue.add_argument("--dry-run", action="store_true")
    requeue.add_argument("--limit", type=int, metavar="N")

    purge = sub.add_parser("purge", add_help=False)
    _filter_options(purge)
    purge.add_argument("-y", "--yes", action="store_true")

    migrate = sub.add_parser("migrate", add_help=False)
    migrate.add_argument("--check", action="store_true")
    migrate.add_argument("--sql", action="store_true")

    sync = sub.add_parser("sync", add_help=False)
    sync.add_argument("--spider", action="append", default=[], metavar="NAME")
    return parser


def filters_from(ns: Any) -> Filters:
    return Filters.from_options(
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


class Command(ScrapyCommand):
    requires_project = False
    default_settings = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return "{export,requeue,purge,migrate,sync} [options]"

    def short_desc(self) -> str:
        return "Export, requeue or purge scrapy-retryqueue dead letters"

    def long_desc(self) -> str:
        return (__doc__ or "").split("\n", 2)[2].strip("\n")

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        # The description lists the subcommands line by line: keep its lines.
        parser.formatter_class = argparse.RawDescriptionHelpFormatter

    def run(self, args: list[str], opts: Any) -> None:
        assert self.settings is not None
        context: Context | None = None
        try:
            with one_line_errors():
                ns = build_parser().parse_args(args)
                if getattr(ns, "limit", None) is not None and ns.limit < 1:
                    raise CommandFailed(f"--limit must be >= 1, got {ns.limit}")
                context = Context(self.settings)
                self.exitcode = getattr(self, f"_{ns.action}")(context, ns) or 0
        except CommandFailed as exc:
            print(fail_line(exc), file=sys.stderr)
            self.exitcode = exc.code
        except KeyboardInterrupt:
            print("error: interrupted", file=sys.stderr)
            self.exitcode = 130
        finally:
            if context is not None:
                context.close()

    # -- export ----------------------------------------------------------------

    def _export(self, context: Context, ns: Any) -> int:
        filters = filters_from(ns)
        output = ns.output
        fmt = ns.format
        if fmt is None:
            suffix = Path(output).suffix.lower().lstrip(".") if output != "-" else ""
            fmt = suffix if suffix in FORMATS else "csv"
        store = context.store()
        with store.connect() as conn:
            total = count(conn, filters)
            if ns.limit is not None:
                total = min(total, ns.limit)
            if not total:
                raise CommandFailed(f"no tasks match ({filters.describe()})", EXIT_NO_MATCH)
            progress = Progress(total, "exporting")
            if output == "-":
                out = sys.stdout
                written = write_rows(stream_rows(conn, filters, limit=ns.limit), fmt, out, progress)
                out.flush()
            else:
                target = Path(output)
                part = target.with_name(target.name + ".part")
                try:
                    with open(part, "w", encoding="utf-8", newline="") as out:
                        written = write_rows(
                            stream_rows(conn, filters, limit=ns.limit), fmt, out, progress
                        )
                    os.replace(part, target)
                except BaseException:
                    with contextlib.suppress(OSError):
                        part.unlink()
                    raise
            progress.finish()
        if output != "-":
            print(f"exported {written} task(s) to {output} ({fmt})", file=sys.stderr)
        return 0

    # -- requeue ---------------------------------------------------------------

    def _requeue(self, context: Context, ns: Any) -> int:
        filters = filters_from(ns)
        if filters.statuses != ["dead"]:
            raise CommandFailed("requeue takes dead letters only; leave out --status")
        store = context.store()
        table = store.table
        c = table.c
        with store.connect() as conn:
            total = count(conn, filters)
        if ns.limit is not None:
            total = min(total, ns.limit)
        if not total:
            raise CommandFailed(f"no dead letters match ({filters.describe()})", EXIT_NO_MATCH)
        client = None if ns.dry_run else context.redis()
        queues: dict[str, RedisDelayedQueue] = {}
        moved = skipped = live = seen = 0
        last_id = 0
        progress = Progress(total, "requeueing" if not ns.dry_run else "checking")
        columns = requeue_columns(table)

        def queue_for(spider: str) -> RedisDelayedQueue:
            if spider not in queues:
                queues[spider] = RedisDelayedQueue(client, spider, node_id=context.config.node_id)
            return queues[spider]

        while seen < total:
            with store.connect() as conn:
                rows = conn.execute(
                    select(*columns)
                    .where(filters.where(), c.id > last_id)
                    .order_by(c.id)
                    .limit(min(_CHUNK, total - seen))
                ).all()
            if not rows:
                break
            last_id = rows[-1].id
            seen += len(rows)
            for _ in rows:
                progress.advance()
            if ns.dry_run:
                for row in rows:
                    print(f"{row.id}\t{row.spider}\t{row.kind}\t{row.url}")
                moved += len(rows)
                continue
            done = requeue_rows(
                store,
                rows,
                queue_for=queue_for,
                node_id=context.config.node_id,
                keep_budget=bool(ns.keep_budget),
            )
            moved += done.moved
            live += done.live
            skipped += len(done.malformed)
            for row, exc in done.malformed:
                print(f"skipped {row.id} {row.url or ''}: cannot requeue ({exc})", file=sys.stderr)
        progress.finish()
        verb = "would requeue" if ns.dry_run else "requeued"
        extra = []
        if live:
            extra.append(f"{live} already had a live retry in the queue")
        if skipped:
            extra.append(f"{skipped} skipped (malformed)")
        budget = "" if ns.dry_run else (" (budget kept)" if ns.keep_budget else " (fresh budget)")
        tail = f"; {', '.join(extra)}" if extra else ""
        print(f"{verb} {moved} dead letter(s){budget}{tail}", file=sys.stderr)
        return 0

    # -- purge -----------------------------------------------------------------

    def _purge(self, context: Context, ns: Any) -> int:
        filters = filters_from(ns)
        store = context.store()
        with store.connect() as conn:
            total = count(conn, filters)
        if not total:
            raise CommandFailed(f"no tasks match ({filters.describe()})", EXIT_NO_MATCH)
        what = "dead letter(s)" if filters.statuses == ["dead"] else "task(s)"
        if not ns.yes:
            if not sys.stdin.isatty():
                raise CommandFailed(
                    f"would delete {total} {what} ({filters.describe()}); "
                    "add --yes to confirm (stdin is not a terminal)"
                )
            answer = input(f"Delete {total} {what} ({filters.describe()})? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                print("nothing deleted", file=sys.stderr)
                return 1
        with store.begin() as conn:
            deleted = conn.execute(delete(store.table).where(filters.where())).rowcount
        print(f"deleted {deleted} {what}", file=sys.stderr)
        return 0

    # -- migrate ---------------------------------------------------------------

    def _migrate(self, context: Context, ns: Any) -> int:
        if ns.check and ns.sql:
            raise CommandFailed("--check and --sql do not go together")
        store = context.store(check_schema=False, create=True)
        if ns.sql:
            sys.stdout.write(store.upgrade_sql())
            return 0
        state = store.schema_state()
        if ns.check:
            print(
                f"{store.safe_url}: schema {state.current or 'none'}, code {state.head}: {state.state}"
            )
            return 0 if state.state == "ok" else 1
        if state.state == "ok":
            print(f"{store.safe_url}: schema is up to date ({state.head})", file=sys.stderr)
            return 0
        before, after = store.upgrade()
        print(
            f"{store.safe_url}: schema upgraded from {before or 'empty'} to {after}",
            file=sys.stderr,
        )
        return 0

    # -- sync ------------------------------------------------------------------

    def _sync(self, context: Context, ns: Any) -> int:
        store = context.store(create=True, check_schema=False)
        store.ensure_schema(create=context.store_config.create_schema)
        client = context.redis()
        spiders = [s for value in ns.spider for s in value.split(",") if s]
        if not spiders:
            spiders = sorted(_spiders_with_events(client))
        if not spiders:
            raise CommandFailed("no spider has events in Redis", EXIT_NO_MATCH)
        for spider in spiders:
            sync = EventSync(
                store,
                client,
                spider,
                consumer=f"{context.config.node_id}:sync",
                batch_size=context.store_config.batch_size,
                claim_idle=context.store_config.claim_idle,
                policy_table=context.config.policy_table,
            )
            started = time.monotonic()
            result = sync.drain()
            swept = sync.sweep_dead(older_than_ms=int(time.time() * 1000))
            print(
                f"{spider}: {result.events} event(s) written as {result.rows} row update(s), "
                f"{result.dead_stored + swept} dead letter(s) stored "
                f"({time.monotonic() - started:.1f}s)",
                file=sys.stderr,
            )
        return 0


def _spiders_with_events(client: Any) -> set[str]:
    spiders = set()
    for key in client.scan_iter(match="retryqueue:{*}:events", count=1000):
        name = key.decode() if isinstance(key, bytes) else key
        spiders.add(name[len("retryqueue:{") : -len("}:events")])
    return spiders
