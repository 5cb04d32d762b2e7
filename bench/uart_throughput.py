"""UART through a lease endpoint vs the same pty directly, measured in one run.

A socat pty pair is the serial line: the exporter serves one end (ser2net, as in a real
lab), a far-end thread plays the board on the other. Round-trip latency (16-byte echo)
and one-way throughput (client -> board) are taken for the pty opened directly, the
lease's RFC 2217 endpoint, and its raw TCP endpoint; ratios are to the direct pty.
"""
from __future__ import annotations

import argparse
import time

import serial

from device_loop.core.uart_client import open_uart
from local_lab import FarEnd, lease_ready, local_lab, pty_pair, wait

PAYLOAD = 1 << 20  # bytes sent for throughput


def measure(port, far: FarEnd, rounds: int) -> tuple[float, float]:
    """(median round trip in ms, throughput in MiB/s) over an open pyserial ``port``."""
    far.mode = "echo"
    port.timeout = 5
    port.reset_input_buffer()
    trips = []
    for _ in range(rounds):
        started = time.perf_counter()
        port.write(b"0123456789abcdef")
        if len(port.read(16)) != 16:
            raise SystemExit("echo lost bytes")
        trips.append(time.perf_counter() - started)
    far.mode, far.received = "sink", 0
    chunk = b"x" * 4096
    started = time.perf_counter()
    for _ in range(PAYLOAD // len(chunk)):
        port.write(chunk)
    wait(lambda: far.received >= PAYLOAD, 120, "all bytes at the far end")
    seconds = time.perf_counter() - started
    trips.sort()
    return trips[len(trips) // 2] * 1000, PAYLOAD / seconds / (1 << 20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=200, help="round trips to time (default 200)")
    args = parser.parse_args()
    with pty_pair() as (near, far):
        results = {}
        direct = serial.Serial(str(near), 115200)
        results["pty, opened directly"] = measure(direct, far, args.n)
        direct.close()
        device = {"name": "jupiter", "plugin": "uart", "path": str(near), "raw": True}
        with local_lab([device]) as lab:
            lease = lease_ready(lab.api, "jupiter")
            for endpoint in lease["endpoints"]:
                port = open_uart(endpoint)
                results[f"lease endpoint, {endpoint['protocol']} (ser2net)"] = measure(port, far, args.n)
                port.close()
    base_trip, base_rate = results["pty, opened directly"]
    print(f"UART over a socat pty pair: {args.n} round trips of 16 bytes, then 1 MiB one way")
    print(f"  {'path':<34} {'round trip p50':>15} {'ratio':>7} {'throughput':>12} {'ratio':>7}")
    for name, (trip, rate) in results.items():
        print(f"  {name:<34} {trip:12.3f} ms {trip / base_trip:6.1f}x {rate:7.1f} MiB/s {rate / base_rate:6.2f}x")


if __name__ == "__main__":
    main()
