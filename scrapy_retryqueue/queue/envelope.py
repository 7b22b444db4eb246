"""Task envelopes: a failed request and its retry history as versioned JSON.

Never pickle: an envelope is read from a shared Redis, so reading one must not
be able to run code. Bytes (headers, body) are carried as latin-1 text and
base64; meta and cb_kwargs must be plain JSON, and a value that is not is
reported by its path (``meta['item']``) instead of being dropped. With
RETRYQUEUE_ENCRYPTION_KEYS, headers, body and cookies are sealed into one
token (:mod:`scrapy_retryqueue.secure.encryption`) and opened when read back.
"""

from __future__ import annotations

import base64
import json
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from scrapy import Request
from scrapy.utils.request import request_from_dict

from ..decision.kinds import MALFORMED
from ..exceptions import EnvelopeError
from ..secure.encryption import RequestCipher, open_request
from ..settings.defaults import (
    ENVELOPE_MAX_ATTEMPTS,
    ENVELOPE_MAX_DEPTH,
    ENVELOPE_MAX_MS,
    ENVELOPE_VERSION,
    META_ITEM,
    SCRAPY_META_PROXY,
    SCRAPY_META_SCHEME_PROXY,
    TRANSIENT_META_KEYS,
)

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


def _refuse_constant(name: str) -> Any:
    raise EnvelopeError(f"envelope holds {name}, which is no JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise EnvelopeError(f"envelope holds the number {text[:40]}, too large for a float")
    return value


# Strict: NaN and Infinity are no JSON, and 1e999 is no number a field can hold.
_decode = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float).decode


