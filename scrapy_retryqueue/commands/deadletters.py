"""``scrapy deadletters``: export, requeue and purge dead letters; migrate and sync the store.

Each subcommand checks all its options first (commands/_deadletters_options.py,
commands/_args.py, the export's file) and only then opens the store or Redis: a
refused command leaves the disk, the store and the queue as it found them.
The parser is :func:`build_parser`; where an export writes is :class:`Destination`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from ..decision.kinds import FORGED
from ._args import check_limit, refuse_empty, spider_names
from ._common import (
    EXIT_NO_MATCH,
    ArgumentParser,
    CommandFailed,
    Progress,
    confirm,
    exit_codes_text,
)
from ._common import Command as BaseCommand
from ._deadletters_options import DESCRIPTION, build_parser, filters_from
from ._output import Destination

if TYPE_CHECKING:
    from ..store.filters import Filters
    from ..view.sources import Sources

__all__ = ["Command", "Destination", "build_parser", "filters_from"]


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
        return DESCRIPTION + "\n\n" + exit_codes_text()

    def build_parser(self) -> ArgumentParser:
        return build_parser()

    def dispatch(self, ns: argparse.Namespace) -> int:
        from ..view.sources import Sources

        check_limit(ns)
        assert self.settings is not None
        # Reads and checks the settings; opens nothing until a subcommand asks.
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

        filters = filters_from(ns, sources.config)
        refuse_empty(ns, "--output", "--overwrite-output")
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

        filters = filters_from(ns, sources.config)
        if set(filters.statuses) != {"dead"}:
            raise CommandFailed(
                f"--status {','.join(ns.status)!r}: requeue takes dead letters only; "
                "leave --status out"
            )
        if ns.force and FORGED not in filters.kinds:
            raise CommandFailed(
                f"--force requeues {FORGED} dead letters only: name them with --kind {FORGED}"
            )
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
            signing=sources.config.signing,
            forged=bool(ns.force),
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
        if done.forged:
            extra.append(
                f"{done.forged} skipped ({FORGED}: never fetched; put back only with "
                f"--kind {FORGED} --force)"
            )
        budget = " (budget kept)" if ns.keep_budget else " (fresh budget)"
        tail = f"; {', '.join(extra)}" if extra else ""
        print(f"requeued {done.moved} dead letter(s){budget}{tail}", file=sys.stderr)
        return 0

    # -- purge -----------------------------------------------------------------

    def _purge(self, sources: Sources, ns: Any) -> int:
        from ..store import actions

        asked = filters_from(ns, sources.config)
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
        from ..config import redact_url
        from ..store.config import sqlite_path
        from ..store.db import code_head, upgrade_sql

        if ns.check and ns.sql:
            raise CommandFailed("--check and --sql do not go together")
        url = sources.database_url
        # --sql and --check change nothing: not even a SQLite file is made for them.
        if ns.sql:
            sys.stdout.write(upgrade_sql(url))
            return 0
        file = sqlite_path(url)
        if ns.check and file is not None and not os.path.exists(file):
            print(f"{redact_url(url)}: schema none, code {code_head()}: empty (no file yet)")
            return EXIT_NO_MATCH
        store = sources.store(check_schema=False, create=True)
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

        spiders = spider_names(ns.spider, every="sync every spider with events")
        store = sources.store(create=True, check_schema=False)
        store.ensure_schema(create=sources.store_config.create_schema)
        client = sources.redis()
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
