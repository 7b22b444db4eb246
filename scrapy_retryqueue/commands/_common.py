"""What the commands share: a help per subcommand, one-line errors on stderr, exit codes, prompts.

Light on purpose: Scrapy imports every command module whenever ``scrapy``
runs (a crawl too), so the store and its SQLAlchemy are imported by the
commands that use them, when they run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any, NoReturn

from scrapy.commands import ScrapyCommand

from ..exceptions import RetryQueueError

#: Exit codes of ``scrapy deadletters`` and ``scrapy retryqueue``, the same in
#: both (docs/commands.md shows this table; a test keeps them equal).
EXIT_OK = 0
EXIT_NO_MATCH = 1
EXIT_ERROR = 2
EXIT_NOT_RUNNING = 3
EXIT_CANNOT_LISTEN = 4
EXIT_ABORTED = 5
EXIT_INTERRUPTED = 130
EXIT_CODES: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "done"),
    (
        EXIT_NO_MATCH,
        "nothing matched: no task matches the filters, no spider has anything recorded, "
        "or `migrate --check` found the schema out of date",
    ),
    (
        EXIT_ERROR,
        "an error: bad input or a bad setting, a database or Redis that does not answer, a "
        "schema that does not match, an embedded server that cannot start",
    ),
    (EXIT_NOT_RUNNING, "`retryqueue server status`: the embedded server does not run"),
    (
        EXIT_CANNOT_LISTEN,
        "`retryqueue dashboard`: it cannot listen on its address (the port is already in use, say)",
    ),
    (
        EXIT_ABORTED,
        "a confirmation was not given (answered no, or end of input, Ctrl-D): nothing changed",
    ),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C)"),
)


def exit_codes_text(width: int = 79) -> str:
    """The exit codes, one a paragraph, for a command's help."""
    lines = ["Exit codes (the same for scrapy deadletters and scrapy retryqueue):"]
    for code, meaning in EXIT_CODES:
        lines.extend(
            textwrap.wrap(
                meaning.replace("`", ""),
                width=width,
                initial_indent=f"  {code:<4} ",
                subsequent_indent=" " * 7,
            )
        )
    return "\n".join(lines)


class CommandFailed(RetryQueueError):
    """Ends a command with one line on stderr and an exit code."""

    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


class Aborted(CommandFailed):
    """A confirmation was not given: said as it is, not as an error."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_ABORTED)


class ArgumentParser(argparse.ArgumentParser):
    """argparse that raises CommandFailed (one line) instead of printing usage and exiting."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise CommandFailed(f"{self.prog}: {message} (see {self.prog} -h)")


