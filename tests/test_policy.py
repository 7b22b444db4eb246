"""PolicyTable.decide, per-domain and per-request overrides, Policy validation."""

from __future__ import annotations

import random
from dataclasses import fields

import pytest
from scrapy.settings import Settings

from scrapy_retryqueue.config import load_config
from scrapy_retryqueue.decision import kinds
from scrapy_retryqueue.decision.backoff import PolicyFields
from scrapy_retryqueue.decision.classify import FailureInfo
from scrapy_retryqueue.decision.policy import Decision, Policy, PolicyTable
from scrapy_retryqueue.exceptions import ConfigError

HALF = lambda: 0.5  # noqa: E731
ZERO = lambda: 0.0  # noqa: E731


def _default_policies() -> dict[str, Policy]:
    return {
        kind: Policy.from_dict(kinds.POLICIES[kind], where=kind)
        for kind in kinds.BUILTIN_TABLE.policy_names
    }


def _table(domain_policies=None, retry_after_max=3600.0) -> PolicyTable:
    return PolicyTable(_default_policies(), domain_policies or {}, retry_after_max=retry_after_max)


def _failure(kind, retry_after=None) -> FailureInfo:
    return FailureInfo(kind=kind, error_type="X", message="m", retry_after=retry_after)


def test_what_a_strategy_reads_of_a_policy_is_every_field_of_it():
    # backoff.py spells these without importing policy.py: a field added to Policy
    # and not there would be one a strategy cannot be typed to read.
    offered = {name for name, value in vars(PolicyFields).items() if isinstance(value, property)}
    assert offered == {field.name for field in fields(Policy)}


# -- decide ---------------------------------------------------------------------


def test_first_timeout_is_retried_with_exact_delay():
    decision = _table().decide(_failure("timeout"), {}, rand=HALF)
    # 1 s before jitter; equal jitter with 0.5 gives 0.5 + 0.25.
    assert decision == Decision("timeout", True, 0.75, 1, "timeout: retry 1 of 5")


@pytest.mark.parametrize(("done", "base"), [(0, 1.0), (1, 2.0), (2, 4.0), (3, 8.0), (4, 16.0)])
def test_attempts_count_up_with_seeded_random(done, base):
    decision = _table().decide(
        _failure("timeout"), {"timeout": done}, rand=random.Random(1234).random
    )
    r = random.Random(1234).random()
    assert decision.retry is True
    assert decision.attempt == done + 1
    assert decision.delay == base / 2 + base / 2 * r
    assert decision.reason == f"timeout: retry {done + 1} of 5"


def test_attempts_of_other_kinds_do_not_count():
    decision = _table().decide(_failure("timeout"), {"connection": 5, "server_error": 9}, rand=ZERO)
    assert decision.retry is True
    assert decision.attempt == 1
    assert decision.delay == 0.5


@pytest.mark.parametrize(("kind", "limit"), [("timeout", 5), ("dns", 3), ("unknown", 2)])
def test_gives_up_at_max_retries(kind, limit):
    table = _table()
    assert table.decide(_failure(kind), {kind: limit - 1}, rand=ZERO).retry is True
    decision = table.decide(_failure(kind), {kind: limit}, rand=ZERO)
    assert decision == Decision(kind, False, 0.0, limit, f"{kind}: gave up after {limit} retries")
    assert table.decide(_failure(kind), {kind: limit + 3}, rand=ZERO).retry is False


@pytest.mark.parametrize("kind", ["not_found", "forbidden", "rule"])
def test_permanent_kinds_are_dead_at_once(kind):
    decision = _table().decide(_failure(kind), {}, rand=HALF)
    assert decision == Decision(kind, False, 0.0, 0, f"{kind}: not retried by policy")


