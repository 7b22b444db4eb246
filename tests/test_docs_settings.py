"""docs/settings.md lists every setting once, in a table row with its default, and its links
lead somewhere: the reference people read agrees with settings/defaults.py."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

from scrapy_retryqueue.settings.defaults import SETTINGS

ROOT = Path(__file__).resolve().parents[1]
SETTINGS_MD = ROOT / "docs" / "settings.md"
#: A table row that documents a setting: its first cell names it, maybe as a link.
ROW = re.compile(
    r"^\| \[?`(RETRYQUEUE_[A-Z0-9_]+)`(?:\]\([^)]*\))?[^|]*\| ([^|]*) \| ([^|]*) \|", re.M
)


def _rows() -> list[tuple[str, str, str]]:
    return ROW.findall(SETTINGS_MD.read_text("utf-8"))


def _shown(value: object) -> str:
    """A default as the docs write it: Python's literal, strings and lists in double quotes."""
    if isinstance(value, (str, list, dict)):
        return json.dumps(value)
    return repr(value)


def test_every_setting_is_in_exactly_one_table_row() -> None:
    counts = Counter(name for name, _type, _default in _rows())
    assert sorted(set(SETTINGS) - set(counts)) == [], "settings missing from docs/settings.md"
    assert sorted(set(counts) - set(SETTINGS)) == [], "rows of no setting in docs/settings.md"
    assert [name for name, count in counts.items() if count > 1] == []


def test_each_row_shows_the_default() -> None:
    for name, _type, default in _rows():
        shown = re.match(r"`([^`]*)`", default)
        assert shown is not None, f"{name}: no default in {default!r}"
        assert shown.group(1) == _shown(SETTINGS[name]), name


def _slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: Counter[str] = Counter()
    fenced = False
    for line in path.read_text("utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        heading = None if fenced else re.match(r"#{1,6} (.+)", line)
        if heading:
            slug = _slug(heading.group(1))
            found.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
            seen[slug] += 1
    return found


def test_every_link_into_a_doc_names_a_heading_of_it() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    anchors = {page.resolve(): _anchors(page) for page in pages}
    broken = []
    for page in pages:
        for target, anchor in re.findall(r"\]\(([^)\s#]*)#([^)\s]+)\)", page.read_text("utf-8")):
            linked = (page.parent / target).resolve() if target else page.resolve()
            if linked in anchors and anchor not in anchors[linked]:
                broken.append(f"{page.relative_to(ROOT)}: {target}#{anchor}")
    assert broken == []
