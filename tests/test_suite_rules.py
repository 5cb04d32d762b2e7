"""Rules of the suite itself: timing goals live in bench/, not in tests (a test may bound a
time only by a duration it set or measured: a wait, a timeout, a period, a baseline), and
the tests share their helpers through tests/helpers.py, not through another test module."""
from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# what holds a measured time: `time.monotonic() - began`, `took`, `elapsed_s`, `max(ages)`...
ELAPSED = re.compile(r"(?:time\.(?:monotonic|perf_counter)\(\)\s*-\s*\w+|\b(?:took|elapsed(?:_s)?|after_s|waited_s)\b"
                     r"(?:\"\])?|max\(ages\))\s*<=?\s*")
# where the bound's expression ends
BOUND_END = re.compile(r",|\band\b|\bor\b|#|\\$|$")


def literal_time_bounds(text: str) -> list[str]:
    """The lines of ``text`` whose assertion bounds a measured time from above by a bare
    number (``took < 2.0``), not by a duration the test names (``took < 2 * timeout_s``)."""
    found = []
    for line in text.splitlines():
        if "assert" not in line:
            continue
        for match in ELAPSED.finditer(line):
            rest = line[match.end():]
            bound = rest[:BOUND_END.search(rest).start()]
            if bound.strip() and not re.search(r"[A-Za-z_]", bound):
                found.append(line.strip())
    return found


def test_no_test_bounds_a_time_by_a_bare_number():
    offending = {path.name: lines for path in sorted(TESTS.glob("*.py"))
                 if path.name != Path(__file__).name and (lines := literal_time_bounds(path.read_text()))}
    assert not offending, ("a timing goal belongs in bench/; in a test, bound a time by a duration the test set or "
                           f"measured: {offending}")


def test_the_time_bound_check_tells_a_goal_from_a_relative_bound():
    assert literal_time_bounds('    assert time.monotonic() - began < 0.2, "not again"') != []
    assert literal_time_bounds("    assert len(got) == 40 and took < 3.5, took") != []
    assert literal_time_bounds("    assert max(ages) < 1.5, ages") != []
    assert literal_time_bounds("    assert said.elapsed_s < 5") != []
    assert literal_time_bounds("    assert took < (batches + 1) * deadlines.timeout_s, took") == []
    assert literal_time_bounds("    assert time.monotonic() - asked < started_s, 'at once'") == []
    assert literal_time_bounds("    assert 0.95 * timeout_s <= took <= 1.6 * timeout_s, took") == []
    assert literal_time_bounds("    assert time.monotonic() - ended >= GRACE_S") == []


def test_no_test_imports_helpers_from_another_tests_end_to_end_module():
    importing = [path.name for path in sorted(TESTS.glob("*.py"))
                 if re.search(r"^\s*(from|import) test_end_to_end\b", path.read_text(), re.M)]
    assert not importing, f"shared helpers live in tests/helpers.py: {importing}"
