"""The static checks, run by the suite so that `./lab test` runs them: ruff (lint) and mypy
(types), each as configured in pyproject.toml (import-linter's contracts: tests/test_layers.py);
and the comments' citations, which name only what the repository holds: sections of
docs/architecture.md and of the README, by headings that exist."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SRC

pytestmark = pytest.mark.service  # (the tools run as processes)

BIN = Path(sys.executable).parent  # the virtualenv's: the test extra installs the tools there
ARCHITECTURE = SRC / "docs" / "architecture.md"
# written in two pieces, so that this file does not say them itself
OUTSIDE = ("DESIGN" + " §", "../" + "shared")
# a citation: the document's path, a comma (or none) and a heading in double quotes, on
# the same line or, in a wrapped comment, the next
CITATION = re.compile(r'docs/architecture\.md,?[ \t]*(?:\n[ \t]*(?:#[ \t]*)?)?"([^"\n]+)"')
README = SRC / "README.md"
README_CITATION = re.compile(r'\bREADME(?:\.md)?,?[ \t]*(?:\n[ \t]*(?:#[ \t]*)?)?"([^"\n]+)"')
SKIPPED_DIRS = {".git", ".venv", "__pycache__", "node_modules"}


def _run(tool: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    path = BIN / tool
    if not path.exists():
        pytest.fail(f"{path} is missing: install the test extra (pip install -e '.[test]', as ./lab test does)")
    return subprocess.run([str(path), *args], cwd=SRC, capture_output=True, text=True, timeout=timeout)


def _said(result: subprocess.CompletedProcess) -> str:
    return (result.stdout[-12000:] + result.stderr[-4000:]).strip()


def test_ruff_finds_nothing():
    result = _run("ruff", "check", "--output-format", "concise", timeout=120)
    assert result.returncode == 0, f"ruff check:\n{_said(result)}"


@pytest.mark.timeout(300)  # a first run, with no cache yet, takes half a minute on two cores
def test_mypy_finds_nothing_and_holds_the_built_in_plugins_to_the_hookspecs(tmp_path):
    """mypy on the package, then on a module of calls of each built-in plugin's hooks as the
    exporter makes them (``_hook_checks``): one test, so that the second run finds the first's
    cache (two runs on two workers each analysed the whole package, cold in a fresh clone)."""
    result = _run("mypy", timeout=280)
    assert result.returncode == 0, f"mypy:\n{_said(result)}"
    checks = tmp_path / "hook_checks.py"
    checks.write_text(_hook_checks())
    result = subprocess.run([str(BIN / "mypy"), "--config-file", str(SRC / "pyproject.toml"), "--cache-dir",
                             str(SRC / ".mypy_cache"), str(checks)], cwd=SRC, capture_output=True, text=True,
                            timeout=280, env={**os.environ, "MYPYPATH": str(SRC)})
    assert result.returncode == 0, f"mypy, on the built-in plugins' hooks against the hookspecs:\n{_said(result)}"


def _repository_files() -> list[Path]:
    """The repository's files as git sees them (tracked, and new ones not ignored), else
    every file outside .git, .venv and caches."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=SRC,
                                capture_output=True, timeout=60, check=True).stdout
        names = {name for name in listed.decode().split("\0") if name}
    except (OSError, subprocess.SubprocessError):
        names = set()
        for folder, dirs, files in os.walk(SRC):
            dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS and not d.endswith((".egg-info", "_cache"))]
            names |= {os.path.relpath(os.path.join(folder, f), SRC) for f in files}
    return [SRC / name for name in sorted(names) if (SRC / name).is_file() and not (SRC / name).is_symlink()]


def _texts() -> dict[str, str]:
    texts = {}
    for path in _repository_files():
        data = path.read_bytes()
        if b"\0" not in data[:8192]:  # text, not a picture
            texts[str(path.relative_to(SRC))] = data.decode(errors="replace")
    return texts


def _headings(markdown: str) -> set[str]:
    headings, fenced = set(), False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (match := re.match(r"#{1,6}\s+(.+?)\s*#*\s*$", line)):
            headings.add(match.group(1))
    return headings


def test_nothing_cites_a_document_outside_the_repository():
    found = [f"{name}:{n}: {line.strip()}" for name, text in _texts().items()
             for n, line in enumerate(text.splitlines(), start=1) if any(s in line for s in OUTSIDE)]
    assert not found, ("these cite documents the repository does not hold; cite a section of docs/architecture.md "
                       "instead, as (docs/architecture.md, \"Heading\"):\n" + "\n".join(found))


