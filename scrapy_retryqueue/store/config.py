"""RETRYQUEUE_* settings of the SQL store, read and validated once.

A bad value raises :class:`ConfigError` naming the setting and showing the value.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import bool_setting, number_setting, raw_setting, redact_url
from ..exceptions import ConfigError
from ..secure.signing import parse_keys
from ..settings import defaults
from ..values import shown

_DIALECTS = ("postgresql", "sqlite")


@dataclass(frozen=True, slots=True)
class StoreConfig:
    enabled: bool
    #: The crawl's writer in a forked process (True), a thread of the crawl
    #: (False), or the process where the crawl can fork it, else the thread (None:
    #: RETRYQUEUE_STORE_PROCESS = "auto").
    process: bool | None
    #: The SQLAlchemy URL; None means the SQLite file under the embedded dir.
    database_url: str | None
    batch_size: int
    interval: float
    retry_max: float
    claim_idle: float
    close_timeout: float
    create_schema: bool
    #: Days; None keeps dead letters forever.
    dead_retention: float | None
    history_retention: float | None
    #: RETRYQUEUE_SIGNING_KEYS (key bytes: a forked writer gets them pickled); none:
    #: the writer checks no signature.
    signing_keys: tuple[bytes, ...] = ()

    def url_for(self, embedded_directory: Path) -> str:
        """The database URL to use: the configured one, or the SQLite default."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{embedded_directory / defaults.STORE_SQLITE_NAME}"


def _positive(settings: Any, name: str, maximum: float | None = None) -> float:
    value = float(number_setting(settings, name, finite=True, maximum=maximum))
    if value == 0:
        raise ConfigError(f"{name} must be > 0, got {value!r}")
    return value


def _retention(settings: Any, name: str) -> float | None:
    value = raw_setting(settings, name)
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "off")):
        return None
    return _positive(settings, name, maximum=defaults.SETTING_DAYS_MAX)


def _process(settings: Any) -> bool | None:
    """RETRYQUEUE_STORE_PROCESS: ``"auto"`` (None), or a boolean as any setting's."""
    name = "RETRYQUEUE_STORE_PROCESS"
    value = raw_setting(settings, name)
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return None
    try:
        return bool_setting(settings, name)
    except ConfigError:
        raise ConfigError(f"{name} must be 'auto', True or False, got {shown(value)}") from None


def check_database_url(url: Any, *, name: str = "RETRYQUEUE_DATABASE_URL") -> str | None:
    """*url* when it is a PostgreSQL or SQLite SQLAlchemy URL; None when unset."""
    if url is None or url == "":
        return None
    if not isinstance(url, str):
        raise ConfigError(f"{name} must be a database URL string, got {url!r}")
    # Here, not at the top: a crawl reads these settings before it needs SQLAlchemy.
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        raise ConfigError(
            f"{name} must be a URL like postgresql://user@host/db or sqlite:///path, "
            f"got {redact_url(url)!r}"
        ) from None
    if parsed.get_backend_name() not in _DIALECTS:
        raise ConfigError(
            f"{name} must be a postgresql:// or sqlite:/// URL, got {redact_url(url)!r}"
        )
    if parsed.get_backend_name() == "sqlite" and parsed.database in (None, "", ":memory:"):
        # An in-memory database is one per connection: the writer's rows would
        # vanish, and nobody else (the commands, the dashboard) could read them.
        raise ConfigError(
            f"{name} must name a SQLite file (sqlite:///path/to/store.sqlite3), got {redact_url(url)!r}"
        )
    return url


def sqlite_path(url: str) -> str | None:
    """The file of a sqlite:/// URL; None for any other database."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    return parsed.database if parsed.get_backend_name() == "sqlite" else None


def load_store_config(settings: Any) -> StoreConfig:
    """Read and validate the store's RETRYQUEUE_* settings of a Scrapy Settings object."""
    return StoreConfig(
        enabled=bool_setting(settings, "RETRYQUEUE_STORE_ENABLED"),
        process=_process(settings),
        database_url=check_database_url(raw_setting(settings, "RETRYQUEUE_DATABASE_URL")),
        batch_size=number_setting(
            settings, "RETRYQUEUE_STORE_BATCH_SIZE", minimum=1, whole=True, finite=True
        ),
        interval=_positive(settings, "RETRYQUEUE_STORE_INTERVAL"),
        retry_max=_positive(settings, "RETRYQUEUE_STORE_RETRY_MAX"),
        claim_idle=_positive(settings, "RETRYQUEUE_STORE_CLAIM_IDLE"),
        close_timeout=float(
            number_setting(settings, "RETRYQUEUE_STORE_CLOSE_TIMEOUT", finite=True)
        ),
        create_schema=bool_setting(settings, "RETRYQUEUE_STORE_CREATE_SCHEMA"),
        dead_retention=_retention(settings, "RETRYQUEUE_DEAD_RETENTION"),
        history_retention=_retention(settings, "RETRYQUEUE_HISTORY_RETENTION"),
        signing_keys=parse_keys(raw_setting(settings, "RETRYQUEUE_SIGNING_KEYS")),
    )
