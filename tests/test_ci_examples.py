"""The CI examples (examples/ci/) run as their runners run them, against a real lab of simulated
boards started here (docs/architecture.md, "Results where CI shows them", "A lease bound to a
command"): every step's command line verbatim, in the shell the runner uses, with the variables
it sets; and a cancel sent as each runner sends it.

- GitHub Actions (actions/runner's ProcessInvoker): SIGINT to the step's entry process alone,
  SIGTERM 7.5 s later, SIGKILL 2.5 s after that; a step is ``bash --noprofile --norc -eo
  pipefail FILE`` (``shell: bash``).
- GitLab Runner, shell executor: the script in a process group of its own, SIGTERM to the whole
  group, SIGKILL to it 10 minutes later.

The GitHub cancel test also holds the workflow's ``exec``: without it the SIGINT and SIGTERM
reach only bash (which notes the first and dies of the second), `with` never hears of the
cancel, and the board stays leased until the job's orphans are killed and the keepalive runs out.

``DEVICE_LOOP_TEST_CANCEL_SCALE`` (default 1: the runners' own intervals) multiplies those
intervals; nothing else shortens them. ``ci/build.sh``, ``ci/test-on-board.sh`` and
``ci/bench.sh`` are the project's in the examples: here, stand-ins in a git repository with a
base branch (``main``, the bench's cost 1.0) and a pull request's (cost 1.2: slower).
"""
from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from conftest import BUILT_IN_PLUGINS, DEFAULT_COORDINATOR_GUARD, LOAD_ENV, SRC, Coordinator, Exporter, wait_for
from helpers import device, pid_alive, wait_state
from device_loop.core import LIVE_LEASE_STATES

pytestmark = [pytest.mark.service, pytest.mark.timeout(240)]

EXAMPLES = SRC / "examples" / "ci"
SCALE = float(os.environ.get("DEVICE_LOOP_TEST_CANCEL_SCALE", "1"))
GITHUB_SIGINT_TO_SIGTERM_S = 7.5 * SCALE
GITHUB_SIGTERM_TO_SIGKILL_S = 2.5 * SCALE
GITLAB_SIGTERM_TO_SIGKILL_S = 600.0 * SCALE
BOARDS = ("sim-board-0", "sim-board-1")
AB_ROUNDS = "4"          # the fewest where 4 + 4 runs can decide at α 0.05

BUILD = """#!/bin/sh
# the build: a firmware image that says what it was built from
set -e
mkdir -p "$(dirname "$1")"
printf 'firmware, bench cost %s\\n' "$(cat "$(dirname "$0")/cost")" > "$1"
"""
TEST_ON_BOARD = """#!/bin/bash
# the tests: one command on the leased board; with CI_TEST_HANG set, a test that runs until
# cancelled (CI_TEST_HANG=ignore-int: one that ignores SIGINT, as many test runners do)
set -e
"$CI_DEVICE_LOOP" exec "$DEVICE_LOOP_LEASE" -- uname -a
if [ -n "${CI_TEST_HANG:-}" ]; then
  [ "$CI_TEST_HANG" = ignore-int ] && trap '' INT
  sleep 1000 &
  echo $$ $! > "$CI_TEST_PIDS.tmp"; mv "$CI_TEST_PIDS.tmp" "$CI_TEST_PIDS"
  wait
fi
"""
BENCH = """#!/bin/sh
# the benchmark: the board's workload at this checkout's cost, as the metric bench_ms
set -e
"$CI_DEVICE_LOOP" exec "$DEVICE_LOOP_LEASE" -- run-workload --cost "$(cat "$(dirname "$0")/cost")" \\
  | sed 's/workload_ms/bench_ms/'
"""
# a fake of what posts to the forge: it keeps its arguments and the body it would send
RECORDER = """#!/bin/sh
out="$CI_RECORDED/$(basename "$0").$$"
printf '%s\\n' "$@" > "$out.args"
for a in "$@"; do
  case "$a" in
    body@*) cp "${a#body@}" "$out.body" ;;
  esac
done
prev=
for a in "$@"; do [ "$prev" = --body-file ] && cp "$a" "$out.body"; prev="$a"; done
"""


