"""Task envelopes: a failed request and its retry history as versioned JSON.

Never pickle: an envelope is read from a shared Redis, so reading one must not
be able to run code. Bytes (headers, body) are carried as latin-1 text and
base64; meta and cb_kwargs must be plain JSON, and a value that is not is
reported by its path (``meta['item']``) instead of being dropped. With
RETRYQUEUE_ENCRYPTION_KEYS, headers, body and cookies are sealed into one
token (:mod:`scrapy_retryqueue.encryption`) and opened when read back.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from scrapy import Request
from scrapy.utils.misc import load_object
from scrapy.utils.request import request_from_dict

from .defaults import ENVELOPE_VERSION, TRANSIENT_META_KEYS
from .encryption import RequestCipher, open_request
from .exceptions import EnvelopeError
from .kinds import MALFORMED

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode

# Request attributes written only when they differ from Request's defaults, to
# keep envelopes small.
_REQUEST_DEFAULTS: dict[str, Any] = {
    "method": "GET",
    "encoding": "utf-8",
    "priority": 0,
    "flags": [],
    "cookies": {},
    "cb_kwargs": {},
    "meta": {},
    "callback": None,
    "errback": None,
}


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
        return _dumps(doc)


def task_from_json(raw: str | bytes) -> Task:
    """Parse an envelope; EnvelopeError says which field is wrong."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise EnvelopeError(f"envelope is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise EnvelopeError(f"envelope must be a JSON object, got {type(doc).__name__}")
    version = doc.get("v")
    if not isinstance(version, int) or isinstance(version, bool):
        raise EnvelopeError(f"envelope field 'v' must be an integer version, got {version!r}")
    if version > ENVELOPE_VERSION:
        raise EnvelopeError(
            f"envelope version {version} is newer than this scrapy-retryqueue reads "
            f"({ENVELOPE_VERSION}); upgrade the package on this node"
        )
    for name, kind in (("id", str), ("spider", str), ("request", dict), ("attempts", dict)):
        if not isinstance(doc.get(name), kind):
            value = doc.get(name)
            # Only the type of a bad request: its value may hold secret headers,
            # and this message reaches logs and dead letters.
            shown = f"a {type(value).__name__}" if name == "request" else repr(value)
            raise EnvelopeError(f"envelope field {name!r} must be {kind.__name__}, got {shown}")
    if not isinstance(doc["request"].get("url"), str):
        raise EnvelopeError("envelope field 'request.url' is missing or not a string")
    attempts = doc["attempts"]
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in attempts.values()):
        raise EnvelopeError(
            f"envelope field 'attempts' must map kinds to integers, got {attempts!r}"
        )
    try:
        return Task(
            id=doc["id"],
            spider=doc["spider"],
            request=doc["request"],
            attempts=dict(attempts),
            kind=str(doc.get("kind") or ""),
            first_error=doc.get("first_error"),
            last_error=doc.get("last_error"),
            node=str(doc.get("node", "")),
            created=int(doc.get("created", 0)),
            updated=int(doc.get("updated", 0)),
            due=int(doc.get("due", 0)),
            dead_kind=doc.get("dead_kind"),
            max_retries=_budget(doc.get("max_retries")),
        )
    except (TypeError, ValueError) as exc:
        raise EnvelopeError(f"envelope has a field of the wrong type: {exc}") from None


