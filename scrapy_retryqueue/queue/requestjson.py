"""A request as JSON and back: what an envelope's ``request`` and the leased frontier store.

Never pickle: a stored request is read from a shared Redis, so rebuilding one
must not be able to run code. Bytes (headers, body) are carried as latin-1
text and base64; meta and cb_kwargs must be plain JSON, and a value that is
not is reported by its path (``meta['item']``) instead of being dropped. A
request class or an item class named by a stored value is looked up among the
modules imported already, never imported. With RETRYQUEUE_ENCRYPTION_KEYS,
headers, body and cookies are sealed into one token
(:mod:`scrapy_retryqueue.secure.encryption`) and opened when read back.
"""

from __future__ import annotations

import base64
import math
import sys
from collections.abc import Mapping
from typing import Any

from scrapy import Request
from scrapy.utils.request import request_from_dict

from ..exceptions import EnvelopeError
from ..secure.encryption import RequestCipher, open_request
from ..settings.defaults import (
    ENVELOPE_MAX_DEPTH,
    META_ITEM,
    SCRAPY_META_PROXY,
    SCRAPY_META_SCHEME_PROXY,
    TRANSIENT_META_KEYS,
)
from .document import dumps, read_document, shown
from .signature import FIELD as SIGNATURE_FIELD

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
    # A scalar item is taken as it is: its path is only made for a value that needs
    # a look (a meta of a few scalars is most requests' whole meta).
    if isinstance(value, (list, tuple)):
        return [
            v
            if v is None or isinstance(v, (bool, str, int))
            else check_json(v, f"{path}[{i}]", _depth + 1)
            for i, v in enumerate(value)
        ]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise EnvelopeError(f"{path} has a key {k!r} that is not a string")
            if v is None or isinstance(v, (bool, str, int)):
                out[k] = v
            else:
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
    proxy_dropped = bool(raw_meta.get(SCRAPY_META_SCHEME_PROXY))
    meta = {}
    for k, v in raw_meta.items():
        # A non-str key is kept so that check_json reports it by name.
        if k in TRANSIENT_META_KEYS or (isinstance(k, str) and k.startswith("_")):
            continue
        if (proxy_dropped and k == SCRAPY_META_PROXY) or (
            recomputed and k in recomputed and v == recomputed[k]
        ):
            continue
        meta[k] = v
    d["meta"] = check_json(meta, "meta")
    # Empty (most requests): what check_json makes of it equals the default, not stored.
    for name in ("cb_kwargs", "cookies", "flags"):
        value = d.get(name)
        d[name] = check_json(value, name) if value else _REQUEST_DEFAULTS[name]
    for name, default in _REQUEST_DEFAULTS.items():
        value = d.get(name, default)
        if value != default:
            out[name] = value
    headers = [
        [name.decode("latin-1"), value.decode("latin-1")]
        # dict's items: Headers' own would look each name up again (getlist).
        for name, values in dict.items(d.get("headers") or {})
        for value in values
    ]
    if headers:
        out["headers"] = headers
    body = d.get("body") or b""
    if body:
        out["body"] = base64.b64encode(body).decode("ascii")
    if "_class" in d:
        out["_class"] = d["_class"]
    if request.dont_filter:
        # Kept: a request the project let past the dupefilter and the offsite check
        # (Scrapy's OffsiteMiddleware lets dont_filter through) is let past it again
        # when re-injected; any other is checked as a fresh one is.
        out["dont_filter"] = True
    return out


_NOT_FOUND = object()
_ATTRIBUTES = Request.attributes
#: The attributes request_to_json reads besides url, callback, errback and headers.
_READ = ("body", "cookies", "meta", "encoding", "flags", "cb_kwargs", "method", "priority")


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
        "headers": request.headers,
    }
    if request.attributes is _ATTRIBUTES:
        # Request's own attributes: only those request_to_json reads.
        for attr in _READ:
            d[attr] = getattr(request, attr)
    else:
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
            f"envelope request class {shown(d['_class'])} is not a scrapy Request class "
            "this process has imported"
        )
    for name, kind in _REQUEST_TYPES.items():
        if name in d and (not isinstance(d[name], kind) or isinstance(d[name], bool)):
            raise EnvelopeError(
                f"envelope request field {name!r} must be {kind.__name__}, got {shown(d[name])}"
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
                f"envelope request {name} {shown(method)} is not the name of a spider method"
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
    return dumps(data)


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
    data.pop(SIGNATURE_FIELD, None)  # checked by the caller (signature.py), no request field
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
