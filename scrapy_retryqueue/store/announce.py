"""A writer service's announcement in Redis, and a crawl's reading of it.

While ``scrapy retryqueue writer`` runs it holds one STRING per spider it was told to
serve, or one for the whole project when it serves every spider
(:func:`~scrapy_retryqueue.queue.keys.writer_key`): its consumer name, with an
expiry of STORE_WRITER_ANNOUNCE_TTL seconds that a thread of its own renews every
third of that, whatever its database is doing. It deletes them as it stops; a writer
killed leaves them to expire. A crawl that finds one for its spider starts no writer
of its own: the service writes its events (docs/store.md, "a fleet's writer service").
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Sequence
from typing import Any

from ..queue.keys import writer_key
from ..settings.defaults import STORE_WRITER_ANNOUNCE_TTL
from ..values import as_text

logger = logging.getLogger(__name__)


def announced_writer(client: Any, spider: str, project: str = "") -> tuple[str, str] | None:
    """(the writer service's consumer name, its key) when one announces itself for
    *spider* (or for every spider of *project*); None when none does. Two reads."""
    for key in (writer_key(spider, project), writer_key(None, project)):
        value = client.get(key)
        if value:
            return as_text(value), key
    return None


class WriterAnnouncement:
    """Holds a writer service's keys in Redis from :meth:`start` to :meth:`stop`."""

    def __init__(
        self,
        client: Any,
        *,
        consumer: str,
        spiders: Sequence[str] | None,
        project: str = "",
        ttl: float = STORE_WRITER_ANNOUNCE_TTL,
    ) -> None:
        self.client = client
        self.consumer = consumer
        self.keys = (
            [writer_key(spider, project) for spider in dict.fromkeys(spiders)]
            if spiders
            else [writer_key(None, project)]
        )
        self.ttl = ttl
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Announce now (raises if Redis does not answer), then renew in a thread."""
        self.renew()
        self._thread = threading.Thread(
            target=self._renewing, name="retryqueue-writer-announce", daemon=True
        )
        self._thread.start()

    def renew(self) -> None:
        for key in self.keys:
            self.client.set(key, self.consumer, px=int(self.ttl * 1000))

    def _renewing(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                self.renew()
            except Exception as exc:
                # Redis out of reach: the crawls cannot read it either; the next
                # renewal announces it again (the writer's own line names the outage).
                logger.debug("scrapy-retryqueue: announcing the writer failed: %s", exc)

    def stop(self) -> None:
        """Stop renewing, and take back the keys that still name this writer."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        for key in self.keys:
            with contextlib.suppress(Exception):
                # Another writer of the same spiders may have announced itself since.
                if as_text(self.client.get(key) or b"") == self.consumer:
                    self.client.delete(key)
