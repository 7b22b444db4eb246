"""What to do with one failed attempt: request + failure + config -> a Plan (no I/O).

The planner asks the policy table (with the request's meta overrides), gives a
403 / 404 from a cooling domain its one probe, lets the retry hook keep,
replace, veto or re-time a retry, and builds the task envelope to write. It counts and
logs nothing itself: what a person should hear of is returned as ``notes``,
which the reporter turns into stats and log lines.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from scrapy.utils.httpobj import urlparse_cached

from ..decision import kinds
from ..decision.classify import FailureInfo
from ..decision.policy import Decision, Policy
from ..exceptions import ConfigError, EnvelopeError
from ..queue.envelope import Task, request_to_json
from ..queue.taskinfo import host_word
from ..settings import defaults
from ..values import now_ms
from .retryhook import ask_hook
from .taskref import TaskRef, ref_of, ref_updated

if TYPE_CHECKING:
    from scrapy import Request, Spider

    from ..config import Config


@dataclass(frozen=True, slots=True)
class Note:
    """Something the planner met that a person should hear of: a stat, maybe an error line."""

    stat: str
    error: str | None = None


@dataclass(slots=True)
class Plan:
    """A decision about one failure, and the task to write for it."""

    decision: Decision
    failure: FailureInfo
    task: Task
    ref: TaskRef | None
    now: int
    #: The request to retry: the failed one, or the retry hook's replacement.
    request: Request
    notes: list[Note] = field(default_factory=list)
    #: Given up because its retries ran out (Scrapy's ``retry/max_reached``),
    #: not because the kind is never retried.
    exhausted: bool = False
    #: The host of the task's URL (taskinfo.host_of), from the request's parse
    #: that Scrapy's downloader cached; None: parse the URL again.
    host: str | None = None
    #: The project raised the failure on purpose from a callback (RetryLater of a
    #: kind the crawl knows, PermanentFailure): told as its kind, not as an error.
    asked: bool = False

    @property
    def token(self) -> str | None:
        """The lease this plan's write settles, None for a failure that starts a task."""
        return None if self.ref is None or self.ref["settled"] else self.ref["token"]

    @property
    def op(self) -> str:
        """The queue write that carries the plan out."""
        if not self.decision.retry:
            return "deadletter"
        return "reschedule" if self.token is not None else "schedule"


