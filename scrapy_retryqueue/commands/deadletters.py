"""``scrapy deadletters``: export, requeue and purge dead letters; migrate and sync the store.

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
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy.commands import ScrapyCommand

from ._common import (
    EXIT_NO_MATCH,
    ArgumentParser,
    CommandFailed,
    Progress,
    fail_line,
    one_line_errors,
)

if TYPE_CHECKING:
    from ..sources import Sources
    from ..store.queries import Filters


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
    from ..store.export import FORMATS

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
    from ..store.queries import Filters

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


def _count(sources: Sources, filters: Filters) -> int:
    from ..store.queries import count

    with sources.store().connect() as conn:
        return count(conn, filters)


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
        sources: Sources | None = None
        try:
            with one_line_errors():
                from ..sources import Sources

                ns = build_parser().parse_args(args)
                if getattr(ns, "limit", None) is not None and ns.limit < 1:
                    raise CommandFailed(f"--limit must be >= 1, got {ns.limit}")
                sources = Sources(self.settings)
                self.exitcode = getattr(self, f"_{ns.action}")(sources, ns) or 0
        except CommandFailed as exc:
            print(fail_line(exc), file=sys.stderr)
            self.exitcode = exc.code
        except KeyboardInterrupt:
            print("error: interrupted", file=sys.stderr)
            self.exitcode = 130
        finally:
            if sources is not None:
                sources.close()

    # -- export ----------------------------------------------------------------

    def _export(self, sources: Sources, ns: Any) -> int:
        from ..store.export import FORMATS, write_rows
        from ..store.queries import count, stream_rows

        filters = filters_from(ns)
        output = ns.output
        fmt = ns.format
        if fmt is None:
            suffix = Path(output).suffix.lower().lstrip(".") if output != "-" else ""
            fmt = suffix if suffix in FORMATS else "csv"
        store = sources.store()
        with store.connect() as conn:
            total = count(conn, filters)
            if ns.limit is not None:
                total = min(total, ns.limit)
            if not total:
                raise CommandFailed(f"no tasks match ({filters.describe()})", EXIT_NO_MATCH)
            progress = Progress(total, "exporting")
            rows = stream_rows(conn, filters, limit=ns.limit)
            if output == "-":
                out = sys.stdout
                written = write_rows(rows, fmt, out, progress.advance)
                out.flush()
            else:
                target = Path(output)
                part = target.with_name(target.name + ".part")
                try:
                    with open(part, "w", encoding="utf-8", newline="") as out:
                        written = write_rows(rows, fmt, out, progress.advance)
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

    def _requeue(self, sources: Sources, ns: Any) -> int:
        from ..store import actions
        from ..store.queries import chunks

        filters = filters_from(ns)
        if filters.statuses != ["dead"]:
            raise CommandFailed("requeue takes dead letters only; leave out --status")
        total = _count(sources, filters)
        if ns.limit is not None:
            total = min(total, ns.limit)
        if not total:
            raise CommandFailed(f"no dead letters match ({filters.describe()})", EXIT_NO_MATCH)
        if ns.dry_run:
            progress = Progress(total, "checking")
            store = sources.store()
            c = store.table.c
            for rows in chunks(store, filters, (c.spider, c.kind, c.url), limit=total):
                progress.advance(len(rows))
                for row in rows:
                    print(f"{row.id}\t{row.spider}\t{row.kind}\t{row.url}")
            progress.finish()
            print(f"would requeue {progress.done} dead letter(s)", file=sys.stderr)
            return 0
        client = sources.redis()
        progress = Progress(total, "requeueing")
        done = actions.requeue(
            sources.store(),
            client,
            filters,
            node_id=sources.config.node_id,
            events_maxlen=sources.config.events_maxlen,
            keep_budget=bool(ns.keep_budget),
            limit=total,
            on_chunk=progress.advance,
        )
        progress.finish()
        for bad in done.malformed:
            print(
                f"skipped {bad.row_id} {bad.url or ''}: cannot requeue ({bad.reason})",
                file=sys.stderr,
            )
        extra = []
        if done.live:
            extra.append(f"{done.live} already had a live retry in the queue")
        if done.malformed:
            extra.append(f"{len(done.malformed)} skipped (malformed)")
        budget = " (budget kept)" if ns.keep_budget else " (fresh budget)"
        tail = f"; {', '.join(extra)}" if extra else ""
        print(f"requeued {done.moved} dead letter(s){budget}{tail}", file=sys.stderr)
        return 0

    # -- purge -----------------------------------------------------------------

    def _purge(self, sources: Sources, ns: Any) -> int:
        from ..store import actions

        filters = filters_from(ns)
        total = _count(sources, filters)
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
        deleted = actions.purge(sources.store(), filters)
        print(f"deleted {deleted} {what}", file=sys.stderr)
        return 0

    # -- migrate ---------------------------------------------------------------

    def _migrate(self, sources: Sources, ns: Any) -> int:
        if ns.check and ns.sql:
            raise CommandFailed("--check and --sql do not go together")
        store = sources.store(check_schema=False, create=True)
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

    def _sync(self, sources: Sources, ns: Any) -> int:
        from .. import view
        from ..store.sync import EventSync
        from ..values import now_ms

        store = sources.store(create=True, check_schema=False)
        store.ensure_schema(create=sources.store_config.create_schema)
        client = sources.redis()
        spiders = [s for value in ns.spider for s in value.split(",") if s]
        if not spiders:
            spiders = sorted(view.spiders_with_events(client))
        if not spiders:
            raise CommandFailed("no spider has events in Redis", EXIT_NO_MATCH)
        for spider in spiders:
            sync = EventSync(
                store,
                client,
                spider,
                consumer=f"{sources.config.node_id}:sync",
                batch_size=sources.store_config.batch_size,
                claim_idle=sources.store_config.claim_idle,
                policy_table=sources.config.policy_table,
            )
            started = time.monotonic()
            result = sync.drain()
            swept = sync.sweep_dead(older_than_ms=now_ms())
            print(
                f"{spider}: {result.events} event(s) written as {result.rows} row update(s), "
                f"{result.dead_stored + swept} dead letter(s) stored "
                f"({time.monotonic() - started:.1f}s)",
                file=sys.stderr,
            )
        return 0
