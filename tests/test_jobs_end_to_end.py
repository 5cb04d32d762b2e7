"""Jobs from the command line and from Python, end to end (docs/architecture.md, "Jobs and
evidence"): a job file run here, its table, listing, page and evidence with a chart, rerun
from its id; --until-decided stopping at its first look; a failing command and a lease
revoked mid-job failing the job with their reason, the runs kept and the lease released; a
job queued and cancelled; a foreground worker stopped by SIGTERM; hostile input refused with
a clear message, never a traceback. One lab for the module: every test gives its board back."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading

import pytest

from conftest import WAIT_S, Coordinator, Exporter, own_environment, wait_for
from helpers import Piped, pid_alive, wait_state
import zygote
from device_loop.cli import main as cli_main
from device_loop.client import Lab
from device_loop.client.runner import Runner, Stopper
from device_loop.core.ab.jobs import JobSpec
from device_loop.core.vocabulary import JobState

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]

WORKLOAD = "device-loop exec $DEVICE_LOOP_LEASE -- run-workload --cost {cost}"
BOARD = {"name": "sim-board-0", "plugin": "sim", "class": "sim-board", "tags": ["rvv"], "workload_s": 0.02}


@pytest.fixture(scope="module")
def one_lab(tmp_path_factory):
    folder = tmp_path_factory.mktemp("jobs-lab")
    environ = own_environment(folder)
    coordinator = Coordinator(folder, environ)
    exporter = Exporter(folder, environ, coordinator.url, [BOARD])
    try:
        yield coordinator, {**environ, "DEVICE_LOOP_COORDINATOR": coordinator.url}
    finally:
        exporter.stop()
        coordinator.stop()


@pytest.fixture
def lab(one_lab):
    """The module's lab, its board idle; the environment of a CLI pointed at it."""
    wait_state(one_lab[0], "sim-board-0", "idle")
    return one_lab


def here(capsys, coordinator, *args: str) -> tuple[int, str, str]:
    """``device-loop ARGS`` in this process (no Python start: for refusals and quick reads):
    exit code, stdout, stderr."""
    argv = sys.argv
    sys.argv = ["device-loop", "--coordinator", coordinator.url, "--user", "alice", *args]
    try:
        code = cli_main._run()
    finally:
        sys.argv = argv
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    return code, out, err


def cli(env, *args: str) -> subprocess.CompletedProcess:
    """``device-loop ARGS`` in a process of its own (forked from the zygote), to its end."""
    done = zygote.run(list(args), env, timeout=WAIT_S)
    assert "Traceback" not in done.stderr, done.stderr
    return done


class Running:
    """``device-loop ARGS`` running in a process of its own (forked from the zygote: ``Piped``),
    its output in files of ``folder``; killed on the way out if it still runs."""

    def __init__(self, env, folder, *args: str):
        self.out, self.err = folder / "cli.out", folder / "cli.err"
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.process = Piped(list(args), env, stdout=out.fileno(), stderr=err.fileno())

    def __enter__(self) -> "Running":
        return self

    def __exit__(self, *exc) -> None:
        self.process.close()

    def ended(self) -> tuple[int, str, str]:
        """Its exit status, standard output and standard error, once it ended."""
        code = self.process.wait(WAIT_S)
        return code, self.out.read_text(), self.err.read_text()


