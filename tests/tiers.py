"""Which tier a test is in: unit, integration or e2e (a pytest marker each).

- ``e2e``: runs a real crawl in a subprocess: its module is marked e2e, or the
  test, one of its fixtures or a helper they call launches ``scrapy crawl``
  (tests/crawling.py's helpers, ``python -m scrapy.cmdline crawl``) or a
  ``*_crawl.py`` script.
- ``integration``: talks to Redis or PostgreSQL (it uses one of
  ``SERVER_FIXTURES``, directly or through other fixtures), or is marked
  integration (it starts a server of its own: the embedded valkey, the flaky site).
- ``unit``: everything else. It needs no server: ``make test-unit`` runs the tier
  with the servers' URLs on a closed port, so a unit test that talks to one fails.

A test marked unit that turns out to need more is a usage error, not a silent
promotion: the unit tier must stay runnable without servers.
"""

from __future__ import annotations

import types
from typing import Any

import pytest

from . import crawling

TIERS = ("unit", "integration", "e2e")
#: The fixtures that reach a shared server. Tests get every fixture their fixtures
#: use (item.fixturenames is the closure), so the ones built on these (redis_client,
#: spider_name, queue, make_task, new_pg_database, database_url, dashboard_data, ...)
#: count without being listed.
SERVER_FIXTURES = frozenset({"redis_url", "redis_cluster_url", "pg_admin_url"})
#: What launches a crawl in a subprocess: the helpers of tests/crawling.py ...
CRAWL_LAUNCHERS = (crawling.crawl, crawling.start_crawl)
#: ... and these string constants: ``python -m scrapy.cmdline crawl``, a crawl script.
CRAWL_SCRIPT_SUFFIX = "_crawl.py"


def _code_launches_crawl(code: types.CodeType, scope: dict[str, Any], seen: set[int]) -> bool:
    consts = [c for c in code.co_consts if isinstance(c, str)]
    if any(c.endswith(CRAWL_SCRIPT_SUFFIX) for c in consts) or (
        "scrapy.cmdline" in consts and "crawl" in consts
    ):
        return True
    names = set(code.co_names)
    if "crawling" in names and names & {"crawl", "start_crawl"}:
        return True  # a local ``from .crawling import crawl``
    for name in names:
        if _launches_crawl(scope.get(name), seen):
            return True
    return any(
        _code_launches_crawl(c, scope, seen)
        for c in code.co_consts
        if isinstance(c, types.CodeType)  # lambdas and nested functions
    )


def _launches_crawl(obj: Any, seen: set[int]) -> bool:
    """Whether *obj* (a test, a fixture, or a helper of the tests they call) runs a crawl."""
    if any(obj is launcher for launcher in CRAWL_LAUNCHERS):
        return True
    obj = getattr(obj, "__wrapped__", obj)
    code = getattr(obj, "__code__", None)
    module = getattr(obj, "__module__", None) or ""
    if code is None or id(code) in seen or not module.startswith(__package__ or "tests"):
        return False
    seen.add(id(code))
    return _code_launches_crawl(code, obj.__globals__, seen)


def _runs_crawl(item: pytest.Item) -> bool:
    seen: set[int] = set()
    if _launches_crawl(getattr(item, "function", None), seen):
        return True
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs if info is not None else {}
    return any(
        _launches_crawl(d.func, seen) for name in item.fixturenames for d in defs.get(name, ())
    )


def tier_of(item: pytest.Item) -> str:
    """The item's tier: what it needs, or the closest tier marker when that says more."""
    marked = next((m.name for m in item.iter_markers() if m.name in TIERS), None)
    if _runs_crawl(item):
        needs = "e2e"
    elif SERVER_FIXTURES.intersection(item.fixturenames):
        needs = "integration"
    else:
        needs = "unit"
    if marked == "unit" and needs != "unit":
        raise pytest.UsageError(f"{item.nodeid} is marked unit but is an {needs} test")
    return max(needs, marked or "unit", key=TIERS.index)


def mark_tiers(items: list[pytest.Item]) -> None:
    """Give every test exactly one tier marker."""
    tiers = [tier_of(item) for item in items]
    # Exactly one each: a module's marker (integration) must not also select a
    # test of it marked otherwise (unit), so tier markers stay on the tests only.
    for item, tier in zip(items, tiers, strict=True):
        for node in item.listchain():
            node.own_markers[:] = [m for m in node.own_markers if m.name not in TIERS]
        item.add_marker(tier)
