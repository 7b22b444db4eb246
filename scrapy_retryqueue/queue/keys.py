"""Redis key names and lease tokens: the only place they are spelled and parsed.

Every key of one spider shares the hash tag ``{spider}``, so a Lua script that
touches several of them runs in one Redis Cluster slot. A project's namespace
(RETRYQUEUE_NAMESPACE, else its BOT_NAME) stands before the hash tag,
``retryqueue:<project>:{<spider>}:<name>``, so that two projects with a spider
of the same name never meet; an empty one is the layout from before namespaces,
``retryqueue:{<spider>}:<name>``. Both layouts of a spider share its slot, so one
script can move a queue from the one to the other.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from ..exceptions import ConfigError, SpiderNameError
from ..settings.names import usable_project
from ..values import as_text

PREFIX = "retryqueue"
#: Hex digits of a lease prefix's random part: two processes with one node id
#: (a restarted node) never hold the same token.
_LEASE_NONCE_DIGITS = 12


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
    #: HASH task id -> "<created ms> <host> <url>" of live tasks: what a script
    #: needs of a task, kept beside its envelope so that no script parses it
    taskinfo: str
    #: HASH task id -> kind a dead letter died of (beside its envelope in deadtasks)
    deadkinds: str
    #: HASH domain -> "<state> <until ms> <level> <since ms> <reason>" of a domain
    #: cooling down (per-domain cooldowns)
    domains: str
    #: ZSET domain -> end of its cooldown (ms), the domains whose retries wait
    cooling: str
    #: HASH domain -> "<window start ms> <failures>": the burst counter
    bursts: str
    #: HASH domain -> lease expiry (ms) of its half-open probe in flight
    probes: str
    #: HASH node id -> "<heartbeat ms> <last busy ms> <registered ms>": the nodes
    #: crawling the spider
    nodes: str
    #: ZSET request id -> score (-priority, or push order): the leased frontier's
    #: requests waiting for a node (frontier.py)
    frontier: str
    #: HASH request id -> request (JSON) of every frontier request, waiting or leased
    frontier_requests: str
    #: HASH request id -> its score in ``frontier``, kept while it is leased
    frontier_scores: str
    #: ZSET request id -> lease expiry (ms) of frontier requests a node holds
    frontier_leased: str
    #: HASH request id -> lease token of the node that holds it
    frontier_owners: str
    #: HASH request id -> times its lease expired unacknowledged
    frontier_reclaims: str
    #: SET request fingerprints the frontier has taken (its dupefilter)
    frontier_seen: str
    #: HASH request id -> "<kind> <stored text>" of frontier requests taken out:
    #: poison (leases expired too often) or malformed (cannot be read)
    frontier_quarantine: str
    #: STRING counter: the push order of the FIFO frontier
    frontier_seq: str
    #: STRING "<finished ms> <node id>": the fleet's crawl on the frontier finished
    #: (frontier_finish.lua); a node that starts then crawls nothing (frontier_join.lua)
    frontier_finished: str
    #: HASH "<kind> <domain>" -> learned recovery record (decision/recovery.py): how long
    #: the domain's outages of that kind lasted, as weighted survival bins
    recovery: str
    #: HASH domain -> retry budget record (decision/retrybudget.py): the fresh requests and
    #: the retries of the domain, per slice of the budget's window
    budget: str
    #: HASH task id -> ``updated`` (ms) of its live envelope, written with it
    #: (RETRYQUEUE_SIGNING_KEYS): an older copy of the envelope is a replay
    versions: str
    #: ZSET task id -> ``updated`` (ms) of the envelope its task last finished with
    #: (acknowledged, dead-lettered, cancelled), trimmed by age and count: a copy
    #: written before it is a replay (RETRYQUEUE_SIGNING_KEYS)
    finished: str
    #: The project's namespace; "" for the layout from before namespaces.
    project: str = ""

    @property
    def namespace(self) -> str:
        """``retryqueue:<project>:{<spider>}``, what every key of this spider starts with."""
        return _namespace(self.spider, self.project)


def _usable(spider: str) -> bool:
    return bool(spider) and "{" not in spider and "}" not in spider


def _namespace(spider: str, project: str = "") -> str:
    if project:
        return f"{PREFIX}:{project}:{{{spider}}}"
    return f"{PREFIX}:{{{spider}}}"


def _shown(name: str) -> str:
    """*name*'s repr for an error line, cut at 80 characters (a name may be huge)."""
    return repr(name) if len(name) <= 80 else f"{name[:80]!r}… ({len(name)} characters)"


