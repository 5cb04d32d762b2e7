"""A leased board in a container (docs/architecture.md, "Containers and CDI"), with podman
from Debian as a person runs it: rootful, runc, a local image imported from busybox-static
(no registry). A lease on a simulated board has its exporter write a CDI spec; `podman run
--device device-loop.dev/<class>=<device>` sees exactly the board's console (a pty, so a
bind mount) and talks to the board through it; after the release the spec is gone and the
same command fails as podman says it; a container still holding the console after the
release is an orphan, reported with its pid and cgroup, until an admin has it killed or it ends.

How podman runs here, and the CDI folder: tests/podman_lab.py.
"""
from __future__ import annotations

import os
import socket

import pytest

from conftest import Exporter, wait_for
from device_loop.core.holders import cgroup_of
from helpers import read_until, reserve, wait_active, wait_state, written_cdi_spec
from podman_lab import CDI_DIR, UNRESOLVABLE

pytestmark = [pytest.mark.service, pytest.mark.timeout(180)]

CONSOLE = "/dev/device-loop/console"  # where the sim plugin's environment puts the board's console


def _console_rdev_hex(node: str) -> str:
    """``MAJOR:MINOR`` of ``node`` in hex, as busybox's ``stat -c %t:%T`` prints it."""
    rdev = os.stat(node).st_rdev
    return f"{os.major(rdev):x}:{os.minor(rdev):x}"


def test_a_leased_board_in_a_container_and_its_orphan(tmp_path, env, coordinator, podman, podman_names):
    device, kind = podman_names["device"], f"device-loop.dev/{podman_names['class']}"
    qualified = f"{kind}={device}"
    board = {"name": device, "plugin": "sim", "class": podman_names["class"]}
    exporter = Exporter(tmp_path, env, coordinator.url, [board], name=podman_names["host"], cdi_dir=str(CDI_DIR))
    holder = None
    try:
        wait_state(coordinator, device, "idle")
        bare = podman.container(None, "ls /dev")
        assert bare.returncode == 0, bare.stderr
        assert podman.container(qualified, "true").returncode == 126, "no lease, no spec: podman cannot resolve it"

        lease = wait_active(coordinator, reserve(coordinator, device)["id"])
        spec = written_cdi_spec(CDI_DIR, podman_names["host"], lease["id"])
        link = exporter.state_dir / "sim" / device
        (endpoint,) = [e for e in lease["endpoints"] if e["protocol"] == "raw"]
        with socket.create_connection((endpoint["host"], endpoint["port"]), timeout=10) as uart:
            uart.sendall(b"\r")
            read_until(uart, f"{device}:~# ".encode(), 20)  # the bridge has the console open
            # the container writes a command into the board's console; the board answers on the lease's UART
            said = podman.container(qualified, f"ls -1 /dev/device-loop; stat -c %t:%T {CONSOLE}; "
                                               f"echo $DEVICE_LOOP_CONSOLE; ls /dev; printf 'uname\\r' > {CONSOLE}")
            assert said.returncode == 0, said.stderr
            answer = read_until(uart, f"Linux {device}".encode(), 20)
        lines = said.stdout.split("\n")
        assert lines[:3] == ["console", _console_rdev_hex(str(link)), CONSOLE], said.stdout
        # exactly that node: the container's /dev is podman's own, and the board's console beside it
        assert set(lines[3:]) - {""} == set(bare.stdout.split()) | {"device-loop"}, said.stdout
        assert b"uname" in answer

        # a container that keeps the console open past the lease's end
        holder = podman.popen("run", "--rm", "--name", f"{device}-held", "--network", "none", "--device", qualified,
                              podman.image,
                              "sh", "-c", f"exec 3<>{CONSOLE}; echo held; exec sleep 600")
        assert holder.stdout.readline() == "held\n", holder.stderr.read() if holder.poll() is not None else ""
        assert coordinator.api(f"/leases/{lease['id']}/release", "POST").status_code == 200

        wait_for(lambda: not spec.exists(), what="the lease's CDI spec removed")
        gone = podman.container(qualified, "true")
        assert gone.returncode == 126 and UNRESOLVABLE in gone.stderr, gone.stderr

        def orphan_reported():
            row = coordinator.api(f"/devices/{device}").json()
            return row if row["state"] == "reclaiming" and row["busy_by"] else None
        row = wait_for(orphan_reported, what="the container's process reported as an orphan")
        (orphan,) = row["busy_by"]
        assert orphan["program"] == "sleep" and orphan["command"] == "sleep 600", orphan
        assert "libpod" in orphan["cgroup"] and orphan["cgroup"] == cgroup_of(orphan["pid"]), orphan
        assert coordinator.api(f"/devices/{device}").json()["state"] == "reclaiming"

        op = coordinator.api(f"/admin/devices/{device}/orphans/kill", "POST").json()
        done = wait_for(lambda: (lambda o: o if o["state"] not in ("queued", "running") else None)(
            coordinator.api(f"/ops/{op['id']}").json()), what="the kill done")
        assert done["state"] == "done" and done["result"]["killed"] == [orphan["pid"]], done
        assert holder.wait(30) == 137, "the container ends with its process killed"
        wait_state(coordinator, device, "idle")
        assert podman.container(qualified, "true").returncode == 126

        # ... or until it ends by itself (here: when its standard input closes)
        lease = wait_active(coordinator, reserve(coordinator, device)["id"])
        written_cdi_spec(CDI_DIR, podman_names["host"], lease["id"])
        holder = podman.popen("run", "--rm", "-i", "--name", f"{device}-ends", "--network", "none", "--device",
                              qualified, podman.image,
                              "sh", "-c", f"exec 3<>{CONSOLE}; echo held; exec cat")
        assert holder.stdout.readline() == "held\n", holder.stderr.read() if holder.poll() is not None else ""
        assert coordinator.api(f"/leases/{lease['id']}/release", "POST").status_code == 200
        (orphan,) = wait_for(orphan_reported, what="the second container reported as an orphan")["busy_by"]
        assert orphan["program"] == "cat" and "libpod" in orphan["cgroup"], orphan
        holder.stdin.close()
        assert holder.wait(30) == 0
        wait_state(coordinator, device, "idle")
    finally:
        if holder is not None and holder.poll() is None:
            podman.remove(f"{device}-held", f"{device}-ends")
            holder.kill()
            holder.wait()
        exporter.stop()