def test_a_job_file_its_table_listing_page_evidence_and_rerun(lab, tmp_path, capsys):
    coordinator, env = lab
    job_file = tmp_path / "decode.toml"
    job_file.write_text(f"""
title = "decode on a board"
rounds = 3
setup = ["echo prepared > {tmp_path}/setup-ran"]
run = ["test -n \\"$DEVICE_LOOP_LEASE\\" && {WORKLOAD.format(cost=1.0)} && echo 'frames: 60.5 fps'"]

[target]
class = "sim-board"

[[metrics]]
name = "workload_ms"
unit = "ms"

[[metrics]]
name = "fps"
better = "higher"
regex = 'frames: (?P<value>[0-9.]+)'
""")
    done = cli(env, "run", str(job_file))
    assert done.returncode == 0, done.stdout + done.stderr
    job_id = done.stdout.split("evidence: device-loop job evidence ")[1].split()[0]
    assert "workload_ms" in done.stdout and "fps" in done.stdout and f"{job_id}: done" in done.stdout
    assert "run 2 run: status 0" in done.stderr, "progress on stderr"
    assert (tmp_path / "setup-ran").read_text() == "prepared\n"

    code, listed, _ = here(capsys, coordinator, "jobs")
    assert code == 0 and job_id in listed and "decode on a board" in listed
    code, shown, _ = here(capsys, coordinator, "job", "show", job_id)
    assert "cell 0: sim-board-0" in shown and "runs: 3 (0 warmup, 0 failed)" in shown and "fps" in shown
    assert "  run 2 exited 0:\n" in shown and "    frames: 60.5 fps" in shown, "what the runs printed is shown"
    assert re.search(r"cell 0: sim-board-0 \(lease-\w+\) (ISA [\w ]+|no vector ISA) \(\d+ features\)", shown), shown
    page = json.loads(here(capsys, coordinator, "job", "show", job_id, "--json")[1])
    assert [sorted(s["metric"] for s in r["samples"]) for r in page["runs"]] == [["fps", "workload_ms"]] * 3
    assert {s["value"] for r in page["runs"] for s in r["samples"] if s["metric"] == "fps"} == {60.5}

    chart = tmp_path / "runs.png"
    code, evidence, _ = here(capsys, coordinator, "job", "evidence", job_id, "--plot", str(chart))
    assert code == 0 and evidence.startswith("# decode on a board")
    assert f"device-loop run --from-job {job_id}" in evidence and f"]({chart})" in evidence
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    code, again, err = here(capsys, coordinator, "run", "--from-job", job_id, "--json")
    assert code == 0, err
    rerun = json.loads(again)
    assert rerun["id"] != job_id and rerun["state"] == "done" and rerun["spec"] == page["spec"]
    assert rerun["analysis"]["cells"][0]["metrics"][0]["name"] == "workload_ms"


def test_until_decided_stops_at_the_first_look_that_decides(lab):
    coordinator, env = lab
    lab_client = Lab(coordinator.url, user="alice")
    spec = JobSpec.model_validate({"target": {"device": "sim-board-0"}, "ab": {
        "baseline": [WORKLOAD.format(cost=1.0)], "patch": [WORKLOAD.format(cost=0.5)], "rounds": 6, "warmup": 0,
        "settle": False, "until_decided": True, "max_rounds": 24}})
    job = lab_client.jobs.submit(spec, claim=True)  # this process is its worker
    said: list[str] = []
    ended = Runner(lab_client.jobs, say=said.append).run(job)
    assert ended.state is JobState.DONE and len(ended.runs) == 12, "decided at 6 rounds, the first of 6, 12, 24"
    assert any("decided at 6 rounds (look 1 of 3)" in line for line in said), said
    assert lab_client.jobs.wait(job.id, timeout=10).state is JobState.DONE
    assert "faster" in lab_client.jobs.evidence(job.id)
    lab_client.api.close()


def test_a_failing_command_fails_the_job_with_its_output_and_keeps_the_runs(lab, tmp_path, capsys):
    coordinator, env = lab
    flag = tmp_path / "second"
    command = f"if [ -e {flag} ]; then echo 'build broke' >&2; exit 3; fi; touch {flag}; {WORKLOAD.format(cost=1.0)}"
    code, out, _ = here(capsys, coordinator, "ab", "--device", "sim-board-0", "--baseline", command,
                        "--patch", WORKLOAD.format(cost=0.9), "--rounds", "3", "--warmup", "0", "--no-settle", "--json")
    assert code == 1
    job = json.loads(out)
    assert job["state"] == "failed" and "exit status 3" in job["reason"] and "build broke" in job["reason"]
    assert [(r["arm"], r["status"]) for r in job["runs"]] == [("A", 0), ("B", 0), ("A", 3)]
    assert "build broke" in job["runs"][-1]["output_tail"]
    wait_state(coordinator, "sim-board-0", "idle")  # the lease was given back
    leases = coordinator.api("/leases").json()
    assert leases == []


