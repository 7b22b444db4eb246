"""Learned recovery times: the binned survival records the scripts keep, read back as curves.

Pure, no I/O. For each (kind, domain) Redis holds one record (``recovery`` in
keys.py): ``"<updated ms> <n0> <e0> <n1> <e1> ..."``, where ``n_b`` is the
weight of tasks whose outage was seen to last into bin *b* (at risk there) and
``e_b`` the weight of those that recovered in it. A task adds to the bins its
outage newly reached at each outcome (reschedule, dead letter: censored; ack:
recovered, spread evenly over the gap between its last failure and its success), so it counts
once per bin however often it fails, and one still failing or dead-lettered is a
censored observation, as Kaplan-Meier wants.
Weights halve every half-life (the scripts decay a record when they update it;
the reader decays it to the time it reads). Bins are half an octave wide.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..settings.defaults import RECOVERY_BINS, RECOVERY_FIRST_EDGE, RECOVERY_RECORD_MAX
from ..values import as_text

#: Lower edge of each bin, seconds: 0, then RECOVERY_FIRST_EDGE * 2 ** ((b - 1) / 2).
EDGES: tuple[float, ...] = (0.0,) + tuple(
    RECOVERY_FIRST_EDGE * 2 ** ((b - 1) / 2) for b in range(1, RECOVERY_BINS)
)
#: Upper edge of the last bin (open in the records; closed here for interpolation).
_TOP = EDGES[-1] * math.sqrt(2)


def bin_of(seconds: float) -> int:
    """The bin an outage of *seconds* ends in."""
    if not seconds >= RECOVERY_FIRST_EDGE:  # NaN too
        return 0
    b = math.floor(2 * math.log2(seconds / RECOVERY_FIRST_EDGE)) + 1
    return min(b, RECOVERY_BINS - 1)


def field_name(kind: str, domain: str) -> str:
    """The record's field: ``"<kind> <domain>"`` (a host name holds no space)."""
    return f"{kind} {domain}"


def parse_field(field: str) -> tuple[str, str] | None:
    kind, sep, domain = field.rpartition(" ")
    return (kind, domain) if sep and kind and domain else None


def observation(prior_ms: int | None, wait_ms: int, recovered: bool = False) -> tuple[int, int]:
    """The bins (first, last) an outcome adds at-risk weight to.

    *prior_ms* is how long the task's outage had lasted at its previous outcome
    (None or 0 for its first: it is at risk from bin 0), *wait_ms* how long now.
    first > last when the outage reached no new bin. A recovery (*recovered*) is
    spread over the gap between the last failure and the success (:meth:`Record.add`
    with its *gap*): the outage ended somewhere in between. Dated at the success,
    the curve would learn the lag of the attempts that found it over, a strategy
    timed by it would wait longer for it, and the lag would grow with every pass;
    dated at the gap's middle, one bin would get what a long gap spreads over several.
    """
    prior = prior_ms if prior_ms and prior_ms > 0 else 0
    last = bin_of(max(0, wait_ms) / 1000)
    if not prior:
        return 0, last
    return bin_of(prior / 1000) + 1, last


def _upper(b: int) -> float:
    # The last bin is open: a gap past its lower edge falls in it whole.
    return EDGES[b + 1] if b + 1 < len(EDGES) else math.inf


