"""Reserve -> endpoint ready, measured against a real coordinator and exporter.

Starts ``device-loop coordinator`` and ``device-loop exporter`` (heartbeat every 5 s,
two simulated boards) on free loopback ports, then reserves a board N times: the clock
runs from the POST that creates the lease until the lease answers ready with its UART
endpoint accepting connections. Prints p50 and p99 and their ratio to the heartbeat
period (what a heartbeat-only design would cost on average is half a period).
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx2
import tomli_w

from device_loop.core.ports import free_port

HEARTBEAT_S = 5.0


def start(args: list[str], env: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "device_loop.cli", *args], env=env,
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)


def wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.01)
    return value


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=60, help="reservations to time (default 60)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="devloop-bench-"))
    env = {**os.environ, "HOME": str(tmp), "XDG_STATE_HOME": str(tmp / "state"), "XDG_DATA_HOME": str(tmp / "data")}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = {"exporter": {"name": "bench", "coordinator": url, "heartbeat_s": HEARTBEAT_S,
                           "state_dir": str(tmp / "exporter")},
              "devices": [{"name": f"sim-board-{i}", "plugin": "sim"} for i in range(2)]}
    (tmp / "exporter.toml").write_text(tomli_w.dumps(config))
    coordinator = start(["coordinator", "--data-dir", str(tmp / "coord"), "--port", str(port)], env, tmp / "c.log")
    exporter = None
    api = httpx2.Client(base_url=f"{url}/api/v1", headers={"X-Device-Loop-User": "bench"}, timeout=30)
    try:
        wait(lambda: _ok(api, "/health"), 20, "coordinator")
        exporter = start(["exporter", "--config", str(tmp / "exporter.toml")], env, tmp / "e.log")
        states = lambda: {d["name"]: d["state"] for d in api.get("/devices").json()}  # noqa: E731
        wait(lambda: set(states().values()) == {"idle"} and len(states()) == 2, 20, "idle boards")
        samples = []
        for i in range(args.n):
            board = f"sim-board-{i % 2}"
            wait(lambda: states()[board] == "idle", 20, f"{board} idle")
            started = time.perf_counter()
            lease = api.post("/leases", json={"device": board, "ttl_s": 600}).json()
            while not lease["ready"]:
                lease = api.get(f"/leases/{lease['id']}", params={"wait": 10, "unless": "pending"}).json()
                if lease["state"] not in ("pending", "active"):
                    raise SystemExit(f"lease ended: {lease['reason']}")
            endpoint = lease["endpoints"][0]
            socket.create_connection((endpoint["host"], endpoint["port"]), timeout=5).close()
            samples.append(time.perf_counter() - started)
            api.post(f"/leases/{lease['id']}/release")
        p50, p99 = percentile(samples, 50), percentile(samples, 99)
        print(f"reserve -> endpoint ready, {len(samples)} reservations of a sim board, heartbeat every {HEARTBEAT_S:g}s")
        print(f"  p50 {p50 * 1000:7.1f} ms   = {p50 / HEARTBEAT_S:.3f} x heartbeat period")
        print(f"  p99 {p99 * 1000:7.1f} ms   = {p99 / HEARTBEAT_S:.3f} x heartbeat period")
        print(f"  mean {statistics.mean(samples) * 1000:6.1f} ms, max {max(samples) * 1000:.1f} ms")
        print(f"  target p50 < 200 ms: {'met' if p50 < 0.2 else 'NOT met'}")
    finally:
        api.close()
        for proc in (exporter, coordinator):
            if proc is not None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)


def _ok(api: httpx2.Client, path: str) -> bool:
    try:
        return api.get(path).status_code == 200
    except httpx2.HTTPError:
        return False


if __name__ == "__main__":
    main()
