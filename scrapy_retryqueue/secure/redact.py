"""Secrets in a stored request, hidden from people: header values masked on every surface.

A stored request keeps its headers so it can be replayed, credentials included.
What a person sees of it (dashboard pages, the JSON API, exports, logs, the
audit log) shows the names of such headers with their values masked, unless
an export is explicitly asked to include them.
"""

from __future__ import annotations

import base64
import bisect
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from .encryption import FIELD as ENCRYPTED_FIELD
from .encryption import LABEL as ENCRYPTED
from .encryption import is_sealed, sealed_fields

#: What a masked value reads as.
MASK = "***"


def secret_names(names: Iterable[str]) -> frozenset[str]:
    """RETRYQUEUE_SECRET_HEADERS as a set of lower-case header names."""
    return frozenset(name.strip().lower() for name in names if name and name.strip())


def _is_secret(name: Any, secret: frozenset[str]) -> bool:
    return isinstance(name, str) and name.strip().lower() in secret


def mask_headers(headers: Any, secret: frozenset[str]) -> Any:
    """Envelope headers with secret values masked, whatever their shape.

    This package writes ``[[name, value], ...]``; a hostile or older writer may
    store a dict (``{name: value}`` or ``{name: [values]}``) or pairs with more
    than one value (``[name, value, value]``): every value of a secret name is
    masked in each. Anything else is returned as it is (a malformed envelope is
    shown as what it is).
    """
    if isinstance(headers, Mapping):
        return {name: MASK if _is_secret(name, secret) else v for name, v in headers.items()}
    if not isinstance(headers, list):
        return headers
    masked: list[Any] = []
    for pair in headers:
        if isinstance(pair, (list, tuple)) and len(pair) >= 2 and _is_secret(pair[0], secret):
            masked.append([pair[0], *([MASK] * (len(pair) - 1))])
        else:
            masked.append(pair)
    return masked


#: ``scheme://user:password@``: the password of a URL written in any text.
_URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^\s/?#@:]*:)([^\s/?#@]*)(@)")


def mask_url_passwords(text: Any) -> Any:
    """*text* with the password of every URL in it masked (``redis://u:***@h``); a
    request's URL, an error message that quotes one. Anything not text as it is."""
    if not isinstance(text, str) or "@" not in text:
        return text
    return _URL_PASSWORD.sub(lambda m: f"{m.group(1)}{MASK}{m.group(3)}", text)


def mask_request(request: Any, secret: frozenset[str]) -> Any:
    """A stored request (envelope ``request`` dict) as people may see it.

    Secret header values are masked, and so are cookies (a ``Cookie`` header's
    twin) when ``cookie`` is a secret name, and a password in the URL. The input
    is not changed.
    """
    if not isinstance(request, Mapping):
        return request
    if is_sealed(request):
        # Encrypted at rest (RETRYQUEUE_ENCRYPTION_KEYS): each sealed field
        # reads "(encrypted)" and the token is not shown.
        shown = {k: v for k, v in request.items() if k != ENCRYPTED_FIELD}
        shown.update(dict.fromkeys(sealed_fields(request), ENCRYPTED))
        return shown
    shown = dict(request)
    if "url" in shown:
        shown["url"] = mask_url_passwords(shown["url"])
    if "headers" in shown:
        shown["headers"] = mask_headers(shown["headers"], secret)
    if "cookie" in secret and shown.get("cookies"):
        cookies = shown["cookies"]
        if isinstance(cookies, Mapping):
            shown["cookies"] = {name: MASK for name in cookies}
        elif isinstance(cookies, list):
            shown["cookies"] = [
                {**c, "value": MASK} if isinstance(c, Mapping) and "value" in c else MASK
                for c in cookies
            ]
        else:
            shown["cookies"] = MASK
    return shown


def mask_error(error: Any) -> Any:
    """A stored first / last error with any URL password in its message masked."""
    if isinstance(error, Mapping) and isinstance(error.get("message"), str):
        return {**error, "message": mask_url_passwords(error["message"])}
    return error