# --- the lab and the project ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ci-lab")
    (folder / "home").mkdir()
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("DEVICE_LOOP_", "GITHUB_", "CI_"))}
    environ.update(HOME=str(folder / "home"), DEVICE_LOOP_USER="ci", DEVICE_LOOP_COORDINATOR=
                   DEFAULT_COORDINATOR_GUARD.url, PYTHONUNBUFFERED="1", **{LOAD_ENV: BUILT_IN_PLUGINS})
    coordinator = Coordinator(folder, environ)
    boards = [{"name": name, "class": "sim-board", "resources": [
        {"plugin": "sim", "workload_s": 0.02}, {"plugin": "flash", "target": str(folder / f"{name}.img")}]}
        for name in BOARDS]
    for name in BOARDS:
        (folder / f"{name}.img").write_bytes(b"factory firmware\n")
    exporter = Exporter(folder, environ, coordinator.url, boards)
    try:
        for name in BOARDS:
            wait_state(coordinator, name, "idle")
        yield coordinator, environ
    finally:
        exporter.stop()
        coordinator.stop()


def _git(where: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(where), *args], check=True, capture_output=True, text=True,
                          env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME":
                               "t", "GIT_COMMITTER_EMAIL": "t@t"}).stdout.strip()


@dataclass
class Project:
    """A checkout of a pull request (``origin`` has its base, ``main``), and what a runner adds."""
    checkout: Path
    bin: Path
    recorded: Path
    sha: str
    runs: Path
    env: dict[str, str] = field(default_factory=dict)


@pytest.fixture
def project(lab, tmp_path) -> Project:
    coordinator, environ = lab
    origin, work = tmp_path / "origin.git", tmp_path / "work"
    _git(tmp_path, "init", "-q", "--bare", "-b", "main", str(origin))
    _git(tmp_path, "init", "-q", "-b", "main", str(work))
    for name, text in (("build.sh", BUILD), ("test-on-board.sh", TEST_ON_BOARD), ("bench.sh", BENCH),
                       ("cost", "1.0\n")):
        path = work / "ci" / name
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        if name.endswith(".sh"):
            path.chmod(0o755)
    _git(work, "add", ".")
    _git(work, "commit", "-qm", "base")
    _git(work, "remote", "add", "origin", str(origin))
    _git(work, "push", "-q", "origin", "main")
    _git(work, "checkout", "-qb", "pr")
    (work / "ci" / "cost").write_text("1.2\n")          # the pull request makes the bench slower
    _git(work, "commit", "-qam", "slower")
    shims = tmp_path / "bin"
    shims.mkdir()
    for name, text in (("device-loop", f'#!/bin/sh\nexec {sys.executable} -m device_loop.cli "$@"\n'),
                       ("gh", RECORDER), ("curl", RECORDER)):
        (shims / name).write_text(text)
        (shims / name).chmod((shims / name).stat().st_mode | stat.S_IEXEC)
    recorded = tmp_path / "recorded"
    recorded.mkdir()
    runs = tmp_path / "runner"
    runs.mkdir()
    # (the stand-ins call the tests' own device-loop by its path: `with` puts its venv's script
    # first on PATH, which in a shared development venv may belong to another checkout)
    env = {**environ, "PATH": f"{shims}:{environ['PATH']}", "CI_RECORDED": str(recorded),
           "CI_DEVICE_LOOP": str(shims / "device-loop"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC.parent), environ.get("PYTHONPATH", "")])),
           "CI": "true"}
    return Project(work, shims, recorded, _git(work, "rev-parse", "HEAD"), runs, env)


# --- the runners ---------------------------------------------------------------------------------

@dataclass
class Step:
    name: str
    status: int | None        # None: skipped
    summary: str = ""


def _interpolated(value: str, expressions: dict[str, str]) -> str:
    """GitHub's ``${{ EXPR }}`` in a value, from ``expressions`` (an expression the example gained
    and this test does not know fails it)."""
    def one(found: re.Match) -> str:
        assert found.group(1) in expressions, f"the test does not know ${{{{ {found.group(1)} }}}}"
        return expressions[found.group(1)]
    return re.sub(r"\$\{\{\s*(.+?)\s*\}\}", one, str(value))