@dataclass(slots=True)
class Record:
    """One (kind, domain)'s weights as of *updated* (ms)."""

    updated: int
    at_risk: list[float]
    recovered: list[float]

    def decayed(self, now: int, half_life: float) -> Record:
        factor = _decay(now - self.updated, half_life)
        # A record from a clock ahead of this one is not decayed, nor dated later.
        return Record(
            now,
            [x * factor for x in self.at_risk],
            [x * factor for x in self.recovered],
        )

    def add(
        self,
        first: int,
        last: int,
        recovered: bool,
        *,
        now: int,
        half_life: float,
        gap: tuple[int | None, int] | None = None,
    ) -> Record:
        """This record after one outcome: what the scripts do (lua/lib/recovery.lua, in
        ack.lua, reschedule.lua, deadletter.lua), for the simulation and the tests that
        hold them equal. *gap*: (prior ms, wait ms) of a recovery, spread over it: each
        bin of the gap is at risk by the share of the gap from its lower edge on, and
        recovers by the share of the gap in it. Without it, at risk in first..last and
        recovered in last."""
        record = self.decayed(now, half_life)
        size = max(len(record.at_risk), last + 1)
        record.at_risk += [0.0] * (size - len(record.at_risk))
        record.recovered += [0.0] * (size - len(record.recovered))
        p = (gap[0] or 0) / 1000 if gap else 0.0
        w = gap[1] / 1000 if gap else 0.0
        if recovered and gap and w > p:
            # The same operations, in the same order, as the script's.
            for b in range(first, last + 1):
                lo = EDGES[b]
                record.at_risk[b] += 1 if lo <= p else (w - lo) / (w - p)
            for b in range(first - 1 if p > 0 else first, last + 1):
                lo, hi = EDGES[b], _upper(b)
                record.recovered[b] += (min(hi, w) - max(lo, p)) / (w - p)
            return record
        for b in range(first, last + 1):
            record.at_risk[b] += 1
        if recovered:
            record.recovered[last] += 1
        return record

    def encode(self) -> str:
        numbers = [
            f"{x:.10g}" for pair in zip(self.at_risk, self.recovered, strict=True) for x in pair
        ]
        return " ".join([str(self.updated), *numbers])


def empty_record(now: int = 0) -> Record:
    return Record(now, [], [])


def _decay(age_ms: float, half_life: float) -> float:
    if age_ms <= 0 or half_life <= 0:
        return 1.0
    return 0.5 ** (age_ms / 1000 / half_life)


def decode_record(raw: bytes | str) -> Record:
    """A record as the scripts write it; ValueError for anything else."""
    text = as_text(raw) if isinstance(raw, bytes) else raw
    if len(text) > RECOVERY_RECORD_MAX:
        raise ValueError(f"longer than {RECOVERY_RECORD_MAX} characters")
    parts = text.split()
    if len(parts) % 2 != 1 or len(parts) > 2 * RECOVERY_BINS + 1:
        raise ValueError("not <updated> followed by (at risk, recovered) pairs")
    try:
        updated = int(parts[0])
        numbers = [float(x) for x in parts[1:]]
    except ValueError:
        raise ValueError("holds something that is not a number") from None
    if updated < 0 or any(not math.isfinite(x) or x < 0 for x in numbers):
        raise ValueError("holds a negative or non-finite number")
    at_risk, recovered = numbers[0::2], numbers[1::2]
    if any(e > n * (1 + 1e-6) + 1e-9 for n, e in zip(at_risk, recovered, strict=True)):
        raise ValueError("has more recoveries than tasks at risk in a bin")
    return Record(updated, at_risk, recovered)


