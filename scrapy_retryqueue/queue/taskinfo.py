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

from urllib.parse import urlsplit


def host_of(url: str) -> str:
    """The host of *url* as the cooldowns name domains: what Scrapy's
    ``urlparse_cached(request).hostname`` gives for it (the breaker's name of a
    domain), so the claim holds exactly the tasks of a cooling domain; ``""``
    when *url* has none (or a host with whitespace, which no domain has)."""
    try:
        host = urlsplit(url).hostname if isinstance(url, str) else None
    except ValueError:  # an unclosed IPv6 bracket
        return ""
    return host_word(host)


def host_word(host: str | None) -> str:
    """A hostname already parsed (``urlparse_cached(request).hostname``) as
    :func:`host_of` gives it: ``""`` when there is none or it holds whitespace."""
    # str.split() cuts at what str.isspace() calls whitespace: one C call, not a loop.
    if not host or host.split() != [host]:
        return ""
    return host


def taskinfo_value(created: int | None, host: str, url: str) -> str:
    """The taskinfo entry of a task: ``"<created ms> <host> <url>"`` (created
    empty when not known, the host empty when the URL has none; *host* from
    :func:`host_of`)."""
    when = str(created) if isinstance(created, int) and created >= 0 else ""
    if host and host.split() != [host]:
        host = ""  # one word: claim.lua reads the URL after it
    return f"{when} {host} {url}"
