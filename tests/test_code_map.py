"""docs/architecture.md, "Where the code is", held to the files: every module of the package
is named in its folder's row (a plugin by its package), and every file or folder a row
names exists."""
from __future__ import annotations

import re
from pathlib import Path

from conftest import SRC

ARCHITECTURE = SRC / "docs" / "architecture.md"
FOLDERS = ("device_loop", "core", "coordinator", "exporter", "client", "cli", "plugins")
NAMED = re.compile(r"`([\w./-]+(?:\.py|/))`")  # `leases.py`, `web/`, `core/answers.py`


def table_rows(markdown: str) -> list[tuple[str, str]]:
    """(the first cell's path, the rest of the row) for each row of the section's table."""
    section = markdown.split("\n## Where the code is\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if line.startswith("| `"):
            first, rest = line[2:].split(" | ", 1)
            rows.append((first.strip("`"), rest))
    return rows


def named_paths(rows: list[tuple[str, str]]) -> tuple[set[str], list[str]]:
    """(the paths the rows name, relative to the repository; what a row names that does not
    exist). A name is the row's folder's (the first cell's, or that file's folder), or the
    repository's when it begins with one of the top-level folders; a file not in the row's
    folder is looked for in the subfolders the row named before it (`web/`, then `pages.py`)."""
    named, missing = set(), []
    for first, rest in rows:
        folder = first if first.endswith("/") else str(Path(first).parent) + "/"
        named.add(first.rstrip("/"))
        subfolders: list[str] = []
        for name in NAMED.findall(rest):
            top = name.split("/", 1)[0]
            candidates = [name] if top in FOLDERS and "/" in name.rstrip("/") else \
                [folder + name] + [sub + name for sub in subfolders]
            found = next((c for c in candidates if (SRC / c).exists()), None)
            if found is None:
                missing.append(f"{first}: {name}")
                continue
            if found.endswith("/"):
                subfolders.append(found)
            named.add(found.rstrip("/"))
    return named, missing


def modules() -> list[str]:
    """The package's modules: each .py file of its folders (not __init__.py), a plugin's
    package standing for its files."""
    found = {str(package.parent.relative_to(SRC)) for package in (SRC / "plugins").glob("*/__init__.py")}
    for folder in FOLDERS:
        if folder == "plugins":
            continue
        for path in (SRC / folder).rglob("*.py"):
            relative = path.relative_to(SRC)
            if not path.name.startswith("__") and "__pycache__" not in relative.parts:
                found.add(str(relative))
    return sorted(found)


def test_every_row_of_the_code_map_names_what_exists():
    rows = table_rows(ARCHITECTURE.read_text())
    assert len(rows) >= 6, f"the table was not found (its heading or layout changed?): {rows}"
    _, missing = named_paths(rows)
    assert not missing, f"docs/architecture.md, \"Where the code is\", names files that do not exist: {missing}"


def test_every_module_is_in_the_code_map():
    named, _ = named_paths(table_rows(ARCHITECTURE.read_text()))
    left_out = [m for m in modules() if m not in named]
    assert not left_out, ("docs/architecture.md, \"Where the code is\", leaves these out (name each in its folder's "
                          f"row, with its job): {left_out}")


def test_the_code_map_check_sees_a_missing_module_and_a_missing_file():
    rows = [("core/", "shared: `model.py`, `no_such_module.py`")]
    named, missing = named_paths(rows)
    assert "core/model.py" in named and missing == ["core/: no_such_module.py"]
    assert "core/vocabulary.py" in modules() and "core/vocabulary.py" not in named