class Curve:
    """A recovery-time distribution: the share of outages still on after t seconds."""

    __slots__ = ("_survival", "at_risk", "recovered")

    def __init__(self, at_risk: Iterable[float], recovered: Iterable[float]) -> None:
        self.at_risk = list(at_risk)
        self.recovered = list(recovered)
        survival = [1.0]
        for n, e in zip(self.at_risk, self.recovered, strict=True):
            hazard = min(1.0, e / n) if n > 0 else 0.0
            survival.append(survival[-1] * (1.0 - hazard))
        #: Survival at each bin's lower edge, and at the last one's upper edge.
        self._survival = survival

    @property
    def outages(self) -> float:
        """Weighted tasks observed (every one is at risk in bin 0)."""
        return self.at_risk[0] if self.at_risk else 0.0

    @property
    def recoveries(self) -> float:
        return sum(self.recovered)

    def at_risk_at(self, seconds: float) -> float:
        b = bin_of(seconds)
        return self.at_risk[b] if b < len(self.at_risk) else 0.0

    def survival(self, seconds: float) -> float:
        """The share of outages still on after *seconds* (interpolated in a bin)."""
        b = bin_of(seconds)
        if b >= len(self.at_risk):
            return self._survival[-1]
        lo, hi = _edges(b)
        s_lo, s_hi = self._survival[b], self._survival[b + 1]
        share = min(1.0, max(0.0, (seconds - lo) / (hi - lo)))
        return s_lo + (s_hi - s_lo) * share

    def next_time(self, since: float, target: float) -> float | None:
        """The time (seconds since the first failure) by which an outage that has lasted
        *since* is over with probability *target*; None when the curve does not say
        (no data that far, or every outage seen was over by then)."""
        s_now = self.survival(since)
        if s_now <= 1e-9:
            return None
        goal = (1.0 - target) * s_now
        for b in range(bin_of(since), len(self.at_risk)):
            if self.at_risk[b] <= 0:
                return None
            lo, hi = _edges(b)
            start = max(lo, since)
            s_start, s_hi = self.survival(start), self._survival[b + 1]
            if s_hi <= goal:
                if s_start <= goal:
                    return start
                return start + (hi - start) * (s_start - goal) / (s_start - s_hi)
        return None

    def knots(self, min_at_risk: float = 0.0) -> list[tuple[float, float]]:
        """(t, survival) at each bin's edges, up to the upper edge of the last bin with at
        least *min_at_risk* weight at risk: where the curve is piecewise linear, and how
        far it says anything (decision/schedule.py plans over them)."""
        last = max(
            (b for b, n in enumerate(self.at_risk) if n >= min_at_risk and n > 0), default=-1
        )
        return [(EDGES[0], self._survival[0])] + [
            (_edges(b)[1], self._survival[b + 1]) for b in range(last + 1)
        ]

    def points(self) -> list[tuple[float, float]]:
        """(t, share of outages over after t) at each bin's upper edge: the chart."""
        return [(_edges(b)[1], 1.0 - self._survival[b + 1]) for b in range(len(self.at_risk))]


def _edges(b: int) -> tuple[float, float]:
    return EDGES[b], (EDGES[b + 1] if b + 1 < len(EDGES) else _TOP)


class RecoveryStats:
    """Every (kind, domain) curve of one spider, and each kind's over all its domains."""

    def __init__(self, records: Mapping[tuple[str, str], Record] | None = None) -> None:
        self.records = dict(records or {})
        self.curves = {key: Curve(r.at_risk, r.recovered) for key, r in self.records.items()}
        pooled: dict[str, tuple[list[float], list[float]]] = {}
        for (kind, _), record in self.records.items():
            n, e = pooled.setdefault(kind, ([], []))
            for b, (x, y) in enumerate(zip(record.at_risk, record.recovered, strict=True)):
                if b >= len(n):
                    n.append(0.0)
                    e.append(0.0)
                n[b] += x
                e[b] += y
        self.kinds = {kind: Curve(n, e) for kind, (n, e) in pooled.items()}

    def __len__(self) -> int:
        return len(self.records)

    def curve(self, kind: str, domain: str | None) -> Curve | None:
        return self.curves.get((kind, domain)) if domain else None

    def kind_curve(self, kind: str) -> Curve | None:
        return self.kinds.get(kind)


def read_records(
    raw: Mapping[bytes | str, bytes | str], *, now: int, half_life: float
) -> tuple[RecoveryStats, list[str]]:
    """The records of one spider's ``recovery`` hash, decayed to *now*, and the fields
    that were malformed (ignored: anything in Redis may come from a hostile writer)."""
    records: dict[tuple[str, str], Record] = {}
    malformed: list[str] = []
    for raw_field, value in raw.items():
        try:
            field = as_text(raw_field)
        except UnicodeDecodeError:  # a name no script writes: shown, escaped
            malformed.append(bytes(raw_field).decode(errors="backslashreplace"))
            continue
        key = parse_field(field)
        try:
            if key is None:
                raise ValueError("field is not '<kind> <domain>'")
            record = decode_record(value)
        except (ValueError, UnicodeDecodeError):
            malformed.append(field)
            continue
        records[key] = record.decayed(now, half_life)
    return RecoveryStats(records), malformed
