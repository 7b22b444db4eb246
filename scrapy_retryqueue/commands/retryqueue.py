"""``scrapy retryqueue``: manage the retry queue from the command line.

scrapy retryqueue server start|stop|status   the embedded Redis-compatible server
scrapy retryqueue status [--spider NAME] [--json]
                                             per spider: due, due now, leased, dead,
                                             succeeded today, by kind, top domains
scrapy retryqueue dashboard [--host H] [--port P] [--token T]
                            [--redis-url URL] [--database-url URL]
                                             the web dashboard (needs the dashboard extra)
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError

from .. import embedded
from ..config import load_config
from ..connection import embedded_dir
from ..defaults import DASHBOARD_SETTINGS
from ..exceptions import ConfigError, EmbeddedServerError
from ._common import ArgumentParser, CommandFailed, fail_line, one_line_errors

_HOST = DASHBOARD_SETTINGS["RETRYQUEUE_DASHBOARD_HOST"]
_PORT = DASHBOARD_SETTINGS["RETRYQUEUE_DASHBOARD_PORT"]


class Command(ScrapyCommand):
    requires_project = False
    default_settings = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return (
            "server {start,stop,status} | status [--spider NAME] [--json] | "
            "dashboard [--host H] [--port P] [--token T]"
        )

    def short_desc(self) -> str:
        return "Manage scrapy-retryqueue (the embedded server) and show the queue's status"

    def long_desc(self) -> str:
        return (
            "server start   start the project's embedded Redis-compatible server\n"
            "server stop    stop it (pending retries stay on disk for the next start)\n"
            "server status  say whether it runs, and where\n"
            "status         per spider: due, due now, leased, dead, succeeded today,\n"
            "               by kind and top domains (a table; --json for scripts;\n"
            "               --spider NAME, repeatable, to show only some)\n"
            f"dashboard      serve the web dashboard (--host, default {_HOST}; --port,\n"
            f"               default {_PORT}; --token or RETRYQUEUE_DASHBOARD_TOKEN to allow\n"
            "               actions; --redis-url, --database-url override the settings)"
        )

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        parser.formatter_class = argparse.RawDescriptionHelpFormatter

    def run(self, args: list[str], opts: Any) -> None:
        if args and args[0] == "status":
            self._status(args[1:])
            return
        if args and args[0] == "dashboard":
            self._dashboard(args[1:])
            return
        if len(args) != 2 or args[0] != "server" or args[1] not in ("start", "stop", "status"):
            raise UsageError(
                "expected: scrapy retryqueue server {start,stop,status} | scrapy retryqueue status"
                " | scrapy retryqueue dashboard"
            )
        assert self.settings is not None
        try:
            config = load_config(self.settings)
        except ConfigError as exc:
            self._fail(str(exc))
            return
        directory = embedded_dir(config.embedded_dir)
        action = args[1]
        if action == "status":
            if embedded.is_running(directory):
                print(f"running: {embedded.server_url(directory)} (data in {directory})")
            else:
                print(f"not running (data in {directory})")
                self.exitcode = 3
        elif action == "start":
            try:
                url = embedded.ensure_server(directory)
            except EmbeddedServerError as exc:
                self._fail(str(exc))
                return
            print(f"running: {url}")
        elif embedded.stop_server(directory):
            print(f"stopped (data kept in {directory})")
        else:
            print("not running")

    def _status(self, args: list[str]) -> None:
        from ..sources import Sources
        from ._status import render_json, render_table, report

        assert self.settings is not None
        sources: Sources | None = None
        try:
            with one_line_errors():
                parser = ArgumentParser(prog="scrapy retryqueue status", add_help=False)
                parser.add_argument("--spider", action="append", default=[])
                parser.add_argument("--json", action="store_true")
                ns = parser.parse_args(args)
                spiders = [s for value in ns.spider for s in value.split(",") if s]
                sources = Sources(self.settings)
                shown = report(sources, spiders)
            print(render_json(shown) if ns.json else render_table(shown))
        except CommandFailed as exc:
            print(fail_line(exc), file=sys.stderr)
            self.exitcode = exc.code
        finally:
            if sources is not None:
                sources.close()

    def _dashboard(self, args: list[str]) -> None:
        assert self.settings is not None
        try:
            with one_line_errors():
                parser = ArgumentParser(prog="scrapy retryqueue dashboard", add_help=False)
                parser.add_argument("--host")
                parser.add_argument("--port", type=int)
                parser.add_argument("--token")
                parser.add_argument("--redis-url")
                parser.add_argument("--database-url")
                ns = parser.parse_args(args)
                try:
                    import uvicorn

                    from ..dashboard.app import create_app
                    from ..dashboard.settings import check_bind, load_dashboard_config
                except ImportError as exc:
                    raise CommandFailed(
                        f"the dashboard needs its extra: pip install 'scrapy-retryqueue[dashboard]' "
                        f"({exc})"
                    ) from None
                settings = self.settings.copy()
                if ns.redis_url:
                    settings.set("RETRYQUEUE_REDIS_URL", ns.redis_url, priority="cmdline")
                if ns.database_url:
                    settings.set("RETRYQUEUE_DATABASE_URL", ns.database_url, priority="cmdline")
                token = ns.token or os.environ.get("RETRYQUEUE_DASHBOARD_TOKEN") or None
                config = load_dashboard_config(settings, host=ns.host, port=ns.port, token=token)
                check_bind(config)
                app = create_app(settings, config=config)
        except CommandFailed as exc:
            print(fail_line(exc), file=sys.stderr)
            self.exitcode = exc.code
            return
        mode = "actions need the token" if config.token else "read-only (no token)"
        print(f"dashboard on http://{config.host}:{config.port}/ ({mode})", file=sys.stderr)
        uvicorn.run(app, host=config.host, port=config.port, log_level="warning")

    def _fail(self, message: str) -> None:
        print(f"error: {message}")
        self.exitcode = 2
