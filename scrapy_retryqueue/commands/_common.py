"""What the commands share: argument parsing, one-line errors, a progress line for terminals.

Light on purpose: Scrapy imports every command module whenever ``scrapy``
runs (a crawl too), so the store and its SQLAlchemy are imported by the
commands that use them, when they run.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, NoReturn

import redis

from ..exceptions import RetryQueueError

#: Exit codes of the commands (0: done): nothing matched; bad input or a side down.
EXIT_NO_MATCH = 1
EXIT_ERROR = 2


class CommandFailed(RetryQueueError):
    """Ends a command with one line on stderr and an exit code."""

    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


class ArgumentParser(argparse.ArgumentParser):
    """argparse that raises CommandFailed (one line) instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise CommandFailed(f"{self.prog}: {message}")


@contextmanager
def one_line_errors() -> Iterator[None]:
    """Turn the errors a person can cause or fix into CommandFailed."""
    try:
        yield
    except CommandFailed:
        raise
    except RetryQueueError as exc:  # a bad setting or filter, the store, the embedded server
        raise CommandFailed(str(exc)) from None
    except (redis.RedisError, OSError) as exc:
        raise CommandFailed(f"{type(exc).__name__}: {exc}") from None
    except Exception as exc:
        database_error = _database_error(exc)
        if database_error is None:
            raise
        raise CommandFailed(f"database error: {database_error}") from None


def _database_error(exc: Exception) -> str | None:
    """One line for an SQLAlchemy error; None for anything else."""
    # Only a command that opened the store can raise one: SQLAlchemy is loaded then.
    sa_exc = sys.modules.get("sqlalchemy.exc")
    if sa_exc is None or not isinstance(exc, sa_exc.SQLAlchemyError):
        return None
    from ..store.db import describe_db_error

    return describe_db_error(exc)


def fail_line(exc: CommandFailed) -> str:
    return f"error: {exc}"


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
