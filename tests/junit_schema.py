"""The JUnit schema Jenkins and GitLab read, for the tests that hold our JUnit XML to it.

No Debian package ships it, nor any wheel on PyPI. The one published by Jenkins' xUnit plugin
(``junit-10.xsd``, MIT) comes in pytest's source distribution, where pytest's own tests validate
its JUnit XML against it (``testing/example_scripts/junit-10.xsd``): ``./lab test`` takes it from
the installed pytest's sdist before pytest starts (tests/prepare.py), and a test only reads it.
"""
from __future__ import annotations

from pathlib import Path

from prepare import junit_xsd_path, not_prepared


def junit_xsd() -> Path:
    """The path of junit-10.xsd; the test fails if ./lab test has not fetched it."""
    where = junit_xsd_path()
    if not where.is_file():
        not_prepared("the JUnit schema", f"there is no {where}")
    return where


def validator():
    """An ``xmlschema.XMLSchema`` of junit-10.xsd."""
    import xmlschema

    return xmlschema.XMLSchema(str(junit_xsd()))
