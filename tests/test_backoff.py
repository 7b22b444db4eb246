"""compute_backoff, min_backoff and parse_retry_after: pure functions, exact values."""

from __future__ import annotations

import random
from email.utils import formatdate

import pytest

from scrapy_retryqueue.decision import kinds
from scrapy_retryqueue.decision.backoff import compute_backoff, min_backoff, parse_retry_after

#: A policy to compute with: base 3 s, x2, cap 120 s (the default timeout policy
#: before issue 24's measurement; the figures below are this one's).
TIMEOUT = {"base_delay": 3.0, "multiplier": 2.0, "max_delay": 120.0}
NOW = 1_700_000_000.0


def _never() -> float:
    raise AssertionError("rand must not be called for jitter='none'")


def test_default_timeout_policy_is_the_documented_one():
    # docs/settings.md, "Default policies": 1, 2, 4, 8, 16 s before jitter.
    timeout = kinds.POLICIES["timeout"]
    chain = [
        compute_backoff(
            a,
            base_delay=timeout["base_delay"],
            multiplier=timeout["multiplier"],
            max_delay=timeout["max_delay"],
            jitter="none",
        )
        for a in range(timeout["max_retries"])
    ]
    assert chain == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert timeout["max_delay"] == 120.0


@pytest.mark.parametrize(
    ("attempt", "expected"),
    [(0, 3.0), (1, 6.0), (2, 12.0), (3, 24.0), (4, 48.0), (5, 96.0), (6, 120.0), (7, 120.0)],
)
def test_no_jitter_is_exponential_and_capped(attempt, expected):
    assert compute_backoff(attempt, **TIMEOUT, jitter="none", rand=_never) == expected


def test_default_chain_before_jitter():
    chain = [compute_backoff(a, **TIMEOUT, jitter="none") for a in range(5)]
    assert chain == [3.0, 6.0, 12.0, 24.0, 48.0]


@pytest.mark.parametrize(("r", "expected"), [(0.0, 0.0), (0.25, 3.0), (0.5, 6.0), (0.75, 9.0)])
def test_full_jitter_scales_the_whole_delay(r, expected):
    # attempt 2: 12 s before jitter; full jitter draws from [0, 12).
    assert compute_backoff(2, **TIMEOUT, jitter="full", rand=lambda: r) == expected


@pytest.mark.parametrize(("r", "expected"), [(0.0, 6.0), (0.5, 9.0), (0.75, 10.5)])
def test_equal_jitter_keeps_half(r, expected):
    # attempt 2: 12 s before jitter; equal jitter draws from [6, 12).
    assert compute_backoff(2, **TIMEOUT, jitter="equal", rand=lambda: r) == expected


def test_equal_is_the_default_jitter():
    assert compute_backoff(1, **TIMEOUT, rand=lambda: 0.0) == 3.0
    assert compute_backoff(1, **TIMEOUT, rand=lambda: 0.5) == 4.5


def test_multiplier_defaults_to_two():
    assert compute_backoff(3, base_delay=1.0, max_delay=100.0, jitter="none") == 8.0


def _jittered(delay: float, r: float, jitter: str) -> float:
    return delay * r if jitter == "full" else delay / 2 + delay / 2 * r


CAPS = [3.0, 6.0, 12.0, 24.0, 48.0, 96.0, 120.0]


@pytest.mark.parametrize("jitter", ["full", "equal"])
def test_seeded_random_gives_exact_delays(jitter):
    # A fresh Random(42) per call: every call sees the same first draw.
    r = random.Random(42).random()
    got = [
        compute_backoff(a, **TIMEOUT, jitter=jitter, rand=random.Random(42).random)
        for a in range(7)
    ]
    assert got == [_jittered(d, r, jitter) for d in CAPS]


