"""``scrapy deadletters``: export, requeue and purge dead letters; migrate and sync the store.

    scrapy deadletters export  [filters] [--format csv|jsonl|json] [-o FILE | -O FILE]
                               [--limit N] [--include-secrets]
    scrapy deadletters requeue [filters] [--keep-budget] [--dry-run] [--limit N]
    scrapy deadletters purge   [filters] [--yes]
    scrapy deadletters migrate [--check | --sql]
    scrapy deadletters sync    [--spider NAME ...]

Filters: --spider, --kind, --domain, --http-status, --node (each repeatable or
comma-separated), --since / --until (2024-05-01, 2024-05-01T13:30, today, 7d),
--status (dead by default; all for every task), --id.

Each subcommand describes its options: scrapy deadletters SUBCOMMAND -h.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..decision.kinds import BUILTIN_TABLE
from ._common import (
    EXIT_ERROR,
    EXIT_NO_MATCH,
    ArgumentParser,
    CommandFailed,
    Progress,
    confirm,
    exit_codes_text,
    subcommand_parser,
)
from ._common import Command as BaseCommand

if TYPE_CHECKING:
    from ..store.queries import Filters
    from ..view.sources import Sources

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
        description=(__doc__ or "").split("\n", 2)[2].strip("\n"),
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
            "rebuild) is skipped and named."
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


def _refuse_empty_values(ns: Any) -> None:
    """An empty filter value is an error: dropped, it would match everything
    (``purge --spider "$UNSET" --yes`` would delete every spider's dead letters)."""
    for option in ("spider", "kind", "domain", "http_status", "node", "status", "id"):
        for value in getattr(ns, option, None) or []:
            if any(not part.strip() for part in value.split(",")):
                flag = "--" + option.replace("_", "-")
                raise CommandFailed(
                    f"{flag} {value!r} holds an empty value; give a value, or leave {flag} "
                    "out to match every one"
                )
    for option in ("since", "until"):
        value = getattr(ns, option, None)
        if value is not None and not value.strip():
            raise CommandFailed(f"--{option} is empty; give a time, or leave --{option} out")


def filters_from(ns: Any, sources: Sources) -> Filters:
    from ..store.queries import Filters

    _refuse_empty_values(ns)
    return Filters.from_options(
        # The project's own kinds (RETRYQUEUE_KINDS) are kinds here too.
        known_kinds=sources.config.kinds.names,
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


class Command(BaseCommand):
    name = "deadletters"

    def syntax(self) -> str:
        return "{export,requeue,purge,migrate,sync} [options]"

    def short_desc(self) -> str:
        return "Export, requeue or purge scrapy-retryqueue dead letters"

    def long_desc(self) -> str:
        return (__doc__ or "").split("\n", 2)[2].strip("\n") + "\n\n" + exit_codes_text()

    def build_parser(self) -> ArgumentParser:
        return build_parser()

    def dispatch(self, ns: argparse.Namespace) -> int:
        from ..view.sources import Sources

        if getattr(ns, "limit", None) is not None and ns.limit < 1:
            raise CommandFailed(f"--limit must be >= 1, got {ns.limit}")
        assert self.settings is not None
        self._sources: Sources | None = Sources(self.settings)
        result: int = getattr(self, f"_{ns.action}")(self._sources, ns)
        return result

    def close(self) -> None:
        sources = getattr(self, "_sources", None)
        if sources is not None:
            sources.close()
            self._sources = None

    # -- export ----------------------------------------------------------------

    def _export(self, sources: Sources, ns: Any) -> int:
        from ..store.queries import count, stream_rows

        filters = filters_from(ns, sources)
        destination = Destination.from_options(ns.output, ns.overwrite_output, ns.format)
        destination.check()
        secret = frozenset() if ns.include_secrets else sources.config.secret_headers
        store = sources.store()
        with store.connect() as conn:
            total = count(conn, filters)
            if ns.limit is not None:
                total = min(total, ns.limit)
            if not total:
                raise CommandFailed(f"no tasks match ({filters.describe()})", EXIT_NO_MATCH)
            progress = Progress(total, "exporting")
            rows = stream_rows(conn, filters, limit=ns.limit)
            written = destination.write(rows, secret, progress.advance)
            progress.finish()
        if destination.path is not None:
            how = "appended" if destination.append else "exported"
            extra = ", secret header values included" if ns.include_secrets else ""
            print(
                f"{how} {written} task(s) to {destination.path} ({destination.fmt}{extra})",
                file=sys.stderr,
            )
        return 0

    # -- requeue ---------------------------------------------------------------

    def _requeue(self, sources: Sources, ns: Any) -> int:
        from ..store import actions
        from ..store.queries import chunks

        filters = filters_from(ns, sources)
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
            project=sources.config.namespace,
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

        asked = filters_from(ns, sources)
        # As the dashboard: only finished tasks; a live one's row is deleted by
        # the writer's next event anyway, and its task stays due in Redis.
        filters = actions.applicable("purge", asked)
        live = [status for status in asked.statuses if status not in filters.statuses]
        if not filters.statuses:
            raise CommandFailed(
                f"purge deletes finished tasks only ({', '.join(actions.ACTION_STATUSES['purge'])}); "
                f"--status {','.join(live)} names tasks still live in Redis: cancel them first "
                "(the dashboard's cancel)"
            )
        if live:
            print(f"purge leaves live tasks alone ({', '.join(live)})", file=sys.stderr)
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
            confirm(f"Delete {total} {what} ({filters.describe()})?")
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
            return 0 if state.state == "ok" else EXIT_NO_MATCH
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
        from ..store.service import event_sync
        from ..values import now_ms
        from ..view import live as view

        store = sources.store(create=True, check_schema=False)
        store.ensure_schema(create=sources.store_config.create_schema)
        client = sources.redis()
        spiders = [s for value in ns.spider for s in value.split(",") if s]
        if not spiders:
            spiders = sorted(view.spiders_with_events(client, sources.config.namespace))
        if not spiders:
            raise CommandFailed("no spider has events in Redis", EXIT_NO_MATCH)
        for spider in spiders:
            sync = event_sync(
                store,
                client,
                spider,
                sources.store_config,
                consumer=f"{sources.config.node_id}:sync",
                project=sources.config.namespace,
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


class Destination:
    """Where ``export`` writes, following Scrapy's feed exports: ``-O`` overwrites, ``-o`` appends."""

    def __init__(self, path: Path | None, fmt: str, *, append: bool) -> None:
        #: None: stdout.
        self.path = path
        self.fmt = fmt
        self.append = append

    @classmethod
    def from_options(
        cls, output: str | None, overwrite: str | None, fmt: str | None
    ) -> Destination:
        from ..store.export import FORMATS

        name = overwrite or output or "-"
        path = None if name == "-" else Path(name)
        if fmt is None:
            suffix = path.suffix.lower().lstrip(".") if path is not None else ""
            fmt = suffix if suffix in FORMATS else "csv"
        return cls(path, fmt, append=path is not None and overwrite is None)

    def check(self) -> None:
        """Refuse, before reading the store, what cannot be written or appended to."""
        if self.path is not None:
            self._refuse_special()
        if not self.append or self.path is None:
            return
        if self.fmt == "json":
            raise CommandFailed(
                f"-o appends, and a json file ({self.path}) holds one array that cannot take "
                "more rows: use -O to overwrite it, or the jsonl format (one object per line) "
                "to append",
                EXIT_ERROR,
            )
        if self.fmt == "csv" and self._has_content():
            from ..store.export import csv_header

            with open(self.path, encoding="utf-8", newline="") as existing:
                first = existing.readline()
            if first.rstrip("\r\n") != csv_header().rstrip("\r\n"):
                raise CommandFailed(
                    f"-o appends, and {self.path} does not start with this export's csv "
                    "header (another file, or another version's columns): use -O to "
                    "overwrite it, or another file",
                    EXIT_ERROR,
                )

    def _refuse_special(self) -> None:
        """A symlink, FIFO, device or directory at FILE: refused, never replaced nor followed.

        Replacing one (-O renames a temporary file over FILE) would swap a
        device node such as /dev/null for a regular file, or a symlink for a
        copy; following one writes where the link points, unseen.
        """
        assert self.path is not None
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode):
            raise CommandFailed(
                f"{self.path} is a symbolic link (to {os.readlink(self.path)}): export neither "
                "follows nor replaces one; give the path it points to, or another file",
                EXIT_ERROR,
            )
        if not stat.S_ISREG(st.st_mode):
            what = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise CommandFailed(
                f"{self.path} is {what} (a FIFO, a device, a socket?): export writes regular "
                "files only; leave out -o / -O to write to stdout",
                EXIT_ERROR,
            )

    def _has_content(self) -> bool:
        assert self.path is not None
        try:
            return self.path.stat().st_size > 0
        except FileNotFoundError:
            return False

    def write(self, rows: Any, secret: frozenset[str], advance: Any) -> int:
        """Write *rows*; returns how many. A file is complete or untouched on failure."""
        from ..store.export import write_rows

        if self.path is None:
            written = write_rows(rows, self.fmt, sys.stdout, advance, secret=secret)
            sys.stdout.flush()
            return written
        header = not (self.append and self._has_content())
        # A fresh name (O_EXCL): a FILE.part planted as a symlink is never followed.
        fd, name = tempfile.mkstemp(
            dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".part"
        )
        part = Path(name)
        try:
            with open(fd, "w", encoding="utf-8", newline="") as out:
                written = write_rows(rows, self.fmt, out, advance, secret=secret, header=header)
                if not self.append:
                    # mkstemp's 0600; the file gets the mode a new one would.
                    umask = os.umask(0)
                    os.umask(umask)
                    os.fchmod(out.fileno(), 0o666 & ~umask)
            self._refuse_special()  # again: FILE may have changed while rows were read
            if self.append:
                self._append_part(part)
            else:
                os.replace(part, self.path)
        finally:
            with contextlib.suppress(OSError):
                part.unlink()
        return written

    def _append_part(self, part: Path) -> None:
        # The rows were written to FILE.part first: a failure while reading the
        # store leaves FILE as it was; only this local copy appends.
        assert self.path is not None
        with open(self.path, "ab") as target, open(part, "rb") as source:
            if self.fmt == "jsonl" and target.tell() and not _ends_with_newline(self.path):
                target.write(b"\n")
            shutil.copyfileobj(source, target)


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as existing:
        existing.seek(-1, os.SEEK_END)
        return existing.read(1) == b"\n"
