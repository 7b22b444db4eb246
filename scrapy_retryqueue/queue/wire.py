"""How the queue's values travel to and from Redis: script texts, task ids, envelopes.

Every script is shipped in the package (``lua/<name>.lua``) with the shared
snippets it calls prepended; a task id or an envelope read back from Redis may
not be UTF-8 text (a hostile writer), and is decoded so that it harms nothing
else and can be written back unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

#: The shared Lua snippets (``lua/lib/<snippet>.lua``) a script calls, by script name:
#: each is prepended to the script's own text, so the one copy serves every caller.
SNIPPETS: Mapping[str, tuple[str, ...]] = {
    "ack": ("recovery", "finished", "finishedtrim"),
    "reschedule": ("recovery",),
    "deadletter": ("recovery", "finished", "finishedtrim"),
    "cancel": ("finished",),
    "reap": ("finished",),
    "claim": ("finished",),
}


def load_script_source(name: str) -> str:
    """The text of ``lua/<name>.lua`` as Redis runs it, shipped in the package: the
    snippets it calls (:data:`SNIPPETS`), then its own text. Its SHA is the whole text's."""
    lua = resources.files(__package__).joinpath("lua")
    parts = [
        lua.joinpath("lib", f"{snippet}.lua").read_text("utf-8")
        for snippet in SNIPPETS.get(name, ())
    ]
    return "".join(parts) + lua.joinpath(f"{name}.lua").read_text("utf-8")


def task_id_text(raw: Any) -> str:
    """A task id from Redis as ``str``; one that is not UTF-8 keeps its bytes as
    surrogates (``surrogateescape``), so :func:`wire_id` writes it back unchanged."""
    if isinstance(raw, bytes):
        try:
            return raw.decode()
        except UnicodeDecodeError:
            return raw.decode("utf-8", "surrogateescape")
    return str(raw)


def wire_id(task_id: str) -> str | bytes:
    """A task id as it goes to Redis: the bytes it was read as (see :func:`task_id_text`)."""
    if task_id.isascii():
        return task_id
    return task_id.encode("utf-8", "surrogateescape")


def envelope_text(raw: Any) -> str | bytes:
    """An envelope from Redis as ``str``, or its bytes as they are when not UTF-8.

    Decoded one by one: a stored envelope that is not UTF-8 text must not fail
    the claim of the others (the reader dead-letters it as ``malformed``).
    """
    if isinstance(raw, bytes):
        try:
            return raw.decode()
        except UnicodeDecodeError:
            return raw
    return str(raw)


def envelope_url(raw: Any) -> str:
    """The request URL of a stored envelope, ``""`` when it cannot be read."""
    if raw is None:
        return ""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, nested too deep
        return ""
    request = doc.get("request") if isinstance(doc, dict) else None
    url = request.get("url") if isinstance(request, dict) else None
    return url if isinstance(url, str) else ""
