"""Who may act on the dashboard: sign-in sessions and the wait after wrong tokens.

A sign-in gets a random session id, kept (as its SHA-256) in this process's
memory with its expiry: signing out forgets it, so the cookie stops working at
once; a restart signs everybody out. A client that sends wrong tokens is made
to wait, doubling, before its next try counts; the dashboard refuses the tries
it makes meanwhile (429 with ``Retry-After``) instead of sleeping, so nobody
else waits.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from ..settings import defaults

Clock = Callable[[], float]


def same(a: str | None, b: str | None) -> bool:
    """Both given and equal, compared in constant time."""
    if not a or not b:
        return False
    return hmac.compare_digest(
        str(a).encode("utf-8", "surrogatepass"), str(b).encode("utf-8", "surrogatepass")
    )


def _digest(session_id: str) -> bytes:
    return hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).digest()


class Sessions:
    """Signed-in sessions: random ids, each valid until it expires or is revoked."""

    def __init__(
        self, ttl: float, *, clock: Clock = time.monotonic, limit: int | None = None
    ) -> None:
        self.ttl = ttl
        self.clock = clock
        self.limit = limit or defaults.DASHBOARD_MAX_SESSIONS
        self._expiry: OrderedDict[bytes, float] = OrderedDict()
        self._lock = threading.Lock()

    def new(self) -> str:
        """A new session id (for the cookie), valid for ``ttl`` seconds."""
        session_id = secrets.token_urlsafe(32)
        now = self.clock()
        with self._lock:
            self._prune(now)
            while len(self._expiry) >= self.limit:
                self._expiry.popitem(last=False)  # the oldest sign-in goes first
            self._expiry[_digest(session_id)] = now + self.ttl
        return session_id

    def valid(self, session_id: str | None) -> bool:
        if not session_id:
            return False
        with self._lock:
            expiry = self._expiry.get(_digest(session_id))
            if expiry is None:
                return False
            if expiry <= self.clock():
                del self._expiry[_digest(session_id)]
                return False
            return True

    def revoke(self, session_id: str | None) -> None:
        if session_id:
            with self._lock:
                self._expiry.pop(_digest(session_id), None)

    def __len__(self) -> int:
        return len(self._expiry)

    def _prune(self, now: float) -> None:
        # Expiries grow with insertion order (one ttl for all): stop at the first live one.
        while self._expiry:
            key, expiry = next(iter(self._expiry.items()))
            if expiry > now:
                return
            del self._expiry[key]


@dataclass(slots=True)
class _Record:
    wrong: int = 0
    last: float = 0.0
    until: float = 0.0


class WrongTokens:
    """Per client: the wrong tokens it sent and until when its next try is refused.

    The first ``free`` wrong tokens cost nothing; each one after makes the client
    wait ``wait`` seconds, doubling, up to ``max_wait``. A right token, or
    ``forget`` seconds without a wrong one, starts the count again.
    """

    def __init__(
        self,
        *,
        clock: Clock = time.monotonic,
        free: int = defaults.DASHBOARD_FREE_WRONG_TOKENS,
        wait: float = defaults.DASHBOARD_WRONG_TOKEN_WAIT,
        max_wait: float = defaults.DASHBOARD_WRONG_TOKEN_MAX_WAIT,
        forget: float = defaults.DASHBOARD_WRONG_TOKEN_FORGET,
        limit: int = defaults.DASHBOARD_MAX_CLIENTS,
    ) -> None:
        self.clock = clock
        self.free, self.wait, self.max_wait = free, wait, max_wait
        self.forget, self.limit = forget, limit
        self._clients: OrderedDict[str, _Record] = OrderedDict()
        self._lock = threading.Lock()

    def retry_after(self, client: str) -> int:
        """Whole seconds *client* must still wait before a token is checked; 0: none."""
        with self._lock:
            record = self._clients.get(client)
            if record is None:
                return 0
            left = record.until - self.clock()
        return math.ceil(left) if left > 0 else 0

    def wrong(self, client: str) -> int:
        """Count a wrong token from *client*; returns the seconds it must now wait."""
        now = self.clock()
        with self._lock:
            record = self._clients.pop(client, None)
            if record is None or now - record.last > self.forget:
                record = _Record()
            record.wrong += 1
            record.last = now
            over = record.wrong - self.free
            if over > 0:
                record.until = now + min(self.max_wait, self.wait * 2 ** min(over - 1, 30))
            self._clients[client] = record  # the most recent last
            while len(self._clients) > self.limit:
                self._clients.popitem(last=False)
            left = record.until - now
        return math.ceil(left) if left > 0 else 0

    def right(self, client: str) -> None:
        with self._lock:
            self._clients.pop(client, None)