@pytest.mark.parametrize("jitter", ["full", "equal"])
def test_shared_seeded_random_gives_exact_sequence(jitter):
    ref = random.Random(42)
    draws = [ref.random() for _ in CAPS]
    rng = random.Random(42)
    seq = [compute_backoff(a, **TIMEOUT, jitter=jitter, rand=rng.random) for a in range(7)]
    assert seq == [_jittered(d, x, jitter) for d, x in zip(CAPS, draws, strict=True)]
    for value, cap in zip(seq, CAPS, strict=True):
        assert (0.0 if jitter == "full" else cap / 2) <= value < cap
    # Jitter really varies: not all draws give the same fraction of the cap.
    assert len({round(v / c, 9) for v, c in zip(seq, CAPS, strict=True)}) > 1


def test_cap_applies_before_jitter():
    # 3 * 2**10 = 3072 s is capped to 120 s; equal jitter then gives [60, 120).
    assert compute_backoff(10, **TIMEOUT, jitter="equal", rand=lambda: 0.0) == 60.0
    assert compute_backoff(10, **TIMEOUT, jitter="full", rand=lambda: 0.5) == 60.0


def test_cap_below_base_delay_wins():
    assert compute_backoff(0, base_delay=10.0, max_delay=4.0, jitter="none") == 4.0


def test_negative_attempt_is_refused():
    with pytest.raises(ValueError, match=r"attempt must be >= 0, got -1"):
        compute_backoff(-1, **TIMEOUT, jitter="none")


def test_unknown_jitter_is_refused_and_named():
    with pytest.raises(ValueError, match=r"none, full, equal; got 'wild'"):
        compute_backoff(0, **TIMEOUT, jitter="wild", rand=lambda: 0.5)


@pytest.mark.parametrize("attempt", [1024, 10_000, 10**6])
def test_huge_attempt_overflow_returns_max_delay(attempt):
    assert compute_backoff(attempt, **TIMEOUT, jitter="none") == 120.0
    assert compute_backoff(attempt, **TIMEOUT, jitter="full", rand=lambda: 0.5) == 60.0


@pytest.mark.parametrize(
    ("jitter", "attempt", "expected"),
    [
        ("none", 0, 3.0),
        ("none", 3, 24.0),
        ("full", 3, 0.0),
        ("equal", 0, 1.5),
        ("equal", 3, 12.0),
        ("equal", 9, 60.0),
    ],
)
def test_min_backoff(jitter, attempt, expected):
    assert min_backoff(attempt, **TIMEOUT, jitter=jitter) == expected


# -- Retry-After ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [("120", 120.0), (b"120", 120.0), ("0", 0.0), (" 7 ", 7.0), (b"  30\r\n", 30.0)],
)
def test_retry_after_delta_seconds(value, expected):
    assert parse_retry_after(value, now=NOW) == expected


def test_retry_after_http_date_in_future():
    header = formatdate(NOW + 90, usegmt=True)
    assert header.endswith("GMT")
    assert parse_retry_after(header, now=NOW) == 90.0
    assert parse_retry_after(header.encode("ascii"), now=NOW) == 90.0
    # The delay is relative to the `now` passed in, not the wall clock.
    assert parse_retry_after(header, now=NOW + 30) == 60.0


def test_retry_after_known_http_date():
    # RFC 9110's example date; 2015-10-21T07:28:00Z is 1445412480.
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412480 - 300) == 300.0


def test_retry_after_http_date_in_past_is_zero():
    header = formatdate(NOW - 3600, usegmt=True)
    assert parse_retry_after(header, now=NOW) == 0.0


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        b"",
        "   ",
        "soon",
        b"garbage",
        "-5",
        "1.5",
        "Mon, 99 Foo 2020 99:99:99 GMT",
        # No time zone: not an HTTP-date, ambiguous.
        "Wed, 21 Oct 2015 07:28:00 -0000",
        # Latin-1 superscript digits: str.isdigit() is True for them, float() is not.
        b"\xb2",
        "\u00b3\u00b9",
    ],
)
def test_retry_after_unreadable_is_none(value):
    assert parse_retry_after(value, now=NOW) is None
