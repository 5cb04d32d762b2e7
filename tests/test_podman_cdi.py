"""A leased board in a container (docs/architecture.md, "Containers and CDI"), with podman
from Debian as a person runs it: rootful, runc, a local image imported from busybox-static
(no registry). A lease on a simulated board has its exporter write a CDI spec; `podman run
--device device-loop.dev/<class>=<device>` sees exactly the board's console (a pty, so a
bind mount) and talks to the board through it; after the release the spec is gone and the
same command fails as podman says it; a container still holding the console after the
release is an orphan, reported with its pid and cgroup, until an admin has it killed or it ends.

Isolation: podman's storage, run state, temporary files, network config and events live in
the session's folder (containers.conf and storage.conf of its own, ``CONTAINERS_CONF``,
``CONTAINERS_STORAGE_CONF``); ``podman import`` runs in a mount namespace of its own with a
throwaway /var/lib (podman 4.3 keeps a blob cache in /var/lib/containers/cache whatever it is
told), so nothing is written to /var/lib/containers. Podman 4.3 reads CDI specs only from
/var/run/cdi and /etc/cdi (containers.conf ``cdi_spec_dirs`` is not read by it; checked): the
exporter here writes into /var/run/cdi, under an exporter name, a class and a device name
unique to the test (its spec file ``device-loop_<host>_<lease>.json``), and the test removes
what it leaves there.
"""
from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import Exporter, wait_for
from device_loop.core.holders import cgroup_of
from helpers import reserve, wait_active, wait_state

pytestmark = [pytest.mark.service, pytest.mark.timeout(180)]

CDI_DIR = Path("/var/run/cdi")  # the folder podman 4.3 reads (besides /etc/cdi)
CONSOLE = "/dev/device-loop/console"  # where the sim plugin's environment puts the board's console
UNRESOLVABLE = "unresolvable CDI devices"


@dataclass
class Podman:
    """podman with a folder of its own: ``run(*args)`` is ``podman ARGS``, finished."""
    folder: Path
    image: str

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "CONTAINERS_CONF": str(self.folder / "containers.conf"),
                "CONTAINERS_STORAGE_CONF": str(self.folder / "storage.conf")}

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(["podman", *args], env=self.env, capture_output=True, text=True, timeout=timeout)

    def popen(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen(["podman", *args], env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)

    def container(self, device: str | None, script: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """``podman run --rm --network none [--device DEVICE] IMAGE sh -c SCRIPT``."""
        wanted = ["--device", device] if device else []
        return self.run("run", "--rm", "--network", "none", *wanted, self.image, "sh", "-c", script,
                        timeout=timeout)


def _configure(folder: Path) -> None:
    (folder / "containers.conf").write_text(f"""\
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]

[engine]
runtime = "runc"
tmp_dir = "{folder}/tmp"
image_copy_tmp_dir = "{folder}/tmp"
events_logger = "file"
events_logfile_path = "{folder}/events.log"

[network]
network_config_dir = "{folder}/networks"
""")
    (folder / "storage.conf").write_text(f"""\
[storage]
driver = "vfs"
graphroot = "{folder}/storage"
runroot = "{folder}/run"
""")


def _busybox_rootfs(root: Path) -> None:
    """A root file system of busybox-static and its applets' links."""
    (root / "bin").mkdir(parents=True)
    for folder in ("dev", "proc", "sys", "tmp", "etc"):
        (root / folder).mkdir()
    shutil.copy2(shutil.which("busybox") or "/bin/busybox", root / "bin" / "busybox")
    applets = subprocess.run([root / "bin" / "busybox", "--list"], capture_output=True, text=True, check=True)
    for applet in applets.stdout.split():
        if applet != "busybox":
            (root / "bin" / applet).symlink_to("busybox")


@pytest.fixture(scope="session")
def podman(tmp_path_factory) -> Podman:
    """Rootful podman in a folder of the session, with a busybox image imported once."""
    missing = [tool for tool in ("podman", "runc", "busybox", "unshare") if not shutil.which(tool)
               and not os.path.exists(f"/usr/sbin/{tool}")]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (./lab test installs podman, runc and busybox-static)")
    if os.geteuid() != 0:
        pytest.skip("rootful podman: run as root")
    folder = tmp_path_factory.mktemp("podman")
    _configure(folder)
    _busybox_rootfs(folder / "rootfs")
    tool = Podman(folder, f"localhost/device-loop-busybox-{secrets.token_hex(4)}")
    archive = subprocess.run(["tar", "-C", folder / "rootfs", "-c", "."], capture_output=True, check=True).stdout
    # a throwaway /var/lib for the import alone: podman 4.3 writes its blob cache there, told or not
    made = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                           'mount -t tmpfs -o size=4m device-loop-test /var/lib && exec podman import '
                           '--change ENV=PATH=/bin - "$0"', tool.image],
                          input=archive, env=tool.env, capture_output=True, timeout=120)
    assert made.returncode == 0, made.stderr.decode(errors="replace")
    return tool


@pytest.fixture
def unique():
    """An exporter name, a class and a device name no other test or lab on this machine uses
    (the CDI folder is the machine's); what the exporter leaves in it is removed after."""
    tag = secrets.token_hex(4)
    names = {"host": f"podtest-{tag}", "class": f"podtest-{tag}", "device": f"podtest-{tag}-0"}
    yield names
    for spec in CDI_DIR.glob(f"device-loop_{names['host']}_*.json"):
        spec.unlink()


