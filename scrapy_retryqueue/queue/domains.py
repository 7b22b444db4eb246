"""Per-domain cooldowns in Redis: a circuit breaker shared by every node.

A domain (a request's lower-case host name) is *open* until a throttling
answer (429, or 503 with Retry-After) or a burst of failures (timeouts,
connection errors, 5xx above a threshold within a window) puts it in
*cooling* until a time every node reads from Redis. While it cools down no
node claims its retries (claim.lua moves them to the end of the cooldown) and
fresh requests to it are parked as ``deferred``. Once the time has passed it
is half-open: claim.lua lets one probe through; a success reopens the domain
(domain_ok.lua), a failure extends the cooldown with backoff (domain_fail.lua).

Like delayed.py, blocking calls; the Scrapy glue runs them off the reactor thread.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import redis

from ..settings.defaults import DOMAIN_REASON_MAX, EVENTS_MAXLEN
from ..values import as_text
from .keys import Keys, keys_for
from .wire import load_script_source

#: Lua scripts of this module (lua/<name>.lua), beside queue.SCRIPT_NAMES.
DOMAIN_SCRIPT_NAMES = ("domain_fail", "domain_ok")
#: What can put a domain in cooldown: a throttling answer or a burst of failures.
CAUSES = ("throttle", "burst")


#: A domain's state in the domains hash, as domain_fail.lua writes it: plain
#: words, so that no script parses JSON text.
_STATE = re.compile(r"([a-z]+) (-?\d{1,19}) (-?\d{1,19}) (-?\d{1,19}) (.*)", re.S)


def parse_state(raw: Any) -> dict[str, Any] | None:
    """A domain's stored state as ``{state, until, level, since, reason}``; None
    when it is neither this version's ``"<state> <until ms> <level> <since ms>
    <reason>"`` nor an older version's JSON object (read from Redis: may be anything)."""
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", "replace")
    if not isinstance(raw, str):
        return None
    match = _STATE.fullmatch(raw)
    if match is not None:
        state, until, level, since, reason = match.groups()
        return {
            "state": state,
            "until": int(until),
            "level": int(level),
            "since": int(since),
            "reason": reason,
        }
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: nested too deep
        return None
    return dict(doc) if isinstance(doc, dict) else None


@dataclass(frozen=True, slots=True)
class DomainChange:
    """What one domain_fail / domain_ok call did."""

    domain: str
    changed: bool
    state: str
    previous: str
    #: End of the cooldown (ms), 0 when open.
    until: int
    level: int


class DomainCooldowns:
    """One spider's domain states in Redis, changed only through their scripts."""

    def __init__(
        self,
        client: redis.Redis | Any,
        spider: str,
        *,
        node_id: str,
        events_maxlen: int = EVENTS_MAXLEN,
        project: str = "",
    ) -> None:
        self.client = client
        self.keys: Keys = keys_for(spider, project)
        self.node_id = node_id
        self.events_maxlen = events_maxlen
        self._fail, self._ok = (
            client.register_script(load_script_source(name)) for name in DOMAIN_SCRIPT_NAMES
        )

    def _keys(self) -> list[str]:
        k = self.keys
        return [k.domains, k.cooling, k.bursts, k.probes, k.events]

    def fail(
        self,
        domain: str,
        *,
        now: int,
        cause: str,
        wait_ms: int,
        base_ms: int,
        max_ms: int,
        burst_threshold: int,
        burst_window_ms: int,
        reason: str,
    ) -> DomainChange:
        """Count a failure of *domain*: cause ``throttle`` or ``burst``."""
        if cause not in CAUSES:
            raise ValueError(f"cause must be one of {', '.join(CAUSES)}; got {cause!r}")
        changed, state, until, previous, level = self._fail(
            keys=self._keys(),
            args=[
                *(now, domain, cause, int(wait_ms), int(base_ms), int(max_ms)),
                *(int(burst_threshold), int(burst_window_ms), reason[:DOMAIN_REASON_MAX]),
                *(self.node_id, self.events_maxlen),
            ],
        )
        return DomainChange(
            domain, bool(changed), as_text(state), as_text(previous), int(until), int(level)
        )

    def ok(self, domain: str, *, now: int) -> DomainChange:
        """A success of *domain*: reopen it when its cooldown has ended."""
        changed = self._ok(keys=self._keys(), args=[now, domain, self.node_id, self.events_maxlen])
        if changed:
            return DomainChange(domain, True, "open", "cooling", 0, 0)
        return DomainChange(domain, False, "", "", 0, 0)

    def cooling(self) -> dict[str, int]:
        """Domains cooling down or half-open: domain -> end of the cooldown (ms)."""
        return {
            as_text(domain): int(until)
            for domain, until in self.client.zrange(self.keys.cooling, 0, -1, withscores=True)
        }
