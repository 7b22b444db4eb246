"""Engines, the schema version check and migrations of the SQL store.

``Store(url)`` opens a database; :meth:`Store.ensure_schema` refuses, with a
message that says what to do, a database whose schema is older or newer than
this code, and creates the schema in an empty one (Alembic migrations shipped
with the package; ``scrapy deadletters migrate`` applies them). Alembic is
imported only when a schema is not current: created, upgraded or refused.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import create_engine, event, inspect, text
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from ..config import redact_url
from ..exceptions import RetryQueueError
from ..queue.files import open_private, private_dir, private_file
from .models import SCHEMA_HEAD, VERSION_TABLE, tasks_table

if TYPE_CHECKING:
    from alembic.config import Config as AlembicConfig
    from alembic.script import ScriptDirectory

logger = logging.getLogger(__name__)

SCRIPT_LOCATION = "scrapy_retryqueue.store:migrations"
#: pg_advisory_lock key serializing schema creation between nodes ("rqstore").
_PG_LOCK_KEY = 0x7271_7374_6F72_65
#: Seconds a new SQLite file may take to be put in WAL mode by a connection beside.
_WAL_WAIT = 10.0


class StoreError(RetryQueueError):
    """The store cannot be used; the message says why and what to do."""


class StoreUnavailable(StoreError):
    """The database does not answer (down, unreachable, refused)."""


class SchemaError(StoreError):
    """The database's schema is missing, older or newer than this code."""


def describe_db_error(exc: BaseException) -> str:
    """One line for a database error (no SQL, no parameters)."""
    orig = getattr(exc, "orig", None) or exc
    first = str(orig).strip().splitlines()
    return f"{type(orig).__name__}: {first[0] if first else ''}".rstrip(": ")


def is_connection_error(exc: BaseException) -> bool:
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    name = type(getattr(exc, "orig", exc)).__name__
    return name in ("OperationalError", "InterfaceError")


class _AlembicAtDebug(logging.Filter):
    """Alembic's INFO lines as DEBUG while the store runs it, in that thread only.

    Alembic says "Context impl PostgresqlImpl.", "Will assume transactional
    DDL.", "setup plugin ..." and "Running upgrade ..." at INFO each time a
    schema is checked or created: a dozen lines at the start of every crawl
    for routine work. The store says what matters itself (``schema upgraded
    from ... to ...``). A filter on a logger sees only that logger's own
    records, so it is put on every alembic logger; it changes only records
    made inside :func:`alembic_at_debug`, so a project's own use of Alembic in
    the same process keeps its levels.
    """

    _inside = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.INFO and getattr(self._inside, "depth", 0):
            record.levelno = logging.DEBUG
            record.levelname = logging.getLevelName(logging.DEBUG)
            # The logger let it through at INFO: ask again at DEBUG (a handler
            # without a level of its own would show it otherwise).
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


_AT_DEBUG = _AlembicAtDebug()
#: Alembic's loggers that log at INFO (alembic 1.13 to 1.20); the ones loaded
#: when a migration runs are added too (:func:`alembic_at_debug`).
_ALEMBIC_LOGGERS = (
    "alembic",
    "alembic.config",
    "alembic.runtime.migration",
    "alembic.runtime.plugins",
    "alembic.ddl.impl",
    "alembic.ddl.postgresql",
    "alembic.env",
)


def _filter_alembic_loggers() -> None:
    names = set(_ALEMBIC_LOGGERS) | {
        name for name in logging.root.manager.loggerDict if name.startswith("alembic.")
    }
    for name in names:
        alembic_logger = logging.getLogger(name)
        if _AT_DEBUG not in alembic_logger.filters:
            alembic_logger.addFilter(_AT_DEBUG)


@contextlib.contextmanager
def alembic_at_debug() -> Iterator[None]:
    """Run Alembic with its INFO lines logged at DEBUG (see :class:`_AlembicAtDebug`)."""
    _filter_alembic_loggers()
    inside = _AlembicAtDebug._inside
    inside.depth = getattr(inside, "depth", 0) + 1
    try:
        yield
    finally:
        inside.depth -= 1
        _filter_alembic_loggers()  # the modules this run imported, for the next one


def alembic_config(script_location: str = SCRIPT_LOCATION) -> AlembicConfig:
    with alembic_at_debug():  # importing Alembic logs its plugins at INFO
        from alembic.config import Config as AlembicConfig

    cfg = AlembicConfig()
    cfg.set_main_option("script_location", script_location)
    return cfg


