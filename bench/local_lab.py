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
import uuid
from pathlib import Path

import httpx2
import serial
import tomli_w

from device_loop.core import PROTOCOL_VERSION
from device_loop.core.ports import free_port
from device_loop.core.protocol import DeviceReport, Heartbeat, ResourceReport


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:7.1f} ms"


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


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) process ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_env(folder: Path) -> dict:
    """This environment with HOME and the XDG folders in ``folder``."""
    return {**os.environ, "HOME": str(folder), "XDG_STATE_HOME": str(folder / "state"),
            "XDG_DATA_HOME": str(folder / "data")}


def spawn(args: list[str], env: dict, log: Path) -> subprocess.Popen:
    """``device-loop ARGS`` in a session of its own, its output in ``log``."""
    return subprocess.Popen([sys.executable, "-m", "device_loop.cli", *args], env=env,
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)


def start_coordinator(folder: Path, env: dict, port: int, *extra: str) -> subprocess.Popen:
    """A single-user coordinator on ``port``, its data in ``folder``, its log beside it;
    healthy when this returns."""
    proc = spawn(["coordinator", "--data-dir", str(folder), "--port", str(port), "--single-user", *extra], env,
                 folder.with_name(folder.name + ".log"))
    with httpx2.Client(base_url=f"http://127.0.0.1:{port}/api/v1", timeout=5) as api:
        wait(lambda: _healthy(api) or proc.poll() is not None, 20, "coordinator")
    if proc.poll() is not None:
        raise SystemExit(f"the coordinator on port {port} exited: see {folder.name}.log in {folder.parent}")
    return proc


def stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each of ``procs`` and wait for it to end."""
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


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
def local_lab(devices: list[dict], heartbeat_s: float = 5.0, prepare=None, idle_s: float = 60.0,
              names: set[str] | None = None):
    """Yield a :class:`LocalLab` serving ``devices``, all idle (within ``idle_s``; ``names``: the
    devices they are, where an entry is several). ``prepare(folder, env)``, before anything
    starts, may put files in the lab's folder and change its environment."""
    tmp = Path(tempfile.mkdtemp(prefix="devloop-bench-"))
    env = bench_env(tmp)
    if prepare is not None:
        prepare(tmp, env)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = {"exporter": {"name": "bench", "coordinator": url, "heartbeat_s": heartbeat_s,
                           "state_dir": str(tmp / "exporter")}, "devices": devices}
    (tmp / "exporter.toml").write_text(tomli_w.dumps(config))
    procs = [start_coordinator(tmp / "coord", env, port)]
    api = httpx2.Client(base_url=f"{url}/api/v1", headers={"X-Device-Loop-User": "bench"}, timeout=30)
    try:
        procs.insert(0, spawn(["exporter", "--config", str(tmp / "exporter.toml")], env, tmp / "exporter.log"))
        names = names or {d["name"] for d in devices}
        wait(lambda: {d["name"] for d in api.get("/devices").json() if d["state"] == "idle"} >= names, idle_s,
             "idle devices")
        yield LocalLab(api, url, procs[-1], procs[0], env | {"DEVICE_LOOP_COORDINATOR": url, "DEVICE_LOOP_USER": "bench"},
                       tmp)
    finally:
        api.close()
        stop(procs)


def lease_ready(api: httpx2.Client, device: str) -> dict:
    """Reserve ``device`` and return the lease once its endpoints are up."""
    lease = api.post("/leases", json={"device": device, "ttl_s": 600}).json()
    while not lease["ready"]:
        lease = api.get(f"/leases/{lease['id']}", params={"wait": 10, "unless": "pending"}).json()
        if lease["state"] not in ("pending", "active"):
            raise SystemExit(f"lease ended: {lease['reason']}")
    return lease


class SimHost:
    """An exporter as the coordinator sees it: heartbeats of ``n`` devices."""

    def __init__(self, name: str, n: int):
        self.name, self.boot, self.generation = name, uuid.uuid4().hex, 0
        self.devices = [DeviceReport.model_validate(
            {"name": f"{name}-d{i}", "class": "load", "resources": [
                {"kind": "uart", "plugin": "sim", "identifier": f"{name}:d{i}"}]}) for i in range(n)]

    def body(self, health: str = "ok") -> bytes:
        self.generation += 1
        for device in self.devices:
            device.resources = [ResourceReport(kind="uart", plugin="sim", identifier=device.resources[0].identifier,
                                               health=health, reason="" if health == "ok" else "bench")]
        return Heartbeat(protocol=PROTOCOL_VERSION, version="bench", boot_id=self.boot, generation=self.generation,
                         heartbeat_s=5, devices=self.devices).model_dump_json(by_alias=True).encode()


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
