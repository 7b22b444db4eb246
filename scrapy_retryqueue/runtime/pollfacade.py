"""The runtime facade's polls: the round trip that claims due tasks, a claimed task's request.

One round trip renews, reaps and claims; what its answer holds is told; a
claimed task is read back as its request (or, for an item replay, its item),
unless the crawl refuses it (:mod:`.refusals`: forged, or off the spider's domains).

:class:`PollFacade` is a base of :class:`~.facade.RetryQueueRuntime`, as
:class:`~.frontierfacade.FrontierFacade` is: it works on the runtime's own parts,
which RetryQueueRuntime.__init__ sets up. :mod:`.leases` builds the round trip and
holds what it claimed; the extension re-injects the requests.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy.utils.httpobj import urlparse_cached

from ..decision.kinds import FORGED as FORGED_KIND
from ..decision.kinds import MALFORMED as MALFORMED_KIND
from ..decision.kinds import POISON as POISON_KIND
from ..decision.pollshare import alive_after, live_nodes, polls_early
from ..exceptions import EncryptionKeyError, SignatureError
from ..queue.connection import is_outage
from ..queue.delayed import Write
from ..queue.envelope import (
    EnvelopeError,
    check_item_replay,
    check_json,
    malformed_envelope,
    request_from_json,
)
from ..queue.taskinfo import host_word
from ..settings.defaults import (
    FLEET_BUSY_MIN_MS,
    FLEET_HEARTBEAT_MIN_MS,
    FLEET_REGISTERED_POLLS,
    META_FRONTIER,
    META_ITEM,
    META_TASK,
    SCRAPY_META_DONT_CACHE,
    SCRAPY_META_RETRY_TIMES,
)
from ..values import now_ms
from .outcome import Outcome
from .planner import retries_so_far
from .refusals import check_place, forged_stats, forged_write, signed_task
from .taskref import task_ref

if TYPE_CHECKING:
    from collections.abc import Mapping

    from scrapy import Request, Spider
    from twisted.internet import defer

    from ..config import Config
    from ..queue.envelope import Task
    from .breaker import DomainBreaker
    from .frontier import Frontier
    from .leases import Leases, PollResult
    from .refusals import Offsite, Record
    from .reporting import Reporter
    from .retrybudget import RequestCounts
    from .writes import WritePath

#: The facade's logger: its lines keep the name they had before the facade was split.
logger = logging.getLogger(f"{__package__}.facade")


class PollFacade:
    """The polls and re-injection of the runtime facade; only ever a base of
    RetryQueueRuntime."""

    # Set up by RetryQueueRuntime.__init__.
    config: Config
    reporter: Reporter
    writes: WritePath
    breaker: DomainBreaker
    leases: Leases
    frontier: Frontier
    requests: RequestCounts
    spider: Spider | None
    fleet: dict[str, tuple[int, int, int]]
    _registered: int
    _records: dict[str, Record]
    _offsite: Offsite

    # -- polling -----------------------------------------------------------------------------

    def fleet_working(self) -> list[str]:
        """Other nodes of the spider that were working at their last heartbeat: they may
        still push requests to a shared frontier or fail pages into the queue."""
        now = now_ms()
        poll_ms = int(self.config.poll_interval * 1000)
        alive = alive_after(now, self.config.poll_interval)
        busy_after = now - max(2 * poll_ms, FLEET_BUSY_MIN_MS)
        # A node that registered a moment ago may not have pushed its start
        # requests yet: it counts as working for a few polls.
        new_after = now - max(FLEET_REGISTERED_POLLS * poll_ms, FLEET_HEARTBEAT_MIN_MS)
        return sorted(
            node
            for node, (beat, busy, registered) in self.fleet.items()
            if node != self.config.node_id
            and beat >= alive
            and (busy >= busy_after or registered >= new_after)
        )

    def polls_early(self, due_ms: int) -> bool:
        """Whether this node is the one of its fleet to poll at *due_ms*, a task's due
        time, rather than at its regular poll (decision/pollshare: one live node per due
        time, by what the last poll read of the fleet). True alone or before a poll."""
        live = live_nodes(self.fleet, now_ms(), self.config.poll_interval)
        return polls_early(self.config.node_id, live, due_ms)

    def poll(self, *, last_busy: int = 0) -> defer.Deferred[Any] | None:
        """One round trip: renew, reap, claim, read cooldowns; or replay the spool first.

        Fires with a :class:`PollResult` (its claimed tasks are held; the
        caller re-injects or releases them), or with a bool after a spool
        replay (nothing is claimed until the spool is written, to keep writes
        in order). None when there is nothing to do yet.
        """
        writes = self.writes
        queue = writes.queue
        if queue is None:
            return None
        self.settle_finished()
        if writes.down or writes.spooled:
            return writes.recover()
        if self.frontier.in_use:
            self._frontier_kick(maintain=True)
        learns = callable(getattr(self.config.policy_table.backoff, "learned", None))
        io, token = self.leases.poll_io(
            queue,
            self.breaker.domains,
            last_busy=last_busy,
            registered=self._registered,
            learns=learns,
            budget=self.requests.budget,
            requests=self.requests.take(),
        )
        d = writes.call_untracked(io)
        d.addCallbacks(self._polled, self._poll_failed, errbackArgs=(token,))
        return d

    def _polled(self, result: PollResult) -> PollResult:
        reporter = self.reporter
        self.fleet = result.nodes
        if result.settled:
            self.leases.settle(result.settled)
        if result.unclaimed:
            reporter.count("retryqueue/unclaimed", len(result.unclaimed))
            logger.info(
                "scrapy-retryqueue: %d task(s) a poll whose reply was lost had claimed are "
                "due again",
                len(result.unclaimed),
            )
        if result.recovery is not None:
            stats, malformed = result.recovery
            if malformed:
                reporter.malformed_records(malformed)
            strategy = self.config.policy_table.backoff
            try:
                strategy.learned(stats)  # type: ignore[attr-defined]
            except Exception as exc:  # a strategy's bug must not stop the polls
                reporter.count("retryqueue/backoff_error")
                logger.error("scrapy-retryqueue: RETRYQUEUE_BACKOFF learned() raised %r", exc)
        if result.cooling is not None:
            self.breaker.polled(result.cooling)
        if result.reclaimed:
            reporter.count("retryqueue/reclaimed", len(result.reclaimed))
        if result.poisoned:
            reason = f"lease expired more than {self.config.max_reclaims} times"
            logger.error(
                "scrapy-retryqueue: %d task(s) dead-lettered as poison (lease expired more than "
                "RETRYQUEUE_MAX_RECLAIMS=%d times)",
                len(result.poisoned),
                self.config.max_reclaims,
            )
            reporter.dead_without_request(POISON_KIND, result.poisoned, reason)
        # Ghosts (due ids without an envelope): claim.lua dead-lettered them.
        reporter.ghosts(result.claimed)
        reporter.budget(result.claimed)
        lost = self.leases.lost(result.lost) if result.lost else []
        if lost:
            reporter.count("retryqueue/lease_lost", len(lost))
        for task_id, _ in result.claimed.tasks:
            self.leases.hold(task_id, result.token)
        self._records.update(result.claimed.records)
        return result

    def _poll_failed(self, failure: Any, token: str) -> None:
        if is_outage(failure.value):
            # A timeout or a lost connection: its claim may have run (not retried:
            # the next poll hands back whatever it leased under this token).
            self.leases.doubt(token)
            self.writes.mark_down(failure.value)
            return
        self.reporter.count("retryqueue/poll_error")
        logger.error("scrapy-retryqueue: poll failed: %s", failure.value)

    def claimed(self, task_id: str, raw: str | bytes, token: str) -> Request | None:
        """The request of a task a poll claimed, marked as that task's attempt under *token*.

        None when the stored task cannot be read (dead-lettered as malformed), when
        the crawl refuses it (refusals.py: a bad signature, another task's or spider's
        envelope, a replay: dead-lettered as forged, never fetched), or when its URL is
        off the spider's allowed_domains (dropped as an offsite request, its task
        done). Raises EncryptionKeyError when no listed key decrypts it: it is not
        malformed, a node with the key can run it (encryption.py).
        """
        record = self._records.pop(task_id, None)
        try:
            task = signed_task(self.config, raw)
            request = request_from_json(task.request, self.spider, cipher=self.config.encryption)
            check_item_replay(request.meta.get(META_ITEM))
            spider = self.spider.name if self.spider is not None else ""
            check_place(self.config, spider, task_id, task, record)
            replay = self.config.item_replay and isinstance(request.meta.get(META_ITEM), dict)
            if not replay and not self._offsite.allows(task.request, request):
                # Dropped as Scrapy drops a fresh request off the spider's domains.
                request.meta[META_TASK] = task_ref(task, token)
                self._offsite.refused(task_id, request)
                self.ack(request, ignored=True)
                return None
            return self.claimed_request(task, token, request)
        except EncryptionKeyError:
            raise  # not malformed: it goes on up
        except SignatureError as exc:
            self._dead_letter_forged(task_id, raw, token, exc)
            return None
        except EnvelopeError as exc:
            self._dead_letter_malformed(task_id, raw, token, exc)
            return None
        except Exception as exc:
            # The readers turn any stored value into a task or an EnvelopeError
            # (tests/test_fuzz_entries.py); should one still escape, this task
            # is isolated all the same, or it would stay leased and renewed by
            # this node for as long as the crawl lasts.
            error = EnvelopeError(f"cannot be read ({type(exc).__name__}: {str(exc)[:200]})")
            self._dead_letter_malformed(task_id, raw, token, error)
            return None

    def claimed_request(self, task: Task, token: str, request: Request) -> Request:
        """Mark a claimed task's rebuilt request as that task's attempt under *token*."""
        # A stored meta's frontier lease names no lease of this node.
        request.meta.pop(META_FRONTIER, None)
        # The host from the request's own parse: Scrapy caches it for the request
        # (the offsite check has made it already, the downloader makes it anyway).
        host = host_word(urlparse_cached(request).hostname)
        request.meta[META_TASK] = task_ref(task, token, host=host)
        request.meta[SCRAPY_META_DONT_CACHE] = True
        # Scrapy's count, so a callback's get_retry_request() goes on from it.
        request.meta[SCRAPY_META_RETRY_TIMES] = retries_so_far(task.attempts, request.meta)
        self.reporter.count("retryqueue/reinjected")
        return request

    def _dead_letter_malformed(
        self, task_id: str, raw: str | bytes, token: str, error: Exception
    ) -> None:
        """A claimed task that cannot be read: kept as it is, for a person to look at.

        *raw* is bytes when the stored envelope is not UTF-8 text (kept as base64).
        """
        writes = self.writes
        assert writes.queue is not None
        # ascii(): an id that is not UTF-8 (read with surrogateescape) stays loggable.
        logger.error(
            "scrapy-retryqueue: task %s is malformed (%s); dead-lettered", ascii(task_id), error
        )
        envelope = malformed_envelope(task_id, raw, str(error), self.config.node_id)
        write = Write(
            "deadletter", task_id, now_ms(), token, envelope=envelope, kind=MALFORMED_KIND
        )

        def written(outcome: Outcome) -> None:
            if outcome is Outcome.DEAD:
                self.reporter.dead_without_request(MALFORMED_KIND, [task_id], str(error))

        d = writes.submit(write)
        self.leases.written_by(task_id, d)
        d.addCallbacks(
            written, lambda f: logger.error("could not dead-letter task %s: %s", task_id, f.value)
        )

    def _dead_letter_forged(
        self, task_id: str, raw: str | bytes, token: str, error: SignatureError
    ) -> None:
        """A claimed task the crawl refuses: kept as a forged dead letter, never fetched."""
        writes = self.writes
        assert writes.queue is not None
        write = forged_write(self.config, task_id, raw, token, error, now_ms())

        def written(outcome: Outcome) -> None:
            if outcome is Outcome.DEAD:
                for stat in forged_stats(error):
                    self.reporter.count(stat)
                self.reporter.dead_without_request(FORGED_KIND, [task_id], str(error))

        d = writes.submit(write)
        self.leases.written_by(task_id, d)
        d.addCallbacks(
            written, lambda f: logger.error("could not dead-letter task %s: %s", task_id, f.value)
        )

    def replayed_item(self, replay: Mapping[str, Any]) -> Any:
        """The item an item replay carries, as its class when that class is loaded and is
        an item class (envelope.item_class), else as a dict: the class is gone or
        changed, or the stored name is none the crawl may build (one WARNING per name)."""
        from ..queue.envelope import item_class

        fields = replay["item"]
        path = replay.get("class")
        if not path:
            return fields
        cls = item_class(path)
        if cls is not None:
            try:
                return cls(**fields)
            except Exception:
                return dict(fields)  # the class changed since the item was stored
        self.reporter.item_class_unknown(path)
        return dict(fields)

    @staticmethod
    def replay_meta(item: Any) -> dict[str, Any] | None:
        """An item as its task's envelope keeps it for a replay (RETRYQUEUE_ITEM_REPLAY):
        its fields as JSON, and its class when it can be rebuilt; None when it is not JSON."""
        from itemadapter import ItemAdapter

        try:
            data = check_json(ItemAdapter(item).asdict(), "item")
        except (EnvelopeError, TypeError, ValueError):
            return None
        cls = type(item)
        path = None if cls is dict else f"{cls.__module__}.{cls.__qualname__}"
        return {"item": data, "class": path}