class Planner:
    def __init__(
        self,
        config: Config,
        *,
        fingerprint: Callable[[Request], str],
        retry_hook: Callable[..., Any] | None,
        cooling: Mapping[str, int],
        rand: random.Random | None = None,
        recomputed_meta: Mapping[str, Any] | None = None,
    ) -> None:
        self.config = config
        #: Meta key -> the value a Scrapy middleware sets it to by default: not
        #: stored with that value (envelope.request_to_json).
        self.recomputed_meta = dict(recomputed_meta or {})
        self.fingerprint = fingerprint
        self.retry_hook = retry_hook
        #: Domains cooling down (domain -> end, ms), kept current by the breaker.
        self.cooling = cooling
        self.rand = rand or random.Random()
        #: Set when the spider opens: names callbacks in envelopes.
        self.spider: Spider | None = None

    def plan(
        self,
        request: Request,
        failure: FailureInfo,
        *,
        decision: Decision | None = None,
        task_id: str | None = None,
        asked: bool = False,
    ) -> Plan:
        """Decide what to do with a failed attempt of *request*.

        *decision*, when given, is taken as it is (a ``deferred`` request):
        neither the policy nor the retry hook is asked. *task_id* names a new
        task other than the request's fingerprint (an item replay). *asked*: a
        callback raised the failure on purpose (RetryLater, PermanentFailure);
        the plan is marked so unless its kind is unknown, which is a bug of the
        spider and is told as one.
        """
        now = now_ms()
        notes: list[Note] = []
        ref = ref_of(request)
        if ref is not None and ref["settled"] and ref["id"] != self.fingerprint(request):
            # A new request that copied a re-injected one's meta
            # (meta=response.meta): it is not that task.
            ref = None
        attempts = {k: int(v) for k, v in ref["attempts"].items()} if ref else {}
        if ref is not None and not ref["settled"]:
            task_id = ref["id"]  # a failure of the task itself
        elif task_id is None:
            task_id = ref["id"] if ref else self.fingerprint(request)
        exhausted = False
        #: (request, kind, policy) the policy was resolved for: the envelope's budget.
        resolved: tuple[Request, str, Policy] | None = None
        #: (request, its hostname) once parsed for the decision: the task's host.
        hostname: tuple[Request, str | None] | None = None
        known = self.config.kinds.get(failure.kind)
        # The queue's own kinds are not a project's to raise (RetryLater("poison")).
        if decision is None and (known is None or known.internal):
            failure, decision = self._undeclared(failure, attempts, notes)
            asked = False
        elif asked:
            notes.append(Note(f"retryqueue/raised/{failure.kind}"))
        if decision is not None:
            if decision.retry:
                decision = replace(decision, attempt=attempts.get(decision.kind, 0) + 1)
        else:
            since_first = max(0, now - ref["created"]) / 1000 if ref and ref["created"] else 0.0
            hostname = (request, urlparse_cached(request).hostname)
            decision, exhausted, policy = self._decide(
                request, failure, attempts, notes, since_first, hostname[1]
            )
            if policy is not None:
                resolved = (request, decision.kind, policy)
            if not decision.retry:
                decision = self._probe_permanent(request, failure, attempts, decision, notes)
            if decision.retry:
                decision, exhausted = self._total_cap(request, attempts, decision, notes)
            if decision.retry and self.retry_hook is not None:
                # The task keeps the failed request's id, whatever the hook returns.
                request, decision = self._run_hook(request, decision, failure, policy, notes)
        error = failure.as_dict()
        try:
            request_json = request_to_json(request, self.spider, recomputed=self.recomputed_meta)
        except EnvelopeError as exc:
            request_json = {"url": request.url, "method": request.method}
            if decision.retry:
                # It cannot be parked, so this failure is its last one.
                error = {
                    "kind": kinds.UNSERIALIZABLE,
                    "type": "EnvelopeError",
                    "message": str(exc),
                }
                decision = Decision(
                    kinds.UNSERIALIZABLE,
                    False,
                    0.0,
                    attempts.get(failure.kind, 0),
                    str(exc),
                )
        if ref is not None and ref.get("dont_filter") is not True:
            # Re-injected with dont_filter (it passed the dupefilter once); its
            # envelope keeps the project's own flag, not that one.
            request_json.pop("dont_filter", None)
        if ref is None and self.config.priority_adjust:
            # Adjusted once, when the task is created; the envelope keeps it.
            request_json["priority"] = request.priority + self.config.priority_adjust
        if self.config.encryption is not None:
            # RETRYQUEUE_ENCRYPTION_KEYS: headers, body and cookies stored as one
            # token (encryption.py); the extension opens it when it re-injects.
            request_json = self.config.encryption.seal(request_json)
        if decision.retry:
            attempts[decision.kind] = decision.attempt
            error["delay"] = round(decision.delay, 3)
        task = Task(
            id=task_id,
            spider=self.spider.name if self.spider else "",
            request=request_json,
            attempts=attempts,
            kind=decision.kind,
            first_error=(ref["first_error"] if ref else None) or error,
            last_error=error,
            node=self.config.node_id,
            created=ref["created"] if ref else now,
            # Later than the envelope it follows, whatever the nodes' clocks say: the
            # version a replay of that one is told by (refusals.py).
            updated=max(now, ref_updated(ref) + 1) if ref and ref_updated(ref) else now,
            due=now + int(decision.delay * 1000),
            dead_kind=None if decision.retry else decision.kind,
            max_retries=self._budget(request, decision.kind, resolved),
        )
        # The hook may have replaced the request: its own host then.
        host = (
            host_word(hostname[1])
            if hostname is not None and hostname[0] is request
            else _host(request)
        )
        return Plan(decision, failure, task, ref, now, request, notes, exhausted, host, asked)

    def plan_deferred(self, request: Request, until: int) -> Plan:
        """Park a fresh request to a cooling domain: kind ``deferred``, no budget used."""
        domain = urlparse_cached(request).hostname or ""
        now = now_ms()
        # Half-open (the end has passed): look again once the probe had a moment.
        wait_ms = until - now if until > now else defaults.PROBE_RECHECK_MS
        wait_ms += int(self.rand.random() * min(1000, max(wait_ms // 10, 1)))
        failure = FailureInfo(kinds.DEFERRED, "DomainCooldown", f"{domain} cools down")
        decision = Decision(
            kinds.DEFERRED, True, wait_ms / 1000, 0, f"deferred: {domain} cools down"
        )
        return self.plan(request, failure, decision=decision)

    def _undeclared(
        self, failure: FailureInfo, attempts: Mapping[str, int], notes: list[Note]
    ) -> tuple[FailureInfo, Decision]:
        """A failure of a kind the crawl does not know (``RetryLater("typo")``): a dead
        letter of kind unknown at once, as retrying would only meet the same bug."""
        name = failure.kind
        message = (
            f"{failure.error_type} names kind {name!r}, which neither the built-in kinds nor "
            f"RETRYQUEUE_KINDS declare (declared: {', '.join(self.config.kinds.declared) or 'none'})"
        )
        notes.append(
            Note("retryqueue/undeclared_kind", f"{message}; dead-lettered as {kinds.UNKNOWN}")
        )
        failure = replace(failure, kind=kinds.UNKNOWN, message=f"{message}: {failure.message}")
        decision = Decision(
            kinds.UNKNOWN, False, 0.0, attempts.get(kinds.UNKNOWN, 0), f"{kinds.UNKNOWN}: {message}"
        )
        return failure, decision

    def _budget(
        self, request: Request, kind: str, resolved: tuple[Request, str, Policy] | None = None
    ) -> int | None:
        """The resolved max_retries of *kind* for *request* (its domain's and meta's
        overrides applied), kept in the envelope; None for a kind no policy covers.
        *resolved*: the policy the decision already resolved, for that request and kind."""
        if kind not in self.config.kinds or self.config.kinds.is_internal(kind):
            return None
        if resolved is not None and resolved[0] is request and resolved[1] == kind:
            return resolved[2].max_retries
        domain = urlparse_cached(request).hostname
        table = self.config.policy_table
        meta_policy, max_retries = self._meta_overrides(request, [])
        try:
            return table.policy_for(kind, domain, meta_policy, max_retries).max_retries
        except ConfigError:  # a bad meta override: the decision used the settings too
            return table.policy_for(kind, domain).max_retries

    def _meta_overrides(self, request: Request, notes: list[Note]) -> tuple[Any, int | None]:
        meta_policy = request.meta.get(defaults.META_POLICY)
        max_retries = request.meta.get(defaults.META_MAX_RETRIES)
        table = self.config.policy_table
        try:
            if meta_policy is not None:
                table.check_meta_policy(meta_policy)
            if max_retries is not None and (
                isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0
            ):
                raise ConfigError(
                    f"meta['{defaults.META_MAX_RETRIES}'] must be a whole number >= 0, "
                    f"got {max_retries!r}"
                )
        except ConfigError as exc:
            # A bad meta value must not lose the request: fall back to settings.
            notes.append(
                Note("retryqueue/meta_error", f"{exc} (using the settings' policy instead)")
            )
            return None, None
        if max_retries is None:
            # Scrapy's key is a budget too (and, in _total_cap, a cap over kinds).
            scrapy_max = request.meta.get(defaults.SCRAPY_META_MAX_RETRY_TIMES)
            if _whole(scrapy_max):
                max_retries = scrapy_max
        return meta_policy, max_retries

    def _decide(
        self,
        request: Request,
        failure: FailureInfo,
        attempts: dict[str, int],
        notes: list[Note],
        since_first: float,
        domain: str | None,
    ) -> tuple[Decision, bool, Policy | None]:
        """The policy's decision, whether it gave up because the budget ran out
        (a kind its policy retries: Scrapy's ``retry/max_reached``), and the
        policy it used (None for a kind no policy covers). *domain*: the
        request's hostname."""
        meta_policy, max_retries = self._meta_overrides(request, notes)
        table = self.config.policy_table

        def backoff_error(message: str) -> None:
            notes.append(Note("retryqueue/backoff_error", message))

        def decide(meta_policy: Any, max_retries: int | None) -> Decision:
            return table.decide(
                failure,
                attempts,
                domain=domain,
                meta_policy=meta_policy,
                meta_max_retries=max_retries,
                rand=self.rand.random,
                since_first=since_first,
                url=request.url,
                on_error=backoff_error,
            )

        try:
            decision = decide(meta_policy, max_retries)
        except ConfigError as exc:
            # Valid against the project's policy, not against the domain's one.
            notes.append(
                Note("retryqueue/meta_error", f"{exc} (using the settings' policy instead)")
            )
            meta_policy = max_retries = None
            decision = decide(None, None)
        policy = (
            table.policy_for(decision.kind, domain, meta_policy, max_retries)
            if decision.kind in table.policies
            else None
        )
        exhausted = not decision.retry and policy is not None and policy.retry
        return decision, exhausted, policy

    def _total_cap(
        self, request: Request, attempts: dict[str, int], decision: Decision, notes: list[Note]
    ) -> tuple[Decision, bool]:
        """Scrapy's cap on all retries of a request (``max_retry_times``), over every kind.

        ``retryqueue_max_retries`` (per kind) wins where both are set.
        """
        meta = request.meta
        if meta.get(defaults.META_MAX_RETRIES) is not None:
            return decision, False
        cap = meta.get(defaults.SCRAPY_META_MAX_RETRY_TIMES)
        if cap is not None and not _whole(cap):
            notes.append(
                Note(
                    "retryqueue/meta_error",
                    f"meta['{defaults.SCRAPY_META_MAX_RETRY_TIMES}'] must be a whole number >= 0, "
                    f"got {cap!r} (ignored)",
                )
            )
            cap = None
        done = retries_so_far(attempts, meta)
        if cap is None and decision.kind not in self.config.own_budget_kinds:
            cap = self.config.retry_times
            if cap is None and done > retries_so_far(attempts, {}):
                # A callback counted retries with get_retry_request(): Scrapy's cap holds.
                cap = self.config.scrapy_retry_times
        if cap is None:
            return decision, False
        if done < cap:
            return decision, False
        return (
            Decision(
                decision.kind,
                False,
                0.0,
                attempts.get(decision.kind, 0),
                f"{decision.kind}: gave up after {done} retries (max_retry_times={cap})",
            ),
            True,
        )

    def _probe_permanent(
        self,
        request: Request,
        failure: FailureInfo,
        attempts: dict[str, int],
        decision: Decision,
        notes: list[Note],
    ) -> Decision:
        """A 403 / 404 while its domain cools down may be the site's overload:
        one retry after the cooldown (RETRYQUEUE_COOLDOWN_PROBE_PERMANENT)."""
        if (
            not self.cooling
            or not self.config.cooldown_probe_permanent
            or not self.config.kinds.has(failure.kind, "cooldown_probe")
            or attempts.get(failure.kind, 0) > 0
        ):
            return decision
        domain = urlparse_cached(request).hostname or ""
        until = self.cooling.get(domain)
        if until is None:
            return decision
        wait_ms = max(until - now_ms(), 0) + defaults.PROBE_RECHECK_MS
        notes.append(Note("retryqueue/domain/permanent_probes"))
        return Decision(
            failure.kind,
            True,
            wait_ms / 1000,
            1,
            f"{failure.kind} while {domain} cools down: one more try after the cooldown",
        )

    def _run_hook(
        self,
        request: Request,
        decision: Decision,
        failure: FailureInfo,
        policy: Policy | None,
        notes: list[Note],
    ) -> tuple[Request, Decision]:
        """Ask RETRYQUEUE_RETRY_HOOK about a retry: keep, replace, veto or re-time it."""
        assert self.retry_hook is not None
        table = self.config.policy_table
        request, decision, said = ask_hook(
            self.retry_hook, request, decision, failure, policy, table
        )
        if said is not None:
            notes.append(Note(*said))
        return request, decision


def retries_so_far(attempts: Mapping[str, int], meta: Mapping[str, Any]) -> int:
    """Retries a request has had, by every way it can have been retried: the queue's
    attempts (a deferral uses no budget) or Scrapy's ``retry_times`` (a callback's
    ``get_retry_request()``), whichever counted more."""
    counted = sum(n for kind, n in attempts.items() if kind != kinds.DEFERRED)
    scrapy_count = meta.get(defaults.SCRAPY_META_RETRY_TIMES)
    if isinstance(scrapy_count, int) and not isinstance(scrapy_count, bool):
        counted = max(counted, scrapy_count)
    return counted


def _host(request: Request) -> str | None:
    try:
        return host_word(urlparse_cached(request).hostname)
    except ValueError:  # an unclosed IPv6 bracket: host_of says "" for it too
        return None


def _whole(value: Any) -> bool:
    """A whole number >= 0, and not a bool."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