def _budget(value: Any) -> int | None:
    # Lenient: an older envelope has none, and a wrong one must not make the
    # task malformed (only the store shows it).
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def check_json(value: Any, path: str) -> Any:
    """*value* as plain JSON data (tuples become lists); EnvelopeError names *path*."""
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise EnvelopeError(f"{path} is {value!r}, which JSON cannot hold")
        return value
    if isinstance(value, (list, tuple)):
        return [check_json(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise EnvelopeError(f"{path} has a key {k!r} that is not a string")
            out[k] = check_json(v, f"{path}[{k!r}]")
        return out
    raise EnvelopeError(
        f"{path} is a {type(value).__module__}.{type(value).__qualname__}, not JSON data"
    )


def request_to_json(request: Request, spider: Any) -> dict[str, Any]:
    """A request as JSON data; EnvelopeError names what cannot be serialized."""
    try:
        d = request.to_dict(spider=spider)
    except ValueError as exc:
        # Request.to_dict: a callback or errback that is not a method of the spider.
        raise EnvelopeError(f"request callback/errback cannot be stored: {exc}") from None
    out: dict[str, Any] = {"url": d["url"]}
    meta = {
        k: v
        for k, v in (d.get("meta") or {}).items()
        # A non-str key is kept so that check_json reports it by name.
        if k not in TRANSIENT_META_KEYS and not (isinstance(k, str) and k.startswith("_"))
    }
    d["meta"] = check_json(meta, "meta")
    d["cb_kwargs"] = check_json(d.get("cb_kwargs") or {}, "cb_kwargs")
    d["cookies"] = check_json(d.get("cookies") or {}, "cookies")
    d["flags"] = check_json(d.get("flags") or [], "flags")
    for name, default in _REQUEST_DEFAULTS.items():
        value = d.get(name, default)
        if value != default:
            out[name] = value
    headers = [
        [name.decode("latin-1"), value.decode("latin-1")]
        for name, values in (d.get("headers") or {}).items()
        for value in values
    ]
    if headers:
        out["headers"] = headers
    body = d.get("body") or b""
    if body:
        out["body"] = base64.b64encode(body).decode("ascii")
    if "_class" in d:
        out["_class"] = d["_class"]
    return out


def request_from_json(
    data: Mapping[str, Any], spider: Any, *, cipher: RequestCipher | None = None
) -> Request:
    """Rebuild a request written by :func:`request_to_json`.

    It is marked ``dont_filter``: the dupefilter saw its URL the first time.
    Encrypted fields (RETRYQUEUE_ENCRYPTION_KEYS) are opened with *cipher*;
    without a key that opens them, EncryptionKeyError (never EnvelopeError:
    the task is sound, only this node cannot read it).
    """
    data = open_request(data, cipher)
    d: dict[str, Any] = {k: v for k, v in data.items() if k not in ("headers", "body")}
    headers: dict[bytes, list[bytes]] = {}
    try:
        for name, value in data.get("headers", []):
            headers.setdefault(name.encode("latin-1"), []).append(value.encode("latin-1"))
        d["headers"] = headers
        d["body"] = base64.b64decode(data.get("body", ""), validate=True)
    except (ValueError, TypeError, AttributeError) as exc:
        raise EnvelopeError(f"envelope request headers/body are malformed: {exc}") from None
    if "_class" in d and not _is_request_class_path(d["_class"]):
        raise EnvelopeError(f"envelope request class {d['_class']!r} is not a scrapy Request class")
    d["dont_filter"] = True
    try:
        return request_from_dict(d, spider=spider)
    except (ValueError, TypeError, AttributeError, ImportError) as exc:
        raise EnvelopeError(f"envelope request cannot be rebuilt: {exc}") from None


def frontier_request_to_json(
    request: Request, spider: Any, *, cipher: RequestCipher | None = None
) -> str:
    """A request as the leased frontier stores it: :func:`request_to_json`, sealed
    with *cipher* when set, and its ``dont_filter`` flag (a frontier request is
    not marked ``dont_filter`` on its way back, unlike a retry)."""
    data = request_to_json(request, spider)
    if cipher is not None:
        data = cipher.seal(data)
    if request.dont_filter:
        data["dont_filter"] = True
    return _dumps(data)


def frontier_request_from_json(
    raw: str | bytes, spider: Any, *, cipher: RequestCipher | None = None
) -> Request:
    """Rebuild a request of the leased frontier; EnvelopeError says what is wrong."""
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise EnvelopeError(f"frontier request is not JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("url"), str):
        raise EnvelopeError("frontier request must be a JSON object with a string 'url'")
    dont_filter = data.pop("dont_filter", False) is True
    request = request_from_json(data, spider, cipher=cipher)
    request.dont_filter = dont_filter
    return request


def _is_request_class_path(path: Any) -> bool:
    # Only a Request subclass may be instantiated from shared data.
    if not isinstance(path, str):
        return False
    try:
        cls = load_object(path)
    except (ImportError, AttributeError, ValueError, NameError):
        return False
    return isinstance(cls, type) and issubclass(cls, Request)


def malformed_envelope(task_id: str, raw: str | bytes, error: str, node: str) -> str:
    """The dead-letter envelope of a task that cannot be read, its stored value kept.

    Text is kept as it is (``raw``); bytes that are not UTF-8 text are kept as
    base64 (``raw_base64``), so the dead letter itself is valid JSON.
    """
    doc: dict[str, Any] = {
        "v": ENVELOPE_VERSION,
        "id": task_id,
        "dead_kind": MALFORMED,
        "kind": MALFORMED,
        "node": node,
        "last_error": {"kind": MALFORMED, "type": "EnvelopeError", "message": error},
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