def _runs(condition: str | None, failed: bool, cancelled: bool, event: str) -> bool:
    """A step's ``if:`` as GitHub reads the few the example uses (no status function: success())."""
    expression = (condition or "").removeprefix("${{").removesuffix("}}").strip()
    known = {"": not failed and not cancelled, "always()": True,
             "github.event_name == 'pull_request'": not failed and not cancelled and event == "pull_request",
             "github.event_name == 'pull_request' && !cancelled()": event == "pull_request" and not cancelled}
    assert expression in known, f"the test does not know the condition {expression!r}"
    return known[expression]


class Cancel:
    """When and how to cancel: at the step named ``at``, once ``ready()``; ``watch()`` is called
    while the runner waits (the test's eyes on the board)."""

    def __init__(self, at: str, ready, watch):
        self.at, self.ready, self.watch = at, ready, watch
        self.sent_at: float | None = None


class _Piped:
    """A job process whose output the runner reads through a pipe, as GitLab Runner's (Go's
    ``exec.Cmd.Wait`` returns once the process exited *and* every holder of its output pipe
    closed it: the runner waits for what the script left running too)."""

    def __init__(self, args: list[str], **popen):
        import threading

        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **popen)
        self.pid = self.proc.pid
        self.output = b""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        self.output = self.proc.stdout.read()

    def poll(self) -> int | None:
        return None if self._reader.is_alive() else self.proc.poll()

    def wait(self, timeout: float) -> int:
        self._reader.join(timeout)
        return self.proc.wait(timeout=1)


def _wait_exit(proc, seconds: float, cancel: Cancel) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return True
        cancel.watch()
        time.sleep(0.02)          # (a runner's poll; what is awaited is the process's exit)
    return proc.poll() is not None


def github_job(project: Project, lab_url: str, event: str = "pull_request", cancel: Cancel | None = None,
               last: str | None = None) -> dict[str, Step]:
    """The example workflow's one job as the runner runs it: each ``run:`` step a bash script
    of its own, ``uses:`` steps left out (actions from the marketplace), ``if:`` as GitHub
    reads it; ``cancel`` as the runner cancels; ``last``: stop after that step."""
    workflow = yaml.safe_load((EXAMPLES / "github-actions.yml").read_text())
    job = workflow["jobs"]["board"]
    shell = workflow["defaults"]["run"]["shell"]
    assert shell == "bash"
    expressions = {"vars.DEVICE_LOOP_COORDINATOR": lab_url, "secrets.DEVICE_LOOP_TOKEN": "",
                   "github.token": "a-token", "github.event.pull_request.number": "7"}
    base = {**project.env, "GITHUB_ACTIONS": "true", "GITHUB_EVENT_NAME": event, "GITHUB_SHA": project.sha,
            "GITHUB_BASE_REF": "main" if event == "pull_request" else "", "RUNNER_TEMP": str(project.runs)}
    base.update({k: _interpolated(v, expressions) for k, v in {**workflow["env"], **job.get("env", {})}.items()})
    base["AB_ROUNDS"] = AB_ROUNDS
    github_env = project.runs / "github-env"
    github_env.touch()
    base["GITHUB_ENV"] = str(github_env)
    steps: dict[str, Step] = {}
    failed = cancelled = False
    for number, step in enumerate(job["steps"]):
        name = step.get("name", step.get("uses", ""))
        if "uses" in step or not _runs(step.get("if"), failed, cancelled, event):
            steps[name] = Step(name, None)
            continue
        assert "${{" not in step["run"], "a run: line takes expressions through env (no script injection)"
        script = project.runs / f"step-{number}.sh"
        script.write_text(step["run"])
        summary = project.runs / f"summary-{number}.md"
        summary.touch()
        env = {**base, **{k: _interpolated(v, expressions) for k, v in step.get("env", {}).items()},
               "GITHUB_STEP_SUMMARY": str(summary)}
        proc = subprocess.Popen(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
                                cwd=project.checkout, env=env, start_new_session=True)
        if cancel is not None and cancel.at == name:
            wait_for(cancel.ready, what=f"{name} started")
            cancel.sent_at = time.monotonic()
            proc.send_signal(signal.SIGINT)                 # to the entry process alone, as the runner does
            if not _wait_exit(proc, GITHUB_SIGINT_TO_SIGTERM_S, cancel):
                proc.send_signal(signal.SIGTERM)
                if not _wait_exit(proc, GITHUB_SIGTERM_TO_SIGKILL_S, cancel):
                    proc.kill()
            cancelled = True
        status = proc.wait(timeout=180)
        steps[name] = Step(name, status, summary.read_text())
        for line in github_env.read_text().splitlines():       # what a step adds for the steps after it
            key, _, value = line.partition("=")
            base[key] = value
        github_env.write_text("")
        failed = failed or status != 0
        if name == last:
            break
    return steps