def keys_for(spider: str, project: str = "") -> Keys:
    """The keys of one spider's namespace: ``retryqueue:<project>:{<spider>}:<name>``,
    or ``retryqueue:{<spider>}:<name>`` with no project."""
    if not _usable(spider):
        raise SpiderNameError(
            f"spider name {_shown(spider)} cannot name a queue: it must be non-empty, without "
            "'{' or '}' (its keys hold it as a Redis hash tag)"
        )
    if not usable_project(project):
        raise ConfigError(
            f"namespace {_shown(project)} must be 1-64 letters, digits, '_', '.' or '-' "
            "(RETRYQUEUE_NAMESPACE)"
        )
    base = _namespace(spider, project)
    return Keys(
        project=project,
        spider=spider,
        due=f"{base}:due",
        leased=f"{base}:leased",
        tasks=f"{base}:tasks",
        owners=f"{base}:owners",
        reclaims=f"{base}:reclaims",
        dead=f"{base}:dead",
        deadtasks=f"{base}:deadtasks",
        events=f"{base}:events",
        taskinfo=f"{base}:taskinfo",
        deadkinds=f"{base}:deadkinds",
        domains=f"{base}:domains",
        cooling=f"{base}:cooling",
        bursts=f"{base}:bursts",
        probes=f"{base}:probes",
        nodes=f"{base}:nodes",
        frontier=f"{base}:frontier",
        frontier_requests=f"{base}:frontier:requests",
        frontier_scores=f"{base}:frontier:scores",
        frontier_leased=f"{base}:frontier:leased",
        frontier_owners=f"{base}:frontier:owners",
        frontier_reclaims=f"{base}:frontier:reclaims",
        frontier_seen=f"{base}:frontier:seen",
        frontier_quarantine=f"{base}:frontier:quarantine",
        frontier_seq=f"{base}:frontier:seq",
        frontier_finished=f"{base}:frontier:finished",
        recovery=f"{base}:recovery",
        budget=f"{base}:budget",
        versions=f"{base}:versions",
        finished=f"{base}:finished",
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
        keys.taskinfo,
        keys.deadkinds,
        keys.domains,
        keys.cooling,
        keys.bursts,
        keys.probes,
        keys.nodes,
        keys.recovery,
        keys.budget,
        keys.versions,
        keys.finished,
        *frontier_keys(keys),
    ]


def frontier_keys(keys: Keys) -> list[str]:
    """The leased frontier's keys (a fleet that starts over deletes these)."""
    return [
        keys.frontier,
        keys.frontier_requests,
        keys.frontier_scores,
        keys.frontier_leased,
        keys.frontier_owners,
        keys.frontier_reclaims,
        keys.frontier_seen,
        keys.frontier_quarantine,
        keys.frontier_seq,
        keys.frontier_finished,
    ]


def scan_pattern(key: str | None = None, project: str | None = None) -> str:
    """A SCAN pattern matching one key of every spider (*key* names a :class:`Keys`
    field, e.g. ``"events"``), or every key of every spider: of one *project*
    ("" for the layout without a namespace), or of every project when None."""
    if key is not None and (key in ("spider", "project") or key not in Keys.__slots__):
        raise ValueError(f"{key!r} is not a key of a spider's namespace")
    if project is None:
        base = f"{PREFIX}:*{{*}}"
    else:
        if not usable_project(project):
            raise ValueError(f"namespace {project!r} cannot be used in a key")
        base = _namespace("*", project)
    if key is None:
        return f"{base}:*"
    sample = keys_for("x")
    return f"{base}:{getattr(sample, key)[len(sample.namespace) + 1 :]}"


def queue_of(key: str | bytes) -> tuple[str, str] | None:
    """(project, spider) of the namespace *key* is in; None for a key not of this package."""
    text, start = as_text(key), f"{PREFIX}:"
    if not text.startswith(start):
        return None
    rest, project = text[len(start) :], ""
    if not rest.startswith("{"):
        project, sep, rest = rest.partition(":")
        if not sep or not project or not usable_project(project) or not rest.startswith("{"):
            return None
    # A spider's name holds no brace, so its hash tag ends at the first "}:"
    # (the frontier's keys have a ":" after it too).
    spider, sep, _ = rest[1:].partition("}:")
    return (project, spider) if sep and _usable(spider) else None


def spider_of(key: str | bytes, project: str | None = None) -> str | None:
    """The spider whose namespace *key* is in (of *project* when given: "" for the
    layout without a namespace); None for a key not of this package, or of another project."""
    found = queue_of(key)
    if found is None or (project is not None and found[0] != project):
        return None
    return found[1]


def writer_key(spider: str | None, project: str = "") -> str:
    """The STRING a ``scrapy retryqueue writer`` announces itself in while it runs (its
    consumer name, with an expiry it renews): for one *spider*,
    ``retryqueue:<project>:{<spider>}:writer``; for every spider of the project (None),
    ``retryqueue:<project>:writer`` (``retryqueue:writer`` with no namespace), a key of
    no spider's namespace. Not in :func:`all_keys`: it is no part of a spider's queue."""
    if spider is not None:
        return f"{keys_for(spider, project).namespace}:writer"
    if not usable_project(project):
        raise ConfigError(
            f"namespace {_shown(project)} must be 1-64 letters, digits, '_', '.' or '-' "
            "(RETRYQUEUE_NAMESPACE)"
        )
    return f"{PREFIX}:{project}:writer" if project else f"{PREFIX}:writer"


def lease_prefix(node_id: str) -> str:
    """The start of every lease token one process hands out: node id and a nonce."""
    return f"{node_id}:{uuid.uuid4().hex[:_LEASE_NONCE_DIGITS]}"


def lease_token(prefix: str, serial: int) -> str:
    """The token of one claim: ``<node id>:<nonce>:<serial>`` (*prefix* from lease_prefix)."""
    return f"{prefix}:{serial}"


def lease_owner(token: Any) -> str:
    """The node id in a lease token (node ids may hold ':', the nonce and serial do not)."""
    return as_text(token).rsplit(":", 2)[0]
