"""Rules of the suite itself: timing goals live in bench/, not in tests (a test may bound a
time only by a duration it set or measured: a wait, a timeout, a period, a baseline), and
the tests share their helpers through tests/helpers.py, not through another test module."""
from __future__ import annotations

import ast
import os
import re
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

TESTS = Path(__file__).resolve().parent
# what holds a measured time: `time.monotonic() - began`, `took`, `elapsed_s`, `max(ages)`...
ELAPSED = re.compile(r"(?:time\.(?:monotonic|perf_counter)\(\)\s*-\s*\w+|\b(?:took|elapsed(?:_s)?|after_s|waited_s)\b"
                     r"(?:\"\])?|max\(ages\))\s*<=?\s*")
# where the bound's expression ends
BOUND_END = re.compile(r",|\band\b|\bor\b|#|\\$|$")


def _assertions(text: str) -> list[str]:
    """The lines of ``text`` that assert, and each assertion written over several lines joined
    into one line."""
    lines = [line for line in text.splitlines() if "assert" in line]
    try:
        source = textwrap.dedent(text)
        tree = ast.parse(source)
    except SyntaxError:  # (a fragment)
        return lines
    spread = [ast.get_source_segment(source, node) or "" for node in ast.walk(tree)
              if isinstance(node, ast.Assert) and node.end_lineno != node.lineno]
    return lines + [re.sub(r"\\?\n\s*", " ", statement) for statement in spread]


def literal_time_bounds(text: str) -> list[str]:
    """The assertions of ``text`` that bound a measured time from above by a bare number
    (``took < 2.0``), not by a duration the test names (``took < 2 * timeout_s``); in a test
    module or in a fixture, on one line or over several."""
    found = []
    for line in _assertions(text):
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
    assert literal_time_bounds("def f():\n    assert (len(got) == 40\n            and took < 3.5), took\n") != []
    assert literal_time_bounds("    assert took < (batches + 1) * deadlines.timeout_s, took") == []
    assert literal_time_bounds("    assert time.monotonic() - asked < started_s, 'at once'") == []
    assert literal_time_bounds("    assert 0.95 * timeout_s <= took <= 1.6 * timeout_s, took") == []
    assert literal_time_bounds("    assert time.monotonic() - ended >= GRACE_S") == []


# ---- a wait is bounded by progress or a setting (conftest.py: wait_for, WAIT_S) ---------------

#: no argument's place: a timeout given by its keyword only
KEYWORD_ONLY = 1 << 16


#: the suite's waits: the place of their timeout among their arguments, and its keyword (by the
#: name called: ``asyncio.wait_for``, ``threading.Condition.wait_for`` and ``anyio.fail_after``
#: too); a function of the tests that passes one of its parameters on as a wait's timeout is a
#: wait too (``_waits_of``)
WAITS = {"wait_for": (1, "timeout"), "wait_state": (3, "timeout"), "wait_active": (2, "timeout"),
         "fail_after": (0, "delay"),
         # Playwright's, whose timeout is a keyword only (in ms): a page's waits are bounded by
         # the context's default, the safety net (conftest.BrowserWaitingUpToTheSafetyNet)
         **{name: (KEYWORD_ONLY, "timeout") for name in (
             "wait_for_selector", "wait_for_function", "wait_for_url", "wait_for_load_state", "wait_for_event",
             "expect_response", "expect_request", "expect_event")},
         "set_default_timeout": (0, "timeout")}
#: the clocks a hand-made wait's deadline is read on (``deadline = time.monotonic() + timeout``)
CLOCKS = ("time.monotonic", "time.time", "time.perf_counter", "monotonic", "perf_counter")


def bare_number(node: ast.expr) -> bool:
    """Whether ``node`` is a number written out (``5``, ``2 * 60``, ``-1.5``): no name of a
    setting, a measured duration or the safety net in it."""
    parts = list(ast.walk(node))
    return (all(isinstance(n, (ast.Constant, ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop)) for n in parts)
            and any(isinstance(n, ast.Constant) and isinstance(n.value, (int, float)) for n in parts))


def _callee(call: ast.Call) -> str | None:
    return call.func.id if isinstance(call.func, ast.Name) else \
        call.func.attr if isinstance(call.func, ast.Attribute) else None


#: what calls a function given as its first argument with the arguments that follow (on a thread)
CALLERS = ("to_thread", "run_sync")


def _waited(call: ast.Call, waits: dict[str, tuple[int, str]]) -> tuple[int, str, list, list] | None:
    """When ``call`` is a wait (``wait_for(...)``, or ``asyncio.to_thread(wait_for, ...)``): the
    place of its timeout among ``args``, its keyword, ``args`` and ``keywords``."""
    name, args = _callee(call), call.args
    if name in CALLERS and args and isinstance(args[0], (ast.Name, ast.Attribute)):
        name, args = ast.unparse(args[0]).rsplit(".", 1)[-1], args[1:]
    if name not in waits:
        return None
    return (*waits[name], args, call.keywords)


