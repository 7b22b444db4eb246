"""The embedded valkey server (scrapy_retryqueue/embedded.py), started for real.

Each test uses its own directory under tmp_path, so each has its own server;
a finaliser stops it (and waits for the process to go) whatever the test did.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from scrapy_retryqueue.queue import embedded

# Every test starts (or runs the commands of) a real valkey server.
pytestmark = pytest.mark.integration


def _alive(pid: int) -> bool:
    """True while *pid* runs (a zombie waiting to be reaped counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _servers_in(directory: Path) -> list[int]:
    """Pids of the valkey servers whose working directory is *directory*."""
    target = str(directory.resolve())
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if os.readlink(proc / "cwd") != target:
                continue
            if Path(os.readlink(proc / "exe")).name != "valkey-server":
                continue
        except OSError:
            continue
        if _alive(int(proc.name)):
            pids.append(int(proc.name))
    return pids


def _wait_gone(pids: list[int], timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.02)
    return left


def _pidfile(directory: Path) -> int:
    return int((directory / embedded.PID_NAME).read_text().strip())


@pytest.fixture
def server_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory for one embedded server, stopped (for sure) at the end."""
    directory = tmp_path / "retryqueue"
    yield directory
    _stop_for_sure(directory)


def _stop_for_sure(directory: Path) -> None:
    pids = _servers_in(directory) if directory.exists() else []
    if directory.exists():
        embedded.stop_server(directory)
    for pid in _wait_gone(pids, timeout=5):
        # Only servers this test started (their working directory is its tmp dir).
        os.kill(pid, signal.SIGKILL)
    _wait_gone(pids, timeout=5)
    embedded.socket_path(directory).unlink(missing_ok=True)


def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=5)


def test_ensure_server_starts_a_server_on_a_unix_socket(server_dir: Path) -> None:
    assert not embedded.is_running(server_dir)

    url = embedded.ensure_server(server_dir)

    sock = server_dir / embedded.SOCKET_NAME
    assert url == f"unix://{sock}" == embedded.server_url(server_dir)
    assert sock.is_socket()
    assert embedded.is_running(server_dir)
    client = _client(url)
    assert client.ping()
    info = client.info("persistence")
    assert info["aof_enabled"] == 1
    assert client.config_get("port") == {"port": "0"}
    assert _servers_in(server_dir) == [_pidfile(server_dir)]
    client.close()


def test_second_ensure_server_reuses_the_running_one(server_dir: Path) -> None:
    url = embedded.ensure_server(server_dir)
    pid = _pidfile(server_dir)

    assert embedded.ensure_server(server_dir) == url

    assert _pidfile(server_dir) == pid
    assert _servers_in(server_dir) == [pid]


def test_data_survives_a_restart(server_dir: Path) -> None:
    client = _client(embedded.ensure_server(server_dir))
    client.set("pending", "retry me")
    client.zadd("due", {"task": 1234})
    client.close()
    first_pid = _pidfile(server_dir)

    assert embedded.stop_server(server_dir) is True
    assert _wait_gone([first_pid]) == []
    assert not embedded.is_running(server_dir)
    assert not (server_dir / embedded.SOCKET_NAME).exists()

    client = _client(embedded.ensure_server(server_dir))
    assert _pidfile(server_dir) != first_pid
    assert client.get("pending") == b"retry me"
    assert client.zscore("due", "task") == 1234
    client.close()


def test_stop_server_when_not_running(server_dir: Path) -> None:
    server_dir.mkdir(parents=True)
    assert embedded.stop_server(server_dir) is False

    embedded.ensure_server(server_dir)
    assert embedded.stop_server(server_dir) is True
    assert embedded.stop_server(server_dir) is False
    assert not embedded.is_running(server_dir)


def test_stop_server_in_a_directory_never_used(tmp_path: Path) -> None:
    assert embedded.stop_server(tmp_path / "never-used") is False


def test_stale_socket_file_does_not_count_as_running(server_dir: Path) -> None:
    server_dir.mkdir(parents=True)
    (server_dir / embedded.SOCKET_NAME).write_text("left over from a crash")
    assert not embedded.is_running(server_dir)

    url = embedded.ensure_server(server_dir)

    assert embedded.is_running(server_dir)
    assert _client(url).ping()


def test_long_directory_falls_back_to_a_short_socket(tmp_path: Path) -> None:
    directory = tmp_path / ("d" * 60) / ("e" * 60)
    assert len(os.fsencode(directory / embedded.SOCKET_NAME)) > 100
    try:
        url = embedded.ensure_server(directory)

        sock = embedded.socket_path(directory)
        assert sock.parent == Path(tempfile.gettempdir())
        assert sock.name.startswith("retryqueue-") and sock.suffix == ".sock"
        assert len(os.fsencode(sock)) <= 100
        assert url == f"unix://{sock}"
        assert sock.is_socket()
        assert embedded.is_running(directory)
        assert _client(url).ping()
        # Data stays in the project directory; only the socket moved.
        assert (directory / embedded.PID_NAME).exists()
        # Another long directory gets another socket.
        assert embedded.socket_path(directory.with_name("f" * 60)) != sock
    finally:
        _stop_for_sure(directory)
    assert not embedded.socket_path(directory).exists()


def _ensure_at_once(directory: Path, barrier: Any, results: Any) -> None:
    barrier.wait(timeout=60)
    results.put(embedded.ensure_server(directory))


def test_concurrent_ensure_server_starts_exactly_one(server_dir: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    workers = 4
    barrier = ctx.Barrier(workers)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_ensure_at_once, args=(server_dir, barrier, results))
        for _ in range(workers)
    ]
    for proc in procs:
        proc.start()
    urls = [results.get(timeout=90) for _ in range(workers)]
    for proc in procs:
        proc.join(timeout=30)
    assert [proc.exitcode for proc in procs] == [0] * workers

    assert set(urls) == {embedded.server_url(server_dir)}
    assert _servers_in(server_dir) == [_pidfile(server_dir)]
    log = (server_dir / embedded.LOG_NAME).read_text()
    assert log.count("Ready to accept connections") == 1
    assert _client(urls[0]).ping()


# -- scrapy retryqueue server ... ---------------------------------------------


@pytest.fixture
def retryqueue_cmd(
    server_dir: Path, tmp_path: Path
) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run ``scrapy retryqueue <args>`` outside any project, on *server_dir*."""
    env = {k: v for k, v in os.environ.items() if k != "SCRAPY_SETTINGS_MODULE"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "scrapy.cmdline",
                "retryqueue",
                *args,
                "-s",
                f"RETRYQUEUE_EMBEDDED_DIR={server_dir}",
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    return run


def test_command_server_start_status_stop(
    retryqueue_cmd: Callable[..., subprocess.CompletedProcess[str]], server_dir: Path
) -> None:
    status = retryqueue_cmd("server", "status")
    assert status.returncode == 3, status
    assert status.stdout == f"not running (data in {server_dir})\n"

    start = retryqueue_cmd("server", "start")
    assert start.returncode == 0, start
    url = embedded.server_url(server_dir)
    assert start.stdout == f"running: {url}\n"
    assert embedded.is_running(server_dir)
    pid = _pidfile(server_dir)

    status = retryqueue_cmd("server", "status")
    assert status.returncode == 0, status
    assert status.stdout == f"running: {url} (data in {server_dir})\n"

    again = retryqueue_cmd("server", "start")
    assert again.returncode == 0, again
    assert _pidfile(server_dir) == pid

    stop = retryqueue_cmd("server", "stop")
    assert stop.returncode == 0, stop
    assert stop.stdout == f"stopped (data kept in {server_dir})\n"
    assert _wait_gone([pid]) == []
    assert not embedded.is_running(server_dir)

    stop = retryqueue_cmd("server", "stop")
    assert stop.returncode == 0, stop
    assert stop.stdout == "not running\n"

    status = retryqueue_cmd("server", "status")
    assert status.returncode == 3, status


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            (),
            "the following arguments are required: {server,status,dashboard,writer,settings,keygen}",
        ),
        (("server",), "the following arguments are required: server_action"),
        (
            ("server", "restart"),
            "invalid choice: 'restart' (choose from 'start', 'stop', 'status')",
        ),
        # Python 3.13's argparse no longer quotes the choices: the prefix holds on both.
        (("serve", "start"), "invalid choice: 'serve' (choose from "),
        (("server", "start", "x"), "unrecognized arguments: x"),
    ],
)
def test_command_bad_usage(
    retryqueue_cmd: Callable[..., subprocess.CompletedProcess[str]],
    server_dir: Path,
    args: tuple[str, ...],
    expected: str,
) -> None:
    # One line on stderr that names what is wrong and where the help is (the
    # commands' -h describes each subcommand), not Scrapy's whole usage text.
    result = retryqueue_cmd(*args)

    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith("error: scrapy retryqueue")
    assert result.stderr.count("\n") == 1
    assert expected in result.stderr
    assert "-h)" in result.stderr
    assert "Traceback" not in result.stderr
    assert not embedded.is_running(server_dir)