@pytest.mark.parametrize("kind", kinds.BUILTIN_TABLE.named("internal"))
def test_internal_kinds_are_never_retried(kind):
    decision = _table().decide(
        _failure(kind),
        {kind: 0},
        meta_policy={kind: {"retry": True, "max_retries": 10}},
        meta_max_retries=10,
        rand=HALF,
    )
    assert decision == Decision(kind, False, 0.0, 0, f"{kind}: never retried")


def test_kind_without_policy_falls_back_to_unknown():
    decision = _table().decide(_failure("martian"), {}, rand=ZERO)
    assert decision.retry is True
    # unknown: base 60 s, equal jitter with 0 gives 30 s.
    assert decision.delay == 30.0
    assert _table().decide(_failure("martian"), {"martian": 2}).retry is False


def test_retry_after_raises_the_delay():
    # rate_limited: base 5 s -> 2.5 s at rand 0; the server asks for 100 s.
    decision = _table().decide(_failure("rate_limited", retry_after=100.0), {}, rand=ZERO)
    assert decision.retry is True
    assert decision.delay == 100.0


def test_retry_after_sets_the_delay_when_shorter_than_the_backoff():
    # The server's word, not rate_limited's 2.5-5 s: a Retry-After of 2 s waits 2 s.
    decision = _table().decide(_failure("rate_limited", retry_after=2.0), {}, rand=ZERO)
    assert decision.delay == 2.0
    # A Retry-After in the past (0 s) is retried at the next poll.
    assert _table().decide(_failure("rate_limited", retry_after=0.0), {}).delay == 0.0


def test_a_custom_strategy_cannot_wait_less_than_retry_after():
    class Short:
        def delay(self, ctx):
            return 1.0

    table = PolicyTable(_default_policies(), {}, retry_after_max=3600.0, backoff=Short())
    assert table.decide(_failure("rate_limited", retry_after=50.0), {}).delay == 50.0


def test_retry_after_is_capped_by_retry_after_max():
    table = _table(retry_after_max=600.0)
    decision = table.decide(_failure("rate_limited", retry_after=86400.0), {}, rand=ZERO)
    assert decision.delay == 600.0


def test_retry_after_does_not_extend_the_retry_budget():
    budget = kinds.POLICIES["rate_limited"]["max_retries"]
    decision = _table().decide(_failure("rate_limited", retry_after=10.0), {"rate_limited": budget})
    assert decision.retry is False


# -- per domain -----------------------------------------------------------------


def _domain_table() -> PolicyTable:
    base = _default_policies()["timeout"]
    return _table(
        {
            "example.com": {"timeout": base.merged({"max_retries": 1}, where="t")},
            "shop.example.com": {
                "timeout": base.merged({"max_retries": 7, "jitter": "none"}, where="t")
            },
        }
    )


@pytest.mark.parametrize(
    ("domain", "max_retries"),
    [
        ("example.com", 1),
        ("www.example.com", 1),
        ("shop.example.com", 7),
        ("a.b.shop.example.com", 7),
        ("notexample.com", 5),
        ("example.com.evil.net", 5),
        ("other.org", 5),
        (None, 5),
    ],
)
def test_domain_policy_exact_host_and_suffix(domain, max_retries):
    assert _domain_table().policy_for("timeout", domain).max_retries == max_retries


@pytest.mark.parametrize("long_first", [True, False])
def test_longest_suffix_wins_regardless_of_insertion_order(long_first):
    base = _default_policies()["timeout"]
    entries = [
        ("example.com", {"timeout": base.merged({"max_retries": 1}, where="t")}),
        ("a.example.com", {"timeout": base.merged({"max_retries": 9}, where="t")}),
    ]
    table = _table(dict(reversed(entries) if long_first else entries))
    assert table.policy_for("timeout", "x.a.example.com").max_retries == 9
    assert table.policy_for("timeout", "a.example.com").max_retries == 9
    assert table.policy_for("timeout", "b.example.com").max_retries == 1


def test_domain_policy_only_overrides_its_kinds():
    table = _domain_table()
    assert table.policy_for("connection", "shop.example.com") == _default_policies()["connection"]


