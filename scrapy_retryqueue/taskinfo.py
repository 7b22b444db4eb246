"""What the Lua scripts need of a task, kept beside its envelope: its creation time, host and URL.

No script parses an envelope (its JSON promises no key order). The scripts
that write an envelope into the tasks hash also write the task's entry in the
``taskinfo`` hash, a value made here from what Python knows already:
``"<created ms> <host> <url>"``. claim.lua reads it to hold the tasks of a
cooling domain, to dead-letter one that waited longer than
RETRYQUEUE_DEFERRAL_MAX_WAIT, and to name its URL in that ``dead`` event.
Pure: no I/O.
"""

from __future__ import annotations

import re

#: scheme://authority, as claim.lua's host_of read it before this module.
_AUTHORITY = re.compile(r"[A-Za-z0-9+.-]+://([^/?#]*)")
_BRACKETED = re.compile(r"\[([^\]]*)\]")


def host_of(url: str) -> str:
    """The host of *url* as the cooldowns name domains: lower case, without the
    userinfo and the port, an IPv6 address without its brackets; ``""`` when
    *url* has no authority (or a host with whitespace, which no domain has)."""
    match = _AUTHORITY.match(url) if isinstance(url, str) else None
    if match is None:
        return ""
    authority = match.group(1).rpartition("@")[2]
    bracketed = _BRACKETED.match(authority)
    host = bracketed.group(1) if bracketed else authority.partition(":")[0]
    host = host.lower()
    return "" if any(c.isspace() for c in host) else host


def taskinfo_value(created: int | None, host: str, url: str) -> str:
    """The taskinfo entry of a task: ``"<created ms> <host> <url>"`` (created
    empty when not known, the host empty when the URL has none; *host* from
    :func:`host_of`)."""
    when = str(created) if isinstance(created, int) and created >= 0 else ""
    if any(c.isspace() for c in host):
        host = ""  # one word: claim.lua reads the URL after it
    return f"{when} {host} {url}"
