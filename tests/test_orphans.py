"""Orphans (docs/architecture.md, "Lifecycle" and "Containers and CDI"): a process still
holding a board's node after its lease ended keeps the board reclaiming and is reported
with its pid and cgroup to admins (anyone else sees how many); an admin has the exporter
kill it, and the board is idle again. How a node is matched by another name (a container's
view) is held here too."""
import json
import os
import pty
import subprocess
import sys

import httpx2
import pytest

from conftest import Coordinator, Exporter, lab_tokens, sim_devices, wait_for
from device_loop.core.holders import cgroup_of, holders, start_time_of
from device_loop.exporter.orphans import Orphan, _kill
from helpers import run_cli
from own_dev import held_in_its_own_dev

HOLD = "import sys, time; f = open(sys.argv[1], 'rb+', buffering=0); print('held', flush=True); time.sleep(600)"


@pytest.mark.service
def test_the_kernel_s_node_is_held_through_a_container_s_node_of_its_number_a_copy_is_only_itself(tmp_path):
    """The kernel's own node (/dev/null, on devtmpfs) is held by a process that opened a node
    of its device number in a /dev of its own (a rootful container's): it opens that device.
    A node of the same number made elsewhere (a copy, a test's fake tree) is only itself: who
    opened another node of its number does not hold it, who opened it does. A pty's number
    is not enough (each devpts numbers its own)."""
    copy = tmp_path / "null-by-another-name"
    os.mknod(copy, 0o600 | 0o020000, os.makedev(1, 3))
    with held_in_its_own_dev("/dev/null", 1, 3) as container:
        assert holders({"/dev/null"}, among={container.pid})["/dev/null"] == {container.pid}
        assert holders({str(copy)}, among={container.pid})[str(copy)] == set(), "another node of its number"
    with open(copy, "rb"):
        assert os.getpid() in holders({str(copy)})[str(copy)]
    master, slave = pty.openpty()
    try:
        lookalike = tmp_path / "pty-lookalike"
        os.mknod(lookalike, 0o600 | 0o020000, os.stat(slave).st_rdev)
        assert os.getpid() in holders({os.ttyname(slave)})[os.ttyname(slave)]
        assert os.getpid() not in holders({str(lookalike)})[str(lookalike)]
    finally:
        os.close(master)
        os.close(slave)


@pytest.mark.service
def test_a_kill_checks_the_process_again(tmp_path):
    """The exporter kills a pid only while it is the process it found (start time) and still
    holds the node."""
    master, slave = pty.openpty()
    node = os.ttyname(slave)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, node], stdout=subprocess.PIPE)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        assert holder.stdout.readline() == b"held\n"
        started = start_time_of(holder.pid)
        assert _kill(Orphan(holder.pid, started + 1, node)) == "another process has that pid now"
        assert _kill(Orphan(other.pid, start_time_of(other.pid), node)) == "no longer holds the node"
        assert holder.poll() is None and other.poll() is None
        assert _kill(Orphan(holder.pid, started, node)) == ""
        assert holder.wait(5) == -9
        assert _kill(Orphan(holder.pid, started, node)) == "gone before the kill"
    finally:
        for proc in (holder, other):
            proc.kill()
            proc.wait()
        os.close(master)
        os.close(slave)


