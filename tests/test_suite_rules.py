"""Rules of the suite itself: timing goals live in bench/, not in tests (a test may bound a
time only by a duration it set or measured: a wait, a timeout, a period, a baseline), and
the tests share their helpers through tests/helpers.py, not through another test module."""
from __future__ import annotations

import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

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


# ---- how ./lab test spreads the suite over its workers (tests/scheduling.py) ------------------

class FakeConfig:
    def getvalue(self, name):
        return {"tx": ["3*popen"]}[name]


class FakeWorker:
    """What the scheduler asks of an xdist worker: the tests it was sent, what it was asked to give back."""

    def __init__(self, name):
        self.name, self.shutting_down, self.sent, self.asked = name, False, [], []
        self.gateway = SimpleNamespace(id=name)

    def send_runtest_some(self, indices):
        self.sent += indices

    def send_steal(self, indices):
        self.asked.append(list(indices))

    def shutdown(self):
        self.shutting_down = True


def scheduled(collection, workers=3):
    from scheduling import SuiteStealing

    scheduler = SuiteStealing(FakeConfig(), longest=("test_lab.py::", "test_big.py::test_long"),
                              kept=("test_lab.py",))
    nodes = [FakeWorker(f"gw{n}") for n in range(workers)]
    for node in nodes:
        scheduler.add_node(node)
        scheduler.add_node_collection(node, collection)
    scheduler.schedule()
    return scheduler, nodes


COLLECTION = ([f"tests/test_big.py::test_long[{n}]" for n in range(3)] + [f"tests/test_a.py::t{n}" for n in range(30)]
              + [f"tests/test_lab.py::q{n}" for n in range(6)] + [f"tests/test_c.py::c{n}" for n in range(30)])


def test_the_longest_tests_begin_each_worker_s_first_batch_and_a_kept_module_goes_whole():
    _, nodes = scheduled(COLLECTION)
    firsts = [[COLLECTION[i].split("::")[1] for i in node.sent] for node in nodes]
    assert [batch[0] for batch in firsts] == ["q0", "test_long[0]", "test_long[1]"], firsts
    assert firsts[0][:6] == [f"q{n}" for n in range(6)], "the module whole, first"
    assert "test_long[2]" == firsts[0][6], "dealt in turn: the fourth to the first worker again"
    assert sorted(i for node in nodes for i in node.sent) == list(range(len(COLLECTION))), "each test once"


def test_a_steal_never_takes_part_of_a_kept_module():
    from scheduling import SuiteStealing

    collection = [f"tests/test_a.py::t{n}" for n in range(4)] + [f"tests/test_lab.py::q{n}" for n in range(6)]
    scheduler = SuiteStealing(FakeConfig(), kept=("test_lab.py",))
    busy, idle = FakeWorker("gw0"), FakeWorker("gw1")
    for node in (busy, idle):
        scheduler.add_node(node)
        scheduler.add_node_collection(node, collection)
    scheduler.collection = collection
    scheduler.node2pending[busy] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]  # t0 runs; q0-q5 at the tail
    scheduler.check_schedule()
    (asked,) = busy.asked
    assert asked == [4, 5, 6, 7, 8, 9], "half the queue would cut the module at q1: all of it is asked for"
    scheduler.steal_requested_from_node = None
    busy.asked.clear()
    scheduler.node2pending[busy] = [4, 5, 6, 7, 8, 9]  # q0 runs: nothing of the module may go
    scheduler.check_schedule()
    assert busy.asked == [] and idle.shutting_down


# ---- the venv's install is this checkout's (tests/conftest.py, stale_install) ------------------

@pytest.mark.service  # (it starts a Python)
def test_a_lab_process_that_would_import_another_checkout_stops_the_session(tmp_path):
    from conftest import stale_install

    elsewhere = tmp_path / "device_loop"
    elsewhere.mkdir()
    (elsewhere / "__init__.py").write_text("")
    stale = stale_install({**os.environ, "PYTHONPATH": str(tmp_path)})
    assert stale and str(elsewhere) in stale and str(TESTS.parent / "device_loop") in stale, stale
    assert stale_install() is None


@pytest.mark.service  # (it runs ./lab)
def test_lab_installs_nothing_into_a_venv_linked_from_another_checkout(tmp_path):
    """A worktree whose .venv links another checkout's: ./lab up there once pip-installed the
    worktree into that venv, which then imported a deleted folder's code."""
    import shutil
    import subprocess

    checkout, other = tmp_path / "worktree", tmp_path / "other-venv"
    (other / "bin").mkdir(parents=True)
    checkout.mkdir()
    shutil.copy(TESTS.parent / "lab", checkout / "lab")
    shutil.copy(TESTS.parent / "throwaway-postgres.sh", checkout / "throwaway-postgres.sh")
    (checkout / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    calls = tmp_path / "calls"
    for name in ("python", "device-loop"):  # each says how it was called, and with which PYTHONPATH
        (other / "bin" / name).write_text(f'#!/bin/sh\necho "{name} $* PYTHONPATH=$PYTHONPATH" >> {calls}\n')
        (other / "bin" / name).chmod(0o755)
    (checkout / ".venv").symlink_to(other)
    done = subprocess.run(["bash", str(checkout / "lab"), "up", "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "installing nothing" in done.stderr, done.stderr
    said = calls.read_text()
    assert "pip" not in said and f"device-loop up --help PYTHONPATH={checkout}" in said, said
