"""Task envelopes: a failed request and its retry history as versioned JSON.

Never pickle: an envelope is read from a shared Redis, so reading one must not
be able to run code (:mod:`.document` reads it strictly; :mod:`.requestjson`
turns its ``request`` into a Request and back). With RETRYQUEUE_SIGNING_KEYS an
envelope carries a signature (:mod:`.signature`); a task that cannot be read is
kept as a dead letter that holds its stored value (:func:`malformed_envelope`).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

from ..decision.kinds import FORGED, MALFORMED
from ..exceptions import EnvelopeError
from ..settings.defaults import ENVELOPE_MAX_ATTEMPTS, ENVELOPE_MAX_MS, ENVELOPE_VERSION
from .document import dumps, read_document, shown
from .requestjson import (  # noqa: F401  (the names other modules import from here)
    check_item_replay,
    check_json,
    frontier_request_from_json,
    frontier_request_to_json,
    item_class,
    request_from_json,
    request_to_json,
)


@dataclass(slots=True)
class Task:
    """A retry task: one request and what happened to it so far."""

    id: str
    spider: str
    #: The request in JSON form (see :func:`request_to_json`).
    request: dict[str, Any]
    attempts: dict[str, int] = field(default_factory=dict)
    kind: str = ""
    first_error: dict[str, Any] | None = None
    last_error: dict[str, Any] | None = None
    node: str = ""
    created: int = 0
    updated: int = 0
    due: int = 0
    #: Set on dead letters only: the kind they died of.
    dead_kind: str | None = None
    #: The resolved retry budget (max_retries) of the kind that failed last, for
    #: this request (its domain's and meta's overrides applied); None when no
    #: policy covers the kind, or for an envelope written before it was kept.
    max_retries: int | None = None

    @property
    def url(self) -> str:
        return str(self.request.get("url", ""))

    def to_json(self) -> str:
        doc: dict[str, Any] = {
            "v": ENVELOPE_VERSION,
            "id": self.id,
            "spider": self.spider,
            "kind": self.kind,
            "attempts": self.attempts,
            "first_error": self.first_error,
            "last_error": self.last_error,
            "node": self.node,
            "created": self.created,
            "updated": self.updated,
            "due": self.due,
            "request": self.request,
        }
        if self.max_retries is not None:
            doc["max_retries"] = self.max_retries
        if self.dead_kind is not None:
            doc["dead_kind"] = self.dead_kind
        return dumps(doc)


def _ms(doc: dict[str, Any], name: str) -> int:
    value = doc.get(name, 0)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= ENVELOPE_MAX_MS:
        return value
    raise EnvelopeError(
        f"envelope field {name!r} has the wrong type: must be a time in ms from 0 to "
        f"{ENVELOPE_MAX_MS}, got {shown(value)}"
    )


def _optional(doc: dict[str, Any], name: str, kind: type, default: Any) -> Any:
    value = doc.get(name)
    if value is None:
        return default
    if not isinstance(value, kind):
        raise EnvelopeError(
            f"envelope field {name!r} has the wrong type: must be {kind.__name__} or null, "
            f"got {shown(value)}"
        )
    return value


def task_from_json(raw: str | bytes) -> Task:
    """Parse an envelope; EnvelopeError says which field is wrong.

    Whatever *raw* holds, the result is a Task whose fields have the types
    and ranges this package writes, or an EnvelopeError: no other exception.
    """
    return task_from_document(read_document(raw))


def task_from_document(doc: dict[str, Any]) -> Task:
    """An envelope read by :func:`~.document.read_document` as a Task (see :func:`task_from_json`)."""
    version = doc.get("v")
    if not isinstance(version, int) or isinstance(version, bool):
        raise EnvelopeError(f"envelope field 'v' must be an integer version, got {shown(version)}")
    if version > ENVELOPE_VERSION:
        raise EnvelopeError(
            f"envelope version {shown(version)} is newer than this scrapy-retryqueue reads "
            f"({ENVELOPE_VERSION}); upgrade the package on this node"
        )
    for name, kind in (("id", str), ("spider", str), ("request", dict), ("attempts", dict)):
        if not isinstance(doc.get(name), kind):
            value = doc.get(name)
            # Only the type of a bad request: its value may hold secret headers,
            # and this message reaches logs and dead letters.
            told = f"a {type(value).__name__}" if name == "request" else shown(value)
            raise EnvelopeError(f"envelope field {name!r} must be {kind.__name__}, got {told}")
    if not isinstance(doc["request"].get("url"), str):
        raise EnvelopeError("envelope field 'request.url' is missing or not a string")
    attempts = doc["attempts"]
    for count in attempts.values():
        if (
            not isinstance(count, int)
            or isinstance(count, bool)
            or not 0 <= count <= ENVELOPE_MAX_ATTEMPTS
        ):
            raise EnvelopeError(
                "envelope field 'attempts' must map kinds to integers from 0 to "
                f"{ENVELOPE_MAX_ATTEMPTS}, got {shown(count)}"
            )
    return Task(
        id=doc["id"],
        spider=doc["spider"],
        request=doc["request"],
        attempts=dict(attempts),
        kind=_optional(doc, "kind", str, ""),
        first_error=_optional(doc, "first_error", dict, None),
        last_error=_optional(doc, "last_error", dict, None),
        node=_optional(doc, "node", str, ""),
        created=_ms(doc, "created"),
        updated=_ms(doc, "updated"),
        due=_ms(doc, "due"),
        dead_kind=_optional(doc, "dead_kind", str, None),
        max_retries=_budget(doc.get("max_retries")),
    )


def _budget(value: Any) -> int | None:
    # Lenient: an older envelope has none, and a wrong one must not make the
    # task malformed (only the store shows it).
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 2**31 - 1:
        return value
    return None


def malformed_envelope(task_id: str, raw: str | bytes, error: str, node: str) -> str:
    """The dead-letter envelope of a task that cannot be read, its stored value kept.

    Text is kept as it is (``raw``); bytes that are not UTF-8 text are kept as
    base64 (``raw_base64``), so the dead letter itself is valid JSON.
    """
    return _kept(task_id, raw, node, MALFORMED, "EnvelopeError", error)


def forged_envelope(task_id: str, raw: str | bytes, reason: str, node: str) -> str:
    """The dead-letter envelope of an entry the crawl refused (RETRYQUEUE_SIGNING_KEYS, or a
    task under another id): kind ``forged``, its stored value kept as it was, for the audit.

    It holds no ``request``: nothing of a refused entry is ever rebuilt into one
    (``scrapy deadletters requeue --kind forged --force`` reads ``raw`` itself).
    """
    return _kept(task_id, raw, node, FORGED, "SignatureError", reason)


def _kept(task_id: str, raw: str | bytes, node: str, kind: str, error_type: str, why: str) -> str:
    doc: dict[str, Any] = {
        "v": ENVELOPE_VERSION,
        "id": task_id,
        "dead_kind": kind,
        "kind": kind,
        "node": node,
        "last_error": {"kind": kind, "type": error_type, "message": why},
    }
    if isinstance(raw, bytes):
        try:
            doc["raw"] = raw.decode()
        except UnicodeDecodeError:
            doc["raw_base64"] = base64.b64encode(raw).decode("ascii")
    else:
        doc["raw"] = raw
    # ASCII only: a task id read with surrogateescape (not UTF-8) stays writable.
    return json.dumps(doc, separators=(",", ":"))
