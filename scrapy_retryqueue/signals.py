"""Scrapy signals sent by scrapy-retryqueue, so a project can react without subclassing.

Connect a handler as to any Scrapy signal; a handler receives the keyword
arguments it names (any subset of those listed), and an exception it raises is
logged, never propagated (``send_catch_log``)::

    from scrapy_retryqueue import signals as rq_signals

    class Alerts:
        @classmethod
        def from_crawler(cls, crawler):
            ext = cls()
            crawler.signals.connect(ext.dead, signal=rq_signals.retryqueue_dead)
            return ext

        def dead(self, request, task_id, kind, reason):
            ...

Every signal is sent on the reactor thread, once the write it reports was
accepted: written to Redis, or kept in the local spool while Redis is
unreachable (``outcome`` says which).
"""

from __future__ import annotations

#: A failure was parked for a later attempt.
#: Arguments: ``request`` (what will be retried, after the retry hook), ``task_id``,
#: ``decision`` (a :class:`~scrapy_retryqueue.decision.policy.Decision`: kind, delay,
#: attempt, reason), ``outcome`` (``"parked"`` or ``"spooled"``), ``spider``.
retryqueue_scheduled = object()

#: A re-injected request downloaded without a failure status: its task is done.
#: Arguments: ``request``, ``task_id``, ``kind`` (the kind of its last failure),
#: ``attempts`` (dict kind -> retries used), ``wait_ms`` (ms from the task's first
#: failure to this success; None when not known, for a task an older version
#: parked), ``domain`` (the request's host, lower case; ``""`` when it has none),
#: ``outcome``, ``spider``.
retryqueue_recovered = object()

#: A task became a dead letter.
#: Arguments: ``request`` (None for a task dead-lettered by a poll, such as a
#: ``poison`` or ``malformed`` one), ``task_id``, ``kind``, ``reason``,
#: ``decision`` (None when ``request`` is None), ``outcome`` (``"dead"`` or
#: ``"spooled"``), ``spider``.
retryqueue_dead = object()

#: A domain changed state (RETRYQUEUE_DOMAIN_COOLDOWN): it started cooling
#: down, its cooldown was extended, or it reopened. Sent by the node that made
#: the change. Arguments: ``domain``, ``state`` (``"cooling"`` or ``"open"``),
#: ``previous``, ``until`` (end of the cooldown, ms since the epoch; 0 when
#: open), ``level`` (failed probes in a row), ``reason``, ``spider``.
retryqueue_domain_state = object()

__all__ = [
    "retryqueue_dead",
    "retryqueue_domain_state",
    "retryqueue_recovered",
    "retryqueue_scheduled",
]