def _timeout_of(call: ast.Call, waits: dict[str, tuple[int, str]]) -> ast.expr | None:
    """The timeout given to the wait ``call``, if it is one and is given one."""
    if (waited := _waited(call, waits)) is None:
        return None
    place, keyword, args, keywords = waited
    for given in keywords:
        if given.arg == keyword:
            return given.value
    return args[place] if len(args) > place and not isinstance(args[place], ast.Starred) else None


def _waits_of(trees: dict[str, ast.Module]) -> dict[str, tuple[int, str]]:
    """Every wait of the suite: name -> (place of its timeout, its keyword); the functions that
    pass a parameter on as a wait's timeout included, and those that call them, and so on."""
    waits = dict(WAITS)
    while True:
        found = dict(waits)
        for tree in trees.values():
            for function in ast.walk(tree):
                if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) or function.name in found:
                    continue
                params = [a.arg for a in function.args.posonlyargs + function.args.args]
                if params[:1] in (["self"], ["cls"]):
                    params = params[1:]
                params += [a.arg for a in function.args.kwonlyargs]
                for call in ast.walk(function):
                    if isinstance(call, ast.Call):
                        timeout = _timeout_of(call, waits)
                        if isinstance(timeout, ast.Name) and timeout.id in params:
                            found[function.name] = (params.index(timeout.id), timeout.id)
        if found == waits:
            return waits
        waits = found


def _default_of(function: ast.FunctionDef | ast.AsyncFunctionDef, param: str) -> ast.expr | None:
    positional = function.args.posonlyargs + function.args.args
    defaults = dict(zip([a.arg for a in positional][len(positional) - len(function.args.defaults):],
                        function.args.defaults))
    defaults |= {a.arg: d for a, d in zip(function.args.kwonlyargs, function.args.kw_defaults) if d is not None}
    return defaults.get(param)


def bare_wait_bounds(trees: dict[str, ast.Module]) -> list[str]:
    """Where a wait of the suite is bounded by a bare number: a wait given one as its timeout,
    a function passing its timeout on to a wait with one as its default, a deadline of a
    hand-made loop (``time.monotonic() + 5``). ``trees``: file name -> its module."""
    waits = _waits_of(trees)
    found = []
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and (timeout := _timeout_of(node, waits)) is not None:
                if bare_number(timeout):
                    found.append(f"{name}:{node.lineno}: {ast.unparse(node)[:120]}")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in waits:
                default = _default_of(node, waits[node.name][1])
                if default is not None and bare_number(default):
                    found.append(f"{name}:{node.lineno}: def {node.name}(... "
                                 f"{waits[node.name][1]}={ast.unparse(default)})")
            elif (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and bare_number(node.right)
                  and isinstance(node.left, ast.Call) and ast.unparse(node.left.func) in CLOCKS):
                found.append(f"{name}:{node.lineno}: a deadline {ast.unparse(node)}")
    return found


def test_no_wait_is_bounded_by_a_bare_number():
    """A wait for what should happen is bounded by the safety net alone (conftest.WAIT_S); one
    whose bound is what the test checks, by the setting it checks: never by a number found
    on an idle machine, in a test module or in a fixture (conftest.py, helpers.py...)."""
    trees = {path.name: ast.parse(path.read_text()) for path in sorted(TESTS.glob("*.py"))}
    offending = bare_wait_bounds(trees)
    assert not offending, ("bound a wait by progress (the default timeout, conftest.WAIT_S, is only a safety net) "
                           "or by the setting it checks, not by a bare number:\n  " + "\n  ".join(offending))


