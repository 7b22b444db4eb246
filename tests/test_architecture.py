"""The package's modules import one another without a cycle, TYPE_CHECKING imports included.

import-linter's layers contract (pyproject.toml) orders the rooms, but it leaves out
TYPE_CHECKING imports and says nothing about modules inside one room: two modules of
``decision`` that import each other, one of them only for an annotation, break no
contract and still cannot be read, tested or moved one without the other. This
check sees every import grimp finds, those in functions and under TYPE_CHECKING too.
"""

from __future__ import annotations

from pathlib import Path
from textwrap import dedent

import grimp
import pytest

PACKAGE = "scrapy_retryqueue"


def parent_child_imports(graph: grimp.ImportGraph) -> set[tuple[str, str]]:
    """The imports that are a package's relation to its own modules, not one between rooms.

    Two kinds, and only these: a package's ``__init__`` that imports (or lazily
    re-exports, PEP 562) a module inside that package, and a module that imports its
    own parent package. A package that re-exports its modules' names, and a module
    that takes one of them from its package, would otherwise be a cycle of every
    package with its modules. What this leaves unseen: a module that takes from its
    parent a name the parent re-exports from a sibling which imports that module
    back is a cycle between the two siblings, hidden behind their parent.
    """
    found = set()
    for importer in graph.modules:
        for imported in graph.find_modules_directly_imported_by(importer):
            if imported.startswith(importer + ".") or importer.rpartition(".")[0] == imported:
                found.add((importer, imported))
    return found


def import_cycles(package: str) -> list[tuple[str, ...]]:
    """Every import cycle between the modules of *package*, each once, as the modules
    along it from the smallest name; imports between a package and its own modules
    (:func:`parent_child_imports`) do not count."""
    graph = grimp.build_graph(package, exclude_type_checking_imports=False, cache_dir=None)
    for importer, imported in parent_child_imports(graph):
        graph.remove_import(importer=importer, imported=imported)
    cycles = set()
    for importer in graph.modules:
        for imported in graph.find_modules_directly_imported_by(importer):
            if imported == importer:
                continue
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back is not None:
                # back runs from imported to importer: the cycle's modules, in order.
                start = back.index(min(back))
                cycles.add(back[start:] + back[:start])
    return sorted(cycles)


def test_the_package_has_no_import_cycle() -> None:
    cycles = import_cycles(PACKAGE)
    assert cycles == [], "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def write_package(root: Path, name: str, modules: dict[str, str]) -> None:
    for module, source in modules.items():
        path = root / name / f"{module.replace('.', '/')}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dedent(source), "utf-8")


def test_a_cycle_through_a_type_checking_import_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = "architecture_probe_cyclic"
    write_package(
        tmp_path,
        name,
        {
            # The package's face and a module that imports it: parent and child.
            "__init__": "from .a import A\nfrom .face import Face\n",
            "face": "from . import A\n\nclass Face(A): ...\n",
            "a": "from .b import make\n\nclass A:\n    made = make\n",
            # b needs a only for an annotation: still a cycle.
            "b": """\
                from __future__ import annotations

                from typing import TYPE_CHECKING

                if TYPE_CHECKING:
                    from .a import A

                def make() -> A: ...
            """,
            "c": "from .a import A\n",
        },
    )
    monkeypatch.syspath_prepend(str(tmp_path))

    assert import_cycles(name) == [(f"{name}.a", f"{name}.b")]


def test_a_cycle_of_three_modules_is_found_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = "architecture_probe_ring"
    write_package(
        tmp_path,
        name,
        {
            "__init__": "",
            "rooms.__init__": "",
            "rooms.x": "from . import y\n",
            "rooms.y": "from .z import Z\n",
            "rooms.z": "def later():\n    from .x import later\n\nclass Z: ...\n",
        },
    )
    monkeypatch.syspath_prepend(str(tmp_path))

    assert import_cycles(name) == [
        (f"{name}.rooms.x", f"{name}.rooms.y", f"{name}.rooms.z"),
    ]


# -- the rooms as docs/architecture.md maps them ----------------------------------------

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIR = ROOT / PACKAGE
#: The most lines a module may hold: one past this holds more than one concern
#: (the house rule is ~500; the margin keeps a module from creeping up to it).
MODULE_LINES_MAX = 500


def package_modules() -> list[str]:
    """Every module of the package as a path below it, migrations (Alembic's) aside."""
    return sorted(
        p.relative_to(PACKAGE_DIR).as_posix()
        for p in PACKAGE_DIR.rglob("*.py")
        if "migrations" not in p.parts
    )


def modules_named_in(doc: str) -> set[str]:
    import re

    return set(re.findall(r"`((?:[a-z_]+/)*[a-z_]+\.py)`", doc))


def test_every_module_is_in_the_architecture_map() -> None:
    named = modules_named_in((ROOT / "docs" / "architecture.md").read_text("utf-8"))
    # A room's __init__ is its section's heading; the others each have their row.
    missing = [
        m
        for m in package_modules()
        if m not in named and not (m.endswith("/__init__.py") and m.count("/") == 1)
    ]
    assert missing == [], f"docs/architecture.md does not name {missing}"


def test_the_architecture_map_names_no_module_that_is_gone() -> None:
    named = modules_named_in((ROOT / "docs" / "architecture.md").read_text("utf-8"))
    gone = [m for m in sorted(named) if not (PACKAGE_DIR / m).exists() and not (ROOT / m).exists()]
    assert gone == [], f"docs/architecture.md names modules that do not exist: {gone}"


def test_the_map_check_sees_a_module_it_does_not_name() -> None:
    assert modules_named_in("| `queue/keys.py` | key names |") == {"queue/keys.py"}
    assert "queue/delayed.py" not in modules_named_in("| `queue/keys.py` | key names |")


def test_no_module_holds_more_than_one_concerns_worth_of_lines() -> None:
    long = {
        m: n
        for m in package_modules()
        if (n := len((PACKAGE_DIR / m).read_text("utf-8").splitlines())) > MODULE_LINES_MAX
    }
    assert long == {}, f"split these by responsibility: {long}"


def test_every_module_says_its_one_concern_in_its_first_line() -> None:
    import ast

    silent = [
        m
        for m in package_modules()
        if not (ast.get_docstring(ast.parse((PACKAGE_DIR / m).read_text("utf-8"))) or "").strip()
    ]
    assert silent == [], f"modules without a docstring naming their concern: {silent}"
