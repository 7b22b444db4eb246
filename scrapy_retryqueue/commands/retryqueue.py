"""``scrapy retryqueue``: manage the retry queue from the command line.

    scrapy retryqueue server {start,stop,status}
        the project's embedded Redis-compatible server
    scrapy retryqueue status [--spider NAME ...] [--json]
        per spider: due, due now, leased, dead, succeeded today, by kind,
        top domains, learned recovery times
    scrapy retryqueue dashboard [--host H] [--port P] [--token T]
                                [--redis-url URL] [--database-url URL]
        the web dashboard (the dashboard extra)
    scrapy retryqueue writer [--spider NAME ...] [--rescan S] [--consumer NAME]
        write the fleet's events into the store until stopped (the nodes then
        run with RETRYQUEUE_STORE_ENABLED = False)
    scrapy retryqueue settings [--spider NAME] [--changed] [--json]
        every RETRYQUEUE_* setting's value and where it came from, secrets masked
    scrapy retryqueue keygen
        print a new key for RETRYQUEUE_SIGNING_KEYS

Each subcommand describes its options: scrapy retryqueue SUBCOMMAND -h.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import socket
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..exceptions import ConfigError
from ..settings.defaults import DASHBOARD_SETTINGS, STORE_WRITER_RESCAN
from ._args import check_seconds, refuse_empty, spider_names
from ._common import (
    EXIT_CANNOT_LISTEN,
    EXIT_NOT_RUNNING,
    ArgumentParser,
    CommandFailed,
    exit_codes_text,
    subcommand_parser,
)
from ._common import Command as BaseCommand

if TYPE_CHECKING:
    from ..dashboard.settings import DashboardConfig
    from ..view.sources import Sources

_HOST = DASHBOARD_SETTINGS["RETRYQUEUE_DASHBOARD_HOST"]
_PORT = DASHBOARD_SETTINGS["RETRYQUEUE_DASHBOARD_PORT"]
GLOBAL_OPTIONS = (
    "Scrapy's options go with any subcommand: -s NAME=VALUE sets a setting (e.g.\n"
    "-s RETRYQUEUE_REDIS_URL=redis://host:6379/0). See scrapy retryqueue -h."
)


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="scrapy retryqueue",
        description=(__doc__ or "").split("\n", 2)[2].strip("\n"),
        epilog=exit_codes_text(),
    )
    sub = parser.add_subparsers(
        dest="action",
        metavar="{server,status,dashboard,writer,settings,keygen}",
        parser_class=ArgumentParser,
    )
    sub.required = True

    server = subcommand_parser(
        sub,
        "server",
        summary="Start, stop or look at the project's embedded Redis-compatible server.",
        description=(
            "The server the crawl starts when no Redis is configured, with its data in\n"
            "RETRYQUEUE_EMBEDDED_DIR (default: the project's .scrapy/retryqueue/).\n"
            "A crawl stops it when it ends (RETRYQUEUE_EMBEDDED_KEEP); one started here\n"
            "is kept until stopped here.\n"
            "  start   start it (nothing happens if it runs) and print its URL\n"
            "  stop    stop it; pending retries stay on disk for the next start\n"
            "  status  say whether it runs, and where (exit code 3 when it does not)"
        ),
        epilog=GLOBAL_OPTIONS,
    )
    server.add_argument("server_action", choices=("start", "stop", "status"),
                        help="what to do with the server (no default: one is needed)")  # fmt: skip

    status = subcommand_parser(
        sub,
        "status",
        summary="Per spider: what waits in the queue, what is held, what died, what recovered.",
        description=(
            "Live counts from Redis (due, due now, leased, dead letters and events not yet\n"
            "in the store, cooling domains) beside the store's history (dead, succeeded\n"
            "today, by kind, top domains). An embedded server that is not running is not\n"
            "started. Per (kind, domain), the learned recovery times: outages seen, median\n"
            "and p90, and what LearnedBackoff would pick next (docs/backoff.md).\n"
            "A spider of the project that was never crawled is shown with\n"
            "nothing yet; a name that is no spider of the project and has nothing recorded\n"
            "is an error (exit code 1)."
        ),
        epilog=GLOBAL_OPTIONS,
    )
    status.add_argument("--spider", action="append", default=[], metavar="NAME",
                        help="only this spider; repeat, or separate names with commas "
                        "(default: every spider with anything in Redis or the store)")  # fmt: skip
    status.add_argument("--json", action="store_true",
                        help="print JSON, for scripts (default: a table)")  # fmt: skip

    dashboard = subcommand_parser(
        sub,
        "dashboard",
        summary="Serve the web dashboard (needs the dashboard extra).",
        description=(
            "Read-only without a token; with one, actions (requeue, purge, retry now,\n"
            "cancel) need it. It refuses to listen on a non-loopback address without a\n"
            "token. A port in use is exit code 4."
        ),
        epilog=GLOBAL_OPTIONS,
    )
    dashboard.add_argument("--host", metavar="HOST",
                           help=f"the address to listen on (default: RETRYQUEUE_DASHBOARD_HOST, "
                           f"{_HOST})")  # fmt: skip
    dashboard.add_argument("--port", type=int, metavar="PORT",
                           help=f"the port to listen on; 0 picks a free one (default: "
                           f"RETRYQUEUE_DASHBOARD_PORT, {_PORT})")  # fmt: skip
    dashboard.add_argument("--token", metavar="TOKEN",
                           help="the token that allows actions, 8 characters or more "
                           "(default: the RETRYQUEUE_DASHBOARD_TOKEN environment variable, "
                           "else the setting; none: read-only)")  # fmt: skip
    dashboard.add_argument("--redis-url", metavar="URL",
                           help="the Redis to show (default: the crawl's, from "
                           "RETRYQUEUE_REDIS_URL, REDIS_URL, or the embedded server)")  # fmt: skip
    dashboard.add_argument("--database-url", metavar="URL",
                           help="the store to show (default: RETRYQUEUE_DATABASE_URL, else "
                           "the project's SQLite store)")  # fmt: skip

    writer = subcommand_parser(
        sub,
        "writer",
        summary="Write the events of the fleet's spiders into the store, until stopped.",
        description=(
            "The store writer of a fleet whose nodes run with RETRYQUEUE_STORE_ENABLED =\n"
            "False: one process instead of one writer in every crawl. It reads each\n"
            "spider's events through the consumer group 'store', writes them in batches\n"
            "(RETRYQUEUE_STORE_BATCH_SIZE, RETRYQUEUE_STORE_INTERVAL) and acknowledges them\n"
            "after each commit, stores dead letters whose events were trimmed, applies\n"
            "RETRYQUEUE_DEAD_RETENTION / RETRYQUEUE_HISTORY_RETENTION, and waits out a\n"
            "database or Redis that stops answering (one line when it goes, one when it\n"
            "is back). Several writers may run at once: each takes part of the events.\n"
            "Ctrl-C or SIGTERM: it finishes the batch in hand and exits with 0."
        ),
        epilog=GLOBAL_OPTIONS,
    )
    writer.add_argument("--spider", action="append", default=[], metavar="NAME",
                        help="only this spider; repeat, or separate names with commas "
                        "(default: every spider with an events stream in Redis, found again "
                        "every --rescan seconds)")  # fmt: skip
    writer.add_argument("--rescan", type=float, default=STORE_WRITER_RESCAN, metavar="SECONDS",
                        help="seconds between two looks for spiders it does not serve yet, "
                        f"without --spider (default: {STORE_WRITER_RESCAN:g})")  # fmt: skip
    writer.add_argument("--consumer", metavar="NAME",
                        help="this writer's name in the consumer group; two writers at once "
                        "need two names (default: <host name>:<pid>:writer)")  # fmt: skip

    settings = subcommand_parser(
        sub,
        "settings",
        summary="Every RETRYQUEUE_* setting's value and where it came from.",
        description=(
            "The value a crawl reads (the default when nothing sets it) and its source,\n"
            "Scrapy's priority: default, command, addon, project, spider (--spider) or\n"
            "cmdline (-s NAME=VALUE); then Scrapy's RETRY_* and scrapy-redis's REDIS_*\n"
            "settings the add-on reads, when the project sets them. Passwords in URLs, the\n"
            "dashboard token, the encryption and the signing keys read ***. The settings\n"
            "are then checked as a crawl checks them: a bad one is one error line (exit\n"
            "code 2).\n"
            "Nothing is opened: neither Redis nor the store."
        ),
        epilog=GLOBAL_OPTIONS,
    )
    settings.add_argument("--spider", action="append", default=[], metavar="NAME",
                          help="as a crawl of this spider of the project sees them, its "
                          "custom_settings included (default: the project's settings "
                          "alone)")  # fmt: skip
    settings.add_argument("--changed", action="store_true",
                          help="only the settings set somewhere, by the project, a spider or "
                          "-s (default: every setting)")  # fmt: skip
    settings.add_argument("--json", action="store_true",
                          help="print JSON, for scripts (default: a table)")  # fmt: skip

    subcommand_parser(
        sub,
        "keygen",
        summary="Print a new signing key for RETRYQUEUE_SIGNING_KEYS.",
        description=(
            "32 random bytes, url-safe base64 (44 characters), on one line of stdout.\n"
            "Every node, the store writer and the commands of a fleet list the same keys;\n"
            "the first signs, every one listed verifies. To rotate: add the new key second\n"
            "everywhere, then move it first, then remove the old one once nothing signed\n"
            "with it is left (docs/deploy.md, rotating the signing key). Keep keys out of\n"
            "the source tree: pass them in the environment."
        ),
        epilog=GLOBAL_OPTIONS,
    )
    return parser


class Command(BaseCommand):
    name = "retryqueue"

    def syntax(self) -> str:
        return "{server,status,dashboard,writer,settings,keygen} [options]"

    def short_desc(self) -> str:
        return "Manage scrapy-retryqueue's embedded server; show the queue's status and settings"

    def long_desc(self) -> str:
        return (__doc__ or "").split("\n", 2)[2].strip("\n") + "\n\n" + exit_codes_text()

    def build_parser(self) -> ArgumentParser:
        return build_parser()

    def dispatch(self, ns: argparse.Namespace) -> int:
        if ns.action == "server":
            return self._server(ns.server_action)
        if ns.action == "status":
            return self._status(ns)
        if ns.action == "writer":
            return self._writer(ns)
        if ns.action == "settings":
            return self._settings(ns)
        if ns.action == "keygen":
            from ..config import load_config
            from ..secure.signing import generate_key

            # As every subcommand: a setting no crawl accepts is said, not passed over.
            assert self.settings is not None
            load_config(self.settings)
            print(generate_key())
            return 0
        return self._dashboard(ns)

    def close(self) -> None:
        sources = getattr(self, "_sources", None)
        if sources is not None:
            sources.close()
            self._sources = None

    def _server(self, action: str) -> int:
        from ..config import load_config
        from ..queue import embedded
        from ..queue.connection import embedded_dir

        assert self.settings is not None
        directory = embedded_dir(load_config(self.settings).embedded_dir)
        if action == "status":
            if embedded.is_running(directory):
                print(f"running: {embedded.server_url(directory)} (data in {directory})")
                return 0
            print(f"not running (data in {directory})")
            return EXIT_NOT_RUNNING
        if action == "start":
            print(f"running: {embedded.ensure_server(directory, keep=True)}")
        elif embedded.stop_server(directory):
            print(f"stopped (data kept in {directory})")
        else:
            print("not running")
        return 0

    def _status(self, ns: argparse.Namespace) -> int:
        from ..view.sources import Sources
        from ._status import render_json, render_table, report

        assert self.settings is not None
        spiders = spider_names(ns.spider, every="show every spider")
        self._sources: Sources | None = Sources(self.settings)
        shown = report(self._sources, spiders, self.settings)
        print(render_json(shown) if ns.json else render_table(shown))
        return 0

    def _dashboard(self, ns: argparse.Namespace) -> int:
        from ..config import load_config
        from ..store.config import load_store_config

        assert self.settings is not None
        refuse_empty(ns, "--host", "--token", "--redis-url", "--database-url")
        try:
            import uvicorn

            from ..dashboard.app import create_app
            from ..dashboard.settings import check_bind, load_dashboard_config
        except ImportError as exc:
            raise CommandFailed(
                f"the dashboard needs its extra: pip install 'scrapy-retryqueue[dashboard]' ({exc})"
            ) from None
        settings = self.settings.copy()
        if ns.redis_url:
            settings.set("RETRYQUEUE_REDIS_URL", ns.redis_url, priority="cmdline")
        if ns.database_url:
            settings.set("RETRYQUEUE_DATABASE_URL", ns.database_url, priority="cmdline")
        token = ns.token or os.environ.get("RETRYQUEUE_DASHBOARD_TOKEN") or None
        with naming_options(ns):
            config = load_dashboard_config(settings, host=ns.host, port=ns.port, token=token)
            check_bind(config)
            # The dashboard opens Redis and the store when first asked: a bad setting
            # is said now, in one line, rather than on every page.
            load_config(settings)
            load_store_config(settings)
        sock = listen(config.host, config.port)
        try:
            app = create_app(settings, config=config)
            server = uvicorn.Server(server_config(app, config))
            port = sock.getsockname()[1]
            mode = "actions need the token" if config.token else "read-only: no token"
            host = f"[{config.host}]" if ":" in config.host else config.host
            print(f"dashboard on http://{host}:{port}/ ({mode})", file=sys.stderr, flush=True)
            # uvicorn shuts down on Ctrl-C, then raises it again: for a server
            # that is how it ends, not an interruption of its work.
            with contextlib.suppress(KeyboardInterrupt):
                server.run(sockets=[sock])
        finally:
            sock.close()
        print("dashboard stopped", file=sys.stderr)
        return 0

    def _settings(self, ns: argparse.Namespace) -> int:
        from ._settings import render_json, render_table, report, with_spider

        assert self.settings is not None
        shown = report(with_spider(self.settings, ns.spider), changed=ns.changed)
        print(render_json(shown) if ns.json else render_table(shown))
        if shown["error"]:
            # The one line a crawl with these settings would stop at.
            raise CommandFailed(shown["error"])
        return 0

    def _writer(self, ns: argparse.Namespace) -> int:
        from ..view.sources import Sources
        from ._writer import run_writer

        assert self.settings is not None
        check_seconds("--rescan", ns.rescan)
        spiders = spider_names(ns.spider, every="serve every spider with events")
        refuse_empty(ns, "--consumer")
        consumer = ns.consumer or f"{socket.gethostname()}:{os.getpid()}:writer"
        self._sources = Sources(self.settings)
        return run_writer(
            self._sources,
            spiders=spiders or None,
            rescan=ns.rescan,
            consumer=consumer,
            log_to_stderr=not self.settings.getbool("LOG_ENABLED"),
        )


#: The dashboard's options and the settings they stand for.
_DASHBOARD_OPTIONS = {
    "host": "RETRYQUEUE_DASHBOARD_HOST",
    "port": "RETRYQUEUE_DASHBOARD_PORT",
    "token": "RETRYQUEUE_DASHBOARD_TOKEN",
    "redis_url": "RETRYQUEUE_REDIS_URL",
    "database_url": "RETRYQUEUE_DATABASE_URL",
}


@contextlib.contextmanager
def naming_options(ns: argparse.Namespace) -> Iterator[None]:
    """A bad value given as an option is said with the option beside its setting's
    name (``RETRYQUEUE_DASHBOARD_PORT (--port) must be 0-65535``): the person typed
    the option, the check knows the setting."""
    try:
        yield
    except ConfigError as exc:
        message = str(exc)
        for dest, setting in _DASHBOARD_OPTIONS.items():
            option = "--" + dest.replace("_", "-")
            given = getattr(ns, dest, None) is not None
            if given and message.startswith(setting + " ") and f"({option})" not in message:
                message = f"{setting} ({option}){message[len(setting) :]}"
                break
        raise CommandFailed(message) from None


def server_config(app: Any, config: DashboardConfig) -> Any:
    """The uvicorn configuration the dashboard is served with."""
    import uvicorn

    return uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_level="warning",
        # uvicorn would believe X-Forwarded-For from loopback by default: a client
        # there could take a fresh address per wrong token, or somebody else's. The
        # app reads it itself, from RETRYQUEUE_DASHBOARD_TRUSTED_PROXIES only.
        proxy_headers=False,
    )


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to *host*:*port*; one line and exit code 4 when it cannot be.

    Bound here rather than by uvicorn, which logs the error and exits with 1
    (the code of "nothing matched").
    """
    where = f"{host}:{port}"
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise CommandFailed(
            f"the dashboard cannot listen on {where}: {exc.strerror}", EXIT_CANNOT_LISTEN
        ) from None
    except (UnicodeError, ValueError) as exc:  # a name the resolver cannot even encode
        raise CommandFailed(
            f"the dashboard cannot listen on {where}: {exc}", EXIT_CANNOT_LISTEN
        ) from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            reason = "address already in use (another dashboard, or another program); choose another port with --port"
        else:
            reason = exc.strerror or str(exc)
        raise CommandFailed(
            f"the dashboard cannot listen on {where}: {reason}", EXIT_CANNOT_LISTEN
        ) from None
    return sock