def test_a_lease_revoked_mid_job_fails_it_with_that_reason(lab, tmp_path):
    coordinator, env = lab
    ready, go = tmp_path / "ready", tmp_path / "go"
    command = f"touch {ready}; while [ ! -e {go} ]; do sleep 0.05; done; {WORKLOAD.format(cost=1.0)}"
    (tmp_path / "job.toml").write_text(f'run = [{json.dumps(command)}]\nrounds = 2\n[target]\ndevice = "sim-board-0"\n')
    with Running(env, tmp_path, "run", "--json", str(tmp_path / "job.toml")) as running:
        wait_for(ready.exists, what="the first run under way")
        (lease,) = coordinator.api("/leases").json()
        assert coordinator.api(f"/admin/leases/{lease['id']}/revoke", "POST").status_code == 200
        go.touch()
        code, out, err = running.ended()
    assert code == 75, err  # the lab failed it (docs/architecture.md, "Lab failures")
    job = json.loads(out)
    assert job["state"] == "failed" and f"the lease {lease['id']} on sim-board-0 is revoked" in job["reason"], job["reason"]
    assert len(job["runs"]) == 1 and job["runs"][0]["status"] != 0


def test_a_job_queued_for_a_worker_and_cancelled(lab, capsys):
    coordinator, env = lab
    code, queued, _ = here(capsys, coordinator, "ab", "--class", "sim-board", "--baseline", "true", "--patch", "true",
                           "--submit")
    assert code == 0 and "queued for a device-loop worker" in queued
    job_id = queued.split(":")[0]
    assert job_id.startswith("job-")
    assert "queued" in here(capsys, coordinator, "jobs")[1]
    code, cancelled, _ = here(capsys, coordinator, "job", "cancel", job_id)
    assert code == 0 and f"{job_id}: cancelled" in cancelled
    code, twice, _ = here(capsys, coordinator, "job", "cancel", job_id, "--json")
    assert code == 1 and json.loads(twice)["error"] == "job_ended"


def test_needs_from_the_command_line_on_a_lab_of_sim_boards(lab, capsys):
    """A sim board is real-hw (it stands in for one, and says so); needs any finds no device
    here, and a job that needs one fails saying so (docs/architecture.md, "Who gets the next lease")."""
    coordinator, env = lab
    code, listed, _ = here(capsys, coordinator, "ls")
    assert code == 0 and "FIDELITY" in listed and "simulated" in listed
    code, out, _ = here(capsys, coordinator, "reserve", "--needs", "any", "--json")
    refused = json.loads(out)
    assert code == 1 and refused["error"] == "no_such_devices" and "needs any" in refused["message"], refused
    code, out, _ = here(capsys, coordinator, "reserve", "sim-board-0", "--needs", "any", "--json")
    assert code == 1 and json.loads(out)["error"] == "wrong_fidelity" and "is simulated" in json.loads(out)["message"]
    code, out, _ = here(capsys, coordinator, "reserve", "--needs", "real-hw", "--json")
    lease = json.loads(out)
    assert code == 0 and lease["device"] == "sim-board-0", out
    assert here(capsys, coordinator, "release", lease["id"])[0] == 0
    wait_state(coordinator, "sim-board-0", "idle")
    code, out, _ = here(capsys, coordinator, "ab", "--class", "sim-board", "--needs", "any", "--baseline", "true",
                        "--patch", "true", "--rounds", "1", "--warmup", "0", "--no-settle", "--json")
    job = json.loads(out)
    assert code == 1 and job["state"] == "failed" and "needs any" in job["reason"], job
    assert job["spec"]["needs"] == "any" and job["runs"] == []
    assert [cell["failure"] for cell in job["cells"]] == [None], "the spec's, not the lab's: no retry cures it"


