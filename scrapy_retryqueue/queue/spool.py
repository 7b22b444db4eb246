"""A local spool for queue writes made while Redis is unreachable.

Writes wait in memory up to a limit, then in a JSON-lines file, and are
replayed in order once Redis answers again. The file is locked by the process
that owns it; a file whose lock is free belongs to a crawl that died, and the
next crawl of the same spider against the same queue adopts and replays it, so
a crash during an outage loses nothing either. A spool belongs to one queue
(Redis server, database, project namespace and spider): writes spooled for one
queue are never replayed into another. A Redis Cluster is one queue whatever node a crawl
reached it through: the caller says which other labels name its queue.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import IO

from ..exceptions import RetryQueueError
from .delayed import Write
from .files import open_private, private_dir
from .taskinfo import host_of


def _to_line(write: Write) -> str:
    return json.dumps(
        [
            write.op,
            write.task_id,
            write.now,
            write.token,
            write.envelope,
            write.due,
            write.kind,
            write.attempt,
            write.url,
            write.created,
            write.host,
            write.version,
            write.dead_id,
            write.learn,
            write.prior,
        ],
        separators=(",", ":"),
    )


def _from_line(line: str) -> Write:
    op, task_id, now, token, envelope, due, kind, attempt, url, *more = json.loads(line)
    # A line spooled by an older version has no creation time and host, nor the
    # version its envelope is recorded with, a dead letter's own id, or the
    # learning update (the outage it teaches is then not learned from).
    created, host, version, dead_id, learn, prior = (more + [None, "", None, "", "", None])[:6]
    return Write(
        op,
        task_id,
        int(now),
        token,
        envelope,
        int(due),
        kind,
        int(attempt),
        url,
        created if isinstance(created, int) else None,
        # An older line's host is its URL's: the replayed task is held while its
        # domain cools, as one parked now would be.
        host if isinstance(host, str) and host else host_of(url or ""),
        version=version if isinstance(version, int) else None,
        dead_id=dead_id if isinstance(dead_id, str) else "",
        learn=learn if isinstance(learn, str) else "",
        prior=prior if isinstance(prior, int) and not isinstance(prior, bool) else None,
    )


class SpoolFull(RetryQueueError):
    """The spool holds RETRYQUEUE_SPOOL_MAX writes already."""


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def spider_folder(spider: str, project: str = "") -> str:
    """The folder name of one spider's spool in one project's namespace: ``~`` is
    never in a safe spider name, so no project's folder is another's spider's."""
    return f"{_safe(project)}~{_safe(spider)}" if project else _safe(spider)


#: File beside a queue's spool folders that names the queue, for people.
QUEUE_LABEL = "QUEUE"


def queue_id(queue: str) -> str:
    """A short, stable folder name for one queue's spools."""
    return hashlib.sha1(queue.encode()).hexdigest()[:12]


