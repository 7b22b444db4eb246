"""Task references in request meta: which task a re-injected request is, and its lease.

Plain JSON on purpose: a shared frontier (scrapy-redis) may serialize the
request, and another node may run it; its ack then still names the lease.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..queue.taskinfo import host_of
from ..settings.defaults import META_TASK

if TYPE_CHECKING:
    from scrapy import Request

    from ..queue.envelope import Task

#: The meta value under META_TASK.
TaskRef = dict[str, Any]


def task_ref(task: Task, token: str, *, host: str | None = None) -> TaskRef:
    """The reference a claimed task's request carries while this lease holds it.

    *host*: its request's host when the caller has the request's URL parsed
    (:func:`~..queue.taskinfo.host_word`), else parsed here from the task's URL.
    """
    return {
        "id": task.id,
        "token": token,
        "kind": task.kind,
        "attempts": dict(task.attempts),
        "first_error": task.first_error,
        "created": task.created,
        # The previous failure: how long the outage had lasted then (decision/recovery.py).
        "updated": task.updated,
        "due": task.due,
        "url": task.url,
        # What the ack writes for learning (the succeeded event, the recovered
        # signal): the domain; the wait is counted from "created".
        "host": host_of(task.url) if host is None else host,
        # True once acked, rescheduled or dead-lettered: a later failure of the
        # same response (its callback, an item) starts a new task.
        "settled": False,
        # The stored request's own dont_filter (a re-injected one always has it):
        # what its next envelope keeps, and whether the offsite check applies.
        "dont_filter": task.request.get("dont_filter") is True,
    }


def ref_of(request: Request) -> TaskRef | None:
    """The request's task reference, None for a request that is no task's attempt."""
    ref = request.meta.get(META_TASK)
    if (
        isinstance(ref, dict)
        and isinstance(ref.get("id"), str)
        and isinstance(ref.get("token"), str)
    ):
        return ref
    return None


def ref_host(ref: TaskRef) -> str:
    """The host of the ref's request (a ref made by an older version has none)."""
    host = ref.get("host")
    return host if isinstance(host, str) else host_of(str(ref.get("url") or ""))


def ref_created(ref: TaskRef) -> int | None:
    """When the ref's task was created (ms), None when not known."""
    created = ref.get("created")
    if isinstance(created, int) and not isinstance(created, bool) and created > 0:
        return created
    return None


def ref_updated(ref: TaskRef) -> int | None:
    """The ``updated`` time (ms) of the envelope the ref's task was claimed with."""
    updated = ref.get("updated")
    if isinstance(updated, int) and not isinstance(updated, bool):
        return updated
    return None


def live_ref(request: Request) -> TaskRef | None:
    """The task reference while its lease is still to be settled, else None."""
    ref = ref_of(request)
    return None if ref is None or ref["settled"] else ref


def settle(ref: TaskRef) -> None:
    """Mark the lease used: the first write that names it (ack, reschedule, dead) wins."""
    ref["settled"] = True


def ref_learning(ref: TaskRef) -> tuple[str, int | None]:
    """What the ref's next outcome teaches the recovery records (decision/recovery.py): the kind
    of the task's first failure (its outage's kind) and the ms from that failure to the
    previous one (None when not known: the outage counts from bin 0)."""
    first = ref.get("first_error")
    kind = first.get("kind") if isinstance(first, dict) else None
    if not isinstance(kind, str) or not kind:
        kind = ref.get("kind") if isinstance(ref.get("kind"), str) else ""
    created, updated = ref_created(ref), ref.get("updated")
    if created is None or not isinstance(updated, int) or isinstance(updated, bool):
        return kind, None
    return kind, max(0, updated - created)
