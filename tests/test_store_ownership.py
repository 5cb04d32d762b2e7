"""A service reaches only its tables (docs/architecture.md, "A service reaches only its
tables"): each query module of ``coordinator/store/`` names the modules it serves
(``OWNERS``, ``LENT_TO``), and no other module imports it or reaches one of its objects
(``<name>_sql``); ``rules.py`` wires them all. The core holds no statement about a table."""
from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

from conftest import SRC

COORDINATOR = SRC / "coordinator"
STORE = COORDINATOR / "store"
SHARED = {"__init__", "core", "drivers", "outage", "counts", "facts"}  # the core and the SQL the query modules share
WIRING = {"rules.py"}  # hands every service its query objects
QUERY_MODULES = sorted(p.stem for p in STORE.glob("*.py") if p.stem not in SHARED)


def _users(name: str) -> set[str]:
    module = importlib.import_module(f"device_loop.coordinator.store.{name}")
    return {*module.OWNERS, *module.LENT_TO}


def _reached(path: Path) -> set[str]:
    """The query modules ``path`` imports, or whose objects (``hosts_sql``, ...) it names."""
    reached = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            parts = node.module.split(".")
            if "store" in parts:
                below = parts[parts.index("store") + 1:]
                reached |= {below[0]} if below else {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            reached |= {a.name.split("store.", 1)[1].split(".")[0] for a in node.names if ".store." in a.name}
        name = node.attr if isinstance(node, ast.Attribute) else node.arg if isinstance(node, ast.arg) else \
            node.id if isinstance(node, ast.Name) else None
        if name and name.endswith("_sql"):
            reached.add(name.removesuffix("_sql"))
    return reached & set(QUERY_MODULES)


def _modules() -> list[Path]:
    """Every module of ours outside the store package (the tests aside)."""
    return [p for folder in ("coordinator", "cli", "client", "exporter", "core", "plugins", "bench")
            for p in (SRC / folder).rglob("*.py") if STORE not in p.parents]


def test_each_query_module_is_reached_only_by_the_modules_it_names():
    wrong = []
    for path in _modules():
        user = path.relative_to(COORDINATOR).as_posix() if COORDINATOR in path.parents else None
        if user in WIRING:
            continue
        for name in sorted(_reached(path)):
            if user not in _users(name):
                wrong.append(f"{path.relative_to(SRC)} reaches store/{name}.py, which serves "
                             f"{sorted(_users(name))}: call the owning service, or lend it in rules.py "
                             "and name the borrower in LENT_TO")
    assert not wrong, "\n".join(wrong)


def test_the_modules_named_are_there_and_use_what_they_are_handed():
    for name in QUERY_MODULES:
        for user in _users(name):
            path = COORDINATOR / user
            assert path.exists(), f"store/{name}.py names {user}, which is no coordinator module"
            assert name in _reached(path), f"store/{name}.py names {user}, which does not use it: drop it"


def test_the_core_holds_no_statement_about_a_table():
    from device_loop.coordinator.store import core

    source = inspect.getsource(core)
    tables = {"hosts", "devices", "leases", "operations", "tickets", "jobs", "images", "tokens", "audit",
              "idempotency", "user_counts", "candidates", "adoptions", "resources", "device_ring"}
    named = {t for t in tables for keyword in ("FROM", "INTO", "UPDATE") if f"{keyword} {t} " in source}
    assert not named, f"store/core.py has statements about {sorted(named)}: they belong in their query modules"
