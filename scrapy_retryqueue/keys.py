"""Redis key names: the only place they are spelled.

Every key of one spider shares the hash tag ``{spider}``, so a Lua script that
touches several of them runs in one Redis Cluster slot.
"""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "retryqueue"


@dataclass(frozen=True, slots=True)
class Keys:
    spider: str
    #: ZSET task id -> due time (ms)
    due: str
    #: ZSET task id -> lease expiry (ms)
    leased: str
    #: HASH task id -> envelope (JSON) of live tasks
    tasks: str
    #: HASH task id -> lease token of the node that holds it
    owners: str
    #: HASH task id -> times its lease expired unacknowledged
    reclaims: str
    #: ZSET task id -> time of death (ms), dead letters not yet in the SQL store
    dead: str
    #: HASH task id -> envelope (JSON) of dead letters
    deadtasks: str
    #: STREAM lifecycle events
    events: str
    #: HASH domain -> JSON state of a domain cooling down (per-domain cooldowns)
    domains: str
    #: ZSET domain -> end of its cooldown (ms), the domains whose retries wait
    cooling: str
    #: HASH domain -> "<window start ms> <failures>": the burst counter
    bursts: str
    #: HASH domain -> lease expiry (ms) of its half-open probe in flight
    probes: str


def keys_for(spider: str) -> Keys:
    """The keys of one spider's namespace: ``retryqueue:{<spider>}:<name>``."""
    if not spider or "{" in spider or "}" in spider:
        raise ValueError(f"spider name {spider!r} cannot be used in a Redis hash tag")
    base = f"{PREFIX}:{{{spider}}}"
    return Keys(
        spider=spider,
        due=f"{base}:due",
        leased=f"{base}:leased",
        tasks=f"{base}:tasks",
        owners=f"{base}:owners",
        reclaims=f"{base}:reclaims",
        dead=f"{base}:dead",
        deadtasks=f"{base}:deadtasks",
        events=f"{base}:events",
        domains=f"{base}:domains",
        cooling=f"{base}:cooling",
        bursts=f"{base}:bursts",
        probes=f"{base}:probes",
    )


def all_keys(keys: Keys) -> list[str]:
    return [
        keys.due,
        keys.leased,
        keys.tasks,
        keys.owners,
        keys.reclaims,
        keys.dead,
        keys.deadtasks,
        keys.events,
        keys.domains,
        keys.cooling,
        keys.bursts,
        keys.probes,
    ]