@dataclass(frozen=True, slots=True)
class SchemaState:
    #: Revision recorded in the database; None for an unversioned database.
    current: str | None
    #: Revision this code needs.
    head: str
    #: ok, empty, older, newer or unversioned.
    state: str


def make_engine(url: str) -> Engine:
    """An engine for *url*; SQLite files get their directory, WAL and a busy timeout.

    A ``postgresql://`` URL without a driver uses psycopg2, the driver this
    package depends on (SQLAlchemy 2.1 would pick psycopg 3).
    """
    parsed = make_url(url)
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg2")
    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            # Dead letters hold requests, secrets too: the user's only. SQLite
            # gives its -wal and -shm files the database file's mode.
            path = Path(parsed.database)
            if not path.parent.exists():
                private_dir(path.parent)
            private_file(path)
        kwargs["connect_args"] = {"timeout": 30}
    else:
        kwargs["connect_args"] = {
            "connect_timeout": 5,
            "application_name": "scrapy-retryqueue",
        }
        kwargs["pool_size"] = 2
    try:
        engine = create_engine(parsed, **kwargs)
    except ImportError as exc:
        raise StoreError(
            f"the database driver for {redact_url(url)} is not installed ({exc})"
        ) from None
    if engine.dialect.name == "sqlite":

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            _use_wal(cur)
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

    return engine


def _use_wal(cur: Any) -> None:
    """Put the file in WAL mode unless it is already.

    WAL is the file's, once set, so it is asked first. The change wants the file to
    itself and fails at once, without waiting on the busy timeout, while another
    connection (the writer, a reader of the store) opens a new file at the same
    moment; that connection is setting WAL too, so a short wait and a second look
    find it done. The wait blocks no reactor: a store is opened by the writer (its
    thread or process), the commands and the dashboard's worker threads, never by
    the crawl's reactor thread.
    """
    deadline = time.monotonic() + _WAL_WAIT
    while True:
        try:
            if cur.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