def mask_envelope(envelope: Any, secret: frozenset[str]) -> Any:
    """A task envelope (dict) with its request masked; anything else as it is.

    A malformed dead letter's stored value is masked too, as far as text that may
    not be JSON allows (:func:`mask_raw`): its text (``raw``), and bytes that were
    not UTF-8 (``raw_base64``), masked inside and encoded again.
    """
    if not isinstance(envelope, Mapping):
        return envelope
    shown = dict(envelope)
    if isinstance(shown.get("raw"), str):
        shown["raw"] = mask_raw(shown["raw"], secret)
    if "raw_base64" in shown:
        shown["raw_base64"] = _mask_base64(shown["raw_base64"], secret)
    for name in ("first_error", "last_error"):
        if name in shown:
            shown[name] = mask_error(shown[name])
    if "request" in shown:
        shown["request"] = mask_request(shown["request"], secret)
    return shown


def _mask_base64(value: Any, secret: frozenset[str]) -> Any:
    """Stored bytes (base64) with secret values masked: read as Latin-1, which
    keeps every byte and every ASCII header name as it is, masked, encoded again."""
    try:
        raw = base64.b64decode(value, validate=True) if isinstance(value, str) else None
    except ValueError:
        raw = None
    if raw is None:
        return f"({MASK}: not base64, not shown)"
    masked = mask_raw(raw.decode("latin-1"), secret).encode("latin-1", "replace")
    return base64.b64encode(masked).decode("ascii")


#: The tokens of JSON text, left to right, each character read once (a string's
#: body possessively: hostile text cannot make the scan backtrack): a string,
#: unterminated when the text was cut short; a bracket or separator; blanks; any
#: other run (a number, true, a stray character).
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*+(?:"|\\?$)|[\[\]{}:,]|\s+|[^"\[\]{}:,\s]+')
_QUOTED_MASK = f'"{MASK}"'


def _json_name(quoted: str) -> str | None:
    """The text of a quoted JSON string (escapes such as \\u0041 read); None if cut short."""
    try:
        value = json.loads(quoted)
    except ValueError:
        return None
    return value if isinstance(value, str) else None


def _value_end(tokens: list[str], start: int) -> int:
    """The index past the JSON value that starts at *start* (a bracketed one up to
    its closing bracket, or the end of text when it was cut short)."""
    if tokens[start] not in ("[", "{"):
        return start + 1
    depth = 0
    for index in range(start, len(tokens)):
        if tokens[index] in ("[", "{"):
            depth += 1
        elif tokens[index] in ("]", "}"):
            depth -= 1
            if depth == 0:
                return index + 1
    return len(tokens)


def mask_raw(text: str, secret: frozenset[str]) -> str:
    """Stored envelope text (a malformed one: maybe not JSON) with secret values masked.

    Best effort on text that cannot be parsed, read as a stream of JSON tokens:
    the values of each ``["<secret header>", "<value>", ...]`` list and
    ``"<secret header>": <value>`` member (a list of values too), a header name
    written with escapes (``"\\u0041uthorization"``) too, a value cut off by the
    end of the text too; with ``cookie`` secret, the value of ``"cookies"``.
    Linear in the text's length.
    """
    tokens = _TOKEN.findall(text)
    solid = [i for i, token in enumerate(tokens) if not token.isspace()]
    masked = list(tokens)
    place = 0
    # Each token is looked at a bounded number of times: a masked stretch is skipped.
    while place < len(solid):
        index = solid[place]
        name = _json_name(tokens[index]) if tokens[index].startswith('"') else None
        place += 1
        if name is None:
            continue
        follows = tokens[solid[place]] if place < len(solid) else None
        before = tokens[solid[place - 2]] if place >= 2 else None
        if follows == ":" and place + 1 < len(solid):
            # "name": value
            if _is_secret(name, secret) or (name == "cookies" and "cookie" in secret):
                value = solid[place + 1]
                end = _value_end(tokens, value)
                masked[value:end] = [_QUOTED_MASK] + [""] * (end - value - 1)
                place = bisect.bisect_left(solid, end)
        elif before == "[" and _is_secret(name, secret):
            # ["name", value, value...]: each value up to the list's end
            while place < len(solid) and tokens[solid[place]] not in ("]", "[", "{", "}"):
                if tokens[solid[place]].startswith('"'):
                    masked[solid[place]] = _QUOTED_MASK
                place += 1
    return "".join(masked)