def test_hostile_input_is_refused_clearly(lab, tmp_path, capsys):
    coordinator, env = lab
    cases = {
        "bad.toml": ("run = [", "is not TOML"),
        "unknown.toml": ('run = ["true"]\ncolour = "red"\n', "colour: Extra inputs are not permitted"),
        "nothing.toml": ("title = 'x'\n", "a job runs something"),
        "regex.toml": ('run = ["true"]\n[[metrics]]\nname = "t"\nregex = "(?P<value"\n', "regex is not one"),
        "binary.toml": (b"\xff\xfe\x00", "not UTF-8"),
    }
    for name, (text, says) in cases.items():
        path = tmp_path / name
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        code, _, err = here(capsys, coordinator, "run", str(path))
        assert code == 2 and says in err, (name, err)
    for args, says in ((["run"], "give a JOBFILE.toml or --from-job ID"),
                       (["run", str(tmp_path / "missing.toml")], "cannot read"),
                       (["ab", "--baseline", "a", "--patch", "b", "--max-rounds", "9"], "give --until-decided too"),
                       (["ab", "--baseline", "a", "--patch", "b", "--metric-regex", "t"], "give NAME=REGEX"),
                       (["ab", "--baseline", "a", "--patch", "b", "--rounds", "999"], "rounds"),
                       (["ab", "--baseline", "", "--patch", "b"], "baseline")):
        code, _, err = here(capsys, coordinator, *args)
        assert code == 2 and says in err, (args, err)
    for args in (["job", "show", "job-nope"], ["job", "evidence", "job-nope"], ["run", "--from-job", "job-nope"]):
        code, _, err = here(capsys, coordinator, *args)
        assert code == 1 and "job-nope" in err, (args, err)
    code, out, _ = here(capsys, coordinator, "job", "show", "../../etc", "--json")
    assert code == 1 and json.loads(out)["error"]


def test_a_worker_stopped_by_sigterm_fails_its_job_and_releases(lab, tmp_path):
    """The foreground worker (device-loop run) on SIGTERM: the command killed, the job failed."""
    coordinator, env = lab
    started = tmp_path / "started"
    (tmp_path / "job.toml").write_text(f'run = ["touch {started}; sleep 60"]\n[target]\ndevice = "sim-board-0"\n')
    with Running(env, tmp_path, "run", "--json", str(tmp_path / "job.toml")) as running:
        wait_for(started.exists, what="the command running")
        running.process.terminate()
        code, out, err = running.ended()
    assert code == 128 + signal.SIGTERM, err  # as a shell says it (CI runners cancel so)
    job = json.loads(out)
    assert job["state"] == "failed" and "SIGTERM" in job["reason"] and job["runs"] == []
    wait_state(coordinator, "sim-board-0", "idle")


def test_a_running_job_cancelled_stops_its_worker_and_its_command(lab, tmp_path, capsys):
    coordinator, env = lab
    pid = tmp_path / "pid"
    (tmp_path / "job.toml").write_text(f'run = ["echo $$ > {pid}; sleep 60"]\n[target]\ndevice = "sim-board-0"\n')
    with Running(env, tmp_path, "run", "--json", str(tmp_path / "job.toml")) as running:
        wait_for(lambda: pid.exists() and pid.read_text().strip(), what="the command running")
        (job,) = [j for j in json.loads(here(capsys, coordinator, "jobs", "--json")[1]) if j["state"] == "running"]
        assert here(capsys, coordinator, "job", "cancel", job["id"])[0] == 0
        code, out, err = running.ended()  # its next beat says so
    assert code == 1, err
    ended = json.loads(out)
    assert ended["state"] == "cancelled" and ended["reason"] == "cancelled by alice"
    assert not pid_alive(int(pid.read_text())), "the command was killed"


def test_stop_kills_the_running_commands_of_every_cell():
    stopper, killed = Stopper(), threading.Event()
    with stopper.killing(killed.set):
        stopper.stop("worker stopped")
        assert killed.is_set() and stopper.reason == "worker stopped"
    stopper.stop("later")
    assert stopper.reason == "worker stopped", "the first reason stays"
    late = threading.Event()
    with stopper.killing(late.set):
        assert late.is_set(), "a command begun after the stop is killed at once"