class Store:
    """One database of failure history and dead letters."""

    def __init__(self, url: str, *, script_location: str = SCRIPT_LOCATION) -> None:
        self.url = url
        self.safe_url = redact_url(url)
        self.engine = make_engine(url)
        self.dialect = self.engine.dialect.name
        self.table = tasks_table
        self._script_location = script_location

    @cached_property
    def _alembic(self) -> AlembicConfig:
        return alembic_config(self._script_location)

    @cached_property
    def _script(self) -> ScriptDirectory:
        with alembic_at_debug():
            from alembic.script import ScriptDirectory

            return ScriptDirectory.from_config(self._alembic)

    def close(self) -> None:
        self.engine.dispose()

    # -- connections -------------------------------------------------------

    @contextlib.contextmanager
    def connect(self) -> Iterator[Connection]:
        """A connection; a database that does not answer raises StoreUnavailable."""
        try:
            conn = self.engine.connect()
        except SQLAlchemyError as exc:
            raise StoreUnavailable(
                f"the database at {self.safe_url} does not answer ({describe_db_error(exc)})"
            ) from None
        try:
            yield conn
        finally:
            conn.close()

    @contextlib.contextmanager
    def begin(self) -> Iterator[Connection]:
        with self.connect() as conn, conn.begin():
            yield conn

    def ping(self) -> None:
        with self.connect() as conn:
            conn.execute(text("SELECT 1"))

    # -- schema --------------------------------------------------------------

    @property
    def head(self) -> str:
        head = self._script.get_current_head()
        assert head is not None
        return head

    def schema_state(self, conn: Connection | None = None) -> SchemaState:
        if conn is None:
            with self.connect() as c:
                return self.schema_state(c)
        with alembic_at_debug():
            from alembic.runtime.migration import MigrationContext
            from alembic.util.exc import CommandError

            context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
            heads = context.get_current_heads()
        current = heads[0] if heads else None
        head = self.head
        if current is None:
            has_tables = inspect(conn).has_table(self.table.name)
            state = "unversioned" if has_tables else "empty"
        elif current == head:
            state = "ok"
        else:
            try:
                known = self._script.get_revision(current) is not None
            except CommandError:
                known = False
            state = "older" if known else "newer"
        return SchemaState(current, head, state)

    def ensure_schema(self, *, create: bool = True) -> SchemaState:
        """Check that the schema matches this code; create it in an empty database."""
        with self.connect() as conn:
            # SCHEMA_HEAD names the shipped migrations' head, not another script location's.
            shipped = self._script_location == SCRIPT_LOCATION
            if shipped and self._recorded_revision(conn) == SCHEMA_HEAD:
                return SchemaState(SCHEMA_HEAD, SCHEMA_HEAD, "ok")
            state = self.schema_state(conn)
            conn.rollback()
        if state.state == "empty" and create:
            self.upgrade()
            return self.schema_state()
        self.raise_for(state)
        return state

    @staticmethod
    def _recorded_revision(conn: Connection) -> str | None:
        """The revision the version table records, read with plain SQL (no Alembic);
        None when there is no such table or it holds no single revision."""
        try:
            rows = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).all()
        except DBAPIError:
            conn.rollback()  # PostgreSQL refuses anything more in a failed transaction
            return None
        conn.rollback()
        return str(rows[0][0]) if len(rows) == 1 else None

    def raise_for(self, state: SchemaState) -> None:
        where = f"the store database at {self.safe_url}"
        if state.state == "ok":
            return
        if state.state == "empty":
            raise SchemaError(
                f"{where} has no scrapy-retryqueue schema; create it with "
                "`scrapy deadletters migrate`"
            )
        if state.state == "unversioned":
            raise SchemaError(
                f"{where} has a {self.table.name} table but no schema version "
                f"({VERSION_TABLE}); it was not made by these migrations: move it away "
                "or point RETRYQUEUE_DATABASE_URL at another database"
            )
        if state.state == "older":
            raise SchemaError(
                f"{where} has schema revision {state.current}, older than the {state.head} "
                "this scrapy-retryqueue needs; upgrade it with `scrapy deadletters migrate`"
            )
        raise SchemaError(
            f"{where} has schema revision {state.current}, which this scrapy-retryqueue does "
            f"not know (it needs {state.head}): a newer version made it; upgrade "
            "scrapy-retryqueue on this node"
        )

    def upgrade(self, revision: str = "head") -> tuple[str | None, str]:
        """Apply migrations up to *revision*; returns (before, after)."""
        with alembic_at_debug():
            from alembic import command

        with self._schema_lock():
            with self.connect() as conn:
                before = self.schema_state(conn)
                conn.rollback()
            if before.state in ("newer", "unversioned"):
                self.raise_for(before)
            if before.state == "ok" and revision == "head":
                return before.current, before.current or ""
            with self.connect() as conn:
                self._alembic.attributes["connection"] = conn
                try:
                    with alembic_at_debug():
                        command.upgrade(self._alembic, revision)
                    conn.commit()
                finally:
                    self._alembic.attributes.pop("connection", None)
            return before.current, self.schema_state().current or ""

    def upgrade_sql(self, revision: str = "head") -> str:
        """The SQL that :meth:`upgrade` runs from an empty database (offline mode)."""
        return upgrade_sql(self.url, revision, script_location=self._script_location)

    @contextlib.contextmanager
    def _schema_lock(self) -> Iterator[None]:
        """Serialize schema changes between processes (several nodes start at once)."""
        if self.dialect == "postgresql":
            with self.connect() as conn:
                conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _PG_LOCK_KEY})
                conn.commit()
                try:
                    yield
                finally:
                    conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _PG_LOCK_KEY})
                    conn.commit()
        elif self.dialect == "sqlite" and self.engine.url.database not in (None, "", ":memory:"):
            lock_path = Path(f"{self.engine.url.database}.lock")
            with open_private(lock_path, "a+") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(lock, fcntl.LOCK_UN)
        else:
            yield


def upgrade_sql(url: str, revision: str = "head", *, script_location: str = SCRIPT_LOCATION) -> str:
    """The SQL that :meth:`Store.upgrade` runs on an empty database of *url*'s dialect
    (Alembic's offline mode): nothing is connected to, no SQLite file is made."""
    import io

    with alembic_at_debug():
        from alembic import command

    buffer = io.StringIO()
    cfg = alembic_config(script_location)
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.output_buffer = buffer
    with alembic_at_debug():
        command.upgrade(cfg, revision, sql=True)
    return buffer.getvalue()


def code_head(script_location: str = SCRIPT_LOCATION) -> str:
    """The schema revision this code writes (:attr:`Store.head`), without a database."""
    with alembic_at_debug():
        from alembic.script import ScriptDirectory

        head = ScriptDirectory.from_config(alembic_config(script_location)).get_current_head()
    assert head is not None
    return head
