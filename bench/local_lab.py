"""A coordinator and an exporter as real processes on loopback, for the benchmarks."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx2
import serial
import tomli_w

from device_loop.core.ports import free_port


def wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.01)
    return value


def _healthy(api: httpx2.Client) -> bool:
    try:
        return api.get("/health").status_code == 200
    except httpx2.HTTPError:
        return False


def memory_mib(proc: subprocess.Popen, field: str = "VmRSS") -> float:
    """A process's resident memory now (``VmRSS``), or its peak so far (``VmHWM``)."""
    for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise SystemExit(f"{proc.args} is gone")


class LocalLab:
    """A running lab: ``api`` (a client for user ``bench``), ``url``, its processes and
    its ``folder`` (the coordinator's data in ``coord/``, the exporter's state in ``exporter/``)."""

    def __init__(self, api: httpx2.Client, url: str, coordinator: subprocess.Popen, exporter: subprocess.Popen,
                 env: dict, folder: Path):
        self.api, self.url, self.coordinator, self.exporter, self.env = api, url, coordinator, exporter, env
        self.folder = folder

    def coordinator_rss_mib(self) -> float:
        return memory_mib(self.coordinator)


@contextlib.contextmanager
def local_lab(devices: list[dict], heartbeat_s: float = 5.0):
    """Yield a :class:`LocalLab` serving ``devices``, all idle."""
    tmp = Path(tempfile.mkdtemp(prefix="devloop-bench-"))
    env = {**os.environ, "HOME": str(tmp), "XDG_STATE_HOME": str(tmp / "state"), "XDG_DATA_HOME": str(tmp / "data")}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = {"exporter": {"name": "bench", "coordinator": url, "heartbeat_s": heartbeat_s,
                           "state_dir": str(tmp / "exporter")}, "devices": devices}
    (tmp / "exporter.toml").write_text(tomli_w.dumps(config))

    def start(args: list[str], log: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "device_loop.cli", *args], env=env,
                                stdout=open(tmp / log, "w"), stderr=subprocess.STDOUT, start_new_session=True)

    procs = [start(["coordinator", "--data-dir", str(tmp / "coord"), "--port", str(port), "--single-user"],
                   "coordinator.log")]
    api = httpx2.Client(base_url=f"{url}/api/v1", headers={"X-Device-Loop-User": "bench"}, timeout=30)
    try:
        wait(lambda: _healthy(api), 20, "coordinator")
        procs.insert(0, start(["exporter", "--config", str(tmp / "exporter.toml")], "exporter.log"))
        names = {d["name"] for d in devices}
        wait(lambda: {d["name"] for d in api.get("/devices").json() if d["state"] == "idle"} >= names, 60,
             "idle devices")
        yield LocalLab(api, url, procs[-1], procs[0], env | {"DEVICE_LOOP_COORDINATOR": url, "DEVICE_LOOP_USER": "bench"},
                       tmp)
    finally:
        api.close()
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)


def lease_ready(api: httpx2.Client, device: str) -> dict:
    """Reserve ``device`` and return the lease once its endpoints are up."""
    lease = api.post("/leases", json={"device": device, "ttl_s": 600}).json()
    while not lease["ready"]:
        lease = api.get(f"/leases/{lease['id']}", params={"wait": 10, "unless": "pending"}).json()
        if lease["state"] not in ("pending", "active"):
            raise SystemExit(f"lease ended: {lease['reason']}")
    return lease


class FarEnd(threading.Thread):
    """The board: echoes in ``echo`` mode, counts in ``sink`` mode."""

    def __init__(self, path: Path):
        super().__init__(daemon=True)
        self.port = serial.Serial(str(path), 115200, timeout=0.05)
        self.mode, self.received, self.stop = "echo", 0, threading.Event()

    def run(self):
        while not self.stop.is_set():
            try:
                data = self.port.read(1)  # returns as soon as a byte is there
                data += self.port.read(self.port.in_waiting)
            except serial.SerialException:
                return  # socat is gone: the line is cut
            if data and self.mode == "echo":
                self.port.write(data)
            self.received += len(data)


@contextlib.contextmanager
def pty_pair():
    """A serial line from socat: ``(near end's path, FarEnd thread on the other end)``."""
    folder = Path(tempfile.mkdtemp(prefix="devloop-uart-"))
    near, far_path = folder / "ttyA", folder / "ttyB"
    socat = subprocess.Popen(["socat", f"pty,raw,echo=0,link={near}", f"pty,raw,echo=0,link={far_path}"],
                             stderr=subprocess.DEVNULL)
    try:
        wait(lambda: near.exists() and far_path.exists(), 5, "socat")
        far = FarEnd(far_path)
        far.start()
        yield near, far
        far.stop.set()
    finally:
        socat.terminate()
        socat.wait()
