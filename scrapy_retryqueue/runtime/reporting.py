"""What the crawl tells people about its retries: stats, log lines, the audit log, signals.

The one place that knows what a parked retry, a recovery and a dead letter
mean for each of those surfaces; everything else reports through it. Two bases
of :class:`Reporter` hold what is told of other things: :mod:`.pollreports`
(what a poll or a claimed task found) and :mod:`.callbackreports` (a parked
callback error, in Scrapy's words).
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from pydispatch.dispatcher import getAllReceivers
from scrapy.statscollectors import StatsCollector

from .. import signals as rq_signals
from ..decision.kinds import DEFERRED
from ..settings.defaults import SCRAPY_META_GIVE_UP_LOG_LEVEL
from ..values import now_ms
from .audit import AuditLog
from .callbackreports import CallbackReports
from .outcome import Outcome
from .pollreports import PollReports, _SaidOnce
from .taskref import ref_created, ref_host

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler

    from ..config import Config
    from ..decision.classify import FailureInfo
    from ..queue.domains import DomainChange
    from .planner import Note, Plan
    from .taskref import TaskRef

logger = logging.getLogger(__name__)


def _kept(level: int) -> bool:
    """Whether a line of *level* from this module would reach a handler that keeps it.

    Scrapy leaves the root logger at NOTSET and filters at its handler
    (LOG_LEVEL), so ``logger.debug`` builds a whole record (caller lookup,
    time, thread) that the handler then drops: about 20 µs a line, which a
    crawl of 404s at LOG_LEVEL INFO paid once per dead letter, and a retry
    cycle once per parked request. Walking the handlers costs about a
    microsecond; a handler added later (pytest's caplog, a LOG_FILE) is seen
    by the next line. What it cannot see: a logger filter that raises a
    record's level, or a ``callHandlers`` patched to see every record (an
    error tracker's breadcrumbs); for those, DEBUG lines are kept only when
    some handler takes DEBUG.
    """
    if not logger.isEnabledFor(level):
        return False
    found = False
    current: logging.Logger | None = logger
    while current is not None:
        for handler in current.handlers:
            found = True
            if level >= handler.level:
                return True
        current = current.parent if current.propagate else None
    # With no handler at all, logging falls back to its last resort.
    return not found and logging.lastResort is not None and level >= logging.lastResort.level


#: Notes whose error line is said once per distinct message: the same bad meta
#: value, backoff strategy or undeclared kind meets every request.
_SAY_ONCE = frozenset(
    {"retryqueue/meta_error", "retryqueue/backoff_error", "retryqueue/undeclared_kind"}
)
#: Distinct lines one of those stats logs in a crawl, at most.
_SAY_ONCE_MAX = 5


class Reporter(PollReports, CallbackReports):
    """One per crawler: the runtime and its parts tell people everything through it."""

    def __init__(self, crawler: Crawler, config: Config) -> None:
        self.crawler = crawler
        self.stats = crawler.stats
        #: Bound once: Scrapy's StatsCollector looks up each method it is asked for
        #: through a __getattribute__ of its own (half of a stat's cost), and a
        #: retry cycle counts eight stats.
        self._inc_value = _inc_value(crawler.stats)
        self.config = config
        self.spider: Any = None
        self.audit: AuditLog | None = None
        if config.audit_log:
            self.audit = AuditLog(
                config.audit_log,
                rotation=config.audit_rotation,
                retention=config.audit_retention,
            )
        self._errors_logged: set[str] = set()
        #: Learned records, item classes and budget records found unreadable, said once each.
        self._records_said = _SaidOnce()
        self._classes_said = _SaidOnce()
        self._budgets_said = _SaidOnce()
        #: Retries the budget deferred since its last log line, per domain, and when
        #: that line was said (time.monotonic()).
        self._budget_deferred: dict[str, int] = {}
        self._budget_said = float("-inf")
        self._lines_per_stat: dict[str, int] = {}
        #: Kind -> seconds each recovered task waited since its first failure.
        self._recovery_waits: dict[str, list[float]] = {}
        #: Kind -> dead-letter lines logged at their level so far; past
        #: RETRYQUEUE_DEAD_LOG_LIMIT they go to DEBUG (see _dead_line).
        self._dead_lines: dict[str, int] = {}

    def open(self, spider: Any) -> None:
        self.spider = spider
        if self.audit is not None:
            self.audit.open()

    def close(self) -> None:
        if self.audit is not None:
            self.audit.close()

    def count(self, stat: str, value: int = 1) -> None:
        self._inc_value(stat, value)

    def send(self, signal: object, **kwargs: Any) -> None:
        """Send one of :mod:`scrapy_retryqueue.signals` (handler errors are logged).

        Not sent when no handler is connected to it: Scrapy's send would only find
        that out, at about twice the cost of asking (two signals per retried request).
        """
        if self._heard(signal):
            self.crawler.signals.send_catch_log(signal=signal, spider=self.spider, **kwargs)

    def _heard(self, signal: object) -> bool:
        """Whether a handler is connected to *signal* now (:meth:`send` asks first)."""
        for _ in getAllReceivers(self.crawler.signals.sender, signal):
            return True
        return False

    # -- failures ----------------------------------------------------------------

    def notes(self, notes: Iterable[Note]) -> None:
        """The planner's notes: a stat each, an error line once per distinct message."""
        for note in notes:
            self.count(note.stat)
            if note.error is None or note.error in self._errors_logged:
                continue
            if note.stat in _SAY_ONCE:
                # Distinct messages too are bounded: one that names a value (a
                # strategy returning a new bad number each time) must not log
                # every failure, nor grow this set without end.
                said = self._lines_per_stat.get(note.stat, 0) + 1
                self._lines_per_stat[note.stat] = said
                if said > _SAY_ONCE_MAX:
                    if said == _SAY_ONCE_MAX + 1:
                        logger.error(
                            "scrapy-retryqueue: more errors like the above; from now on they "
                            "are only counted in the stat %s",
                            note.stat,
                        )
                    continue
                self._errors_logged.add(note.error)
            logger.error("scrapy-retryqueue: %s", note.error)

    def planned(self, plan: Plan, outcome: Outcome, error: BaseException | None = None) -> Outcome:
        """A plan's write came back: count, log, audit and signal what it did."""
        decision, task = plan.decision, plan.task
        self.count(f"retryqueue/reason_count/{plan.failure.kind}")
        url = task.url
        if outcome is Outcome.PARKED:
            self._scheduled(decision.kind)
            if decision.kind != DEFERRED:  # a deferral is no retry of the request
                self._scrapy_retry(plan.failure)
            if plan.asked:
                self.asked(plan, outcome)
            elif _kept(logging.DEBUG):
                logger.debug(
                    "scrapy-retryqueue: parked %s (%s), due in %.1fs",
                    url,
                    decision.reason,
                    decision.delay,
                )
        elif outcome is Outcome.DEAD:
            self._dead(decision.kind)
            if plan.exhausted:
                self.count("retry/max_reached")
            reason = decision.reason
            if plan.asked and plan.failure.message:
                # The one line a PermanentFailure gets: its message is the why.
                reason = f"{reason}; {plan.failure.message}"
            self._dead_line(decision.kind, plan.request, url, reason)
        elif outcome is Outcome.SPOOLED and plan.asked and decision.retry:
            self.asked(plan, outcome)
        elif outcome is Outcome.SPOOLED:
            logger.debug("scrapy-retryqueue: %s spooled while Redis is down", url)
        elif outcome in (Outcome.DUPLICATE, Outcome.STALE):
            self.count(f"retryqueue/{outcome}")
            logger.debug("scrapy-retryqueue: %s not written (%s task)", url, outcome)
        else:
            self.count("retryqueue/write_error")
            logger.error(
                "scrapy-retryqueue: could not write the %s of %s to Redis: %s",
                "retry" if decision.retry else "dead letter",
                url,
                error,
            )
        if self.audit is not None:
            self.audit.write(
                "scheduled" if outcome is Outcome.PARKED else str(outcome),
                task=task.id,
                url=url,
                kind=decision.kind,
                attempt=decision.attempt,
                delay=round(decision.delay, 3),
                node=self.config.node_id,
                reason=decision.reason,
                ts=plan.now,
            )
        if outcome in (Outcome.PARKED, Outcome.DEAD, Outcome.SPOOLED):
            signal = (
                rq_signals.retryqueue_scheduled if decision.retry else rq_signals.retryqueue_dead
            )
            # Asked before the arguments are made: most crawls connect no handler.
            if self._heard(signal):
                # A dead letter's handler is told its kind and reason too.
                dead = {} if decision.retry else {"kind": decision.kind, "reason": decision.reason}
                self.crawler.signals.send_catch_log(
                    signal=signal,
                    spider=self.spider,
                    request=plan.request,
                    task_id=task.id,
                    decision=decision,
                    outcome=str(outcome),
                    **dead,
                )
        return outcome

    def replayed(self, outcomes: Iterable[tuple[str, Outcome]]) -> None:
        """Spooled writes reached Redis: counted now, like writes that never waited."""
        for kind, outcome in outcomes:
            if outcome is Outcome.PARKED:
                self._scheduled(kind)
            elif outcome is Outcome.DEAD:
                self._dead(kind)
            elif outcome is Outcome.ACKED:
                self.count("retryqueue/recovered")
            else:
                self.count(f"retryqueue/{outcome}")

    # -- successes -----------------------------------------------------------------

    def acked(self, request: Request, ref: TaskRef, how: str, result: Outcome, now: int) -> None:
        """A task's ack came back; *how* is ``recovered`` or ``ignored`` (dropped on purpose)."""
        if how == "recovered" and result in (Outcome.ACKED, Outcome.SPOOLED):
            created = ref_created(ref)
            self.send(
                rq_signals.retryqueue_recovered,
                request=request,
                task_id=ref["id"],
                kind=ref["kind"],
                attempts=dict(ref.get("attempts") or {}),
                outcome=str(result),
                # The outcome to learn from (the succeeded event carries the same).
                wait_ms=None if created is None else max(0, now - created),
                domain=ref_host(ref),
            )
        if result is Outcome.SPOOLED:
            return
        if result is not Outcome.ACKED:
            self.count("retryqueue/stale")
            return
        self.count(f"retryqueue/{how}")
        if how == "recovered":
            kind = str(ref["kind"])
            self.count(f"retryqueue/recovered/{kind}")
            created = ref_created(ref)
            if created is not None:
                self._recovery_waits.setdefault(kind, []).append(max(0, now - created) / 1000)
        self._audit(
            how, task=ref["id"], url=ref["url"], kind=ref["kind"], node=self.config.node_id, ts=now
        )

    def ack_failed(self, ref: TaskRef, error: BaseException) -> None:
        self.count("retryqueue/write_error")
        logger.error(
            "scrapy-retryqueue: could not ack %s (%s); its lease expires and it runs again",
            ref["url"],
            error,
        )

    def summary(self) -> None:
        """Per kind: retries scheduled, recovered, dead-lettered, and the median wait to recover;
        and the budget's deferrals not said yet."""
        if self._budget_deferred:
            self._say_budget(time.monotonic())
        stats = self.stats
        kinds = sorted(
            {
                name.rsplit("/", 1)[1]
                for name in stats.get_stats()
                if name.startswith(("retryqueue/scheduled/", "retryqueue/dead/"))
            }
        )
        if not kinds:
            return
        lines = []
        for kind in kinds:
            waits = sorted(self._recovery_waits.get(kind, ()))
            median = statistics.median(waits) if waits else None
            if median is not None:
                stats.set_value(f"retryqueue/recovery_median_seconds/{kind}", round(median, 3))
            lines.append(
                f"  {kind:<15} scheduled {stats.get_value(f'retryqueue/scheduled/{kind}', 0):>6}"
                f"  recovered {stats.get_value(f'retryqueue/recovered/{kind}', 0):>6}"
                f"  dead {stats.get_value(f'retryqueue/dead/{kind}', 0):>6}"
                f"  median wait {'-' if median is None else f'{median:.1f}s'}"
            )
        quieted = {kind: stats.get_value(f"retryqueue/dead_log_debug/{kind}", 0) for kind in kinds}
        if any(quieted.values()):
            lines.append(
                "  dead letters logged at DEBUG past RETRYQUEUE_DEAD_LOG_LIMIT="
                f"{self.config.dead_log_limit} per kind: "
                + ", ".join(f"{kind} {n}" for kind, n in quieted.items() if n)
            )
        logger.info("scrapy-retryqueue: retries by kind:\n%s", "\n".join(lines))

    # -- domains -------------------------------------------------------------------

    def domain_changed(self, change: DomainChange) -> None:
        if change.state == "open":
            self.count("retryqueue/domain/reopened")
            logger.info("scrapy-retryqueue: domain %s reopened (probe succeeded)", change.domain)
            reason = "probe succeeded"
        else:
            if change.previous == "open":
                self.count("retryqueue/domain/cooldowns")
            else:
                self.count("retryqueue/domain/extended")
            logger.warning(
                "scrapy-retryqueue: domain %s cools down for %.1fs (level %d, was %s)",
                change.domain,
                max(0, change.until - now_ms()) / 1000,
                change.level,
                change.previous,
            )
            reason = "cooldown"
        self.send(
            rq_signals.retryqueue_domain_state,
            domain=change.domain,
            state=change.state,
            previous=change.previous,
            until=change.until,
            level=change.level,
            reason=reason,
        )

    # -- helpers ---------------------------------------------------------------------

    def _scheduled(self, kind: str, count: int = 1) -> None:
        self.count("retryqueue/scheduled", count)
        self.count(f"retryqueue/scheduled/{kind}", count)

    def _dead(self, kind: str, count: int = 1) -> None:
        self.count("retryqueue/dead", count)
        self.count(f"retryqueue/dead/{kind}", count)

    def _scrapy_retry(self, failure: FailureInfo) -> None:
        """Scrapy's own retry stats, with its meaning, for monitoring built on them."""
        self.count("retry/count")
        self.count(f"retry/reason_count/{scrapy_reason(failure)}")

    def _dead_line(self, kind: str, request: Request | None, url: str, reason: str) -> None:
        """One dead letter's log line: at its level for the first RETRYQUEUE_DEAD_LOG_LIMIT
        of its kind in this crawl, at DEBUG after that.

        A crawl that meets thousands of 404s or 403s (every site has some) would
        otherwise log thousands of lines, at WARNING for 403s: formatting and
        writing them cost the crawl CPU, and they bury the lines that matter.
        Past the limit one line says so; the end-of-crawl table has the counts
        (stats retryqueue/dead/<kind> and retryqueue/dead_log_debug/<kind>).
        """
        logged = self._dead_lines.get(kind, 0)
        limit = self.config.dead_log_limit
        if logged < limit:
            self._dead_lines[kind] = logged + 1
            level = self._dead_level(kind, request)
            logger.log(level, "scrapy-retryqueue: dead letter %s (%s)", url, reason)
            return
        if logged == limit:
            self._dead_lines[kind] = logged + 1
            if limit:
                logger.log(
                    self._dead_level(kind, request),
                    "scrapy-retryqueue: %d dead letters of kind %s logged; the rest of this "
                    "crawl's are logged at DEBUG (RETRYQUEUE_DEAD_LOG_LIMIT=%d) and counted in "
                    "the table of retries by kind at the end",
                    limit,
                    kind,
                    limit,
                )
        self.count(f"retryqueue/dead_log_debug/{kind}")
        if _kept(logging.DEBUG):
            logger.debug("scrapy-retryqueue: dead letter %s (%s)", url, reason)

    def _dead_level(self, kind: str, request: Request | None = None) -> int:
        if request is not None:
            level = request.meta.get(SCRAPY_META_GIVE_UP_LOG_LEVEL)
            if level is not None:
                return _log_level(level)
        record = self.config.kinds.get(kind)
        # A kind whose dead letters the site or the project chose (404, a
        # veto) keeps its own level: RETRY_GIVE_UP_LOG_LEVEL is about giving up.
        chosen = record is not None and record.dead_log_level != "ERROR"
        if self.config.give_up_log_level is not None and not chosen:
            return self.config.give_up_log_level
        return self.config.dead_log_levels.get(kind, logging.ERROR)

    def _audit(self, event: str, **fields: Any) -> None:
        if self.audit is not None:
            self.audit.write(event, **fields)


def _inc_value(stats: Any) -> Any:
    """*stats*' inc_value, past the wrapper Scrapy 2.19 puts around it to warn of a
    ``spider`` argument (scrapy.utils.decorators: two calls more per stat), which this
    package never passes. Any other wrapper, or a collector's own method, is kept."""
    inc = stats.inc_value
    code = getattr(inc, "__code__", None)
    inner = getattr(inc, "__wrapped__", None)
    if (
        inner is not None
        and code is not None
        and code.co_name == "sync_inner"
        and code.co_filename.endswith(os.path.join("scrapy", "utils", "decorators.py"))
    ):
        inc = inner
    if getattr(inc, "__func__", None) is StatsCollector.inc_value:
        return _stock_inc_value(stats)
    return inc


def _stock_inc_value(stats: StatsCollector) -> Any:
    """Scrapy's own StatsCollector.inc_value, for a collector that keeps it.

    Its ``self._stats`` goes through the collector's ``__getattribute__``, which
    first looks for a cached wrapper named ``_cached__stats`` and catches the
    AttributeError: about 3 µs a stat, four stats per dead letter. The dict is
    read past it (each time: ``set_stats`` may replace it), and counted as
    Scrapy counts.
    """
    read = object.__getattribute__

    def inc_value(key: str, count: int = 1, start: int = 0) -> None:
        d = read(stats, "_stats")
        d[key] = d.setdefault(key, start) + count

    return inc_value


#: Status -> Scrapy's reason text for it, made once per status a crawl meets.
_STATUS_REASONS: dict[int, str] = {}


def scrapy_reason(failure: FailureInfo) -> str:
    """The reason Scrapy's RetryMiddleware would name in ``retry/reason_count/<reason>``."""
    status = failure.status
    if status is not None:
        reason = _STATUS_REASONS.get(status)
        if reason is None:
            from scrapy.utils.response import response_status_message

            reason = response_status_message(status)
            if 100 <= status <= 999:  # an HTTP status: a bounded table
                _STATUS_REASONS[status] = reason
        return reason
    error_type = failure.error_type
    return error_type if "." in error_type else f"builtins.{error_type}"


def _log_level(value: Any) -> int:
    """A ``give_up_log_level`` meta value (a level name or number); ERROR when unreadable."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    level = logging.getLevelName(str(value).upper())
    return level if isinstance(level, int) else logging.ERROR