class Spool:
    """Thread-safe FIFO of writes: memory first, then a file."""

    def __init__(
        self,
        directory: Path,
        spider: str,
        node_id: str,
        *,
        queue: str,
        memory_limit: int,
        limit: int,
        same_queue: Callable[[str], bool] | None = None,
        project: str = "",
    ):
        #: Where every spool of every queue lives.
        self.root = directory / "spool"
        self.spider = spider_folder(spider, project)
        #: The folder the layout before namespaces spooled this spider in: adopted
        #: like its Redis keys (adopt.lua), by the first namespaced crawl to open.
        self._legacy = _safe(spider) if project else None
        #: The queue's address as people may see it (no password).
        self.queue = queue
        #: Whether another folder's label names this queue too (a cluster reached
        #: through another node): its files are adopted, not left for another queue.
        self._same_queue = same_queue or (lambda other: other == queue)
        self.directory = self.root / queue_id(queue) / self.spider
        self.path = self.directory / f"{_safe(node_id)}.jsonl"
        self.memory_limit = memory_limit
        self.limit = limit
        self._memory: deque[Write] = deque()
        self._on_disk = 0
        self._lock = threading.Lock()
        self._file: IO[str] | None = None

    def __len__(self) -> int:
        return len(self._memory) + self._on_disk

    def open(self) -> list[Write]:
        """Lock this process's file; return the writes of dead crawls' files."""
        for directory in (self.root, self.directory.parent, self.directory):
            private_dir(directory)
        label = self.directory.parent / QUEUE_LABEL
        if not label.exists():
            with open_private(label, "w") as handle:
                handle.write(self.queue + "\n")
        self._file = self._lock_own_file()
        adopted: list[Write] = []
        for other in sorted(self.directory.glob("*.jsonl")):
            if other == self.path:
                continue
            adopted += self._adopt(other)
        for folder in self._folders_of_this_queue():
            for other in sorted(folder.glob("*.jsonl")):
                adopted += self._adopt(other)
        # Our own file may hold writes of an earlier process with the same node id.
        self._file.seek(0)
        adopted += [_from_line(line) for line in self._file if line.strip()]
        self._file.seek(0)
        self._file.truncate()
        return adopted

    def _lock_own_file(self) -> IO[str]:
        """Open and lock this node's file; another live crawler of the same spider and
        node id (two crawlers in one process) has its own, with a numbered name."""
        stem = self.path.stem
        for serial in range(1, 1000):
            if serial > 1:
                self.path = self.directory / f"{stem}-{serial}.jsonl"
            handle = open_private(self.path, "a+")  # held until close
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            return handle
        raise SpoolFull(f"no spool file of {self.directory} can be locked")

    def _adopt(self, path: Path) -> list[Write]:
        with open_private(path, "r+") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return []  # a live crawl owns it
            writes = [_from_line(line) for line in handle if line.strip()]
            path.unlink()
            return writes

    def _label_of(self, spider_dir: Path) -> str | None:
        label = spider_dir.parent / QUEUE_LABEL
        return label.read_text(encoding="utf-8").strip() if label.is_file() else None

    def _names(self) -> list[str]:
        return [self.spider] if self._legacy is None else [self.spider, self._legacy]

    def _folders_of_this_queue(self) -> list[Path]:
        """This spider's folders under other labels that name the same queue, and its
        folders of the layout before namespaces."""
        if not self.root.is_dir():
            return []
        return [
            spider_dir
            for name in self._names()
            for spider_dir in sorted(self.root.glob(f"*/{name}"))
            if spider_dir != self.directory
            and spider_dir.is_dir()
            and (label := self._label_of(spider_dir)) is not None
            and self._same_queue(label)
        ]

    def elsewhere(self) -> list[tuple[Path, int, str]]:
        """Spool files of this spider left for other queues: (path, writes, queue).

        They are never replayed here; a crawl against their queue replays them.
        """
        found: list[tuple[Path, int, str]] = []
        if not self.root.is_dir():
            return found
        folders = [d for name in self._names() for d in sorted(self.root.glob(f"*/{name}"))]
        for spider_dir in folders + [self.root / name for name in self._names()]:
            if spider_dir == self.directory or not spider_dir.is_dir():
                continue
            label = self._label_of(spider_dir)
            if label is not None and self._same_queue(label):
                continue  # adopted by open()
            queue = (
                label
                if label is not None
                else "a Redis this version cannot name (spooled by an older version)"
            )
            for path in sorted(spider_dir.glob("*.jsonl")):
                with open(path, encoding="utf-8") as handle:
                    count = sum(1 for line in handle if line.strip())
                if count:
                    found.append((path, count, queue))
        return found

    def add(self, write: Write) -> None:
        with self._lock:
            if len(self) >= self.limit:
                raise SpoolFull(f"the local spool holds {len(self)} writes (RETRYQUEUE_SPOOL_MAX)")
            if len(self._memory) < self.memory_limit and not self._on_disk:
                self._memory.append(write)
                return
            self._append_to_file([write])

    def _append_to_file(self, writes: list[Write]) -> None:
        assert self._file is not None, "spool not open"
        self._file.seek(0, os.SEEK_END)
        self._file.write("".join(_to_line(w) + "\n" for w in writes))
        self._file.flush()
        self._on_disk += len(writes)

    def take(self) -> list[Write]:
        """Every spooled write, oldest first; the spool is empty afterwards."""
        with self._lock:
            writes = list(self._memory)
            self._memory.clear()
            if self._on_disk and self._file is not None:
                self._file.seek(0)
                writes += [_from_line(line) for line in self._file if line.strip()]
                self._file.seek(0)
                self._file.truncate()
                self._on_disk = 0
            return writes

    def put_back(self, writes: list[Write]) -> None:
        """Return writes that could not be replayed, ahead of newer ones."""
        with self._lock:
            newer = list(self._memory)
            self._memory.clear()
            if self._on_disk and self._file is not None:
                self._file.seek(0)
                newer += [_from_line(line) for line in self._file if line.strip()]
                self._file.seek(0)
                self._file.truncate()
                self._on_disk = 0
            everything = writes + newer
            head, tail = everything[: self.memory_limit], everything[self.memory_limit :]
            self._memory.extend(head)
            if tail:
                self._append_to_file(tail)

    def close(self) -> int:
        """Move what is in memory to the file for the next crawl; return how many wait."""
        with self._lock:
            waiting = len(self)
            if self._file is None:
                return waiting
            if self._memory:
                pending = list(self._memory)
                self._memory.clear()
                self._file.seek(0)
                on_disk = [line for line in self._file if line.strip()]
                self._file.seek(0)
                self._file.truncate()
                self._file.write("".join(_to_line(w) + "\n" for w in pending) + "".join(on_disk))
                self._file.flush()
            empty = waiting == 0
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None
            if empty:
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()
            return waiting
