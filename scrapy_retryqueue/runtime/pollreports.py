"""What the polls and re-injection found that people must hear of: stats, bounded log lines.

Unreadable entries (learned recovery records, retry budget records, item classes an
item replay names), the retry budget's deferrals, ghosts in the due set, and tasks
dead-lettered without a request (poison, malformed). Redis is shared with writers
this crawl does not trust: what their entries name is said once each, at most
:data:`_NAMES_SAID_MAX` of them, so endless new names fill neither the log nor memory.

:class:`PollReports` is a base of :class:`~.reporting.Reporter`, which sets up its state.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from .. import signals as rq_signals
from ..decision.kinds import MALFORMED
from .outcome import Outcome

if TYPE_CHECKING:
    from ..config import Config
    from ..queue.delayed import Claimed

#: The reporter's logger: its lines keep the name they had before it was split.
logger = logging.getLogger(f"{__package__}.reporting")

#: Distinct names of unreadable entries (records, item classes) said in a crawl, at most.
_NAMES_SAID_MAX = 100


class _SaidOnce:
    """Names of unreadable entries said in the log, once each and at most
    _NAMES_SAID_MAX of them: a hostile writer's endless new names must fill
    neither the log nor memory."""

    __slots__ = ("_said",)

    def __init__(self) -> None:
        self._said: set[str] = set()

    def new(self, names: Iterable[str]) -> list[str]:
        """The *names* not said yet, from now on said; none once the bound is reached."""
        if len(self._said) >= _NAMES_SAID_MAX:
            return []
        fresh = [name for name in dict.fromkeys(names) if name not in self._said]
        self._said.update(fresh)
        return fresh


class PollReports:
    """What a poll's answer or a claimed task held, told; only ever a base of Reporter,
    whose count, send and _dead it calls."""

    # Set up by Reporter.__init__.
    config: Config
    _records_said: _SaidOnce
    _classes_said: _SaidOnce
    _budgets_said: _SaidOnce
    _budget_deferred: dict[str, int]
    _budget_said: float

    def item_class_unknown(self, path: object) -> None:
        """An item replay named a class the crawl may not build: counted, said once per name."""
        self.count("retryqueue/item_replay/class_unknown")
        shown = ascii(path)[:200]
        if not self._classes_said.new([shown]):
            return
        logger.warning(
            "scrapy-retryqueue: item replay names class %s, which is no item class loaded "
            "in this crawl; the item goes to the pipelines as a dict",
            shown,
        )

    def malformed_records(self, fields: list[str]) -> None:
        """Learned recovery records that do not read (recovery.py): ignored; one WARNING
        line per field, once per crawl (a bounded number of them)."""
        self.count("retryqueue/learned/malformed", len(fields))
        new = self._records_said.new(fields)
        if not new:
            return
        logger.warning(
            "scrapy-retryqueue: %d learned recovery record(s) are malformed and ignored: %s",
            len(new),
            ", ".join(ascii(f)[:80] for f in new[:5]) + (" ..." if len(new) > 5 else ""),
        )

    def budget(self, claimed: Claimed) -> None:
        """What the retry budget did in one claim: the retries it deferred, counted, and
        said in one INFO line per budget window at most (the domains summed since the
        last line); records it found malformed (started over), one WARNING line each."""
        if claimed.budget_malformed:
            self.count("retryqueue/budget/malformed", len(claimed.budget_malformed))
            new = self._budgets_said.new(claimed.budget_malformed)
            if new:
                logger.warning(
                    "scrapy-retryqueue: %d retry budget record(s) were malformed and are "
                    "started over: %s",
                    len(new),
                    ", ".join(ascii(d)[:80] for d in new[:5]) + (" ..." if len(new) > 5 else ""),
                )
        deferred = claimed.budget_deferred
        if deferred:
            self.count("retryqueue/budget/deferred", sum(deferred.values()))
            for domain, n in deferred.items():
                self._budget_deferred[domain] = self._budget_deferred.get(domain, 0) + n
        now = time.monotonic()
        if self._budget_deferred and now - self._budget_said >= self.config.retry_budget_window:
            self._say_budget(now)

    def _say_budget(self, now: float) -> None:
        """The INFO line of the deferrals summed since the last one."""
        held = sorted(self._budget_deferred.items(), key=lambda kv: (-kv[1], kv[0]))
        self._budget_deferred, self._budget_said = {}, now
        logger.info(
            "scrapy-retryqueue: the retry budget deferred due retries %d times, of %d "
            "domain(s) (%s): their retries are at RETRYQUEUE_RETRY_BUDGET=%g of their "
            "requests + %g/s",
            sum(n for _, n in held),
            len(held),
            ", ".join(f"{d} {n}" for d, n in held[:5]) + (" ..." if len(held) > 5 else ""),
            self.config.retry_budget,
            self.config.retry_budget_floor,
        )

    def dead_without_request(self, kind: str, task_ids: list[str], reason: str) -> None:
        """Tasks a poll dead-lettered (poison, malformed): no request to show."""
        if not task_ids:
            return
        self._dead(kind, len(task_ids))
        for task_id in task_ids:
            self.send(
                rq_signals.retryqueue_dead,
                request=None,
                task_id=task_id,
                kind=kind,
                reason=reason,
                decision=None,
                outcome=str(Outcome.DEAD),
            )

    def ghosts(self, claimed: Claimed) -> None:
        """Due ids the claim found without an envelope: one ERROR line, a stat, dead letters."""
        ghosts, kept = claimed.ghosts, claimed.ghosts_kept
        if not (ghosts or kept):
            return
        self.count("retryqueue/ghosts", len(ghosts) + len(kept))
        shown = ", ".join(map(ascii, [*ghosts, *kept][:5]))
        logger.error(
            "scrapy-retryqueue: %d task id(s) in the due set had no envelope (%s%s); %s",
            len(ghosts) + len(kept),
            shown,
            ", ..." if len(ghosts) + len(kept) > 5 else "",
            f"{len(ghosts)} kept as malformed dead letter(s)"
            + (f", {len(kept)} dropped (a dead letter of that id exists)" if kept else ""),
        )
        reason = "task id was in the due set without an envelope"
        self.dead_without_request(MALFORMED, ghosts, reason)
