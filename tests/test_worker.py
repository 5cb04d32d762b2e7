"""The worker (docs/architecture.md, "Jobs and evidence"): a job's command runs on this
machine in a process group of its own, killed whole at its deadline and gone with a worker
killed outright; an agent's job submitted through MCP runs on ``device-loop worker`` and the
agent reads its markdown; a worker killed mid-job leaves the job failed ("worker lost") with
its runs, its lease released, and nothing it started running, a setsid child included; a
job's regex that would take Python's ``re`` forever does not stop its worker's beats.
(What a shared worker keeps apart: tests/test_shared_worker.py.)"""
from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import Coordinator, Exporter, Proc, lab_tokens, wait_for
from device_loop.client.local_run import LocalCommand, read_metrics
from device_loop.core.ab.jobs import MetricSpec
from helpers import device_loop_for_anyone, open_folder, pid_alive, unused_uids, wait_state
from test_mcp import agent as mcp_client, call

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]


def group_alive(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``."""
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] not in "ZX":
            alive.append(int(entry.name))
    return alive


def test_a_command_past_its_deadline_is_killed_with_all_it_started():
    command = LocalCommand("sleep 30 & sleep 30; echo never", os.environ)
    wait_for(lambda: len(group_alive(command.pid)) >= 3, what="the command and its children")
    result = command.wait(0.3)
    assert result.timed_out and result.status < 0 and "never" not in result.stdout
    wait_for(lambda: not group_alive(command.pid), what="the whole group gone")


def test_status_output_and_samples_of_a_command():
    said = LocalCommand('echo \'{"metric": "decode_ms", "value": 12.5, "unit": "ms"}\'; echo "noise {"; '
                        'echo \'{"metric": "decode_ms", "value": "NaN"}\'; echo "fps: 59.9" >&2; exit 3',
                        {"PATH": os.environ["PATH"]}).wait(10)
    assert said.status == 3 and not said.timed_out and "fps: 59.9" in said.tail()
    assert [(s.metric, s.value, s.unit) for s in read_metrics(said, []).samples] == [("decode_ms", 12.5, "ms")]
    declared = [MetricSpec(name="decode_ms"), MetricSpec(name="fps", better="higher", regex=r"fps: (?P<value>[0-9.]+)")]
    assert [(s.metric, s.value) for s in read_metrics(said, declared).samples] == [("decode_ms", 12.5), ("fps", 59.9)]


def test_a_worker_killed_outright_takes_its_commands_with_it(tmp_path):
    """PR_SET_PDEATHSIG on the group's leader, whose trap kills the whole group."""
    pid_file = tmp_path / "pid"
    script = textwrap.dedent(f"""
        import os, pathlib
        from device_loop.client.local_run import LocalCommand
        command = LocalCommand("sleep 60 & sleep 60", os.environ)
        pathlib.Path({str(pid_file)!r}).write_text(str(command.pid))
        command.wait(60)
    """)
    worker = subprocess.Popen([sys.executable, "-c", script])
    try:
        leader = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), what="the command started"))
        wait_for(lambda: len(group_alive(leader)) >= 3, what="the command's children")
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
        wait_for(lambda: not group_alive(leader), what="the command's group gone with its worker")
        assert not pid_alive(leader)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


def make_tokens(folder: Path, **kinds: str) -> dict[str, str]:
    """Tokens on the lab's database, as its first admin makes them: user -> token, each of
    the kind given (``person``, ``agent``, or ``admin``: a person's with admin rights)."""
    from device_loop.coordinator.identity import issue_token
    from device_loop.coordinator.serve import sqlite_url
    from device_loop.coordinator.store import Store
    from device_loop.core.vocabulary import TokenKind

    async def make() -> dict[str, str]:
        store = Store(sqlite_url(folder / "coord"))
        await store.connect()
        try:
            return {name: (await issue_token(store, time.time, name.split(":")[0], admin=kind == "admin",
                                             kind=TokenKind("person" if kind == "admin" else kind)))["token"]
                    for name, kind in kinds.items()}
        finally:
            await store.disconnect()

    return asyncio.run(make())


def worker(tmp_path: Path, env: dict, coordinator, *args: str, token: str | None = None) -> Proc:
    env = {**env, "DEVICE_LOOP_COORDINATOR": coordinator.url, **({"DEVICE_LOOP_TOKEN": token} if token else {})}
    return Proc(["worker", "--poll", "20s", "--beat", "1s", *args], env, tmp_path / "worker.log")


SIM = {"plugin": "sim", "class": "sim-board", "workload_s": 0.02}
WORKLOAD = "device-loop exec $DEVICE_LOOP_LEASE -- run-workload --cost {cost}"


