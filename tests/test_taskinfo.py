"""taskinfo: the host Python computes for a task is the one claim.lua used to read
from the envelope, and the value's shape is what claim.lua reads."""

from __future__ import annotations

from typing import Any

import pytest

from scrapy_retryqueue.taskinfo import host_of, taskinfo_value

#: claim.lua's host_of before taskinfo existed, applied to a URL given as ARGV[1]
#: (no keys: it reads nothing in Redis).
_OLD_LUA_HOST_OF = """
local url = ARGV[1]
local authority = string.match(url, '^[%w+.-]+://([^/?#]*)')
if not authority then
  return ''
end
authority = string.gsub(authority, '^.*@', '')
local host = string.match(authority, '^%[([^%]]*)%]') or string.match(authority, '^[^:]*')
return string.lower(host)
"""

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


@pytest.mark.parametrize("url", URLS)
def test_the_host_is_the_one_the_claim_script_used_to_read(redis_client: Any, url: str) -> None:
    old = redis_client.eval(_OLD_LUA_HOST_OF, 0, url)
    old = old.decode() if isinstance(old, bytes) else old
    if " " in old:
        old = ""  # one word in taskinfo; no cooling domain has a space
    assert host_of(url) == old


def test_the_value_is_created_host_and_url() -> None:
    url = "http://user@Shop.test:81/a b"
    assert taskinfo_value(1700, host_of(url), url) == f"1700 shop.test {url}"
    # Not known: empty, so claim.lua applies no longest wait.
    assert taskinfo_value(None, "shop.test", "u") == " shop.test u"
    assert taskinfo_value(-1, "shop.test", "u") == " shop.test u"
    assert taskinfo_value(0, "", "") == "0  "
    assert taskinfo_value(5, "a b", "u") == "5  u"
