"""Strict reading of JSON stored in a shared Redis: envelopes, stored requests, dead letters.

A value read from Redis may have been written around the package (a hostile
writer, a partial restore): :func:`read_document` turns whatever it is into a
JSON object or an :class:`~scrapy_retryqueue.exceptions.EnvelopeError`, and
nothing else. The compact writer :data:`dumps` is the one every stored
document is written with.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from ..exceptions import EnvelopeError
from ..settings.defaults import ENVELOPE_MAX_DEPTH


def _not_json(value: Any) -> Any:
    # JSONEncoder.default's own error.
    raise TypeError(f"Object of type {value.__class__.__name__} is not JSON serializable")


def _compact_writer() -> Callable[[Any], str]:
    """JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode,
    with its C encoder made once instead of at each call, and without the check for
    circular references (a stored document is built by this package from JSON data:
    it has none; one would raise RecursionError instead of ValueError). About 2.5 µs
    of an envelope's 8. The plain encoder when this Python's C encoder is missing,
    takes other arguments, or writes a probe document otherwise."""
    plain = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return plain
    try:
        encode = make(
            None, _not_json, json.encoder.encode_basestring, None, ":", ",", False, False, False
        )
    except TypeError:
        return plain

    def compact(value: Any) -> str:
        return "".join(encode(value, 0))

    probe = {"s": 'é"\n\u2028', "n": [1, -2.5, 1e300, True, None], "o": {"": [[], {}]}}
    try:
        if compact(probe) != plain(probe) or compact("x") != plain("x"):
            return plain
    except Exception:
        return plain
    return compact


#: Compact JSON, UTF-8 text kept as it is, NaN and Infinity refused.
dumps = _compact_writer()


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


def shown(value: Any) -> str:
    """A field's value for an error message: short, and only a scalar's value."""
    if value is None or isinstance(value, (bool, int, float, str)):
        text = repr(value) if not isinstance(value, int) or abs(value) < 10**30 else "a huge int"
        return text if len(text) <= 60 else text[:57] + "..."
    return f"a {type(value).__name__}"