def test_domain_policy_drives_decide():
    table = _domain_table()
    failure = _failure("timeout")
    assert table.decide(failure, {"timeout": 1}, domain="example.com").retry is False
    decision = table.decide(failure, {"timeout": 6}, domain="shop.example.com", rand=HALF)
    # jitter none in the shop policy: 1 * 2**6 = 64 s.
    assert decision == Decision("timeout", True, 64.0, 7, "timeout: retry 7 of 7")


def test_domain_policies_from_config_are_lowercased_and_merged_over_kind_policy():
    table = load_config(
        Settings(
            {
                "RETRYQUEUE_POLICIES": {"timeout": {"base_delay": 4}},
                "RETRYQUEUE_DOMAIN_POLICIES": {".Example.COM": {"timeout": {"max_retries": 1}}},
            }
        )
    ).policy_table
    policy = table.policy_for("timeout", "www.example.com")
    assert policy.max_retries == 1
    assert policy.base_delay == 4.0


# -- per request (meta) -----------------------------------------------------------


def test_meta_policy_overrides_fields_of_one_kind():
    table = _table()
    meta = {"timeout": {"max_retries": 1, "jitter": "none", "base_delay": 7}}
    decision = table.decide(_failure("timeout"), {}, meta_policy=meta, rand=HALF)
    assert decision == Decision("timeout", True, 7.0, 1, "timeout: retry 1 of 1")
    assert table.decide(_failure("timeout"), {"timeout": 1}, meta_policy=meta).retry is False
    # Another kind is untouched.
    assert table.decide(_failure("connection"), {"connection": 4}, meta_policy=meta).retry


def test_meta_policy_applies_over_domain_policy():
    table = _domain_table()
    policy = table.policy_for(
        "timeout", "shop.example.com", meta_policy={"timeout": {"base_delay": 1}}
    )
    assert policy.max_retries == 7
    assert policy.jitter == "none"
    assert policy.base_delay == 1.0


def test_meta_policy_can_make_a_permanent_kind_retryable():
    meta = {"not_found": {"retry": True, "max_retries": 2, "base_delay": 10, "max_delay": 10}}
    decision = _table().decide(_failure("not_found"), {}, meta_policy=meta, rand=ZERO)
    assert decision.retry is True
    assert decision.delay == 5.0


@pytest.mark.parametrize(
    ("meta_max", "done", "retry"), [(0, 0, False), (1, 0, True), (1, 1, False), (9, 8, True)]
)
def test_meta_max_retries(meta_max, done, retry):
    decision = _table().decide(
        _failure("timeout"), {"timeout": done}, meta_max_retries=meta_max, rand=ZERO
    )
    assert decision.retry is retry


def test_meta_max_retries_wins_over_meta_policy():
    decision = _table().decide(
        _failure("timeout"),
        {"timeout": 3},
        meta_policy={"timeout": {"max_retries": 10}},
        meta_max_retries=3,
    )
    assert decision.retry is False


@pytest.mark.parametrize("bad", ["3", -1, 1.5, True])
def test_bad_meta_max_retries_names_the_meta_key(bad):
    with pytest.raises(ConfigError) as info:
        _table().decide(_failure("timeout"), {}, meta_max_retries=bad)
    assert "meta['retryqueue_max_retries']" in str(info.value)
    assert repr(bad) in str(info.value)


def test_bad_meta_policy_in_decide_names_the_meta_key():
    with pytest.raises(ConfigError) as info:
        _table().decide(_failure("timeout"), {}, meta_policy={"timeout": {"jitter": "wild"}})
    assert "meta['retryqueue_policy']['timeout']['jitter']" in str(info.value)
    assert "'wild'" in str(info.value)


# -- check_meta_policy ------------------------------------------------------------


def test_check_meta_policy_returns_a_valid_value():
    value = {"timeout": {"max_retries": 2}, "rate_limited": {"jitter": "full"}}
    assert _table().check_meta_policy(value) is value


