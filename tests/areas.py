"""The areas of the code a test touches, as markers: ``./lab test --area uart`` (or ``pytest -m
uart``) runs the tests of one area after a change there (docs/architecture.md, "Testing").

An area is a package of device-loop: ``core``, ``coordinator``, ``store`` and ``web`` (the
coordinator's database and pages), ``exporter``, ``cli``, ``client``, and each built-in plugin
by its folder's name (``uart``, ``adb``, ``qemu``...). A test module is in each area it imports
from, directly or through the tests' own helper modules (``lab_in_process`` brings the
coordinator), and in each its name says (``test_flash_recovery.py``: ``flash``); a test is in
the areas its fixtures start too (``coordinator``, ``exporters``).
A module that touches no area (the suite's own rules, the repository's shape) is in ``suite``.
Nothing is listed by hand, so a new test is in its areas the moment it imports them.
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = "device_loop"
TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

#: device_loop's subpackages that are areas of their own, where their parent is one too.
SUBAREAS = {("coordinator", "store"): "store", ("coordinator", "web"): "web"}

#: The area of a test module that touches no other.
SUITE = "suite"

#: The areas a fixture's processes are made of.
FIXTURE_AREAS = {"coordinator": {"coordinator", "store", "cli"},
                 "exporters": {"exporter", "sim", "uart", "cli"}}


def all_areas() -> dict[str, str]:
    """Every area: its marker's name -> what it is."""
    areas = {name: f"device_loop.{name}" for name in ("core", "coordinator", "exporter", "cli", "client")}
    areas |= {name: f"device_loop.{'.'.join(path)}" for path, name in SUBAREAS.items()}
    areas |= {p.name: f"the {p.name} plugin" for p in sorted((ROOT / "plugins").iterdir())
              if p.is_dir() and (p / "__init__.py").exists()}
    return areas | {SUITE: "the suite's own rules and the repository's shape"}


def area_of(module: str) -> str | None:
    """The area of a module of device_loop (``device_loop.plugins.uart.ser2net`` -> ``uart``),
    None for one of no area (the package's root)."""
    parts = module.split(".")
    if parts[0] != PACKAGE or len(parts) < 2:
        return None
    if parts[1] == "plugins":
        return parts[2] if len(parts) > 2 else None
    if len(parts) > 2 and tuple(parts[1:3]) in SUBAREAS:
        return SUBAREAS[tuple(parts[1:3])]
    return parts[1] if parts[1] in all_areas() else None


def _imported(path: Path) -> set[str]:
    """The modules a file imports (``from X import a`` counts ``X`` and ``X.a``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


@functools.cache
def module_areas(path: Path) -> frozenset[str]:
    """The areas the test file (or helper module) at ``path`` imports from, through the tests'
    own helper modules too (but conftest.py, which every test has), and those its name says."""
    areas = set(path.stem.split("_")) & all_areas().keys()
    for name in _imported(path):
        area = area_of(name)
        if area:
            areas.add(area)
        local = TESTS / f"{name}.py"
        if "." not in name and name != "conftest" and local.exists() and local != path:
            areas |= module_areas(local)
    return frozenset(areas)


def item_areas(path: Path, fixtures) -> set[str]:
    """The areas of one test: its module's, and those of the fixtures it uses."""
    areas = set(module_areas(path))
    for fixture in fixtures:
        areas |= FIXTURE_AREAS.get(fixture, set())
    return areas or {SUITE}


if __name__ == "__main__":  # ./lab test --area: refuse a name that is no area, listing those that are
    import sys

    unknown = [name for name in sys.argv[1:] if name not in all_areas()]
    if unknown:
        sys.exit(f"no such area: {', '.join(unknown)} (areas: {' '.join(all_areas())})")
