"""What no Lua script of the package may do: parse JSON text, read an envelope's
text, or spell a kind's name (kinds come from ARGV, from scrapy_retryqueue.decision.kinds)."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import pytest

from scrapy_retryqueue.decision import kinds

PACKAGE = Path(str(resources.files("scrapy_retryqueue")))
SCRIPTS = sorted(PACKAGE.rglob("*.lua"))

#: A header line naming a key: "-- KEYS[3] tasks HASH task id -> envelope".
_KEY_LINE = re.compile(r"^--\s+KEYS\[(\d+)\]\s+(.*)$", re.M)
#: "local a, b = redis.call('HGET', KEYS[3], ...)" and the like.
_READ = re.compile(
    r"(?:local\s+)?([\w\s,]+?)\s*=\s*redis\.p?call\(\s*'(?:HGET|HMGET|HVALS|HGETALL)'\s*,"
    r"\s*KEYS\[(\d+)\]"
)
_STRING_CALL = re.compile(r"(?:string\.(?:match|find|gmatch|sub|gsub)|\bunpack)\(\s*([\w.\[\]]+)")
_METHOD_CALL = re.compile(r"\b([\w]+)(?:\[[^\]]*\])?:(?:match|find|gmatch|sub|gsub)\(")


def _code(path: Path) -> str:
    """The script without its comments."""
    return "\n".join(line.split("--", 1)[0] for line in path.read_text("utf-8").splitlines())


def _envelope_names(path: Path) -> set[str]:
    """Variables a script binds to envelopes: read from a key its header says holds them."""
    source = path.read_text("utf-8")
    envelope_keys = {i for i, text in _KEY_LINE.findall(source) if "envelope" in text}
    names = {"envelope", "envelopes"}
    for bound, key in _READ.findall(_code(path)):
        if key in envelope_keys:
            names |= {name.strip() for name in bound.split(",")}
    return names


def test_the_scripts_are_found() -> None:
    assert len(SCRIPTS) >= 13


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_no_script_decodes_json(path: Path) -> None:
    assert "cjson.decode" not in _code(path), f"{path.name} parses JSON text"


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_no_script_reads_an_envelopes_text(path: Path) -> None:
    code = _code(path)
    names = _envelope_names(path)
    for match in _STRING_CALL.finditer(code):
        if match.group(0).startswith("unpack"):
            continue
        target = re.split(r"[\[.]", match.group(1))[0]
        assert target not in names, f"{path.name}: {match.group(0)}... reads an envelope"
    for target in _METHOD_CALL.findall(code):
        assert target not in names, f"{path.name}: {target}:... reads an envelope"


def test_the_envelope_check_sees_an_envelope_read() -> None:
    # The check itself: the way claim.lua once read a task's host is caught.
    tmp = PACKAGE / "queue" / "lua" / "claim.lua"
    names = _envelope_names(tmp)
    assert {"envelope", "envelopes"} <= names
    old = """local url = string.match(envelope, '"request":{"url":"([^"]*)"')"""
    assert _STRING_CALL.search(old).group(1) == "envelope"  # type: ignore[union-attr]


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_no_script_spells_a_builtin_kind(path: Path) -> None:
    literals = set(re.findall(r"'([^'\n]*)'|\"([^\"\n]*)\"", _code(path)))
    found = {a or b for a, b in literals}
    spelled = found & {kind.name for kind in kinds.BUILTIN}
    assert not spelled, f"{path.name} spells kinds {sorted(spelled)}; pass them as ARGV"
