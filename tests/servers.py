"""Private servers for tests that stop and start one: Redis nodes, PostgreSQL, any child.

The shared Redis and PostgreSQL on this machine serve every test run at once,
so no test may stop them. A test that needs an outage starts a private server
here and stops that one.

Ports: a server that can bind port 0 itself and report the port it got
(the flaky site, uvicorn) is given 0. These servers cannot (redis-server
treats 0 as "no TCP", PostgreSQL has no such option), so :func:`start_on_free_port`
starts them on a random port and retries on another when the start finds it
taken, instead of probing a port first and hoping it is still free when the
server binds it. "Started" means listening as *this* process (its own log
says so, its data directory answers, or the port's listener has its pid),
not some other server that holds the port.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from .waiting import wait_for

T = TypeVar("T")

#: Ports tried for servers that need a fixed one: below Linux's ephemeral range
#: (32768-60999), so outgoing connections do not take them; a Redis Cluster
#: node also binds its port + 10000, still below that range.
PORTS = range(10_000, 20_000)


class PortTaken(Exception):
    """A server could not bind the port it was given: try another."""


def start_on_free_port(start: Callable[[int], T], what: str, attempts: int = 20) -> T:
    """``start(port)`` on random ports until one start does not raise PortTaken."""
    # Not the random module's shared generator: a test may seed it, and two
    # seeded runs in parallel would then race for the same ports.
    pick = random.SystemRandom()
    tried: list[int] = []
    for _ in range(attempts):
        port = pick.choice(PORTS)
        if port in tried:
            continue
        try:
            return start(port)
        except PortTaken:
            tried.append(port)
    pytest.fail(f"{what}: every port tried was taken ({tried})")


def _restart_on(start: Callable[[int], object], port: int, what: str) -> None:
    """Start a server again on the port its clients know (no other will do)."""
    try:
        start(port)
    except PortTaken:
        pytest.fail(f"{what}: port {port} was taken while the server was stopped")


def _new_text(path: Path, offset: int) -> str:
    if not path.exists():
        return ""
    with path.open("rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


# -- Redis -------------------------------------------------------------------------


class RedisServer:
    """One redis-server process of this test's own, in *directory*.

    ``start()`` picks a free port (first start) or reuses the one it had
    (a restart); ``stop()`` terminates it and waits for it to exit.
    """

    def __init__(self, directory: Path, *args: str) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is needed: run `bash scripts/ensure-services`")
        self.binary = binary
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self.args = args
        self.log = directory / "redis.log"
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        if self.port:
            _restart_on(self._start_on, self.port, "redis-server")
        else:
            self.port = start_on_free_port(self._start_on, f"redis-server in {self.directory}")

    def _start_on(self, port: int) -> int:
        offset = self.log.stat().st_size if self.log.exists() else 0
        process = subprocess.Popen(
            [self.binary, "--port", str(port), "--bind", "127.0.0.1"]
            + ["--dir", str(self.directory), "--logfile", str(self.log), *self.args],
            stdout=subprocess.DEVNULL,
        )
        # Ours once our own log says it listens (the log is in our directory):
        # asking the port could reach another server that holds it.
        wait_for(
            lambda: (
                process.poll() is not None
                or "Ready to accept connections" in _new_text(self.log, offset)
            ),
            f"redis-server on port {port}",
        )
        if process.poll() is not None:
            log = _new_text(self.log, offset)
            if "Address already in use" in log or "Failed listening on port" in log:
                raise PortTaken(port)
            pytest.fail(f"redis-server on port {port} exited ({process.returncode}):\n{log}")
        self.process = process
        return port

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            process.terminate()
            process.wait(10)


# -- PostgreSQL ----------------------------------------------------------------------


def _postgres_bin() -> Path:
    """The directory of initdb and pg_ctl: Debian keeps them off PATH."""
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parts[-3])
    )
    if versions:
        return versions[-1].parent
    on_path = shutil.which("pg_ctl")
    if on_path is None:
        pytest.fail("initdb and pg_ctl are needed: run `bash scripts/ensure-services`")
    return Path(on_path).resolve().parent


class PostgresServer:
    """A throwaway PostgreSQL cluster of this test's own (trust auth, user postgres).

    Its data, log and unix socket live in a temp dir; it listens on 127.0.0.1
    only. PostgreSQL refuses to run as root, so as root every command runs as
    the ``postgres`` user, which then owns the temp dir.
    """

    def __init__(self) -> None:
        self.bin = _postgres_bin()
        self.as_user: list[str] = []
        owner = None
        if os.geteuid() == 0:
            self.as_user = ["runuser", "-u", "postgres", "--"]
            owner = "postgres"
        self.directory = Path(tempfile.mkdtemp(prefix="retryqueue-pg-"))
        if owner is not None:
            shutil.chown(self.directory, owner, owner)
        self.data = self.directory / "data"
        self.log = self.directory / "postgres.log"
        self.port = 0
        self._run("initdb", "-D", self.data, "-A", "trust", "-U", "postgres", "--no-sync")

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(
        self, tool: str, *args: object, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.as_user, str(self.bin / tool), *map(str, args)],
            check=check,
            capture_output=True,
            text=True,
            timeout=120,
        )

    def start(self) -> None:
        if self.port:
            _restart_on(self._start_on, self.port, "PostgreSQL")
        else:
            self.port = start_on_free_port(self._start_on, "a private PostgreSQL")

    def _start_on(self, port: int) -> int:
        offset = self.log.stat().st_size if self.log.exists() else 0
        # Durability is not under test here: fsync off makes it start and stop fast.
        options = f"-p {port} -k {self.directory} -c listen_addresses=127.0.0.1 -c fsync=off"
        done = self._run(
            "pg_ctl", "-D", self.data, "-l", self.log, "-o", options, "-w", "-t", "60", "start",
            check=False,
        )  # fmt: skip
        if done.returncode != 0:
            log = _new_text(self.log, offset)
            if "Address already in use" in log:
                raise PortTaken(port)
            pytest.fail(f"PostgreSQL did not start on port {port}: {done.stderr}\n{log}")
        # pg_ctl saw our server ready; make sure the TCP port is ours too.
        if self.data_directory(port) != str(self.data):
            self._run("pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop", check=False)
            raise PortTaken(port)
        return port

    def data_directory(self, port: int | None = None) -> str | None:
        """The data directory of the server answering on *port* (None: none answers)."""
        import psycopg2

        try:
            conn = psycopg2.connect(
                host="127.0.0.1",
                port=port or self.port,
                user="postgres",
                dbname="postgres",
                connect_timeout=3,
            )
        except psycopg2.OperationalError:
            return None
        try:
            with conn.cursor() as cur:
                cur.execute("SHOW data_directory")
                row = cur.fetchone()
            return None if row is None else str(row[0])
        finally:
            conn.close()

    def stop(self) -> None:
        self._run("pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop")

    def remove(self) -> None:
        """Stop it when it runs, and delete its files."""
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop", check=False)
        shutil.rmtree(self.directory, ignore_errors=True)


# -- Any child that cannot report its port ---------------------------------------------


def listens_as(pid: int, port: int) -> bool:
    """Whether process *pid* has a TCP socket listening on *port*.

    Read from Linux's /proc; elsewhere, whether anything accepts on the port.
    """
    tables = [t for t in (Path("/proc/net/tcp"), Path("/proc/net/tcp6")) if t.exists()]
    if not tables:
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", port)) == 0
    sockets: set[str] = set()
    for table in tables:
        for line in table.read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                sockets.add(f"socket:[{inode}]")
    if not sockets:
        return False
    try:
        return any(os.readlink(fd) in sockets for fd in Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False  # it exited meanwhile
