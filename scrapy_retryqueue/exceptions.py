"""The exceptions scrapy-retryqueue raises or lets a spider raise, all under RetryQueueError."""

from __future__ import annotations

from scrapy.exceptions import IgnoreRequest


class RetryQueueError(Exception):
    """Base of every exception scrapy-retryqueue raises: ``except RetryQueueError`` catches them all."""


class PermanentFailure(RetryQueueError):
    """Raise from a spider callback for a page that will never succeed.

    The request is dead-lettered at once with kind ``rule`` and this message.
    """


class RetryLater(RetryQueueError):
    """Raise from a spider callback to park the request as a failure of *kind*.

    *kind* is a built-in kind or one the project declares in RETRYQUEUE_KINDS
    (``RetryLater("captcha")``); that kind's policy decides whether the request
    is retried, when, and when it becomes a dead letter. A kind the crawl does
    not know is a bug of the spider: its request is dead-lettered as
    ``unknown`` at once, and an ERROR line names the kind.
    """

    def __init__(self, kind: str, message: str = "") -> None:
        if not isinstance(kind, str):
            # Raised in the callback itself, where the mistake is.
            raise TypeError(f"RetryLater(kind) takes a kind's name, got {kind!r}")
        super().__init__(message or f"retry later: {kind}")
        self.kind = kind
        self.message = message


class RequestParked(IgnoreRequest, RetryQueueError):
    """A failed request was parked in the retry queue and will come back later.

    A request's errback receives this failure for each parked attempt; it gets
    the real failure only when the request is finally given up.
    """

    def __init__(self, kind: str, delay: float, task_id: str) -> None:
        super().__init__(f"parked for retry: {kind}, due in {delay:.1f}s")
        self.kind = kind
        self.delay = delay
        self.task_id = task_id


class ConfigError(RetryQueueError, ValueError):
    """A RETRYQUEUE_* setting or a retryqueue_* meta key has a bad value."""


class SpiderNameError(RetryQueueError, ValueError):
    """A spider name that cannot name a queue: empty, or holding ``{`` or ``}``
    (every key of a spider's queue holds its name as a Redis hash tag)."""


class EnvelopeError(RetryQueueError, ValueError):
    """A task envelope cannot be written (unserializable) or read (malformed)."""


class EmbeddedServerError(RetryQueueError, RuntimeError):
    """The embedded Redis-compatible server cannot be started here."""


class DomainCoolingDown(RetryQueueError):
    """A request taken back from Scrapy's download queue because its domain started to
    cool down while it waited there (DOWNLOAD_DELAY, AutoThrottle, per-domain
    concurrency); the downloader middleware parks it as ``deferred``. Internal: a
    request's errback never receives it."""


class EncryptionKeyError(RetryQueueError):
    """A stored request is encrypted and no key of RETRYQUEUE_ENCRYPTION_KEYS opens it.

    Not an :class:`EnvelopeError`: the task is sound and waits for a node that
    has its key; it is never dead-lettered as malformed for this.
    """


class SignatureError(RetryQueueError):
    """A stored entry's signature does not verify (RETRYQUEUE_SIGNING_KEYS): unsigned,
    signed with a key the ring does not list, or not matching what it signs; or a
    signed entry that is not where it was signed for (another task, another spider)
    or that its task has outlived (a replay).

    Not an :class:`EnvelopeError`: the entry may read perfectly well, but the crawl
    did not write it there. Such an entry is never fetched: it becomes a ``forged``
    dead letter (a frontier request: quarantined as ``forged``).
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        #: A short label: unsigned, unknown key, bad signature, moved, replay.
        self.reason = reason
        self.detail = detail