def gitlab_job(project: Project, lab_url: str, cancel: Cancel | None = None, upto: int | None = None) -> int:
    """The example job's script as the shell executor runs it: its lines in one bash, in a
    process group of its own (``upto``: its first lines only); ``cancel``: SIGTERM to the
    group, SIGKILL to it after the runner's grace."""
    job = yaml.safe_load((EXAMPLES / "gitlab-ci.yml").read_text())["board"]
    lines = job["script"][:upto]
    script = project.runs / "gitlab-script.sh"
    script.write_text("\n".join(lines) + "\n")
    env = {**project.env, "GITLAB_CI": "true", "DEVICE_LOOP_COORDINATOR": lab_url, "CI_COMMIT_SHA": project.sha,
           "CI_COMMIT_SHORT_SHA": project.sha[:8], "CI_MERGE_REQUEST_IID": "7",
           "CI_MERGE_REQUEST_TARGET_BRANCH_NAME": "main", "CI_API_V4_URL": "https://gitlab.invalid/api/v4",
           "CI_PROJECT_ID": "1", "DEVICE_LOOP_NOTE_TOKEN": "a-token",
           **{k: str(v) for k, v in job["variables"].items()}, "AB_ROUNDS": AB_ROUNDS}
    proc = _Piped(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)], cwd=project.checkout, env=env,
                  start_new_session=True)
    if cancel is not None:
        wait_for(cancel.ready, what="the job's command started")
        cancel.sent_at = time.monotonic()
        os.killpg(proc.pid, signal.SIGTERM)              # the whole group at once, as the runner does
        if not _wait_exit(proc, GITLAB_SIGTERM_TO_SIGKILL_S, cancel):
            os.killpg(proc.pid, signal.SIGKILL)
    status = proc.wait(timeout=180)
    sys.stdout.write(proc.output.decode(errors="replace"))     # (shown when the test fails)
    return status


# --- what CI gets ---------------------------------------------------------------------------------

def _recorded(project: Project, program: str) -> tuple[list[str], str]:
    args = next(project.recorded.glob(f"{program}.*.args"))
    return args.read_text().splitlines(), args.with_suffix(".body").read_text()


def _holders(coordinator) -> dict[str, str | None]:
    return {name: device(coordinator, name).get("holder") for name in BOARDS}


def _check_reports(project: Project) -> None:
    from junit_schema import validator

    schema = validator()
    for name in ("board-tests.xml", "ab.xml"):
        schema.validate(str(project.checkout / name))
    ab = (project.checkout / "ab.xml").read_text()
    assert 'type="regressed"' in ab and "slower" in ab, ab        # the pull request's bench is slower
    assert "<failure" not in (project.checkout / "board-tests.xml").read_text()
    assert len((project.checkout / "ab.md").read_text().encode()) < 65_536


def test_the_github_workflow_builds_tests_on_a_board_and_posts_the_evidence(lab, project):
    coordinator, _ = lab
    steps = github_job(project, coordinator.url)
    assert {name: s.status for name, s in steps.items()} == {
        "actions/checkout@v4": None, "Build": 0, "Upload the image to the lab's registry": 0,
        "Test on a board running the build": 0, "Build the base branch (the A of the A/B)": 0,
        "A/B of the base against this pull request": 0, "Post the evidence on the pull request": 0,
        "Keep the reports": None}
    _check_reports(project)
    args, body = _recorded(project, "gh")
    assert args == ["pr", "comment", "7", "--body-file", "ab.md"] and "B (patch) is" in body and "slower" in body
    assert "device-loop with: passed" in steps["Test on a board running the build"].summary
    assert "## Results" in steps["A/B of the base against this pull request"].summary
    wait_for(lambda: _holders(coordinator) == {name: None for name in BOARDS}, what="the boards given back")


