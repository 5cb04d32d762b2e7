"""A coordinator and an exporter as real processes on loopback, for the benchmarks."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx2
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


@contextlib.contextmanager
def local_lab(devices: list[dict], heartbeat_s: float = 5.0):
    """Yield an API client (user ``bench``) of a lab serving ``devices``, all idle."""
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
        wait(lambda: {d["name"] for d in api.get("/devices").json() if d["state"] == "idle"} >= names, 20, "idle devices")
        yield api
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
