"""Files the package writes secrets to are the user's only: the spool, the embedded server's data, SQLite.

Each is checked under umask 022, the usual one, with which they were 0644 in
0755 directories before.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from scrapy_retryqueue.queue import embedded
from scrapy_retryqueue.queue.delayed import Write
from scrapy_retryqueue.queue.spool import Spool
from scrapy_retryqueue.store.db import Store

from .test_embedded import _stop_for_sure


@pytest.fixture(autouse=True)
def usual_umask() -> Iterator[None]:
    old = os.umask(0o022)
    yield
    os.umask(old)


def modes(root: Path) -> dict[str, int]:
    """Permission bits of *root* and of everything under it (sockets left out)."""
    found = {".": stat.S_IMODE(root.stat().st_mode)}
    for path in root.rglob("*"):
        st = path.lstat()
        if not stat.S_ISSOCK(st.st_mode):
            found[str(path.relative_to(root))] = stat.S_IMODE(st.st_mode)
    return found


def assert_private(root: Path) -> None:
    for name, mode in modes(root).items():
        assert mode & 0o077 == 0, f"{name} is {oct(mode)}"


def test_the_spool_is_0600_files_in_0700_directories(tmp_path: Path) -> None:
    spool = Spool(tmp_path, "s", "node", queue="redis://q", memory_limit=0, limit=10)
    spool.open()
    spool.add(Write("ack", "t1", 1, "tok"))
    assert spool.path.read_text()  # on disk: memory_limit=0
    assert_private(tmp_path / "spool")
    spool.close()


def test_an_older_spool_file_is_tightened_when_it_is_opened_again(tmp_path: Path) -> None:
    spool = Spool(tmp_path, "s", "node", queue="redis://q", memory_limit=0, limit=10)
    spool.directory.mkdir(parents=True, mode=0o755)
    spool.path.write_text("")
    spool.path.chmod(0o644)
    spool.open()
    assert_private(tmp_path / "spool")
    spool.close()


def test_the_sqlite_store_and_its_wal_are_0600_in_a_0700_directory(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'data' / 'store.sqlite3'}")
    store.ensure_schema()
    with store.begin() as conn:
        conn.execute(store.table.delete())  # a write: the -wal file exists now
    assert {"store.sqlite3", "store.sqlite3-wal"} <= set(os.listdir(tmp_path / "data"))
    assert_private(tmp_path / "data")
    store.close()


def test_the_embedded_servers_data_is_0600_files_in_a_0700_directory(tmp_path: Path) -> None:
    directory = tmp_path / "retryqueue"
    try:
        client = redis.Redis.from_url(embedded.ensure_server(directory))
        client.set("k", "secret")
        client.close()
        assert any(name.endswith(".aof") for name in modes(directory)), modes(directory)
        assert_private(directory)
    finally:
        _stop_for_sure(directory)
