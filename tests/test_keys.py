"""Redis key names and lease tokens: one namespace and one Redis Cluster slot per spider."""

from __future__ import annotations

import fnmatch

import pytest
from redis.crc import key_slot

from scrapy_retryqueue.queue.keys import (
    all_keys,
    frontier_keys,
    keys_for,
    lease_owner,
    lease_prefix,
    lease_token,
    queue_of,
    scan_pattern,
    spider_of,
)
from scrapy_retryqueue.settings.names import project_name


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
    assert keys.taskinfo == "retryqueue:{quotes}:taskinfo"
    assert keys.deadkinds == "retryqueue:{quotes}:deadkinds"
    assert keys.domains == "retryqueue:{quotes}:domains"
    assert keys.cooling == "retryqueue:{quotes}:cooling"
    assert keys.bursts == "retryqueue:{quotes}:bursts"
    assert keys.probes == "retryqueue:{quotes}:probes"
    assert keys.frontier == "retryqueue:{quotes}:frontier"
    assert keys.frontier_requests == "retryqueue:{quotes}:frontier:requests"
    assert keys.frontier_leased == "retryqueue:{quotes}:frontier:leased"
    assert keys.frontier_seen == "retryqueue:{quotes}:frontier:seen"
    assert keys.frontier_quarantine == "retryqueue:{quotes}:frontier:quarantine"
    assert keys.frontier_finished == "retryqueue:{quotes}:frontier:finished"
    assert keys.budget == "retryqueue:{quotes}:budget"
    assert keys.versions == "retryqueue:{quotes}:versions"
    assert keys.finished == "retryqueue:{quotes}:finished"


def test_all_keys_lists_every_key_once():
    keys = keys_for("quotes")
    listed = all_keys(keys)
    fields = [
        v
        for k, v in ((f, getattr(keys, f)) for f in keys.__slots__)
        if k not in ("spider", "project")
    ]
    assert sorted(listed) == sorted(fields)
    assert len(set(listed)) == len(listed) == 29


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


@pytest.mark.parametrize("spider", ["quotes", "a:b", "ünïcødé"])
def test_every_key_names_its_spider_and_matches_the_scan_patterns(spider):
    keys = keys_for(spider)
    assert keys.namespace == f"retryqueue:{{{spider}}}"
    for key in all_keys(keys):
        assert spider_of(key) == spider
        assert spider_of(key.encode()) == spider
        assert fnmatch.fnmatchcase(key, scan_pattern())
    assert fnmatch.fnmatchcase(keys.events, scan_pattern("events"))
    assert not fnmatch.fnmatchcase(keys.due, scan_pattern("events"))


@pytest.mark.parametrize("key", ["other:{a}:due", "retryqueue:a:due", "retryqueue:{}:due", "x"])
def test_a_key_of_no_spider(key):
    assert spider_of(key) is None


@pytest.mark.parametrize("spider", ["quotes", "a:b", "ünïcødé"])
def test_a_project_namespace_stands_before_the_hash_tag(spider):
    keys = keys_for(spider, "books")
    assert keys.project == "books" and keys.spider == spider
    assert keys.due == f"retryqueue:books:{{{spider}}}:due"
    assert keys.namespace == f"retryqueue:books:{{{spider}}}"
    # Two projects' spiders of one name never share a key...
    assert not set(all_keys(keys)) & set(all_keys(keys_for(spider, "quotes")))
    assert not set(all_keys(keys)) & set(all_keys(keys_for(spider)))
    # ...but share the spider's slot, with the layout without a namespace too.
    slots = {key_slot(k.encode()) for k in [*all_keys(keys), *all_keys(keys_for(spider))]}
    assert slots == {key_slot(spider.encode("utf-8"))}
    for key in all_keys(keys):
        assert queue_of(key) == ("books", spider)
        assert spider_of(key) == spider == spider_of(key, "books")
        assert spider_of(key, "quotes") is None and spider_of(key, "") is None
        assert fnmatch.fnmatchcase(key, scan_pattern(project="books"))
        assert fnmatch.fnmatchcase(key, scan_pattern())  # every project
        assert not fnmatch.fnmatchcase(key, scan_pattern(project=""))
        assert not fnmatch.fnmatchcase(key, scan_pattern(project="quotes"))
    assert fnmatch.fnmatchcase(keys.events, scan_pattern("events", "books"))
    assert not fnmatch.fnmatchcase(keys_for(spider).events, scan_pattern("events", "books"))
    assert queue_of(keys_for(spider).due) == ("", spider)
    assert spider_of(keys_for(spider).due, "") == spider


@pytest.mark.parametrize("project", ["a:b", "a{b", "a b", "x" * 65, "a*"])
def test_a_namespace_a_key_cannot_hold_is_refused(project):
    with pytest.raises(ValueError, match="RETRYQUEUE_NAMESPACE"):
        keys_for("quotes", project)


def test_a_bot_name_becomes_a_namespace():
    assert project_name("books") == "books"
    assert project_name("my bot:v2") == "my_bot_v2"
    assert project_name("") == ""


def test_a_scan_pattern_names_a_key_of_the_namespace():
    with pytest.raises(ValueError, match="'nope'"):
        scan_pattern("nope")


@pytest.mark.parametrize("project", ["", "books"])
def test_the_frontiers_keys_follow_the_project_namespace(project):
    keys = keys_for("quotes", project)
    listed = frontier_keys(keys)
    assert len(listed) == 10 and set(listed) <= set(all_keys(keys))
    assert keys.frontier_requests == f"{keys.namespace}:frontier:requests"
    for key in listed:
        assert key.startswith(f"{keys.namespace}:frontier")
        # A frontier key holds a ':' after its name too: still of this spider and project.
        assert queue_of(key) == (project, "quotes")
    # One key's scan pattern names that key only (not every key whose name ends the same).
    pattern = scan_pattern("frontier_requests", project)
    assert fnmatch.fnmatchcase(keys.frontier_requests, pattern)
    assert not fnmatch.fnmatchcase(keys.frontier_owners, pattern)
    assert not fnmatch.fnmatchcase(keys.tasks, scan_pattern("frontier", project))
    other = keys_for("quotes", "quotes" if project else "books")
    assert not set(listed) & set(frontier_keys(other))


def test_a_lease_token_names_the_node_that_holds_it():
    prefix = lease_prefix("host:4242")
    assert prefix.startswith("host:4242:") and len(prefix) == len("host:4242:") + 12
    assert lease_prefix("host:4242") != prefix  # another process of the same node
    token = lease_token(prefix, 7)
    assert token == f"{prefix}:7"
    assert lease_owner(token) == lease_owner(token.encode()) == "host:4242"