def test_the_wait_bound_check_finds_bare_numbers_in_waits_their_wrappers_and_deadlines():
    def found(source: str) -> list[str]:
        return bare_wait_bounds({"t.py": ast.parse(source)})

    assert found("wait_for(ready, 5, what='up')") and found("wait_for(ready, timeout=2 * 10)")
    assert found("helpers.wait_state(lab, 'b0', 'idle', 30)") and found("wait_state(lab, 'b0', 'idle', timeout=-1)")
    assert found("await asyncio.wait_for(next_frame(), 5)") and found("with anyio.fail_after(30): pass")
    assert found("def ended(lab, op, timeout=20.0):\n    return wait_for(lambda: op, timeout)")
    assert found("def ended(lab, op, within=None):\n    return wait_for(lambda: op, within)\n"
                 "ended(lab, 'op-1', within=3)"), "a wait's wrapper is a wait"
    assert found("class Lab:\n    def active(self, lease, timeout=WAIT_S):\n        wait_for(up, timeout)\n"
                 "lab.active('l1', 90)"), "(a method's self is not among its arguments)"
    assert found("await asyncio.to_thread(wait_state, lab, 'b0', 'idle', 30)"), "a wait run on a thread is a wait"
    assert found("await asyncio.to_thread(wait_for, ready, 60, 0.05, 'up')")
    assert found("deadline = time.monotonic() + 10") and found("until = monotonic() + 0.5")
    assert found("wait_for(ready)") == [] and found("wait_for(ready, what='up', interval=0.01)") == []
    assert found("wait_for(ready, 1.5 * GRACE_S)") == []
    assert found("wait_state(lab, 'b0', 'idle', timeout=WAIT_S)") == []
    assert found("await asyncio.wait_for(call, QUICK_S)") == [] and found("deadline = time.monotonic() + timeout") == []
    assert found("def ended(lab, op, timeout=WAIT_S):\n    return wait_for(lambda: op, timeout)") == []
    assert found("time.sleep(0.05)") == [] and found("sock.settimeout(5)") == []
    assert found("await asyncio.to_thread(wait_state, lab, 'b0', 'idle')") == []
    assert found("await asyncio.to_thread(time.sleep, 5)") == []
    assert found("page.wait_for_selector('#live.on', timeout=10_000)") and found(
        "page.wait_for_function('() => window.done', timeout=20_000)"), "Playwright's waits too"
    assert found("context.set_default_timeout(30_000)") and found("context.set_default_timeout(WAIT_S * 1000)") == []
    assert found("page.wait_for_selector('#live.on', state='detached')") == []


def online_pip_calls(trees: dict[str, ast.Module]) -> list[str]:
    """Where a test runs pip to install or download without ``--no-index`` (pip then asks an
    index, and checks its own version online unless ``--disable-pip-version-check``).
    ``trees``: file name -> its module."""
    found = []
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.List):
                words = {n.value for n in node.elts if isinstance(n, ast.Constant) and isinstance(n.value, str)}
                if "pip" in words and words & {"install", "download"} and not {
                        "--no-index", "--disable-pip-version-check"} <= words:
                    found.append(f"{name}:{node.lineno}: {ast.unparse(node)[:120]}")
    return found


def test_no_test_reaches_a_package_index():
    """Nothing is downloaded inside pytest: a test's pip installs a package it has (the plugin
    it checks) from its folder, offline; what the tests need from an index, tests/prepare.py
    fetched before pytest started."""
    trees = {path.name: ast.parse(path.read_text()) for path in sorted(TESTS.glob("*.py"))
             if path.name != "prepare.py"}
    offending = online_pip_calls(trees)
    assert not offending, "pip with --no-index --disable-pip-version-check:\n  " + "\n  ".join(offending)
    assert online_pip_calls({"t.py": ast.parse('run([python, "-m", "pip", "install", "--target", t, src])')})
    assert online_pip_calls({"t.py": ast.parse('run(["pip", "download", "--no-index", "x"])')})
    assert not online_pip_calls({"t.py": ast.parse(
        'run(["pip", "install", "--no-index", "--disable-pip-version-check", src])')})


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


#: The modules where the SQL itself is what is checked (the store, statement counts, migrations,
#: waits that hold nothing, races, outages, the labs' databases, kills, properties, expiries,
#: budgets, the scheduler's queries): their tests run on SQLite and on PostgreSQL.
SQL_IS_THE_POINT = re.compile(r"test_(\w*store\w*|statement_counts|\w*migration\w*|waits_hold_nothing|\w*race\w*|"
                              r"database_outage|lab_databases|\w*faults|\w*properties|keepalive\w*|budget\w*|"
                              r"needs|\w*tickets?\w*)\.py")


def test_a_module_runs_on_sqlite_only_where_its_sql_is_not_the_point():
    """A module of rules says ``DATABASES = SQLITE_ONLY`` (docs/architecture.md, "Testing");
    none of those whose SQL is what they check does."""
    sqlite_only = {path.name for path in TESTS.glob("test_*.py")
                   if re.search(r"^DATABASES = SQLITE_ONLY$", path.read_text(), re.M)}
    assert "test_who_rule.py" in sqlite_only, "the check reads what it should"
    assert not {name for name in sqlite_only if SQL_IS_THE_POINT.fullmatch(name)}
    assert {name for name in ("test_statement_counts.py", "test_lab_databases.py", "test_waits_hold_nothing.py")
            if SQL_IS_THE_POINT.fullmatch(name)} == {"test_statement_counts.py", "test_lab_databases.py",
                                                     "test_waits_hold_nothing.py"}


def test_a_process_a_test_starts_in_its_own_environment_is_a_fork_of_the_zygote(tmp_path):
    """What Python reads at its start is the same in a test's environment as in the zygote's
    (this process's): so its coordinators, exporters and CLI calls fork, not start."""
    from conftest import own_environment, zygote

    assert zygote._interpreter_settings(own_environment(tmp_path)) == zygote._interpreter_settings(os.environ)
