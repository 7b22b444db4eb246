"""Redis key names: one namespace and one Redis Cluster slot per spider."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from scrapy_retryqueue.keys import all_keys, keys_for


def test_key_names():
    keys = keys_for("quotes")
    assert keys.spider == "quotes"
    assert keys.due == "retryqueue:{quotes}:due"
    assert keys.leased == "retryqueue:{quotes}:leased"
    assert keys.tasks == "retryqueue:{quotes}:tasks"
    assert keys.owners == "retryqueue:{quotes}:owners"
    assert keys.reclaims == "retryqueue:{quotes}:reclaims"
    assert keys.dead == "retryqueue:{quotes}:dead"
    assert keys.deadtasks == "retryqueue:{quotes}:deadtasks"
    assert keys.events == "retryqueue:{quotes}:events"
    assert keys.domains == "retryqueue:{quotes}:domains"
    assert keys.cooling == "retryqueue:{quotes}:cooling"
    assert keys.bursts == "retryqueue:{quotes}:bursts"
    assert keys.probes == "retryqueue:{quotes}:probes"


def test_all_keys_lists_every_key_once():
    keys = keys_for("quotes")
    listed = all_keys(keys)
    fields = [v for k, v in ((f, getattr(keys, f)) for f in keys.__slots__) if k != "spider"]
    assert sorted(listed) == sorted(fields)
    assert len(set(listed)) == len(listed) == 12


@pytest.mark.parametrize("spider", ["quotes", "books-toscrape", "a:b", "x" * 200, "ünïcødé"])
def test_all_keys_share_one_cluster_slot(spider):
    keys = all_keys(keys_for(spider))
    slots = {key_slot(k.encode("utf-8")) for k in keys}
    assert len(slots) == 1
    # The slot is the slot of the hash tag alone.
    assert slots == {key_slot(spider.encode("utf-8"))}


def test_different_spiders_have_different_namespaces():
    a, b = keys_for("alpha"), keys_for("beta")
    assert not set(all_keys(a)) & set(all_keys(b))


@pytest.mark.parametrize("spider", ["", "a{b", "a}b", "{x}"])
def test_spider_name_that_breaks_the_hash_tag_is_refused(spider):
    with pytest.raises(ValueError, match="hash tag") as info:
        keys_for(spider)
    assert repr(spider) in str(info.value)
