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
import signal
import socket
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

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

    def kill(self) -> None:
        """kill -9: what it acknowledged is in its append-only file (when it keeps one)."""
        process, self.process = self.process, None
        if process is not None:
            process.kill()
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


# -- A Redis Cluster of a test's own ---------------------------------------------------


class LocalCluster:
    """A Redis Cluster on loopback of this test's own: *masters* masters with a
    replica each, persistent (``appendonly yes``, ``everysec``), failing over
    after ``cluster-node-timeout`` *node_timeout_ms* (2 s: a failover within
    seconds, as a production cluster does with a shorter timeout).

    A node is killed (``kill``), frozen (``freeze`` / ``thaw``: SIGSTOP, as a
    stalled VM) and started again (``start_stopped``) on its own port, with
    its ``nodes.conf`` and append-only file: it rejoins as what the cluster
    says it is now (an old master comes back as a replica after a failover).
    """

    def __init__(self, directory: Path, *, masters: int = 3, node_timeout_ms: int = 2000) -> None:
        self.masters = masters
        self.nodes = [
            RedisServer(
                directory / f"node{n}",
                *("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"),
                *("--cluster-node-timeout", str(node_timeout_ms)),
                *("--appendonly", "yes", "--appendfsync", "everysec", "--save", ""),
            )
            for n in range(2 * masters)
        ]

    @property
    def url(self) -> str:
        return self.nodes[0].url

    @property
    def addresses(self) -> str:
        """Every node's ``host:port``, comma-separated (RETRYQUEUE_REDIS_CLUSTER_NODES)."""
        return ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)

    def live_url(self) -> str:
        """The URL of a node that runs now (the first may be the one a test killed)."""
        return next(node.url for node in self.nodes if node.process is not None)

    def start(self) -> None:
        cli = shutil.which("redis-cli")
        if cli is None:
            pytest.fail("redis-server and redis-cli are needed: run `bash scripts/ensure-services`")
        for node in self.nodes:
            node.start()  # a free port (and its cluster bus port + 10000) or another try
        subprocess.run(
            [cli, "--cluster", "create", *(f"127.0.0.1:{node.port}" for node in self.nodes)]
            + ["--cluster-replicas", "1", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        self.wait_healthy()

    def _ask(self, node: RedisServer, *command: str) -> Any:
        import redis

        client = redis.Redis(port=node.port, socket_timeout=2, socket_connect_timeout=2)
        try:
            return client.execute_command(*command)
        finally:
            client.close()

    def healthy(self) -> bool:
        """Every node runs and says the cluster is ok; every master has a synced replica."""
        if any(node.process is None for node in self.nodes):
            return False
        masters = 0
        for node in self.nodes:
            info = self._ask(node, "CLUSTER", "INFO")
            text = info.decode() if isinstance(info, bytes) else str(info)
            if "cluster_state:ok" not in text:
                return False
            replication = self._ask(node, "INFO", "replication")
            if replication.get("role") == "master":
                masters += 1
                if replication.get("connected_slaves", 0) < 1:
                    return False
            elif replication.get("master_link_status") != "up":
                return False
        return masters == self.masters

    def wait_healthy(self, timeout: float = 60) -> None:
        wait_for(self.healthy, "the cluster to be whole again", timeout=timeout)

    def master_of(self, key: str) -> RedisServer:
        """The node that serves *key*'s slot now, as a live node sees it."""
        from redis.crc import key_slot

        slot = key_slot(key.encode())
        live = next(n for n in self.nodes if n.process is not None)
        for start, end, master, *_ in self._ask(live, "CLUSTER", "SLOTS"):
            if start <= slot <= end:
                port = int(master[1])
                return next(n for n in self.nodes if n.port == port)
        raise AssertionError(f"no node serves slot {slot}")

    def replica_of(self, master: RedisServer) -> RedisServer:
        node_id = self._ask(master, "CLUSTER", "MYID")
        node_id = node_id.decode() if isinstance(node_id, bytes) else node_id
        for node in self.nodes:
            if node is master or node.process is None:
                continue
            replication = self._ask(node, "INFO", "replication")
            if replication.get("master_port") == master.port:
                return node
        raise AssertionError(f"no replica of {node_id}")

    def other_shard(self, key: str) -> tuple[RedisServer, RedisServer]:
        """A master that does not serve *key*'s slot, and its replica."""
        mine = self.master_of(key)
        for node in self.nodes:
            if node is mine or node.process is None:
                continue
            if self._ask(node, "INFO", "replication").get("role") == "master":
                return node, self.replica_of(node)
        raise AssertionError("no other shard")

    def kill(self, *nodes: RedisServer) -> None:
        for node in nodes:
            node.kill()

    def freeze(self, node: RedisServer) -> None:
        assert node.process is not None
        node.process.send_signal(signal.SIGSTOP)

    def thaw(self, node: RedisServer) -> None:
        assert node.process is not None
        node.process.send_signal(signal.SIGCONT)

    def start_stopped(self) -> None:
        for node in self.nodes:
            if node.process is None:
                node.start()

    def stop(self) -> None:
        """Kill every node: the cluster is thrown away (a SIGTERM makes a node write
        out its append-only file first, which a loaded disk can make take long)."""
        for node in self.nodes:
            node.kill()
