"""The per-domain retry budget's record and arithmetic: how many retries a domain may get now.

The fleet shares one record per domain in Redis (``…:budget``, keys.py), written
only by claim.lua, which holds the same arithmetic; this module reads it back
(``scrapy retryqueue status``, tests) and is the reference the script follows.

A record is plain text, ``"<slice ms> <slice index> <q_0> … <q_10> <r_0> … <r_10>"``:
the window (RETRYQUEUE_RETRY_BUDGET_WINDOW) cut into BUDGET_SLICES slices, and
for the newest BUDGET_SLICES + 1 of them (the last one holds "now") the fresh
requests the nodes reported (q) and the retries claimed (r) in each. Slice i of
the lists is slice ``index - BUDGET_SLICES + i``.

A retry may be claimed at time t when, with it, the retries of the newest
BUDGET_SLICES + 1 slices stay within ``floor * window + share * requests`` of
the newest BUDGET_SLICES - 1 slices. Retries are counted over a little more
than a window and requests over a little less, so that the bound holds for the
window ending at every retry (``(t - window, t]``) even though a node reports its
requests up to a poll interval (at most one slice) after it sent them (docs/backoff.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..settings.defaults import BUDGET_RECORD_MAX, BUDGET_SLICES

#: Slices a record holds: the window's and one more (the oldest, retries only).
SLOTS = BUDGET_SLICES + 1
#: Slices whose requests count: the newest BUDGET_SLICES - 1 (one is left for the
#: report lag of a poll interval).
REQUEST_SLOTS = BUDGET_SLICES - 1
_DIGITS_MAX = 15


def slice_ms(window: float) -> int:
    """The length of one slice of a window of *window* seconds, ms (at least 1)."""
    return max(1, int(window * 1000) // BUDGET_SLICES)


@dataclass(frozen=True, slots=True)
class BudgetRecord:
    """One domain's counts, slice by slice (oldest first), ending at slice *index*."""

    index: int
    requests: tuple[int, ...] = (0,) * SLOTS
    retries: tuple[int, ...] = (0,) * SLOTS

    def at(self, index: int) -> BudgetRecord:
        """The record moved on to slice *index*: slices older than the record keeps drop
        out (a record ahead of *index*, another node's clock, stays as it is)."""
        shift = index - self.index
        if shift <= 0:
            return self
        if shift >= SLOTS:
            return BudgetRecord(index)
        pad = (0,) * shift
        return BudgetRecord(index, self.requests[shift:] + pad, self.retries[shift:] + pad)

    def limit(self, *, share: float, floor: float, window: float) -> int:
        """The retries the counted slices may hold: ``floor * window + share * requests``
        (whole retries), for a record already :meth:`at` now."""
        requests = sum(self.requests[SLOTS - REQUEST_SLOTS :])
        return math.floor(floor * window + share * requests)

    def allowance(self, *, share: float, floor: float, window: float) -> int:
        """Retries the domain may get now (never below 0), for a record already :meth:`at` now."""
        return max(0, self.limit(share=share, floor=floor, window=window) - sum(self.retries))

    def text(self, slice_length: int) -> str:
        return " ".join(map(str, (slice_length, self.index, *self.requests, *self.retries)))


def _count(field: str) -> bool:
    """A non-negative whole number of at most 15 digits (Lua's doubles hold it exactly)."""
    return field.isascii() and field.isdigit() and len(field) <= _DIGITS_MAX


def parse_record(raw: Any, slice_length: int) -> BudgetRecord | None:
    """*raw* as a record of slices of *slice_length* ms; an empty record when it was
    written with another slice length (the window changed); None when it is not a
    record at all (a hostile writer): the script starts such a record over."""
    if isinstance(raw, bytes):
        if len(raw) > BUDGET_RECORD_MAX:
            return None
        raw = raw.decode("ascii", "replace")  # a byte that is no ASCII makes it malformed
    text = str(raw)
    if len(text) > BUDGET_RECORD_MAX:
        return None
    fields = text.split()
    if len(fields) != 2 + 2 * SLOTS or not all(_count(f) for f in fields):
        return None
    numbers = [int(f) for f in fields]
    if numbers[0] != slice_length:
        return BudgetRecord(0)
    return BudgetRecord(numbers[1], tuple(numbers[2 : 2 + SLOTS]), tuple(numbers[2 + SLOTS :]))


@dataclass(frozen=True, slots=True)
class DomainBudget:
    """What ``scrapy retryqueue status`` shows of one domain's budget now."""

    domain: str
    #: Fresh requests reported in the slices that count (about the last window).
    requests: int
    #: Retries claimed in the slices that count.
    retries: int
    #: Retries the domain may get now.
    allowance: int
    #: The retries the counted slices may hold (floor x window + share x requests).
    limit: int = 0


def _domain(field: Any) -> str:
    """A record's domain as text; bytes that are not UTF-8 (a hostile writer) shown escaped."""
    if isinstance(field, bytes):
        return field.decode("utf-8", "backslashreplace")
    return str(field)


def read_budgets(
    raw: Mapping[Any, Any], *, now: int, share: float, floor: float, window: float
) -> tuple[list[DomainBudget], list[str]]:
    """The budget hash as read from Redis: each domain's state now (busiest first),
    and the domains whose record is malformed (the next claim starts them over)."""
    length = slice_ms(window)
    index = now // length
    states: list[DomainBudget] = []
    malformed: list[str] = []
    for field, value in raw.items():
        domain = _domain(field)
        record = parse_record(value, length)
        if record is None or record.index - index > SLOTS:
            # Not a record, or one from far ahead: claim.lua starts either over.
            malformed.append(domain)
            continue
        record = record.at(index)
        requests = sum(record.requests[SLOTS - REQUEST_SLOTS :])
        retries = sum(record.retries)
        if requests or retries:
            allowance = record.allowance(share=share, floor=floor, window=window)
            limit = record.limit(share=share, floor=floor, window=window)
            states.append(DomainBudget(domain, requests, retries, allowance, limit))
    states.sort(key=lambda s: (-s.retries, -s.requests, s.domain))
    return states, sorted(malformed)
