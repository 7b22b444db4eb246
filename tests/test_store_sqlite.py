"""SQLite store files opened by several connections at the moment they are made."""

from __future__ import annotations

import threading
from pathlib import Path

from sqlalchemy import text

from scrapy_retryqueue.store.db import Store


def test_connections_opening_a_new_file_together_all_get_in(tmp_path: Path) -> None:
    # The writer and a reader of the store (a command, the dashboard) opening a file
    # that does not exist yet both put it in WAL mode; the loser of that race used
    # to fail at once with "database is locked" and the writer reported an outage.
    errors: list[BaseException] = []
    for round_ in range(60):
        url = f"sqlite:///{tmp_path / f'{round_}.sqlite3'}"
        barrier = threading.Barrier(6)

        def connect(url: str = url, barrier: threading.Barrier = barrier) -> None:
            store = Store(url)
            barrier.wait()
            try:
                with store.engine.connect() as conn:
                    assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
            except BaseException as exc:  # collected for the assert below
                errors.append(exc)
            finally:
                store.close()

        threads = [threading.Thread(target=connect) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert errors == []
