"""``device-loop with`` on a real lab (docs/architecture.md, "A lease bound to a command"): the
command gets the lease, its status is the exit status, and the lease ends with it, however it
ends: run to its end, cancelled as CI runners cancel, cut by --max-time, or failed by the lab."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import WAIT_S, Coordinator, Exporter, own_environment, sim_devices, wait_for
from helpers import device, pid_alive, wait_state
from device_loop.client.command_lease import GRACE_S
from device_loop.coordinator.lifecycle import Settings

KEEPALIVE_S = 5.0  # the shortest keepalive a lease takes
REAPER_S = Settings().reaper_interval_s  # a lapsed lease ends at the reaper's next pass

pytestmark = [pytest.mark.service, pytest.mark.timeout(90)]


def start_with(env, coordinator, *args, **popen) -> subprocess.Popen:
    """``device-loop with ARGS`` in a session of its own (signals reach only it), stdout and stderr piped."""
    return subprocess.Popen([sys.executable, "-m", "device_loop.cli", "--coordinator", coordinator.url, "with",
                             *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **popen)


def outcome_of(proc: subprocess.Popen, timeout: float = WAIT_S) -> tuple[int, dict, str]:
    """(exit status, the --json outcome: stdout's last line, stderr)."""
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, json.loads(out.strip().splitlines()[-1]), err


@pytest.fixture(scope="module")
def shared_lab(tmp_path_factory):
    """One lab for the module's tests (each leaves sim-board-0 to become idle again)."""
    folder = tmp_path_factory.mktemp("with-lab")
    environ = own_environment(folder)
    coordinator = Coordinator(folder, environ)
    exporter = Exporter(folder, environ, coordinator.url, sim_devices("sim-board-0"))
    yield coordinator
    exporter.stop(signal.SIGKILL)
    coordinator.stop()


@pytest.fixture
def lab(shared_lab):
    wait_state(shared_lab, "sim-board-0", "idle")
    return shared_lab


def test_the_command_gets_the_lease_and_its_status_is_the_exit_status(lab, env, tmp_path):
    seen = tmp_path / "seen"
    script = f'echo "$DEVICE_LOOP_LEASE $DEVICE_LOOP_DEVICE" > {seen}; echo out; exit 3'
    status, outcome, err = outcome_of(start_with(env, lab, "sim-board-0", "--json", "--", "sh", "-c", script))
    assert status == 3, err
    lease_id, name = seen.read_text().split()
    assert (outcome["status"], outcome["failure"], outcome["device"], outcome["lease"]) == (3, "test", name, lease_id)
    assert name == "sim-board-0" and outcome["command"] == ["sh", "-c", script]
    assert lab.api(f"/leases/{lease_id}").json()["state"] == "released"

    status, outcome, err = outcome_of(start_with(env, lab, "--class", "sim-board", "--json", "--", "true"))
    assert (status, outcome["failure"], outcome["reason"]) == (0, None, None), err
    assert outcome["timings"]["total_s"] >= outcome["timings"]["run_s"] > 0


def test_max_time_cuts_the_command_with_124_and_its_children_go_too(lab, env, tmp_path):
    pids = tmp_path / "pids"
    script = f"sleep 1000 & echo $! > {pids}; wait"
    status, outcome, err = outcome_of(start_with(env, lab, "sim-board-0", "--max-time", "1s", "--json", "--",
                                                 "sh", "-c", script))
    assert (status, outcome["failure"]) == (124, "timeout"), err
    assert "--max-time 1s" in err
    assert not pid_alive(int(pids.read_text()))


def test_a_lease_revoked_while_the_command_runs_is_a_lab_failure(lab, env, tmp_path):
    started = tmp_path / "started"
    proc = start_with(env, lab, "sim-board-0", "--json", "--", "sh", "-c", f"touch {started}; sleep 1000")
    wait_for(started.exists, what="the command started")
    lease_id = device(lab, "sim-board-0")["lease"] or lab.api("/leases").json()[0]["id"]
    assert lab.api(f"/admin/leases/{lease_id}/revoke", "POST").status_code == 200
    status, outcome, err = outcome_of(proc)
    assert (status, outcome["failure"]) == (75, "lab"), err
    assert "device-loop: lab failure: the lease" in err and "revoked" in outcome["reason"]
    assert err.count("lab failure") == 1, f"said once:\n{err}"


@pytest.mark.parametrize("first, ignored", [(signal.SIGINT, False), (signal.SIGINT, True), (signal.SIGTERM, False),
                                            (signal.SIGHUP, True)])
def test_cancel_as_runners_send_it_frees_the_board_within_a_second(lab, env, tmp_path, first, ignored):
    """SIGINT (or SIGTERM, or SIGHUP), then SIGTERM, then SIGKILL: the lease ends within a
    second of the first (even when the command ignores it), and none of the command's
    processes outlives `with`."""
    pids = tmp_path / "pids"
    ignore = 'trap "" INT TERM HUP; ' if ignored else ""
    script = f"{ignore}sleep 1000 & sleep 1000 & echo $$ $(jobs -p) > {pids}.tmp; mv {pids}.tmp {pids}; wait; wait"
    proc = start_with(env, lab, "sim-board-0", "--json", "--", "sh", "-c", script)
    wait_for(pids.exists, what="the command started")
    lease_id = lab.api("/leases").json()[0]["id"]
    sent = time.monotonic()
    proc.send_signal(first)
    # released within GRACE_S of the first signal (docs/architecture.md, "A lease bound to a command"),
    # with half of it again for this test's own polling under load
    wait_for(lambda: lab.api(f"/leases/{lease_id}").json()["state"] == "released", 1.5 * GRACE_S, interval=0.02,
             what="the lease released")
    assert time.monotonic() - sent < 1.5 * GRACE_S
    if ignored:
        assert proc.poll() is None and all(pid_alive(int(p)) for p in pids.read_text().split())
        proc.send_signal(signal.SIGTERM)  # the second: the group is killed
    status, outcome, err = outcome_of(proc)
    assert (status, outcome["cancelled"], outcome["failure"]) == (128 + first, first.name, None), err
    assert not any(pid_alive(int(p)) for p in pids.read_text().split())


def test_kill_9_of_with_leaves_no_process_and_the_board_free_within_the_keepalive(lab, env, tmp_path):
    pids = tmp_path / "pids"
    script = f"sleep 1000 & echo $$ $! > {pids}.tmp; mv {pids}.tmp {pids}; wait"
    proc = start_with(env, lab, "sim-board-0", "--keepalive", f"{KEEPALIVE_S:g}s", "--", "sh", "-c", script)
    wait_for(pids.exists, what="the command started")
    lease_id = lab.api("/leases").json()[0]["id"]
    assert lab.api(f"/leases/{lease_id}").json()["keepalive_s"] == KEEPALIVE_S
    proc.kill()
    killed = time.monotonic()
    proc.wait()
    wait_for(lambda: not any(pid_alive(int(p)) for p in pids.read_text().split()),
             what="the command's processes gone")
    # its last keep-alive came up to a third of the keepalive before; the reaper passes every second
    wait_for(lambda: lab.api(f"/leases/{lease_id}").json()["state"] == "expired", KEEPALIVE_S + 3 * REAPER_S,
             interval=0.1, what="the lease lapsed")
    assert time.monotonic() - killed < KEEPALIVE_S + 1.5 * REAPER_S
    assert "stopped renewing" in lab.api(f"/leases/{lease_id}").json()["reason"]


# The command: reads the board's console until it closes, then (waiting for the lab to see
# why, as a person would look) fails.
CONSOLE_READER = """
import json, os, socket, sys, time, urllib.request
lease = json.loads(os.environ["DEVICE_LOOP_LEASE_ANSWER"])
endpoint = lease["endpoints"][0]
console = socket.create_connection((endpoint["host"], endpoint["port"]))
open(sys.argv[1], "w").close()
while console.recv(4096):
    pass
url = f"{os.environ['DEVICE_LOOP_COORDINATOR']}/api/v1/leases/{lease['id']}"
request = urllib.request.Request(url, headers={"X-Device-Loop-User": os.environ["DEVICE_LOOP_USER"]})
while json.load(urllib.request.urlopen(request))["ready"]:
    time.sleep(0.05)
sys.exit(1)
"""


def test_the_exporter_killed_while_the_command_runs_is_a_lab_failure(coordinator, exporter_factory, env, tmp_path):
    exporter = exporter_factory()
    wait_state(coordinator, "sim-board-0", "idle")
    started = tmp_path / "started"
    script = tmp_path / "reader.py"
    script.write_text(CONSOLE_READER)
    proc = start_with(env, coordinator, "sim-board-0", "--json", "--", sys.executable, str(script), str(started))
    wait_for(started.exists, what="the command reading the console")
    exporter.stop(signal.SIGKILL)
    status, outcome, err = outcome_of(proc)
    assert (status, outcome["failure"], outcome["command_status"]) == (75, "lab", 1), err
    assert "exporter on host-a lost its connection" in outcome["reason"]
    assert f"device-loop: lab failure: {outcome['reason']}" in err


def test_queued_it_says_its_place_and_runs_once_granted_and_gives_up_at_its_timeout(lab, env, tmp_path):
    holder = lab.api("/leases", "POST", json={"device": "sim-board-0", "ttl_s": 600},
                     headers={"X-Device-Loop-User": "bob"}).json()
    status, outcome, err = outcome_of(start_with(env, lab, "sim-board-0", "--queue", "--timeout", "1s", "--json",
                                                 "--", "true"))
    assert (status, outcome["failure"]) == (75, "lab"), err
    assert "position 1" in err and "no device within 1s" in outcome["reason"] and "cancelled" in outcome["reason"]
    assert not [t for t in lab.api("/tickets").json() if t["state"] in ("waiting", "granted")]

    proc = start_with(env, lab, "sim-board-0", "--queue", "--json", "--", "true")
    wait_for(lambda: any(t["state"] == "waiting" for t in lab.api("/tickets").json()), what="queued")
    lab.api(f"/leases/{holder['id']}/release", "POST", headers={"X-Device-Loop-User": "bob"})
    status, outcome, err = outcome_of(proc)
    assert (status, outcome["device"]) == (0, "sim-board-0"), err


def test_at_a_terminal_the_command_is_its_foreground_and_ctrl_c_reaches_it(lab, env, tmp_path):
    import fcntl
    import termios

    primary, secondary = os.openpty()
    said = tmp_path / "said"
    script = (f'python3 -c "import os; print(os.tcgetpgrp(0) == os.getpgrp())" > {said}; '
              f"sleep 1000")

    def controlling_terminal():
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen([sys.executable, "-m", "device_loop.cli", "--coordinator", lab.url, "with",
                             "sim-board-0", "--json", "--", "sh", "-c", script], env=env, stdin=secondary,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=controlling_terminal)
    os.close(secondary)
    try:
        wait_for(lambda: said.exists() and said.read_text().strip(), what="the command started")
        assert said.read_text().strip() == "True", "the command's group is the terminal's foreground"
        os.write(primary, b"\x03")  # Ctrl-C: the terminal sends SIGINT to its foreground group
        status, outcome, err = outcome_of(proc)
        assert (status, outcome["cancelled"], outcome["failure"]) == (130, "SIGINT", None), err
    finally:
        os.close(primary)


@pytest.mark.parametrize("args, said", [
    (["sim-board-0", "--", "true", *["x"] * 100_000], "100,001 arguments"),
    (["sim-board-0", "--keepalive", "3650d", "--", "true"], "--keepalive: a keepalive is 5 to 3600 seconds"),
    (["sim-board-0", "--keepalive", "0", "--", "true"], "give a unit"),
    (["sim-board-0", "--", "no-such-program-here"], "no such program"),
])
def test_a_hostile_command_line_is_a_usage_error_before_the_lab_is_asked(env, args, said):
    done = subprocess.run([sys.executable, "-m", "device_loop.cli", "--coordinator", "http://127.0.0.1:9", "with",
                           "--json", *args], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["error"] == "usage" and said in answer["message"], answer


def test_a_with_frozen_past_its_keepalive_finds_its_lease_lapsed_a_lab_failure(lab, env, tmp_path):
    """A runner stopped (a suspended VM, SIGSTOP) longer than the keepalive: the lease lapses,
    and once it runs again its command is ended, exit 75 with the reason."""
    started = tmp_path / "started"
    proc = start_with(env, lab, "sim-board-0", "--keepalive", "5s", "--json", "--", "sh", "-c",
                      f"touch {started}; sleep 1000")
    wait_for(started.exists, what="the command started")
    lease_id = lab.api("/leases").json()[0]["id"]
    proc.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: lab.api(f"/leases/{lease_id}").json()["state"] == "expired", interval=0.1,
                 what="the lease lapsed")
    finally:
        proc.send_signal(signal.SIGCONT)
    status, outcome, err = outcome_of(proc)
    assert (status, outcome["failure"]) == (75, "lab"), err
    assert lease_id in outcome["reason"] and "expired" in outcome["reason"]
