"""The runtime facade's part for one attempt of a request: park, defer, ack, release.

A failure is parked for a retry or dead-lettered, a fresh request to a cooling
domain deferred, a success acknowledged, a cancelled re-injection handed back.

:class:`AttemptFacade` is a base of :class:`~.facade.RetryQueueRuntime`, as
:class:`~.frontierfacade.FrontierFacade` is: it works on the runtime's own parts,
which RetryQueueRuntime.__init__ sets up. A failure reads top-down from
:meth:`AttemptFacade.park`: the planner decides, the write path carries the plan
to Redis, the reporter tells what the write did. :class:`Parking` is what the
glue gets back.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from twisted.internet import defer

from ..exceptions import RequestParked
from ..queue.delayed import Write
from ..settings.defaults import META_FRONTIER, META_TASK
from ..values import now_ms
from .outcome import Outcome
from .taskref import (
    TaskRef,
    live_ref,
    ref_created,
    ref_host,
    ref_learning,
    ref_of,
    ref_updated,
    settle,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Container

    from scrapy import Request

    from ..config import Config
    from ..decision.classify import FailureInfo
    from .breaker import DomainBreaker
    from .frontier import Frontier
    from .leases import Leases
    from .planner import Plan, Planner
    from .reporting import Reporter
    from .retrybudget import RequestCounts
    from .writes import WritePath

#: The facade's logger: its lines keep the name they had before the facade was split.
logger = logging.getLogger(f"{__package__}.facade")


@dataclass(slots=True)
class Parking:
    """A failure on its way into the queue: the decision now, the write's Outcome later."""

    kind: str
    delay: float
    task_id: str
    #: The decision: retry later (True) or dead letter (False).
    retry: bool
    #: Retries of this kind so far, this one included when retried.
    attempt: int
    outcome: defer.Deferred[Outcome]
    #: A dead letter of a request no lease names: given up whatever its write does
    #: (kept, spooled, or refused because another copy of the request is a live
    #: task), so the glue passes the failure on without waiting for Redis.
    final: bool = False
    #: A failure the callback raised on purpose (RetryLater of a kind the crawl
    #: knows, PermanentFailure): the reporter tells it as its kind in one line, so
    #: the glue ends the exception there (no spider error, no traceback).
    asked: bool = False

    def parked(self) -> RequestParked:
        """The exception that takes the request out of the crawl until it is due."""
        return RequestParked(self.kind, self.delay, self.task_id)