@pytest.mark.parametrize(
    ("value", "fragments"),
    [
        ([1, 2], ["meta['retryqueue_policy']", "[1, 2]"]),
        ("timeout", ["meta['retryqueue_policy']", "'timeout'"]),
        ({"bogus": {}}, ["meta['retryqueue_policy']", "'bogus'"]),
        ({"poison": {}}, ["meta['retryqueue_policy']", "'poison'"]),
        ({"timeout": 5}, ["meta['retryqueue_policy']['timeout']", "5"]),
        ({"timeout": {"speed": 1}}, ["meta['retryqueue_policy']['timeout']", "'speed'"]),
        (
            {"timeout": {"base_delay": -2}},
            ["meta['retryqueue_policy']['timeout']['base_delay']", "-2"],
        ),
        (
            {"dns": {"max_retries": "many"}},
            ["meta['retryqueue_policy']['dns']['max_retries']", "'many'"],
        ),
        ({"dns": {"retry": 1}}, ["meta['retryqueue_policy']['dns']['retry']", "1"]),
    ],
)
def test_check_meta_policy_errors(value, fragments):
    with pytest.raises(ConfigError) as info:
        _table().check_meta_policy(value)
    for fragment in fragments:
        assert fragment in str(info.value)


# -- Policy.merged ----------------------------------------------------------------

BASE = Policy(True, 3.0, 2.0, 120.0, 5, "equal")


def test_merged_applies_and_converts():
    merged = BASE.merged({"base_delay": 1, "max_retries": 2, "jitter": "none"}, where="w")
    assert merged == Policy(True, 1.0, 2.0, 120.0, 2, "none")
    assert isinstance(merged.base_delay, float)
    # The original is unchanged (frozen).
    assert BASE.max_retries == 5


def test_merged_with_nothing_is_equal():
    assert BASE.merged({}, where="w") == BASE


@pytest.mark.parametrize(
    ("overrides", "fragments"),
    [
        ({"speed": 1}, ["W has unknown field(s) ['speed']", "max_retries"]),
        ({"retry": "yes"}, ["W['retry']", "'yes'"]),
        ({"retry": 1}, ["W['retry']", "1"]),
        ({"jitter": "wild"}, ["W['jitter']", "'wild'"]),
        ({"jitter": None}, ["W['jitter']", "None"]),
        ({"max_retries": -1}, ["W['max_retries']", "-1"]),
        ({"max_retries": 2.0}, ["W['max_retries']", "2.0"]),
        ({"max_retries": True}, ["W['max_retries']", "True"]),
        ({"base_delay": "3"}, ["W['base_delay']", "'3'"]),
        ({"base_delay": -0.5}, ["W['base_delay']", "-0.5"]),
        ({"base_delay": False}, ["W['base_delay']", "False"]),
        ({"base_delay": float("nan")}, ["W['base_delay']", "nan"]),
        ({"max_delay": float("inf")}, ["W['max_delay']", "inf"]),
        ({"multiplier": 0.5}, ["W['multiplier'] must be >= 1", "0.5"]),
        ({"multiplier": 0}, ["W['multiplier'] must be >= 1", "0"]),
        ({"max_delay": 2}, ["W: max_delay (2.0) is below base_delay (3.0)"]),
        ({"base_delay": 200}, ["W: max_delay (120.0) is below base_delay (200.0)"]),
        (7, ["W must be a dict of policy fields", "7"]),
    ],
)
def test_merged_errors(overrides, fragments):
    with pytest.raises(ConfigError) as info:
        BASE.merged(overrides, where="W")
    for fragment in fragments:
        assert fragment in str(info.value)


def test_from_dict_needs_no_base():
    assert Policy.from_dict({"retry": True, "max_delay": 5}, where="w") == Policy(
        True, 0.0, 2.0, 5.0, 0, "equal"
    )