@pytest.mark.anyio
async def test_an_agents_job_through_mcp_runs_on_a_worker_and_the_agent_reads_the_evidence(tmp_path, env):
    coordinator = Coordinator(tmp_path, env, extra=())
    tokens = await asyncio.to_thread(make_tokens, tmp_path, **{"alice": "person", "alice:agent": "agent",
                                                               "ops": "admin"})
    _, token_file = await asyncio.to_thread(lab_tokens, env, coordinator, tmp_path)
    exporter = Exporter(tmp_path, env, coordinator.url, [{"name": "sim-board-0", **SIM}], token_file=str(token_file))
    running = None
    box = open_folder("dl-mcp-")
    try:
        await asyncio.to_thread(wait_state, coordinator, "sim-board-0", "idle")
        # a shared worker's token (an admin's) never reaches its users' commands, which run as
        # alice's account: they reach their lease's device all the same (the worker hands them
        # the lease, not its token)
        no_token = 'test -z "$DEVICE_LOOP_TOKEN" && '
        workload = WORKLOAD.replace("device-loop", str(device_loop_for_anyone(box)))
        spec = {"title": "decode path", "target": {"class": "sim-board"},
                "ab": {"baseline": [no_token + workload.format(cost=1.0)], "patch": [workload.format(cost=0.95)],
                       "rounds": 2, "warmup": 0}}
        async with mcp_client(coordinator.url, tokens["alice:agent"]) as agent:
            job = await call(agent, "submit_job", spec=spec)
            assert (job["state"], job["kind"], job["owner"]) == ("queued", "batch", "alice")
            running = worker(tmp_path, {k: v for k, v in env.items() if k != "DEVICE_LOOP_TOKEN"}, coordinator,
                             "--once", "--users", "alice", "--account", f"alice={unused_uids(1)[0]}",
                             token=tokens["ops"])  # the lab's shared worker
            status = job
            while status["state"] in ("queued", "running"):
                status = await call(agent, "job_status", job_id=job["id"], wait_s=10, unless=status["state"])
            assert status["state"] == "done", status["reason"]
            assert [r["arm"] for r in status["runs"]] == ["A", "B", "A", "B"]
            assert status["worker"] and status["worker"] != "alice", "the worker names itself: host and pid"
            evidence = (await call(agent, "job_evidence", job_id=job["id"]))["result"]
        assert evidence.startswith("# decode path") and job["id"] in evidence
        assert "run-workload --cost 0.95" in evidence and "sim-board-0" in evidence and no_token in evidence
        assert await asyncio.to_thread(running.popen.wait, 30) == 0, running.output()
        assert f"{job['id']} done" in running.output()
        print(running.output())
        leases = coordinator.api("/leases", headers={"Authorization": f"Bearer {tokens['alice']}"}).json()
        assert leases == [], "the job's lease was released"
    finally:
        if running is not None:
            running.stop(signal.SIGKILL)
        exporter.stop()
        coordinator.stop()
        shutil.rmtree(box)


def test_a_worker_killed_mid_job_loses_it_and_leaves_nothing_running(tmp_path, env):
    coordinator = Coordinator(tmp_path, env, extra=("--single-user", "--job-worker-timeout", "2s"))
    exporter = Exporter(tmp_path, env, coordinator.url, [{"name": "sim-board-0", **SIM}])
    pids = tmp_path / "pids"
    # the first run ends at once; the second starts three children that would run for a
    # minute, one of them out of its process group (setsid)
    command = (f"if [ -e {pids} ]; then echo $$ >> {pids}; sleep 60 & echo $! >> {pids}; "
               f"setsid sh -c 'echo $$ >> {pids}; exec sleep 60' & sleep 60; "
               f"else echo started > {pids}; echo '{{\"metric\": \"m\", \"value\": 1}}'; fi")
    running = None
    try:
        wait_state(coordinator, "sim-board-0", "idle")
        job = coordinator.api("/jobs", "POST", json={"spec": {"target": {"device": "sim-board-0"}, "run": [command],
                                                              "rounds": 3}}).json()
        running = worker(tmp_path, {**env, "DEVICE_LOOP_USER": "alice"}, coordinator)
        wait_for(lambda: len(pids.read_text().split()) == 4 if pids.exists() else False,
                 what="the second run's command and its children")
        started = [int(p) for p in pids.read_text().split()[1:]]
        assert all(pid_alive(p) for p in started)
        running.stop(signal.SIGKILL)

        ended = wait_for(lambda: (j := coordinator.api(f"/jobs/{job['id']}", params={"wait": 5, "unless": "running"})
                                  .json())["state"] != "running" and j, what="the reaper ending the job")
        assert ended["state"] == "failed" and ended["reason"].startswith("worker lost"), ended["reason"]
        assert [r["seq"] for r in ended["runs"]] == [0], "the run that ended is kept"
        assert all(r["lease_state"] == "released" for r in ended["reservations"] if r["lease"]), ended["reservations"]
        wait_for(lambda: not any(pid_alive(p) for p in started), what="the worker's commands gone with it")
        wait_state(coordinator, "sim-board-0", "idle")
    finally:
        if running is not None:
            running.stop(signal.SIGKILL)
        exporter.stop()
        coordinator.stop()


def test_a_regex_that_would_take_forever_does_not_stop_the_worker(tmp_path, env):
    """``(a+)+$`` against 30 a's and a '!' takes Python's re some 2^30 steps, holding the
    interpreter: the beats stopped and the job was "worker lost". Read by RE2, in time linear
    in the output, the run is recorded without the metric and the job fails saying so."""
    coordinator = Coordinator(tmp_path, env, extra=("--single-user", "--job-worker-timeout", "2s"))
    exporter = Exporter(tmp_path, env, coordinator.url, [{"name": "sim-board-0", **SIM}])
    running = None
    try:
        wait_state(coordinator, "sim-board-0", "idle")
        spec = {"target": {"device": "sim-board-0"}, "run": ["echo " + "a" * 30 + "!"],
                "metrics": [{"name": "m", "regex": "(?P<value>(a+)+)$"}]}
        job = coordinator.api("/jobs", "POST", json={"spec": spec}).json()
        running = worker(tmp_path, {**env, "DEVICE_LOOP_USER": "alice"}, coordinator)
        ended = wait_for(lambda: (j := coordinator.api(f"/jobs/{job['id']}", params={"wait": 5, "unless": "running"})
                                  .json())["state"] not in ("queued", "running") and j, what="the job's end")
        assert ended["state"] == "failed" and "printed no value for m" in ended["reason"], ended["reason"]
        assert [(r["seq"], r["samples"]) for r in ended["runs"]] == [(0, [])]
    finally:
        if running is not None:
            running.stop(signal.SIGKILL)
        exporter.stop()
        coordinator.stop()