def subcommand_parser(
    sub: Any, name: str, *, summary: str, description: str = "", epilog: str = ""
) -> ArgumentParser:
    """A subcommand whose ``-h`` describes it (*summary*, then *description*)."""
    return sub.add_parser(  # type: ignore[no-any-return]
        name,
        help=summary,
        description=f"{summary}\n\n{description}".rstrip(),
        epilog=epilog or None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


@contextmanager
def one_line_errors() -> Iterator[None]:
    """Turn the errors a person can cause or fix into CommandFailed."""
    try:
        yield
    except (CommandFailed, BrokenPipeError):
        raise  # BrokenPipeError: the reader of our output is gone (Command.run)
    except RetryQueueError as exc:  # a bad setting or filter, the store, the embedded server
        raise CommandFailed(str(exc)) from None
    except Exception as exc:
        if isinstance(exc, OSError) or _is_redis_error(exc):
            raise CommandFailed(f"{type(exc).__name__}: {exc}") from None
        database_error = _database_error(exc)
        if database_error is None:
            raise
        raise CommandFailed(f"database error: {database_error}") from None


def _is_redis_error(exc: Exception) -> bool:
    # Looked up, not imported: Scrapy loads every entry-point command for any
    # ``scrapy`` run (a stock crawl, ``scrapy list``), and importing redis here
    # cost each of them about 60 ms. Only a command that opened a client can
    # raise one, and redis is loaded then.
    error = getattr(sys.modules.get("redis"), "RedisError", None)
    return isinstance(error, type) and isinstance(exc, error)


def _database_error(exc: Exception) -> str | None:
    """One line for an SQLAlchemy error; None for anything else."""
    # Only a command that opened the store can raise one: SQLAlchemy is loaded then.
    sa_exc = sys.modules.get("sqlalchemy.exc")
    if sa_exc is None or not isinstance(exc, sa_exc.SQLAlchemyError):
        return None
    from ..store.db import describe_db_error

    return describe_db_error(exc)


def fail_line(exc: CommandFailed) -> str:
    if isinstance(exc, Aborted):
        return f"aborted: {exc}"
    return f"error: {exc}"


def confirm(question: str, *, stdin: IO[str] | None = None, out: IO[str] | None = None) -> None:
    """Ask *question* ``[y/N]`` on a terminal; anything but yes raises :class:`Aborted`.

    The question goes to stderr (stdout may be a file). End of input (Ctrl-D)
    is a no, said on a line of its own.
    """
    stdin = stdin if stdin is not None else sys.stdin
    out = out if out is not None else sys.stderr
    out.write(f"{question} [y/N] ")
    out.flush()
    answer = stdin.readline()
    if not answer:
        out.write("\n")  # the terminal echoes no newline for Ctrl-D
        raise Aborted("no answer (end of input): nothing changed")
    if answer.strip().lower() not in ("y", "yes"):
        raise Aborted("not confirmed: nothing changed")


class Command(ScrapyCommand):
    """A command made of subcommands (``scrapy deadletters export``), each with its ``-h``.

    Subclasses build their parser (:meth:`build_parser`) and run a parsed
    subcommand (:meth:`dispatch`). Errors are one line on stderr, never a
    traceback, with an exit code of :data:`EXIT_CODES`.
    """

    requires_project = False
    default_settings = {"LOG_ENABLED": False}
    #: The command's name, for the help: ``scrapy <name> ...``.
    name = ""

    def build_parser(self) -> ArgumentParser:
        raise NotImplementedError

    def dispatch(self, ns: argparse.Namespace) -> int:
        raise NotImplementedError

    def close(self) -> None:
        """Release what :meth:`dispatch` opened; called whatever happened."""

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        # The description lists the subcommands line by line: keep its lines.
        parser.formatter_class = argparse.RawDescriptionHelpFormatter
        # Scrapy's parser answers -h before the subcommand is known: take -h over
        # (conflict_handler="resolve"), so that `scrapy deadletters export -h`
        # shows the options of export.
        parser.add_argument(
            "-h",
            "--help",
            action="store_true",
            help=f"show this help, or a subcommand's (scrapy {self.name} SUBCOMMAND -h), and exit",
        )
        self._scrapy_parser = parser

    def run(self, args: list[str], opts: Any) -> None:
        if getattr(opts, "help", False):
            self.show_help(args)
            return
        try:
            with one_line_errors():
                ns = self.build_parser().parse_args(args)
                self.warn_unknown_settings()
                self.exitcode = self.dispatch(ns) or EXIT_OK
        except CommandFailed as exc:
            print(fail_line(exc), file=sys.stderr)
            self.exitcode = exc.code
        except BrokenPipeError:
            # `| head -1`: the reader has what it wanted and closed the pipe. Not an
            # error; stdout goes to /dev/null so that its flush at exit raises nothing.
            with contextlib.suppress(OSError, ValueError):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
                os.close(devnull)
            self.exitcode = EXIT_OK
        except KeyboardInterrupt:
            print("error: interrupted", file=sys.stderr)
            self.exitcode = EXIT_INTERRUPTED
        finally:
            self.close()

    def warn_unknown_settings(self) -> None:
        """One ``warning:`` line on stderr per RETRYQUEUE_* name that is no setting
        (``-s RETRYQUEUE_DASHBOARD_TOKN=...`` would otherwise be ignored unsaid), and one
        for the retired settings it sets, saying what replaced them."""
        from ..config import retired_settings, unknown_settings

        if self.settings is not None:
            names = list(self.settings)
            for notice in (*unknown_settings(names), *retired_settings(names)):
                print(f"warning: {notice}", file=sys.stderr)

    def show_help(self, args: list[str], out: IO[str] | None = None) -> None:
        """The help of the subcommand named in *args*, else of the command (on stdout)."""
        out = out if out is not None else sys.stdout
        parser = self.build_parser()
        subcommands = subparsers_of(parser)
        named = next((a for a in args if not a.startswith("-")), None)
        if named in subcommands:
            subcommands[named].print_help(out)
        else:
            self._scrapy_parser.print_help(out)


def subparsers_of(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The subcommands of *parser* by name."""
    for action in parser._actions:  # argparse keeps them only there
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


class Progress:
    """``\\r12,000 / 1,000,000 rows  1.2%  40,000 rows/s`` on a terminal's stderr, else nothing."""

    def __init__(self, total: int, what: str, stream: IO[str] | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = bool(getattr(self.stream, "isatty", lambda: False)())
        self.total = total
        self.what = what
        self.done = 0
        self._started = time.monotonic()
        self._shown = 0.0

    def advance(self, n: int = 1) -> None:
        self.done += n
        if self.enabled:
            now = time.monotonic()
            if now - self._shown >= 0.2:
                self._shown = now
                self._show(now)

    def _show(self, now: float) -> None:
        rate = self.done / max(now - self._started, 1e-6)
        pct = 100.0 * self.done / self.total if self.total else 100.0
        self.stream.write(
            f"\r{self.what} {self.done:,} / {self.total:,}  {pct:5.1f}%  {rate:,.0f}/s   "
        )
        self.stream.flush()

    def finish(self) -> None:
        if self.enabled:
            self._show(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()
