"""``scrapy retryqueue``: manage the retry queue from the command line.

scrapy retryqueue server start|stop|status   the embedded Redis-compatible server
"""

from __future__ import annotations

import argparse
from typing import Any

from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError

from .. import embedded
from ..config import load_config
from ..connection import embedded_dir
from ..exceptions import ConfigError, EmbeddedServerError


class Command(ScrapyCommand):
    requires_project = False
    default_settings = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return "server {start,stop,status}"

    def short_desc(self) -> str:
        return "Manage scrapy-retryqueue (the embedded server)"

    def long_desc(self) -> str:
        return (
            "server start   start the project's embedded Redis-compatible server\n"
            "server stop    stop it (pending retries stay on disk for the next start)\n"
            "server status  say whether it runs, and where"
        )

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)

    def run(self, args: list[str], opts: Any) -> None:
        if len(args) != 2 or args[0] != "server" or args[1] not in ("start", "stop", "status"):
            raise UsageError("expected: scrapy retryqueue server {start,stop,status}")
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

    def _fail(self, message: str) -> None:
        print(f"error: {message}")
        self.exitcode = 2