def _citations(pattern: re.Pattern) -> list[tuple[str, int, str]]:
    """(file, line, heading) of each citation ``pattern`` finds in the repository's files."""
    return [(name, text.count("\n", 0, match.start()) + 1, match.group(1))
            for name, text in _texts().items() for match in pattern.finditer(text)]


def _cited_headings_missing(document: Path, citations: list[tuple[str, int, str]]) -> str:
    """What ``citations`` cite that ``document`` has no heading of, or "" (saying what it has)."""
    headings = _headings(document.read_text())
    wrong = [f"{name}:{line}: \"{heading}\"" for name, line, heading in citations if heading not in headings]
    return (f"{document.relative_to(SRC)} has no such heading (it has: {', '.join(sorted(headings))}):\n"
            + "\n".join(wrong)) if wrong else ""


def test_each_citation_of_the_architecture_names_one_of_its_headings():
    citations = _citations(CITATION)
    assert len(citations) >= 10, f"the citations were not found (the pattern is out of date?): {citations}"
    assert not (missing := _cited_headings_missing(ARCHITECTURE, citations)), missing


def test_each_citation_of_the_readme_names_one_of_its_headings():
    """A citation of the README (the word, a comma, a heading in double quotes), pyproject.toml's included,
    names a heading the README has."""
    citations = _citations(README_CITATION)
    assert {name for name, _, _ in citations} >= {"pyproject.toml"}, \
        f"the citations were not found (the pattern is out of date?): {citations}"
    assert not (missing := _cited_headings_missing(README, citations)), missing
    assert _cited_headings_missing(README, [("x.py", 1, "Jobs and evidence")]), "a heading it lacks is found"


def _built_in_hooks() -> list[tuple[str, str, str, object]]:
    """(plugin, its module, its class or "", the object whose hook it is) for each hook of each built-in plugin."""
    import importlib
    import tomllib

    from device_loop.core.plugins import HOOKS

    entry_points = tomllib.loads((SRC / "pyproject.toml").read_text())["project"]["entry-points"]["device_loop"]
    found = []
    for plugin, target in sorted(entry_points.items()):
        module_name, _, class_name = target.partition(":")
        holder = importlib.import_module(module_name)
        holder = getattr(holder, class_name) if class_name else holder
        found += [(plugin, module_name, class_name, getattr(holder, hook)) for hook in sorted(HOOKS)
                  if hasattr(holder, hook)]
    return found


def _hook_checks() -> str:
    """A module for mypy alone (never run): for each hook of each built-in plugin, a call
    as the exporter makes it (what the hookspec hands, by name: a hook may take a subset),
    its answer assigned to what the hookspec says it may answer."""
    import inspect

    from device_loop.core import hookspecs

    names: set[str] = set()
    lines: list[str] = []
    for plugin, module_name, class_name, impl in _built_in_hooks():
        hook = impl.__name__
        spec = inspect.signature(getattr(hookspecs, hook))
        taken = [p for p in inspect.signature(impl).parameters if p != "self"]
        annotations = [spec.parameters[p].annotation for p in taken] + [spec.return_annotation]
        names.update(re.findall(r"[A-Za-z_]\w*", " ".join(annotations)))
        params = [f"{p}: {spec.parameters[p].annotation}" for p in taken]
        if class_name:
            params.insert(0, f"plugin: {module_name}.{class_name}")
        lines += [f"import {module_name}",
                  f"def _{plugin}_{hook}({', '.join(params)}) -> None:",
                  f"    answer: {spec.return_annotation} = {'plugin' if class_name else module_name}.{hook}("
                  + ", ".join(f"{p}={p}" for p in taken) + ")"]
    builtins = {"None", "str", "float", "int", "dict", "list", "type", "object", "bool"}
    return "\n".join(["from __future__ import annotations",
                      f"from device_loop.core.hookspecs import {', '.join(sorted(names - builtins))}", *lines]) + "\n"


def test_the_built_in_plugins_hooks_are_annotated():
    """Every hook of a built-in plugin says what it takes and answers (so mypy holds its body to that too)."""
    import inspect

    bare = [f"{plugin}.{impl.__name__}" for plugin, _, _, impl in _built_in_hooks()
            if (signature := inspect.signature(impl)).return_annotation is inspect.Signature.empty
            or any(p.annotation is inspect.Parameter.empty for name, p in signature.parameters.items() if name != "self")]
    assert not bare, f"hooks without annotations: {', '.join(bare)}"