def read_document(raw: str | bytes) -> dict[str, Any]:
    """A stored envelope as a JSON object, or EnvelopeError; whatever *raw* is,
    nothing else is raised.

    Read from a shared Redis, so strict: UTF-8 text, JSON without NaN or
    Infinity, no number too large for a float, no lone surrogate (``\\ud800``:
    no database or Redis client can write it back), nested at most
    ENVELOPE_MAX_DEPTH levels.
    """
    try:
        text = raw.decode() if isinstance(raw, (bytes, bytearray)) else raw
        if not isinstance(text, str):
            raise EnvelopeError(f"envelope is a {type(raw).__name__}, not text")
        text.encode()  # a str read with surrogateescape holds bytes that are not UTF-8
    except UnicodeError:
        raise EnvelopeError("envelope is not JSON: not UTF-8 text") from None
    try:
        doc = _decode(text)
    except RecursionError:
        raise EnvelopeError(f"envelope is nested deeper than {ENVELOPE_MAX_DEPTH} levels") from None
    except ValueError as exc:  # EnvelopeError is one
        if isinstance(exc, EnvelopeError):
            raise
        raise EnvelopeError(f"envelope is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise EnvelopeError(f"envelope must be a JSON object, got {type(doc).__name__}")
    # The common case costs two counts: a text with few brackets cannot be
    # nested deeply, and one without a \ud escape holds no lone surrogate.
    surrogates = "\\ud" in text or "\\uD" in text
    if surrogates or text.count("{") + text.count("[") > ENVELOPE_MAX_DEPTH:
        _check_shape(doc, surrogates=surrogates)
    return doc


def _check_shape(doc: Any, *, surrogates: bool) -> None:
    # Iterative: a recursive walk is what a deep document must not reach.
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > ENVELOPE_MAX_DEPTH:
            raise EnvelopeError(f"envelope is nested deeper than {ENVELOPE_MAX_DEPTH} levels")
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if surrogates and isinstance(key, str):
                _check_text(key)
            if isinstance(item, (dict, list)):
                stack.append((item, depth + 1))
            elif surrogates and isinstance(item, str):
                _check_text(item)


def _check_text(text: str) -> None:
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            raise EnvelopeError("envelope holds a lone surrogate (\\ud800-\\udfff)") from None


def _shown(value: Any) -> str:
    """A field's value for an error message: short, and only a scalar's value."""
    if value is None or isinstance(value, (bool, int, float, str)):
        text = repr(value) if not isinstance(value, int) or abs(value) < 10**30 else "a huge int"
        return text if len(text) <= 60 else text[:57] + "..."
    return f"a {type(value).__name__}"


def _ms(doc: dict[str, Any], name: str) -> int:
    value = doc.get(name, 0)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= ENVELOPE_MAX_MS:
        return value
    raise EnvelopeError(
        f"envelope field {name!r} has the wrong type: must be a time in ms from 0 to "
        f"{ENVELOPE_MAX_MS}, got {_shown(value)}"
    )


def _optional(doc: dict[str, Any], name: str, kind: type, default: Any) -> Any:
    value = doc.get(name)
    if value is None:
        return default
    if not isinstance(value, kind):
        raise EnvelopeError(
            f"envelope field {name!r} has the wrong type: must be {kind.__name__} or null, "
            f"got {_shown(value)}"
        )
    return value


def task_from_json(raw: str | bytes) -> Task:
    """Parse an envelope; EnvelopeError says which field is wrong.

    Whatever *raw* holds, the result is a Task whose fields have the types
    and ranges this package writes, or an EnvelopeError: no other exception.
    """
    doc = read_document(raw)
    version = doc.get("v")
    if not isinstance(version, int) or isinstance(version, bool):
        raise EnvelopeError(f"envelope field 'v' must be an integer version, got {_shown(version)}")
    if version > ENVELOPE_VERSION:
        raise EnvelopeError(
            f"envelope version {_shown(version)} is newer than this scrapy-retryqueue reads "
            f"({ENVELOPE_VERSION}); upgrade the package on this node"
        )
    for name, kind in (("id", str), ("spider", str), ("request", dict), ("attempts", dict)):
        if not isinstance(doc.get(name), kind):
            value = doc.get(name)
            # Only the type of a bad request: its value may hold secret headers,
            # and this message reaches logs and dead letters.
            shown = f"a {type(value).__name__}" if name == "request" else _shown(value)
            raise EnvelopeError(f"envelope field {name!r} must be {kind.__name__}, got {shown}")
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
                f"{ENVELOPE_MAX_ATTEMPTS}, got {_shown(count)}"
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


#: How deep a request's meta, cb_kwargs or cookies may nest: they sit three
#: levels down in an envelope (envelope, request, meta).
_VALUE_DEPTH = ENVELOPE_MAX_DEPTH - 3


def check_json(value: Any, path: str, _depth: int = 1) -> Any:
    """*value* as plain JSON data (tuples become lists); EnvelopeError names *path*.

    Nested deeper than an envelope may be read back (ENVELOPE_MAX_DEPTH) is
    an EnvelopeError too.
    """
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if _depth > _VALUE_DEPTH and isinstance(value, (list, tuple, dict)):
        raise EnvelopeError(
            f"{path} is nested deeper than {_VALUE_DEPTH} levels, more than an envelope holds"
        )
    if isinstance(value, float):
        if not math.isfinite(value):
            raise EnvelopeError(f"{path} is {value!r}, which JSON cannot hold")
        return value
    if isinstance(value, (list, tuple)):
        return [check_json(v, f"{path}[{i}]", _depth + 1) for i, v in enumerate(value)]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise EnvelopeError(f"{path} has a key {k!r} that is not a string")
            out[k] = check_json(v, f"{path}[{k!r}]", _depth + 1)
        return out
    raise EnvelopeError(
        f"{path} is a {type(value).__module__}.{type(value).__qualname__}, not JSON data"
    )


def request_to_json(
    request: Request, spider: Any, *, recomputed: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A request as JSON data; EnvelopeError names what cannot be serialized.

    Only the project's own meta travels: what Scrapy fills in per download
    (TRANSIENT_META_KEYS), private ``_`` keys, a proxy HttpProxyMiddleware took
    from the environment, and each key of *recomputed* that holds the value a
    middleware sets by default (``download_timeout`` at DOWNLOAD_TIMEOUT) are
    left out; the middlewares set them again when the request comes back.
    """
    try:
        d = _request_dict(request, spider)
    except ValueError as exc:
        # Request.to_dict: a callback or errback that is not a method of the spider.
        raise EnvelopeError(f"request callback/errback cannot be stored: {exc}") from None
    out: dict[str, Any] = {"url": d["url"]}
    raw_meta = d.get("meta") or {}
    dropped = set(TRANSIENT_META_KEYS)
    if raw_meta.get(SCRAPY_META_SCHEME_PROXY):
        dropped.add(SCRAPY_META_PROXY)
    for key, default in (recomputed or {}).items():
        if key in raw_meta and raw_meta[key] == default:
            dropped.add(key)
    meta = {
        k: v
        for k, v in raw_meta.items()
        # A non-str key is kept so that check_json reports it by name.
        if k not in dropped and not (isinstance(k, str) and k.startswith("_"))
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


_NOT_FOUND = object()


def _spider_method(spider: Any, func: Any) -> Any:
    """The name of *func* as a method of *spider*, when it is the bound method of
    that name (a callback as a spider defines it); None when not a callable;
    _NOT_FOUND when only Request.to_dict's full search can tell."""
    if func is None or isinstance(func, str) or not callable(func):
        return func
    inner = getattr(func, "__func__", None)
    name = getattr(inner, "__name__", None)
    if spider is None or not isinstance(name, str):
        return _NOT_FOUND
    try:
        found = getattr(spider, name, None)
    except Exception:  # a property that raises: let the full search say
        return _NOT_FOUND
    return name if getattr(found, "__func__", None) is inner else _NOT_FOUND


def _request_dict(request: Request, spider: Any) -> dict[str, Any]:
    """``request.to_dict(spider=spider)``, with the callback's and errback's names
    found at once when they are the spider's methods of those names.

    Request.to_dict finds each by ``inspect.getmembers(spider)``, which reads
    every attribute of the spider (its ``logger`` property builds an adapter):
    about 40 µs per request, two thirds of a dead letter's envelope. The dict
    is built as to_dict builds it; any other callback goes to to_dict itself.
    """
    callback = _spider_method(spider, request.callback)
    errback = _spider_method(spider, request.errback)
    if callback is _NOT_FOUND or errback is _NOT_FOUND:
        return request.to_dict(spider=spider)
    d: dict[str, Any] = {
        "url": request.url,
        "callback": callback,
        "errback": errback,
        "headers": dict(request.headers),
    }
    for attr in request.attributes:
        d.setdefault(attr, getattr(request, attr))
    if type(request) is not Request:
        d["_class"] = request.__module__ + "." + request.__class__.__name__
    return d


def request_from_json(
    data: Mapping[str, Any], spider: Any, *, cipher: RequestCipher | None = None
) -> Request:
    """Rebuild a request written by :func:`request_to_json`.

    It is marked ``dont_filter``: the dupefilter saw its URL the first time.
    Encrypted fields (RETRYQUEUE_ENCRYPTION_KEYS) are opened with *cipher*;
    without a key that opens them, EncryptionKeyError (never EnvelopeError:
    the task is sound, only this node cannot read it). Anything else that
    cannot be rebuilt is an EnvelopeError, whatever the stored values are.
    """
    data = open_request(data, cipher)
    d: dict[str, Any] = {k: v for k, v in data.items() if k not in ("headers", "body")}
    headers: dict[bytes, list[bytes]] = {}
    pairs = data.get("headers", [])
    body = data.get("body", "")
    if not isinstance(pairs, list) or not isinstance(body, str):
        raise EnvelopeError("envelope request headers/body are malformed: not a list and a text")
    for pair in pairs:
        # Both items named: a generator per header would cost more than the check.
        if not (
            isinstance(pair, list)
            and len(pair) == 2
            and isinstance(pair[0], str)
            and isinstance(pair[1], str)
        ):
            raise EnvelopeError(
                "envelope request headers/body are malformed: headers are not [name, value] texts"
            )
    try:
        for name, value in pairs:
            headers.setdefault(name.encode("latin-1"), []).append(value.encode("latin-1"))
        d["headers"] = headers
        d["body"] = base64.b64decode(body, validate=True)
    except ValueError as exc:  # binascii.Error, UnicodeEncodeError
        raise EnvelopeError(f"envelope request headers/body are malformed: {exc}") from None
    if "_class" in d and _request_class(d["_class"]) is None:
        raise EnvelopeError(
            f"envelope request class {_shown(d['_class'])} is not a scrapy Request class "
            "this process has imported"
        )
    for name, kind in _REQUEST_TYPES.items():
        if name in d and (not isinstance(d[name], kind) or isinstance(d[name], bool)):
            raise EnvelopeError(
                f"envelope request field {name!r} must be {kind.__name__}, got {_shown(d[name])}"
            )
    cookies = d.get("cookies", {})
    if not isinstance(cookies, dict) and not (
        isinstance(cookies, list) and all(isinstance(c, dict) for c in cookies)
    ):
        raise EnvelopeError("envelope request field 'cookies' must be a dict or a list of dicts")
    for name in ("callback", "errback"):
        method = d.get(name)
        if method is not None and not (isinstance(method, str) and _method_name(method)):
            raise EnvelopeError(
                f"envelope request {name} {_shown(method)} is not the name of a spider method"
            )
    d["dont_filter"] = True
    try:
        return request_from_dict(d, spider=spider)
    except Exception as exc:
        # The class is a Request class; its constructor, given values written
        # around this package, can raise anything (LookupError for an unknown
        # encoding, TypeError for a priority that is no int, ...).
        raise EnvelopeError(
            f"envelope request cannot be rebuilt: {type(exc).__name__}: {str(exc)[:200]}"
        ) from None


def frontier_request_to_json(
    request: Request,
    spider: Any,
    *,
    cipher: RequestCipher | None = None,
    recomputed: Mapping[str, Any] | None = None,
) -> str:
    """A request as the leased frontier stores it: :func:`request_to_json` (the
    project's own meta only, as a retry keeps it), sealed with *cipher* when set,
    and its ``dont_filter`` flag (a frontier request is not marked ``dont_filter``
    on its way back, unlike a retry)."""
    data = request_to_json(request, spider, recomputed=recomputed)
    if cipher is not None:
        data = cipher.seal(data)
    if request.dont_filter:
        data["dont_filter"] = True
    return _dumps(data)


def frontier_request_from_json(
    raw: str | bytes, spider: Any, *, cipher: RequestCipher | None = None
) -> Request:
    """Rebuild a request of the leased frontier; EnvelopeError says what is wrong.

    Read from a shared Redis, so as strictly as a retry's envelope: the JSON by
    :func:`read_document`, the request by :func:`request_from_json` (a request
    class is looked up among the modules imported already, never imported)."""
    data = read_document(raw)
    if not isinstance(data.get("url"), str):
        raise EnvelopeError("frontier request must be a JSON object with a string 'url'")
    dont_filter = data.pop("dont_filter", False) is True
    request = request_from_json(data, spider, cipher=cipher)
    request.dont_filter = dont_filter
    return request


#: Types of the request fields Request's constructor takes as they are.
_REQUEST_TYPES: dict[str, type] = {
    "method": str,
    "encoding": str,
    "priority": int,
    "meta": dict,
    "cb_kwargs": dict,
    "flags": list,
}


def _loaded_class(path: Any) -> type | None:
    """The class *path* (``module.Name``) names, looked up without importing anything.

    Importing a module runs its top-level code: a name read from a shared
    Redis must not choose what runs. A class this process stored was imported
    when its object was made, so it is loaded already.
    """
    if not isinstance(path, str) or len(path) > 1000:
        return None
    module_name, _, name = path.rpartition(".")
    module = sys.modules.get(module_name) if module_name else None
    cls = getattr(module, name, None) if module is not None and name else None
    return cls if isinstance(cls, type) else None


def _request_class(path: Any) -> type[Request] | None:
    """The Request class *path* names, among the loaded ones (_loaded_class)."""
    cls = _loaded_class(path)
    return cls if cls is not None and issubclass(cls, Request) else None


def check_item_replay(value: Any) -> None:
    """EnvelopeError unless *value* (a stored request's ``retryqueue_item`` meta) is
    absent or an item replay as runtime.replay_meta writes it: ``{"item": {...},
    "class": <text or None>}``."""
    if value is None:
        return
    if (
        not isinstance(value, dict)
        or not isinstance(value.get("item"), dict)
        or not isinstance(value.get("class"), (str, type(None)))
    ):
        raise EnvelopeError(
            f"envelope request meta {META_ITEM!r} is not an item replay "
            '({"item": {...}, "class": <text or null>})'
        )


def item_class(path: Any) -> type | None:
    """The item class an item replay names (RETRYQUEUE_ITEM_REPLAY), among the loaded
    ones (_loaded_class), and one itemadapter takes for an item class (scrapy.Item, a
    dataclass, attrs, pydantic): ``subprocess.Popen`` too is a class, callable with
    the item's fields."""
    from itemadapter import ItemAdapter

    cls = _loaded_class(path)
    return cls if cls is not None and ItemAdapter.is_item_class(cls) else None


def _method_name(name: str) -> bool:
    # A spider method by name, as Request.to_dict writes it; never a dunder
    # (__init__, __class__): those are no callbacks a spider declares.
    return name.isidentifier() and not (name.startswith("__") and name.endswith("__"))


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
