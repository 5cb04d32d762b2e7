"""The JUnit schema Jenkins and GitLab read, for the tests that hold our JUnit XML to it.

No Debian package ships it, nor any wheel on PyPI. The one published by Jenkins' xUnit plugin
(``junit-10.xsd``, MIT) comes in pytest's source distribution, where pytest's own tests validate
its JUnit XML against it (``testing/example_scripts/junit-10.xsd``): this fetches that sdist
from PyPI with pip (the installed pytest's version, so the file does not move under us) and
keeps the schema beside the venv, once.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest

MEMBER = "testing/example_scripts/junit-10.xsd"


def junit_xsd() -> Path:
    """The path of junit-10.xsd, fetched from PyPI the first time."""
    where = Path(sys.prefix) / "share" / "device-loop-tests" / f"junit-10-pytest-{pytest.__version__}.xsd"
    if where.is_file():
        return where
    where.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
                        "--no-deps", "--no-binary", ":all:", "--dest", folder, f"pytest=={pytest.__version__}"],
                       check=True, timeout=120)
        sdist = next(Path(folder).glob("pytest-*.tar.gz"))
        with tarfile.open(sdist) as archive:
            member = archive.getmember(f"{sdist.name.removesuffix('.tar.gz')}/{MEMBER}")
            data = archive.extractfile(member).read()  # type: ignore[union-attr]
    partial = where.with_suffix(f".{os.getpid()}.part")
    partial.write_bytes(data)
    partial.replace(where)          # (two workers fetching at once each put a whole file)
    return where


def validator():
    """An ``xmlschema.XMLSchema`` of junit-10.xsd."""
    import xmlschema

    return xmlschema.XMLSchema(str(junit_xsd()))