def test_mypy_wants_every_function_typed_in_core_the_plugin_api_and_the_services():
    """``disallow_untyped_defs`` covers core/, the plugin API, and rules.py with each service it
    composes (their statements' store may follow): a new service is typed from its first line."""
    import tomllib

    overrides = tomllib.loads((SRC / "pyproject.toml").read_text())["tool"]["mypy"]["overrides"]
    strict = {module for override in overrides if override.get("disallow_untyped_defs")
              for module in override["module"]}
    services = set(re.findall(r"^from \.(\w+) import", (SRC / "coordinator" / "rules.py").read_text(), re.M))
    wanted = {"device_loop.core.*", "device_loop.plugin", "device_loop.coordinator.rules",
              *(f"device_loop.coordinator.{name}" for name in services if not name.startswith("store"))}
    assert sorted(wanted - strict) == []


# ---- kinds are named where they are declared (docs/architecture.md, "Operations") ----------------------------

#: The modules that declare kinds, and may spell their names: the shared constants (FLASH_KIND, POWER_KIND,
#: SETTLE_KIND, REFLASH_STEP), the vocabulary (Purpose.SETTLE, AutoRecover.POWER_CYCLE), the built-in steps'
#: models (exporter/config.py: a step's model is its name), the migrations (history, written once) and the call
#: table (it declares the calls named after kinds: flash, power, settle). A kind's own plugin is outside the scan.
KIND_DECLARING = {"core/__init__.py", "core/vocabulary.py", "exporter/config.py", "coordinator/migrations.py",
                  "coordinator/calls.py"}
#: Where the generic machinery lives: no kind's name is spelled there.
KIND_SCANNED = ("core", "coordinator", "exporter", "device_loop")


def _kind_names() -> set[str]:
    from device_loop.core import FLASH_KIND, ORPHANS_KIND, POWER_KIND, REFLASH_STEP, SETTLE_KIND
    from device_loop.exporter.config import BUILT_IN_STEPS

    # "command" is a step's name and a word of everything else (a holder's command line, an endpoint's
    # command template): its step is held by its model's Literal alone
    return {FLASH_KIND, POWER_KIND, SETTLE_KIND, REFLASH_STEP, ORPHANS_KIND, *BUILT_IN_STEPS} - {"command"}


def _spelled_kinds(path: Path, kinds: set[str]) -> list[tuple[int, str]]:
    """The string constants of ``path`` that are a kind's name, but not its docstrings, a record's
    keys (``row["settle"]``, ``{"settle": ...}``, ``.get("settle")``: a field called like a kind)."""
    import ast

    tree = ast.parse(path.read_text(), str(path))
    ignored: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            ignored.add(id(body[0].value))
        if isinstance(node, ast.Subscript):
            ignored.add(id(node.slice))
        elif isinstance(node, ast.Dict):
            ignored.update(id(key) for key in node.keys if key is not None)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and node.args):
            ignored.add(id(node.args[0]))
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in kinds
            and id(node) not in ignored]


def test_a_kind_s_name_is_spelled_only_where_the_kind_is_declared():
    """A new kind touches its declaration and its plugin, not the generic operation: the
    coordinator and the exporter take a kind's constant and find resources by kind."""
    kinds = _kind_names()
    spelled = [f"{path.relative_to(SRC)}:{line}: {value!r}" for folder in KIND_SCANNED
               for path in sorted((SRC / folder).rglob("*.py"))
               if str(path.relative_to(SRC)) not in KIND_DECLARING
               for line, value in _spelled_kinds(path, kinds)]
    assert spelled == [], "a kind's name outside its declaration (take its constant):\n" + "\n".join(spelled)


def test_the_kind_scan_finds_a_kind_spelled(tmp_path):
    checked = tmp_path / "generic.py"
    checked.write_text('"""flash"""\nKIND = "flash"\nrow["flash"]\nrow.get("power")\n{"settle": 1}\n')
    assert _spelled_kinds(checked, _kind_names()) == [(2, "flash")]


# the declarative tables, which grow a row per call or per migration: no logic to split
LONG_BY_DESIGN = {"calls.py", "migrations.py"}
MAX_LINES = 600


def test_no_coordinator_module_is_over_600_lines():
    long = [f"{path.relative_to(SRC)}: {n} lines" for path in sorted((SRC / "coordinator").rglob("*.py"))
            if path.name not in LONG_BY_DESIGN and (n := len(path.read_text().splitlines())) > MAX_LINES]
    assert not long, (f"split these (one job a module; docs/architecture.md, \"Where the code is\"), "
                      f"{MAX_LINES} lines at most:\n" + "\n".join(long))
