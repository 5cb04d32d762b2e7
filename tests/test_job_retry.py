"""Lab failures in jobs, end to end on a lab of the two demo boards (docs/architecture.md, "Lab
failures"): a run the lab failed (its command exited 75) starts its cell again on the other
demo board, the job ends done and its evidence names both attempts, each with its device
and cause; a command that failed is the test's, one that outran its deadline a timeout, one
whose lease an admin revoked meanwhile the lab's; two lab failures in a row take a board out
of service until an admin clears it. One lab for the module; this process is the worker."""
from __future__ import annotations

import sys
import threading

import httpx2
import pytest

from conftest import Coordinator, Exporter, own_environment, wait_for
from helpers import wait_state
from device_loop.client import Lab
from device_loop.client.runner import Runner
from device_loop.core.ab.jobs import JobSpec, JobView
from device_loop.core.vocabulary import FailureKind, JobState

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]

BOARDS = [{"name": f"sim-board-{n}", "plugin": "sim", "class": "sim-board"} for n in (0, 1)]
METRIC = """echo '{"metric": "t_ms", "value": 2}'"""


@pytest.fixture(scope="module")
def one_lab(tmp_path_factory):
    folder = tmp_path_factory.mktemp("retry-lab")
    environ = own_environment(folder)
    coordinator = Coordinator(folder, environ)
    exporter = Exporter(folder, environ, coordinator.url, BOARDS)
    try:
        yield coordinator
    finally:
        exporter.stop()
        coordinator.stop()


@pytest.fixture
def lab(one_lab):
    """The module's coordinator, both boards idle (out of service no more: a test before may
    have failed one twice), and a client of it as alice."""
    for board in BOARDS:
        if one_lab.api(f"/devices/{board['name']}").json().get("fault_kind") == "lab-failures":
            one_lab.api(f"/admin/devices/{board['name']}/clear-fault", "POST")
        wait_state(one_lab, board["name"], "idle")
    client = Lab(one_lab.url, user="alice")
    yield one_lab, client
    client.api.close()


def run_job(client: Lab, spec: dict, said: list[str] | None = None) -> JobView:
    """``spec`` run to its end by this process as its worker."""
    job = client.jobs.submit(JobSpec.model_validate(spec), claim=True)
    return Runner(client.jobs, say=(said if said is not None else []).append).run(job)


def test_a_lab_failure_is_retried_on_the_other_demo_board_and_the_evidence_names_both(lab, tmp_path):
    coordinator, client = lab
    mark = tmp_path / "failed-once"
    said: list[str] = []
    ended = run_job(client, {"target": {"class": "sim-board"}, "rounds": 2, "retry": 1,
                             "metrics": [{"name": "t_ms", "unit": "ms"}],
                             "run": [f"if [ ! -e {mark} ]; then touch {mark}; echo 'board hung' >&2; exit 75; fi; "
                                     f"{METRIC}"]}, said)
    assert ended.state is JobState.DONE, (ended.reason, said)
    first, second = sorted(ended.cells, key=lambda c: c.attempt)
    assert {first.device, second.device} == {"sim-board-0", "sim-board-1"}, "the retry took the other board"
    assert (first.attempt, first.failure, second.attempt, second.failure) == (0, FailureKind.LAB, 1, None)
    assert "exited 75" in first.reason and "board hung" in first.reason
    assert [(r.attempt, r.seq, r.status, r.failure) for r in ended.runs] == \
        [(0, 0, 75, FailureKind.LAB), (1, 0, 0, None), (1, 1, 0, None)]
    assert any(f"a lab failure on {first.device}" in line and "attempt 1 of 2" in line for line in said), said

    evidence = client.jobs.evidence(ended.id)
    attempts = evidence.split("## Attempts")[1].split("##")[0]
    row0 = next(line for line in attempts.splitlines() if line.startswith("| 0    | 0 "))
    row1 = next(line for line in attempts.splitlines() if line.startswith("| 0    | 1 "))
    assert first.device in row0 and "lab failure" in row0 and "exited 75" in row0
    assert second.device in row1 and "ran" in row1
    assert "retry = 1" in evidence and "failure" in evidence.split("## Runs")[1]
    cell = client.api.get(f"/jobs/{ended.id}")["analysis"]["cells"][0]
    assert (cell["device"], cell["counted"], cell["failed"]) == (second.device, 2, 0), "the last attempt's"
    page = httpx2.get(f"{coordinator.url}/jobs/{ended.id}", headers={"X-Device-Loop-User": "alice"}, timeout=10)
    assert page.status_code == 200 and 'data-label="Failure"><span class="bad">lab</span>' in page.text
    assert coordinator.api(f"/devices/{first.device}").json()["fault"] is None, "one lab failure is no fault"


def test_a_matrix_cell_retries_on_the_board_its_neighbour_gives_back(lab, tmp_path):
    """The other cell goes on while one retries; the retry waits for the one other board."""
    coordinator, client = lab
    once = tmp_path / "failed-once"
    command = f"if mkdir {once} 2>/dev/null; then exit 75; fi; {METRIC}"
    ended = run_job(client, {"target": {"class": "sim-board"}, "retry": 1, "metrics": [{"name": "t_ms"}],
                             "matrix": {"over": ["class=sim-board", "class=sim-board"]},
                             "ab": {"baseline": [command], "patch": [command], "rounds": 1, "warmup": 0,
                                    "settle": False}})
    assert ended.state is JobState.DONE, ended.reason
    attempts = sorted((c.cell, c.attempt, c.device, c.failure) for c in ended.cells)
    retried = [a for a in attempts if a[1] == 1]
    assert len(attempts) == 3 and len(retried) == 1, attempts
    failed = next(a for a in attempts if a[0] == retried[0][0] and a[1] == 0)
    assert failed[3] is FailureKind.LAB and retried[0][2] != failed[2], "the retry ran on the other board"
    assert "## Attempts" in client.jobs.evidence(ended.id)


