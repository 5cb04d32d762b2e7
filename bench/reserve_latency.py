"""Reserve -> endpoint ready, measured against a real coordinator and exporter.

Two simulated boards, heartbeat every 5 s. The clock runs from the POST that creates the
lease until the lease answers ready and its UART endpoint accepts a connection. Prints
p50 and p99 and their ratio to the heartbeat period (a heartbeat-only design would cost
half a period on average).
"""
from __future__ import annotations

import argparse
import socket
import statistics
import time

from local_lab import lease_ready, local_lab, wait

HEARTBEAT_S = 5.0


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=60, help="reservations to time (default 60)")
    args = parser.parse_args()
    boards = [{"name": f"sim-board-{i}", "plugin": "sim"} for i in range(2)]
    with local_lab(boards, HEARTBEAT_S) as api:
        samples = []
        for i in range(args.n):
            board = boards[i % 2]["name"]
            wait(lambda board=board: api.get(f"/devices/{board}").json()["state"] == "idle", 20, f"{board} idle")
            started = time.perf_counter()
            lease = lease_ready(api, board)
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


if __name__ == "__main__":
    main()
