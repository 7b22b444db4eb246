"""What the store's commands share: argument parsing, one-line errors, opening
the store and Redis from settings, and a progress line for terminals."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, NoReturn

import redis
from sqlalchemy.exc import SQLAlchemyError

from .. import embedded
from ..config import Config, load_config, redact_url
from ..connection import client_for, embedded_dir
from ..exceptions import ConfigError, EmbeddedServerError
from ..store.config import StoreConfig, load_store_config
from ..store.db import Store, StoreError, describe_db_error
from ..store.queries import FilterError

#: Exit codes of the store's commands.
EXIT_OK = 0
EXIT_NO_MATCH = 1
EXIT_ERROR = 2


class CommandFailed(Exception):
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
    except (ConfigError, FilterError, StoreError, EmbeddedServerError) as exc:
        raise CommandFailed(str(exc)) from None
    except SQLAlchemyError as exc:
        raise CommandFailed(f"database error: {describe_db_error(exc)}") from None
    except (redis.RedisError, OSError) as exc:
        raise CommandFailed(f"{type(exc).__name__}: {exc}") from None


def fail_line(exc: CommandFailed) -> str:
    return f"error: {exc}"


class Context:
    """Settings-derived configuration, the store and Redis, opened on demand."""

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self.config: Config = load_config(settings)
        self.store_config: StoreConfig = load_store_config(settings)
        self.directory: Path = embedded_dir(self.config.embedded_dir)
        self._store: Store | None = None
        self._redis: Any = None

    @property
    def database_url(self) -> str:
        return self.store_config.url_for(self.directory)

    def store(self, *, check_schema: bool = True, create: bool = False) -> Store:
        if self._store is None:
            url = self.database_url
            default = url.startswith("sqlite:///") and not self.store_config.database_url
            if default and not create:
                path = Path(url.removeprefix("sqlite:///"))
                if not path.exists():
                    raise CommandFailed(
                        f"no store database here: {path} does not exist (run a crawl with the "
                        "add-on first, or set RETRYQUEUE_DATABASE_URL, e.g. "
                        "-s RETRYQUEUE_DATABASE_URL=postgresql://user@host/db)"
                    )
            store = Store(url)
            store.ping()
            if check_schema:
                store.raise_for(store.schema_state())
            self._store = store
        return self._store

    def redis(self, *, start_embedded: bool = True) -> Any:
        """A Redis client; None when the embedded server is not running and may not start."""
        if self._redis is None:
            url = self.config.redis_url
            if url is None and not start_embedded and not embedded.is_running(self.directory):
                return None
            kwargs: dict[str, Any] = {}
            if getattr(self.config, "redis_cluster", False):
                kwargs["cluster"] = True
            client, url = client_for(url, embedded_directory=self.directory, **kwargs)
            try:
                client.ping()
            except (redis.RedisError, OSError) as exc:
                raise CommandFailed(f"Redis at {redact_url(url)} does not answer ({exc})") from None
            self._redis = client
        return self._redis

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
        if self._redis is not None:
            self._redis.close()


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
