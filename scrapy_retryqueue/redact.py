"""Secrets in a stored request, hidden from people: header values masked on every surface.

A stored request keeps its headers so it can be replayed, credentials included.
What a person sees of it (dashboard pages, the JSON API, exports, logs, the
audit log) shows the names of such headers with their values masked, unless
an export is explicitly asked to include them.
"""

from __future__ import annotations

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


def mask_headers(headers: Any, secret: frozenset[str]) -> Any:
    """Envelope headers (``[[name, value], ...]``) with secret values masked.

    Anything that is not a list of pairs is returned as it is (a malformed
    envelope is shown as what it is).
    """
    if not isinstance(headers, list):
        return headers
    masked: list[Any] = []
    for pair in headers:
        if (
            isinstance(pair, (list, tuple))
            and len(pair) == 2
            and isinstance(pair[0], str)
            and pair[0].strip().lower() in secret
        ):
            masked.append([pair[0], MASK])
        else:
            masked.append(pair)
    return masked


def mask_request(request: Any, secret: frozenset[str]) -> Any:
    """A stored request (envelope ``request`` dict) as people may see it.

    Secret header values are masked, and so are cookies (a ``Cookie`` header's
    twin) when ``cookie`` is a secret name. The input is not changed.
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
    return shown


def mask_envelope(envelope: Any, secret: frozenset[str]) -> Any:
    """A task envelope (dict) with its request masked; anything else as it is.

    A malformed dead letter's stored text (``raw``) is masked too, as far as
    text that may not be JSON allows (:func:`mask_raw`).
    """
    if not isinstance(envelope, Mapping):
        return envelope
    if isinstance(envelope.get("raw"), str):
        envelope = {**envelope, "raw": mask_raw(envelope["raw"], secret)}
    if "request" not in envelope:
        return envelope
    return {**envelope, "request": mask_request(envelope["request"], secret)}


#: A string in JSON text, escapes included.
_JSON_STRING = r'"(?:[^"\\]|\\.)*"'


def mask_raw(text: str, secret: frozenset[str]) -> str:
    """Stored envelope text (a malformed one: maybe not JSON) with secret values masked.

    Best effort on text that cannot be parsed: the value of each
    ``["<secret header>", "<value>"]`` pair, and with ``cookie`` secret the
    members of a ``"cookies"`` object, are replaced by the mask.
    """
    for name in secret:
        pair = re.compile(rf'(\[\s*"{re.escape(name)}"\s*,\s*){_JSON_STRING}', re.IGNORECASE)
        text = pair.sub(lambda m: f'{m.group(1)}"{MASK}"', text)
    if "cookie" in secret:
        cookies = re.compile(r'("cookies"\s*:\s*)(\{[^{}]*\}|\[[^\[\]]*\])')
        text = cookies.sub(lambda m: f'{m.group(1)}"{MASK}"', text)
    return text