def _console_rdev_hex(node: str) -> str:
    """``MAJOR:MINOR`` of ``node`` in hex, as busybox's ``stat -c %t:%T`` prints it."""
    rdev = os.stat(node).st_rdev
    return f"{os.major(rdev):x}:{os.minor(rdev):x}"


def _read_until(sock: socket.socket, expect: bytes, timeout: float = 20) -> bytes:
    received, deadline = b"", time.monotonic() + timeout
    while expect not in received:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = sock.recv(4096)
        except socket.timeout:
            break
        if not chunk:
            break
        received += chunk
    assert expect in received, f"expected {expect!r}, the board said {received!r}"
    return received


def test_a_leased_board_in_a_container_and_its_orphan(tmp_path, env, coordinator, podman, unique):
    device, kind = unique["device"], f"device-loop.dev/{unique['class']}"
    qualified = f"{kind}={device}"
    exporter = Exporter(tmp_path, env, coordinator.url, [{"name": device, "plugin": "sim", "class": unique["class"]}],
                        name=unique["host"], cdi_dir=str(CDI_DIR))
    holder = None
    try:
        wait_state(coordinator, device, "idle", timeout=30)
        bare = podman.container(None, "ls /dev")
        assert bare.returncode == 0, bare.stderr
        assert podman.container(qualified, "true").returncode == 126, "no lease, no spec: podman cannot resolve it"

        lease = wait_active(coordinator, reserve(coordinator, device)["id"])
        (spec,) = CDI_DIR.glob(f"device-loop_{unique['host']}_{lease['id']}.json")
        link = exporter.state_dir / "sim" / device
        (endpoint,) = [e for e in lease["endpoints"] if e["protocol"] == "raw"]
        with socket.create_connection((endpoint["host"], endpoint["port"]), timeout=10) as uart:
            uart.sendall(b"\r")
            _read_until(uart, f"{device}:~# ".encode())  # the bridge has the console open
            # the container writes a command into the board's console; the board answers on the lease's UART
            said = podman.container(qualified, f"ls -1 /dev/device-loop; stat -c %t:%T {CONSOLE}; "
                                               f"echo $DEVICE_LOOP_CONSOLE; ls /dev; printf 'uname\\r' > {CONSOLE}")
            assert said.returncode == 0, said.stderr
            answer = _read_until(uart, f"Linux {device}".encode())
        lines = said.stdout.split("\n")
        assert lines[:3] == ["console", _console_rdev_hex(str(link)), CONSOLE], said.stdout
        # exactly that node: the container's /dev is podman's own, and the board's console beside it
        assert set(lines[3:]) - {""} == set(bare.stdout.split()) | {"device-loop"}, said.stdout
        assert b"uname" in answer

        # a container that keeps the console open past the lease's end
        holder = podman.popen("run", "--rm", "--network", "none", "--device", qualified, podman.image,
                              "sh", "-c", f"exec 3<>{CONSOLE}; echo held; exec sleep 600")
        assert holder.stdout.readline() == "held\n", holder.stderr.read() if holder.poll() is not None else ""
        assert coordinator.api(f"/leases/{lease['id']}/release", "POST").status_code == 200

        wait_for(lambda: not spec.exists(), 20, what="the lease's CDI spec removed")
        gone = podman.container(qualified, "true")
        assert gone.returncode == 126 and UNRESOLVABLE in gone.stderr, gone.stderr

        def orphan_reported():
            row = coordinator.api(f"/devices/{device}").json()
            return row if row["state"] == "reclaiming" and row["busy_by"] else None
        row = wait_for(orphan_reported, 20, what="the container's process reported as an orphan")
        (orphan,) = row["busy_by"]
        assert orphan["program"] == "sleep" and orphan["command"] == "sleep 600", orphan
        assert "libpod" in orphan["cgroup"] and orphan["cgroup"] == cgroup_of(orphan["pid"]), orphan
        assert coordinator.api(f"/devices/{device}").json()["state"] == "reclaiming"

        op = coordinator.api(f"/admin/devices/{device}/orphans/kill", "POST").json()
        done = wait_for(lambda: (lambda o: o if o["state"] not in ("queued", "running") else None)(
            coordinator.api(f"/ops/{op['id']}").json()), 20, what="the kill done")
        assert done["state"] == "done" and done["result"]["killed"] == [orphan["pid"]], done
        assert holder.wait(30) == 137, "the container ends with its process killed"
        wait_state(coordinator, device, "idle", timeout=20)
        assert podman.container(qualified, "true").returncode == 126

        # ... or until it ends by itself (here: when its standard input closes)
        lease = wait_active(coordinator, reserve(coordinator, device)["id"])
        holder = podman.popen("run", "--rm", "-i", "--network", "none", "--device", qualified, podman.image,
                              "sh", "-c", f"exec 3<>{CONSOLE}; echo held; exec cat")
        assert holder.stdout.readline() == "held\n", holder.stderr.read() if holder.poll() is not None else ""
        assert coordinator.api(f"/leases/{lease['id']}/release", "POST").status_code == 200
        (orphan,) = wait_for(orphan_reported, 20, what="the second container reported as an orphan")["busy_by"]
        assert orphan["program"] == "cat" and "libpod" in orphan["cgroup"], orphan
        holder.stdin.close()
        assert holder.wait(30) == 0
        wait_state(coordinator, device, "idle", timeout=20)
    finally:
        if holder is not None and holder.poll() is None:
            holder.kill()
            holder.wait()
        exporter.stop()