@pytest.mark.service
@pytest.mark.timeout(120)
def test_an_orphan_keeps_its_board_reclaiming_until_an_admin_has_it_killed(tmp_path, env):
    coordinator = Coordinator(tmp_path, env, extra=())
    tokens, token_file = lab_tokens(env, coordinator, tmp_path, "alice")
    root = json.loads(run_cli(env, coordinator.url, "admin", "token", "create", "root", "--admin", "--data-dir",
                              str(tmp_path / "coord"), "--json").stdout)["token"]
    admin = {"headers": {"Authorization": f"Bearer {root}"}}
    alice = {"headers": {"Authorization": f"Bearer {tokens['alice']}"}}
    exporter = Exporter(tmp_path, env, coordinator.url, sim_devices("sim-board-0"), token_file=str(token_file))
    holder = None

    def board() -> dict:
        return coordinator.api("/devices/sim-board-0", **admin).json()

    try:
        wait_for(lambda: board().get("state") == "idle", what="sim-board-0 idle")
        lease = coordinator.api("/leases", "POST", json={"device": "sim-board-0", "ttl_s": 600}, **alice).json()
        wait_for(lambda: coordinator.api(f"/leases/{lease['id']}", **alice).json()["ready"], what="lease ready")
        # someone's program opens the board's console node during the lease, and outlives it
        holder = subprocess.Popen([sys.executable, "-c", HOLD, str(exporter.state_dir / "sim" / "sim-board-0")],
                                  stdout=subprocess.PIPE, start_new_session=True)
        assert holder.stdout.readline() == b"held\n"
        assert coordinator.api(f"/leases/{lease['id']}/release", "POST", **alice).status_code == 200

        reported = wait_for(lambda: (lambda d: d if d["state"] == "reclaiming" and d["busy_by"] else None)(board()),
                            what="the orphan reported")
        assert reported["busy_by"] == [{"pid": holder.pid, "program": os.path.basename(sys.executable),
                                        "command": f"{sys.executable} -c {HOLD} {exporter.state_dir}/sim/sim-board-0",
                                        "cgroup": cgroup_of(holder.pid)}]
        assert reported["busy_by"][0]["cgroup"], "this machine's processes run in a cgroup"
        assert reported["busy_count"] == 1
        assert reported["reason"] == (f"still held after its lease by pid {holder.pid} "
                                      f"({os.path.basename(sys.executable)}): reclaimed once they end (or an admin "
                                      "has them killed)"), "ls says why"
        public = coordinator.api("/devices/sim-board-0", **alice).json()
        assert "busy_by" not in public and public["busy_count"] == 1, "which processes: an admin's to see"
        assert public["reason"] == ("still held after its lease by 1 process (an admin sees which on its page): "
                                    "reclaimed once they end (or an admin has them killed)")

        page = httpx2.get(f"{coordinator.url}/devices/sim-board-0", timeout=10, **admin).text
        assert f"pid {holder.pid}" in page and reported["busy_by"][0]["cgroup"] in page
        assert 'data-act="kill-orphans"' in page and '<span class="word">kill-orphans</span>' in page
        page = httpx2.get(f"{coordinator.url}/devices/sim-board-0", timeout=10, **alice).text
        assert "1 process: an admin sees which on this page" in page
        assert f"pid {holder.pid}" not in page and f"<b>{os.path.basename(sys.executable)}</b>" not in page
        assert reported["busy_by"][0]["cgroup"] not in page
        assert "kill-orphans" not in page

        refused = coordinator.api("/admin/devices/sim-board-0/orphans/kill", "POST", **alice)
        assert refused.status_code == 403, refused.text
        assert holder.poll() is None and board()["state"] == "reclaiming"

        told = coordinator.api("/admin/devices/sim-board-0/orphans/kill", "POST", json={"pid": os.getpid()}, **admin)
        assert told.status_code == 422, "which processes are killed is the exporter's to see, never the caller's"

        admin_env = {**env, "DEVICE_LOOP_TOKEN": root}
        said = run_cli(admin_env, coordinator.url, "admin", "kill-orphans", "sim-board-0", "--json")
        op = json.loads(said.stdout)
        assert op["state"] == "done" and op["kind"] == "kill-orphans", op
        assert op["result"]["killed"] == [holder.pid] and op["result"]["left"] == []
        (killed,) = op["result"]["processes"]
        assert killed.startswith(f"pid {holder.pid} (cgroup {reported['busy_by'][0]['cgroup']}): {sys.executable} -c ")
        assert holder.wait(10) == -9
        wait_for(lambda: board()["state"] == "idle", what="sim-board-0 idle again")
        assert board()["busy_by"] == [] and board()["busy_count"] == 0
        audit = coordinator.api("/admin/audit", **admin).json()
        (entry,) = [e for e in audit if e["action"] == "kill_orphans"]
        assert entry["actor"] == "root" and entry["device"] == "sim-board-0"

        again = coordinator.api("/admin/devices/sim-board-0/orphans/kill", "POST", **admin)
        assert again.status_code == 409 and again.json()["error"] == "no_orphans", again.text
    finally:
        if holder is not None and holder.poll() is None:
            holder.kill()
            holder.wait()
        exporter.stop()
        coordinator.stop()