def test_the_gitlab_job_builds_tests_on_a_board_and_posts_the_note(lab, project):
    coordinator, _ = lab
    assert gitlab_job(project, coordinator.url) == 0
    _check_reports(project)
    args, body = _recorded(project, "curl")
    assert "https://gitlab.invalid/api/v4/projects/1/merge_requests/7/notes" in args and "slower" in body
    # the same reports later, from the job's id (a job a worker ran: `ab --submit`)
    import xml.etree.ElementTree as ET

    ab = ET.parse(project.checkout / "ab.xml").getroot()
    job_id = next(p.get("value") for p in ab.iter("property") if p.get("name") == "job")
    again = subprocess.run([str(project.bin / "device-loop"), "job", "evidence", job_id, "--junit", "again.xml",
                            "--markdown", "again.md"], cwd=project.checkout, capture_output=True, text=True,
                           env={**project.env, "DEVICE_LOOP_COORDINATOR": coordinator.url}, timeout=60)
    assert again.returncode == 0, again.stderr
    assert (project.checkout / "again.xml").read_text() == (project.checkout / "ab.xml").read_text()
    assert (project.checkout / "again.md").read_text() == (project.checkout / "ab.md").read_text()
    wait_for(lambda: _holders(coordinator) == {name: None for name in BOARDS}, what="the boards given back")


class BoardWatch:
    """When the lease of the tests was given back, seen while the runner waits on its cancel."""

    def __init__(self, coordinator, pids: Path):
        self.coordinator, self.pids, self.freed_at = coordinator, pids, None
        self.leases: list[str] = []

    def ready(self) -> bool:
        if not self.pids.exists():
            return False
        self.leases = [lease["id"] for lease in self.coordinator.api("/leases").json()]
        return True

    def watch(self) -> None:
        if self.freed_at is None and all(self.coordinator.api(f"/leases/{lease}").json()["state"] not in
                                         LIVE_LEASE_STATES for lease in self.leases):
            self.freed_at = time.monotonic()

    def freed_within(self, cancel: Cancel, seconds: float) -> bool:
        """Whether the board was given back within ``seconds`` of the cancel (the runner may
        have stopped waiting before: its shell died of the signal, `with` lives on its second)."""
        assert cancel.sent_at is not None, "no cancel was sent"
        while self.freed_at is None and time.monotonic() < cancel.sent_at + seconds:
            self.watch()
            time.sleep(0.02)
        return self.freed_at is not None and self.freed_at - cancel.sent_at < seconds


def test_a_github_cancel_frees_the_board_within_a_second_even_when_the_tests_ignore_sigint(lab, project):
    coordinator, _ = lab
    pids = project.runs / "pids"
    project.env.update(CI_TEST_HANG="ignore-int", CI_TEST_PIDS=str(pids))
    seen = BoardWatch(coordinator, pids)
    cancel = Cancel("Test on a board running the build", seen.ready, seen.watch)
    steps = github_job(project, coordinator.url, cancel=cancel, last="Test on a board running the build")
    assert seen.freed_within(cancel, 1.5), "the board was not given back within a second of the SIGINT"
    # SIGINT ignored by the tests: the runner's SIGTERM, 7.5 s on, killed their group (`with` says 130: SIGINT)
    assert steps["Test on a board running the build"].status == 130
    assert not any(pid_alive(int(p)) for p in pids.read_text().split())
    board_tests = (project.checkout / "board-tests.xml").read_text()
    assert 'type="cancelled"' in board_tests and "SIGINT" in board_tests


def test_a_gitlab_cancel_frees_the_board_within_a_second(lab, project):
    coordinator, _ = lab
    pids = project.runs / "pids"
    project.env.update(CI_TEST_HANG="yes", CI_TEST_PIDS=str(pids))
    seen = BoardWatch(coordinator, pids)
    cancel = Cancel("script", seen.ready, seen.watch)
    status = gitlab_job(project, coordinator.url, cancel=cancel, upto=4)
    assert seen.freed_within(cancel, 1.5), "the board was not given back within a second of the SIGTERM"
    assert status in (-signal.SIGTERM, 128 + signal.SIGTERM), status   # bash dies of it, or ends with `with`
    assert not any(pid_alive(int(p)) for p in pids.read_text().split())
    assert 'type="cancelled"' in (project.checkout / "board-tests.xml").read_text()