class AttemptFacade:
    """The failures, successes and hand-backs of the runtime facade; only ever a base of
    RetryQueueRuntime."""

    # Set up by RetryQueueRuntime.__init__.
    config: Config
    reporter: Reporter
    writes: WritePath
    breaker: DomainBreaker
    leases: Leases
    planner: Planner
    frontier: Frontier
    requests: RequestCounts
    _in_progress: Callable[[], Container[Request] | None]
    _finishing: dict[str, tuple[Request, TaskRef]]

    # -- failures --------------------------------------------------------------------------

    def park(
        self,
        request: Request,
        failure: FailureInfo,
        *,
        task_id: str | None = None,
        asked: bool = False,
    ) -> Parking:
        """Plan a failed attempt and write it: a retry parked for later, or a dead letter.

        *asked*: a callback raised it on purpose (RetryLater, PermanentFailure);
        :attr:`Parking.asked` says whether it is told as such (its kind is known).
        """
        self._take_lease_back(request)
        plan = self.planner.plan(request, failure, task_id=task_id, asked=asked)
        parking = self._carry_out(plan)
        self._frontier_waits_for(request, parking)
        return parking

    def download_failed(self, request: Request, failure: FailureInfo) -> Parking:
        """A download failed: the domain's breaker hears of it, then the request is parked."""
        self._downloaded(request)
        self.breaker.downloaded(request, failure)
        return self.park(request, failure)

    def download_succeeded(self, request: Request) -> None:
        """A download the site answered: the breaker hears of it; a re-injected task is
        acknowledged once the engine has finished its request (:meth:`settle_finished`)."""
        self._downloaded(request)
        self.breaker.downloaded(request, None)
        ref = live_ref(request)
        if ref is not None:
            # The callback and the requests it makes with meta=response.meta see the
            # task settled, as new requests are no attempt of it; a failure of the
            # page itself takes the lease back (_take_lease_back).
            request.meta[META_TASK] = {**ref, "settled": True}
            self._finishing[ref["id"]] = (request, ref)

    def _take_lease_back(self, request: Request) -> None:
        """The page of a re-injected task failed after its download (its callback, its
        items): that failure is the task's own, written under its lease."""
        ref = ref_of(request) if self._finishing else None
        held = None if ref is None else self._finishing.get(ref["id"])
        if held is not None and held[0] is request:
            del self._finishing[ref["id"]]
            request.meta[META_TASK] = held[1]

    def settle_finished(self) -> None:
        """Acknowledge the re-injected tasks whose request the engine has finished.

        Called at each poll, when the spider is idle and when it closes. A page
        that failed meanwhile has rescheduled its task under the lease already.
        """
        if not self._finishing:
            return
        in_progress = self._in_progress()
        if in_progress is None:
            in_progress = frozenset()  # this Scrapy does not tell: as finished
        for task_id, (request, ref) in list(self._finishing.items()):
            if request not in in_progress:
                del self._finishing[task_id]
                self._acknowledge(request, ref, ignored=False)

    def _downloaded(self, request: Request) -> None:
        """A fresh request (not a retry) counts toward its domain's retry budget."""
        if self.requests.budget is not None and ref_of(request) is None:
            self.requests.sent(request)

    def defer(self, request: Request, *, held: bool = False) -> Parking | None:
        """Park a fresh request whose domain cools down (kind ``deferred``, no budget used).

        *held*: the request was taken back from Scrapy's download queue, where
        it waited when its domain started to cool; a re-injected task is
        deferred then too (its claim let it through before the cooldown).
        None when its domain is open, or when it cannot be stored: it goes now.
        """
        until = self.breaker.cooling_until(request)
        if until is None or (ref_of(request) is not None and not held):
            return None  # open, or re-injected: its claim let it through
        plan = self.planner.plan_deferred(request, until)
        if not plan.decision.retry:
            return None
        parking = self._carry_out(plan)
        parking.outcome.addCallback(self._count_deferred)
        self._frontier_waits_for(request, parking)
        return parking

    def _count_deferred(self, outcome: Outcome) -> Outcome:
        if outcome.request_parked:
            self.reporter.count("retryqueue/domain/deferred")
        return outcome

    def _carry_out(self, plan: Plan) -> Parking:
        self.reporter.notes(plan.notes)
        # The write names the lease before the lease is marked used.
        task = plan.task
        write = Write.for_task(plan.op, task, plan.token, plan.now, host=plan.host)
        # The envelope holds the request now; the plan keeps of it what the reporter
        # reads (its URL) until the write comes back: its headers and meta, kept
        # across the batch's round trip, would be promoted by a collection meanwhile.
        task.request = {"url": task.url}
        if write.token is not None and plan.ref is not None:
            # A task's attempt failed again (or gave up): its outage lasts on.
            write = self._learning(write, plan.ref)
        if plan.ref is not None:
            settle(plan.ref)
        # The reporter hears of the write first (WritePath.submit), with no
        # callbacks of its own kept on the Deferred until the batch is back.
        d = self.writes.submit(write, plan)
        if write.token is not None:
            self.leases.written_by(plan.task.id, d)
        decision = plan.decision
        return Parking(
            decision.kind,
            decision.delay,
            plan.task.id,
            decision.retry,
            decision.attempt,
            d,
            final=not decision.retry and write.token is None,
            asked=plan.asked,
        )

    # -- successes and hand-backs --------------------------------------------------------------

    def ack(self, request: Request, *, ignored: bool = False) -> None:
        """The re-injected request is done: it succeeded, or was dropped on purpose (*ignored*)."""
        ref = live_ref(request)
        if ref is not None:
            self._acknowledge(request, ref, ignored=ignored)

    def _acknowledge(self, request: Request, ref: TaskRef, *, ignored: bool) -> None:
        if self.writes.queue is None:
            return
        settle(ref)
        task_id, now = ref["id"], now_ms()
        write = self.ack_write(ref, now, ignored=ignored)
        how = "ignored" if ignored else "recovered"
        d = self.writes.submit(write)
        self.leases.written_by(task_id, d)
        d.addCallbacks(
            lambda result: self.reporter.acked(request, ref, how, result, now),
            lambda f: self.reporter.ack_failed(ref, f.value),
        )

    def ack_write(self, ref: TaskRef, now: int, *, ignored: bool = False) -> Write:
        """The write that acknowledges *ref*'s task at *now* (ms), with its learning update
        unless the request was dropped on purpose (*ignored*)."""
        # Built once, with its learning update (dataclasses.replace() costs as much again).
        learn, prior = ("", None) if ignored else self._learns(ref)
        return Write(
            *("ack", ref["id"], now, ref["token"]),
            kind=ref["kind"],
            url=ref["url"],
            created=ref_created(ref),
            host=ref_host(ref),
            learn=learn,
            prior=prior,
            # The envelope it was claimed with is the one it finished with (a replay
            # of it is refused: refusals.py).
            version=ref_updated(ref),
        )

    def _learning(self, write: Write, ref: dict[str, Any]) -> Write:
        """*write* with the learning update of its task's outage (recovery.py), when
        RETRYQUEUE_LEARNED_STATS is on and the outage is of a kind a policy retries."""
        learn, prior = self._learns(ref)
        return replace(write, learn=learn, prior=prior) if learn else write

    def _learns(self, ref: dict[str, Any]) -> tuple[str, int | None]:
        """The learning update of the ref's outage: its kind and the ms it had lasted at
        its previous failure; ``("", None)`` when it teaches nothing (:meth:`_learning`)."""
        if not self.config.learned_stats:
            return "", None
        kind, prior = ref_learning(ref)
        if not kind or kind not in self.config.policy_table.policies:
            return "", None  # an internal kind (deferred, malformed...) is no outage
        return kind, prior

    def release(self, request: Request) -> None:
        """Hand a re-injected request's task back, due now (its download was cancelled);
        a frontier request is handed back too, when the node closes, not acknowledged."""
        frontier_ref = request.meta.get(META_FRONTIER)
        if isinstance(frontier_ref, dict):
            self.frontier.hand_back(frontier_ref.get("id"))
        ref = live_ref(request)
        queue = self.writes.queue
        if ref is None or queue is None or self.writes.down:
            return  # not a task, or its lease simply expires
        settle(ref)
        d = self.writes.call(queue.release, {ref["id"]: ref["token"]}, now=now_ms())
        self.leases.written_by(ref["id"], d)
        d.addCallbacks(
            lambda count: self.reporter.count("retryqueue/released", count),
            lambda f: logger.debug("release failed: %s", f.value),
        )