# -- the server runs while a crawl process holds it --------------------------------


def _other_process_holds(directory: Path) -> int:
    """A shared lock on the hold file through a descriptor of its own: to flock,
    another crawl process using the server."""
    import fcntl

    fd = os.open(directory / embedded.HOLD_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


def test_the_last_user_to_let_go_stops_the_server(server_dir: Path) -> None:
    embedded.hold(server_dir)
    embedded.ensure_server(server_dir)
    pid = _pidfile(server_dir)
    other = _other_process_holds(server_dir)
    try:
        # Another process still uses it: it stays.
        assert embedded.let_go(server_dir) is False
        assert embedded.is_running(server_dir)
    finally:
        os.close(other)
    # Two users in one process (the queue and the store writer): the second stops it.
    embedded.hold(server_dir)
    embedded.hold(server_dir)
    assert embedded.let_go(server_dir) is False
    assert embedded.is_running(server_dir)
    assert embedded.let_go(server_dir) is True
    assert _wait_gone([pid]) == []
    assert not embedded.is_running(server_dir)
    # Letting go of what is not held does nothing.
    assert embedded.let_go(server_dir) is False


def test_a_kept_server_outlives_its_last_user(server_dir: Path) -> None:
    embedded.hold(server_dir)
    embedded.ensure_server(server_dir)
    assert embedded.let_go(server_dir, keep=True) is False  # RETRYQUEUE_EMBEDDED_KEEP
    assert embedded.is_running(server_dir)

    # Started to be kept (scrapy retryqueue server start): no crawl stops it...
    embedded.ensure_server(server_dir, keep=True)
    embedded.hold(server_dir)
    assert embedded.let_go(server_dir) is False
    assert embedded.is_running(server_dir)
    # ...until it is stopped by hand, which forgets that it was kept.
    assert embedded.stop_server(server_dir) is True
    assert not (server_dir / embedded.KEEP_NAME).exists()
    embedded.hold(server_dir)
    embedded.ensure_server(server_dir)
    assert embedded.let_go(server_dir) is True


def test_without_scrapy_cfg_the_state_goes_to_a_per_user_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As Scrapyd runs an egg: the settings module imports, no scrapy.cfg is in reach.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SCRAPY_SETTINGS_MODULE", "tests.test_embedded")
    monkeypatch.setenv("SCRAPY_PROJECT", "books/bot")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    directory = embedded.project_directory()
    assert directory == tmp_path / "data" / "scrapy-retryqueue" / "books_bot"
    assert embedded.user_directory_in_use(directory)

    # With scrapy.cfg, Scrapy's own data dir as before.
    (tmp_path / "scrapy.cfg").write_text("[settings]\ndefault = tests.test_embedded\n")
    assert embedded.project_directory() == tmp_path / ".scrapy" / "retryqueue"
    assert not embedded.user_directory_in_use(embedded.project_directory())
    # Named, not made (Scrapy's data_path makes .scrapy even with createdir=False).
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scrapy.cfg"]
    # scrapy.cfg's [datadir] moves it, as it moves Scrapy's.
    (tmp_path / "scrapy.cfg").write_text(
        "[settings]\ndefault = tests.test_embedded\n[datadir]\ndefault = state\n"
    )
    assert embedded.project_directory() == Path("state", "retryqueue")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scrapy.cfg"]


def test_a_directory_that_cannot_be_written_is_one_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(embedded.EmbeddedServerError, match="RETRYQUEUE_EMBEDDED_DIR") as info:
        embedded.check_directory(blocker / "retryqueue")
    assert str(blocker / "retryqueue") in str(info.value)


def test_nodes_checking_one_directory_at_once_all_find_it_writable(tmp_path: Path) -> None:
    # Fleet nodes started at the same instant check the same local state directory:
    # one node's probe is never another's to remove.
    import threading

    directory = tmp_path / "retryqueue"
    errors: list[BaseException] = []

    def check() -> None:
        try:
            for _ in range(200):
                embedded.check_directory(directory)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=check) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert list(directory.iterdir()) == []  # no probe left behind


def _hold_and_exit(directory: str) -> None:
    """A process that holds the server and exits without letting go (a crawl stopped
    as its spider opens never reaches the store writer's engine_stopped)."""
    embedded.hold(Path(directory))
    embedded.ensure_server(Path(directory))


def test_a_process_that_exits_holding_the_server_lets_go_of_it(server_dir: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=_hold_and_exit, args=(str(server_dir),))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    # It was the last user: its exit stopped the server.
    assert not embedded.is_running(server_dir)
    assert _wait_gone(_servers_in(server_dir)) == []
