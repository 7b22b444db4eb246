"""A writer service's announcement in Redis, and a crawl's reading of it.

While ``scrapy retryqueue writer`` runs it holds one STRING per spider it was told to
serve, or one for the whole project when it serves every spider
(:func:`~scrapy_retryqueue.queue.keys.writer_key`): its consumer name, with an
expiry of STORE_WRITER_ANNOUNCE_TTL seconds that a thread of its own renews every
third of that, whatever its database is doing. It deletes them as it stops; a writer
killed leaves them to expire. A crawl that finds one for its spider starts no writer
of its own: the service writes its events (docs/store.md, "a fleet's writer service").

With RETRYQUEUE_SIGNING_KEYS set, an announcement is acted on only when signed with
the queue's key: anyone who can write to Redis could otherwise keep every crawl from
writing its store. The value is then the consumer name, the time it holds until
(ms) and a signature over the key, the name and that time, so a copy of a signed
announcement serves for at most one more TTL (clock skew) after its writer stopped.
A refused announcement is ignored (the crawl writes itself), with one WARNING line.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..exceptions import SignatureError
from ..queue.keys import writer_key
from ..settings.defaults import STORE_WRITER_ANNOUNCE_TTL
from ..values import as_text

if TYPE_CHECKING:
    from ..secure.signing import KeyRing

logger = logging.getLogger(__name__)

#: Announcements refused and said so, by key and value: one line each, not one a poll.
_said: set[tuple[str, str]] = set()
#: At most this many kept: a writer putting a new value at every poll gets a line
#: each time, not a set that grows with it.
_SAID_MAX = 256


def _message(key: str, consumer: str, until_ms: int) -> bytes:
    return f"retryqueue-writer\0{key}\0{consumer}\0{until_ms}".encode()


def signed_value(key: str, consumer: str, until_ms: int, signing: KeyRing) -> str:
    """What a writer holding the queue's key writes at *key* until *until_ms*."""
    return f"{consumer}\n{until_ms}\n{signing.sign(_message(key, consumer, until_ms))}"


def _refusal(key: str, value: str, signing: KeyRing, now_ms: int) -> str | None:
    """Why *value* at *key* is not an announcement of a writer with the key; None: it is."""
    parts = value.rsplit("\n", 2)
    if len(parts) != 3 or not parts[1].isdigit():
        return "it is not signed (RETRYQUEUE_SIGNING_KEYS is set)"
    consumer, until, signature = parts
    try:
        signing.verify(_message(key, consumer, int(until)), signature)
    except SignatureError as exc:
        return exc.detail
    if int(until) + STORE_WRITER_ANNOUNCE_TTL * 1000 < now_ms:
        return "it is a copy of an announcement that ended (its time has passed)"
    return None


def announced_writer(
    client: Any, spider: str, project: str = "", signing: KeyRing | None = None
) -> tuple[str, str] | None:
    """(the writer service's consumer name, its key) when one announces itself for
    *spider* (or for every spider of *project*); None when none does. Two reads. With
    *signing*, only an announcement signed with one of its keys counts."""
    for key in (writer_key(spider, project), writer_key(None, project)):
        value = client.get(key)
        if not value:
            continue
        text = as_text(value)
        if signing is None:
            return text.split("\n", 1)[0], key  # a signed one's name, read without a key
        why = _refusal(key, text, signing, int(time.time() * 1000))
        if why is None:
            return text.rsplit("\n", 2)[0], key
        if (key, text) not in _said:
            if len(_said) >= _SAID_MAX:
                _said.clear()
            _said.add((key, text))
            logger.warning(
                "scrapy-retryqueue: ignored the store writer announcement at %s: %s; "
                "this crawl writes its store itself",
                key,
                why,
            )
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
        signing: KeyRing | None = None,
    ) -> None:
        self.client = client
        self.consumer = consumer
        self.signing = signing
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
        ttl_ms = int(self.ttl * 1000)
        until_ms = int(time.time() * 1000) + ttl_ms
        for key in self.keys:
            self.client.set(key, self._value(key, until_ms), px=ttl_ms)

    def _value(self, key: str, until_ms: int) -> str:
        if self.signing is None:
            return self.consumer
        return signed_value(key, self.consumer, until_ms, self.signing)

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
                if as_text(self.client.get(key) or b"").split("\n", 1)[0] == self.consumer:
                    self.client.delete(key)