def test_whose_failure_a_failed_run_was(lab, tmp_path):
    coordinator, client = lab
    failed = run_job(client, {"target": {"device": "sim-board-0"}, "retry": 1, "run": ["echo broke >&2; exit 3"]})
    assert failed.state is JobState.FAILED and "exit status 3" in failed.reason
    assert [(r.status, r.failure) for r in failed.runs] == [(3, FailureKind.TEST)], "the test's: no retry"
    assert [(c.attempt, c.failure) for c in failed.cells] == [(0, FailureKind.TEST)]

    slow = run_job(client, {"target": {"device": "sim-board-0"}, "command_timeout_s": 0.5, "run": ["sleep 30"]})
    assert [r.failure for r in slow.runs] == [FailureKind.TIMEOUT] and "did not finish within" in slow.reason

    ready, go = tmp_path / "ready", tmp_path / "go"
    wait_state(coordinator, "sim-board-0", "idle")
    holder: dict[str, JobView] = {}
    worker = threading.Thread(target=lambda: holder.update(job=run_job(client, {
        "target": {"device": "sim-board-0"},
        "run": [f"touch {ready}; while [ ! -e {go} ]; do sleep 0.02; done; exit 1"]})))
    worker.start()
    try:
        wait_for(ready.exists, what="the run under way")
        (lease,) = coordinator.api("/leases").json()
        assert coordinator.api(f"/admin/leases/{lease['id']}/revoke", "POST").status_code == 200
    finally:
        go.touch()
        worker.join(60)
    revoked = holder["job"]
    assert [(r.status, r.failure) for r in revoked.runs] == [(1, FailureKind.LAB)], "its lease was revoked: the lab's"
    assert f"the lease {lease['id']} on sim-board-0 is revoked" in revoked.reason
    assert revoked.cells[-1].failure is FailureKind.LAB


def test_two_lab_failures_in_a_row_take_a_board_out_of_service(lab):
    coordinator, client = lab
    assert run_job(client, {"target": {"device": "sim-board-1"}, "run": ["true"]}).state is JobState.DONE  # count: 0
    for n in range(2):
        wait_state(coordinator, "sim-board-1", "idle")
        ended = run_job(client, {"target": {"device": "sim-board-1"}, "run": ["exit 75"]})
        assert ended.state is JobState.FAILED and ended.runs[-1].failure is FailureKind.LAB
        assert n == 1 or coordinator.api("/devices/sim-board-1").json()["fault"] is None
    wait_state(coordinator, "sim-board-1", "faulty")
    board = coordinator.api("/devices/sim-board-1").json()
    assert board["fault_kind"] == "lab-failures" and ended.id in board["fault"], board
    log = coordinator.api("/devices/sim-board-1/log").json()
    assert any("2 lab failures in a row" in entry["cause"] for entry in log)
    assert coordinator.api("/admin/devices/sim-board-1/clear-fault", "POST").status_code == 200
    wait_state(coordinator, "sim-board-1", "idle")


def test_device_loop_run_exits_75_when_the_lab_failed_the_job_and_1_when_the_test_did(lab, tmp_path, capsys):
    """The exit status tells a CI job whose failure it was (docs/architecture.md, "Lab failures")."""
    from device_loop.cli import main as cli_main

    coordinator, _ = lab
    for command, status in (("exit 75", 75), ("exit 3", 1)):
        wait_state(coordinator, "sim-board-1", "idle")
        job_file = tmp_path / f"job-{status}.toml"
        job_file.write_text(f'target = {{ device = "sim-board-1" }}\nrun = ["{command}"]\n')
        argv = sys.argv
        sys.argv = ["device-loop", "--coordinator", coordinator.url, "--user", "alice", "run", str(job_file)]
        try:
            code = cli_main._run()
        finally:
            sys.argv = argv
        err = capsys.readouterr().err
        assert code == status and "Traceback" not in err, (command, code, err)
    assert coordinator.api("/admin/devices/sim-board-1/clear-fault", "POST").status_code in (200, 409)


def test_a_job_s_failure_is_the_test_s_before_the_lab_s():
    """A job with a test failure in one cell and a lab failure in another failed the test: a
    retry of the lab would not make it pass."""
    base = {"id": "job-x", "owner": "alice", "kind": "interactive", "state": "failed", "created_at": 0,
            "spec": {"target": {"class": "sim-board"}, "run": ["true"]}}
    run = {"seq": 0, "arm": "run", "started_at": 1, "ended_at": 2, "status": 1}
    lab_only = JobView.model_validate({**base, "runs": [{**run, "failure": "lab"}]})
    assert lab_only.failure() is FailureKind.LAB
    both = JobView.model_validate({**base, "runs": [{**run, "failure": "lab"}, {**run, "cell": 1, "failure": "test"}]})
    assert both.failure() is FailureKind.TEST
    retried = JobView.model_validate({**base, "runs": [{**run, "failure": "lab"}, {**run, "attempt": 1, "failure": "test"}]})
    assert retried.failure() is FailureKind.TEST, "the last attempt counts"
    assert JobView.model_validate(base).failure() is None
