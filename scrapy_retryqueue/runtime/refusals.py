"""Claimed tasks the crawl refuses to fetch: forged ones, and requests outside the spider's domains.

A claimed envelope is checked before anything of it is rebuilt: with
RETRYQUEUE_SIGNING_KEYS, its signature (:mod:`scrapy_retryqueue.queue.signature`)
and the records kept beside it (a replay); with or without keys, that it was
written for the task id and the spider it is claimed as. One that fails is
never fetched: it becomes a dead letter of kind ``forged`` under an id of its
own (the stored text kept, for the audit), with one WARNING line naming the
task and why, and the stats ``retryqueue/forged`` and ``retryqueue/forged/<reason>``.

A request that passes is then held to the spider's ``allowed_domains`` as a fresh
one is (:class:`Offsite`): re-injected with ``dont_filter``, it would otherwise
pass Scrapy's OffsiteMiddleware unchecked.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from scrapy.utils.httpobj import urlparse_cached

from ..decision.kinds import FORGED
from ..exceptions import SignatureError
from ..queue.document import read_document
from ..queue.envelope import Task, forged_envelope, task_from_document
from ..queue.signature import (
    check_claimed,
    sign_frontier_request,
    verify_envelope,
    verify_frontier_request,
)
from ..queue.write import Write
from . import engineview

if TYPE_CHECKING:
    from scrapy import Request

    from ..config import Config

logger = logging.getLogger("scrapy_retryqueue.runtime")

#: (version, finished): what a claim read beside a task (queue/claim.py, Claimed.records).
Record = tuple[int | None, int | None]


def signed_task(config: Config, raw: str | bytes) -> Task:
    """The claimed task, its signature checked first (with signing keys): SignatureError
    when it does not verify (forged, whether or not it reads), EnvelopeError when it
    cannot be read (a malformed dead letter)."""
    ring = config.signing
    if ring is not None:
        if not isinstance(raw, str):
            raise SignatureError("unsigned", "it is not UTF-8 text, so no signature of it holds")
        verify_envelope(raw, ring, config.namespace)
    return task_from_document(read_document(raw))


def check_place(
    config: Config, spider: str, task_id: str, task: Task, record: Record | None
) -> None:
    """SignatureError unless *task* is the live task it was claimed as: written for this
    task id and spider (with or without keys: a task under another id would be acked
    under that one, and its own lease held for good), and with signing keys, neither
    a copy of a finished task nor an older attempt than the live one (a replay).

    Checked once its request is rebuilt, so that an entry that cannot be read is a
    malformed dead letter whatever else is wrong with it.
    """
    doc: dict[str, Any] = {"id": task.id, "spider": task.spider, "updated": task.updated}
    version, finished = record if record is not None else (None, None)
    if config.signing is not None and version is None:
        # Every signed write records its version with it: a task without one was put
        # there around the scripts (a copy of an envelope, with its record deleted).
        raise SignatureError(
            "replay", "no version is recorded beside it, as every write of a signed task does"
        )
    check_claimed(doc, task_id=task_id, spider=spider, version=version, finished=finished)


def signed_frontier_text(config: Config, spider: str, request_id: str, text: str) -> str:
    """A frontier request's stored text, signed for its id and spider when keys are set."""
    ring = config.signing
    if ring is None:
        return text
    return sign_frontier_request(text, ring, config.namespace, spider, request_id)


def check_frontier(config: Config, spider: str, request_id: str, raw: str | bytes) -> None:
    """SignatureError when signing keys are set and a leased frontier request's stored text
    is not signed for this request id and spider (a start page a keyless writer added, a
    request moved from another id or spider): it is quarantined as forged, never fetched."""
    ring = config.signing
    if ring is None:
        return
    if not isinstance(raw, str):
        raise SignatureError("unsigned", "it is not UTF-8 text, so no signature of it holds")
    verify_frontier_request(raw, ring, config.namespace, spider, request_id)


def forged_dead_id(task_id: str, now: int) -> str:
    """The id a forged entry's dead letter is kept under: never the task's own, so that it
    replaces neither a dead letter of the task it poses as nor its row in the store."""
    return f"{task_id}:{FORGED}:{now}"


def forged_write(
    config: Config, task_id: str, raw: str | bytes, token: str, error: SignatureError, now: int
) -> Write:
    """The write that takes a refused task out of the queue as a forged dead letter."""
    logger.warning(
        "scrapy-retryqueue: task %s is forged (%s); not fetched, kept as a %s dead letter",
        # ascii(): an id that is not UTF-8 (read with surrogateescape) stays loggable.
        ascii(task_id),
        error,
        FORGED,
    )
    envelope = forged_envelope(task_id, raw, str(error), config.node_id)
    return Write(
        "deadletter",
        task_id,
        now,
        token,
        envelope=envelope,
        kind=FORGED,
        dead_id=forged_dead_id(task_id, now),
    )


def forged_stats(error: SignatureError) -> list[str]:
    """The stats one refused entry counts."""
    return ["retryqueue/forged", f"retryqueue/forged/{error.reason.replace(' ', '_')}"]


def _engine_started(crawler: Any) -> bool:
    try:
        return crawler.engine is not None
    except (AttributeError, RuntimeError):
        return False


class Offsite:
    """Holds re-injected requests to the spider's offsite rule, as Scrapy holds fresh ones.

    A request the project sent with ``dont_filter`` or ``allow_offsite`` is let
    through, as Scrapy's OffsiteMiddleware lets it through; a crawl without that
    middleware checks nothing.
    """

    _UNSET: Any = object()

    def __init__(self, crawler: Any, count: Callable[[str], None]) -> None:
        self._crawler = crawler
        self._count = count
        self._rule: Any = self._UNSET
        #: Domains whose first refused retry was said at WARNING; later ones at DEBUG.
        self._said: set[str] = set()

    def allows(self, stored: Mapping[str, Any], request: Request) -> bool:
        """Whether *request* (rebuilt from the *stored* request) may be fetched."""
        if stored.get("dont_filter") is True or request.meta.get("allow_offsite"):
            return True
        if self._rule is self._UNSET and _engine_started(self._crawler):
            self._rule = engineview.offsite_rule(self._crawler)
        if self._rule is self._UNSET:
            return True  # no engine yet: nothing is fetched before it runs anyway
        spider = getattr(self._crawler, "spider", None)
        return self._rule is None or spider is None or bool(self._rule(request, spider))

    def refused(self, task_id: str, request: Request) -> None:
        """One refused request: Scrapy's stats of an offsite request, ours, one line."""
        domain = urlparse_cached(request).hostname or ""
        if domain not in self._said:
            self._count("offsite/domains")
        self._count("offsite/filtered")
        self._count("retryqueue/offsite")
        level = logging.DEBUG if domain in self._said else logging.WARNING
        if len(self._said) < 1000:
            self._said.add(domain)
        logger.log(
            level,
            "scrapy-retryqueue: task %s: %s is outside the spider's allowed_domains; dropped as "
            "Scrapy drops an offsite request (its task is done)",
            ascii(task_id),
            request,
        )
