"""The worker (docs/architecture.md, "Jobs and evidence"): a job's command runs on this
machine in a process group of its own, killed whole at its deadline and gone with a worker
killed outright; an agent's job submitted through MCP runs on ``device-loop worker`` and the
agent reads its markdown; a worker killed mid-job leaves the job failed ("worker lost") with
its runs, its lease released, and nothing it started running."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import wait_for
from device_loop.client.local_run import LocalCommand, samples
from device_loop.core.jobs import MetricSpec
from helpers import pid_alive

pytestmark = pytest.mark.timeout(60)


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
    wait_for(lambda: len(group_alive(command.pid)) >= 3, 5, what="the command and its children")
    result = command.wait(0.3)
    assert result.timed_out and result.status < 0 and "never" not in result.stdout
    wait_for(lambda: not group_alive(command.pid), 5, what="the whole group gone")


def test_status_output_and_samples_of_a_command():
    said = LocalCommand('echo \'{"metric": "decode_ms", "value": 12.5, "unit": "ms"}\'; echo "noise {"; '
                        'echo \'{"metric": "decode_ms", "value": "NaN"}\'; echo "fps: 59.9" >&2; exit 3',
                        {"PATH": os.environ["PATH"]}).wait(10)
    assert said.status == 3 and not said.timed_out and "fps: 59.9" in said.tail()
    assert [(s.metric, s.value, s.unit) for s in samples(said, [])] == [("decode_ms", 12.5, "ms")]
    declared = [MetricSpec(name="decode_ms"), MetricSpec(name="fps", better="higher", regex=r"fps: (?P<value>[0-9.]+)")]
    assert [(s.metric, s.value) for s in samples(said, declared)] == [("decode_ms", 12.5), ("fps", 59.9)]


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
        leader = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), 10, what="the command started"))
        wait_for(lambda: len(group_alive(leader)) >= 3, 5, what="the command's children")
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
        wait_for(lambda: not group_alive(leader), 10, what="the command's group gone with its worker")
        assert not pid_alive(leader)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
