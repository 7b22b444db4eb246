"""taskinfo: the host Python keeps for a task is the breaker's name of its domain,
and the value's shape is what claim.lua reads."""

from __future__ import annotations

import pytest
from scrapy import Request
from scrapy.utils.httpobj import urlparse_cached

from scrapy_retryqueue.queue.taskinfo import host_of, taskinfo_value
from scrapy_retryqueue.store.writer import domain_of

URLS = [
    "http://Shop.Test:8080/a",
    "https://user@shop.test/b?x=1",
    "https://user:p@ss@Shop.test:1/",
    "http://[::1]:8080/x",
    "http://[2001:DB8::1]/",
    "http://[::1/broken",
    "ftp://files.example/pub",
    "svn+ssh://host.example/repo",
    "HTTP://EXAMPLE.COM",
    "http://example.com?q=1",
    "http://example.com#frag",
    "http://:80/",
    "http://",
    "example.com/no-scheme",
    "data:text/plain,hello",
    "",
    "http://xn--bcher-kva.example/",
    "http://exa mple.com/",
]


@pytest.mark.parametrize("url", [*URLS, "http://a@b@c.com/", "http://Shop.Test.:1/"])
def test_the_host_is_the_breakers_name_of_the_domain(url: str) -> None:
    # The breaker names a cooling domain urlparse_cached(request).hostname; the
    # claim holds a task whose taskinfo host is that name, and the store's domain
    # column is the same word.
    try:
        breaker = urlparse_cached(Request(url)).hostname or ""
    except ValueError:  # not a URL Scrapy takes: no request, no domain
        breaker = ""
    if any(c.isspace() for c in breaker):
        breaker = ""
    assert host_of(url) == breaker
    assert domain_of(url) == (breaker or None)


@pytest.mark.parametrize("url", [u for u in URLS if u and "://" in u and "[::1/" not in u])
def test_the_planners_host_from_the_cached_parse_is_host_of_the_url(url: str, tmp_path) -> None:
    # The planner takes the host from the parse Scrapy's downloader cached: it must
    # be what host_of(task.url) would have said, or the claim misses cooling tasks.
    from scrapy import Spider

    from scrapy_retryqueue.decision.classify import FailureInfo
    from scrapy_retryqueue.queue.delayed import Write

    from .runtimes import unopened_runtime

    runtime = unopened_runtime(type("HostSpider", (Spider,), {"name": "hosts"}), tmp_path)
    plan = runtime.planner.plan(Request(url), FailureInfo("not_found", "HttpError", "404"))
    write = Write.for_task(plan.op, plan.task, plan.token, plan.now, host=plan.host)
    assert plan.host == host_of(url) == write.host


def test_the_value_is_created_host_and_url() -> None:
    url = "http://user@Shop.test:81/a b"
    assert taskinfo_value(1700, host_of(url), url) == f"1700 shop.test {url}"
    # Not known: empty, so claim.lua applies no longest wait.
    assert taskinfo_value(None, "shop.test", "u") == " shop.test u"
    assert taskinfo_value(-1, "shop.test", "u") == " shop.test u"
    assert taskinfo_value(0, "", "") == "0  "
    assert taskinfo_value(5, "a b", "u") == "5  u"
    assert taskinfo_value(5, "a\u3000b", "u") == "5  u"  # whitespace beyond ASCII too
    assert taskinfo_value(5, "a\u200bb", "u") == "5 a\u200bb u"  # a zero-width space is none
