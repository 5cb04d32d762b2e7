"""A power cycle through device-loop beside pdudaemon's own request, in one run
(docs/architecture.md, "Power").

A real coordinator and exporter on loopback (single-user) serve a simulated board whose
switch is a file that Debian's pdudaemon writes through its ``localcmdline`` driver; the
board's power resource is that pdudaemon outlet. A console client stays connected to the
lease's console endpoint throughout. Each round, alternately:

1. device-loop: ``lease.power("cycle", off_time=T)`` (the request, the exporter's off, the
   off-time, on, and its wait for the console's first byte), timed from the ask until the
   console client has the board's banner again;
2. by hand: pdudaemon's ``GET /power/control/reboot?hostname=pdu01&port=1&delay=T`` (its own
   off, delay, on), timed from the request until the console client has the banner again.

Target: device-loop <= 1.2x by hand (both include the off-time T and the board's boot).

Usage: bench/power.py [-n 5] [--off-time 1]
"""
from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from device_loop.client import Lab
from device_loop.core.ports import free_port, wait_port_open
from local_lab import lease_ready, local_lab, ms

TARGET = 1.2
BANNER = b"simulated board board"


def start_pdudaemon(folder: Path) -> tuple[subprocess.Popen, int, Path]:
    """pdudaemon on a free loopback port, PDU ``pdu01`` whose outlet N is the file OUTLETS/N."""
    outlets = folder / "outlets"
    outlets.mkdir()
    port = free_port("127.0.0.1")
    config = {"daemon": {"hostname": "127.0.0.1", "port": port, "listener": "http"},
              "pdus": {"pdu01": {"driver": "localcmdline",
                                 "cmd_on": f"sh -c 'echo on > {outlets}/%s'",
                                 "cmd_off": f"sh -c 'echo off > {outlets}/%s'"}}}
    (folder / "pdudaemon.conf").write_text(json.dumps(config))
    proc = subprocess.Popen(["pdudaemon", "--conf", str(folder / "pdudaemon.conf")], start_new_session=True,
                            stdout=open(folder / "pdudaemon.log", "wb"), stderr=subprocess.STDOUT)
    if not wait_port_open("127.0.0.1", port, timeout=20):
        raise SystemExit("pdudaemon did not start: " + (folder / "pdudaemon.log").read_text()[-500:])
    return proc, port, outlets


def until_banner(uart: socket.socket, began: float, timeout: float = 30.0) -> float:
    """Seconds from ``began`` until the console client has the board's banner."""
    seen = b""
    deadline = time.monotonic() + timeout
    while BANNER not in seen:
        if time.monotonic() > deadline:
            raise SystemExit("no banner on the console within 30 s")
        try:
            seen = (seen + uart.recv(65536))[-4096:]
        except TimeoutError:
            pass
    return time.monotonic() - began


def drain(uart: socket.socket) -> None:
    """Forget what the console printed so far (the last round's prompt)."""
    uart.settimeout(0.05)
    try:
        while uart.recv(65536):
            pass
    except TimeoutError:
        pass
    uart.settimeout(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=5, help="rounds of each")
    parser.add_argument("--off-time", type=float, default=1.0, help="seconds off in each cycle")
    args = parser.parse_args()
    if shutil.which("pdudaemon") is None:
        raise SystemExit("pdudaemon is not installed (apt-get install pdudaemon)")
    folder = Path(tempfile.mkdtemp(prefix="device-loop-bench-power-"))
    pdu, port, outlets = start_pdudaemon(folder)
    devices = [{"name": "board", "class": "sim-board",
                "resources": [{"plugin": "sim", "power_switch": str(outlets / "1")},
                              {"plugin": "power", "backend": "pdudaemon", "port": port, "pdu": "pdu01", "outlet": 1}]}]
    ours, theirs, first_bytes = [], [], []
    try:
        with local_lab(devices, heartbeat_s=1.0) as served:
            lab = Lab(served.url, user="bench")
            lease = lab.lease(lease_ready(served.api, "board")["id"])
            (endpoint,) = [e for e in lease.data["endpoints"] if e.get("role") == "console"]
            with socket.create_connection((endpoint["host"], endpoint["port"]), timeout=5) as uart:
                for _ in range(args.n):
                    drain(uart)
                    began = time.monotonic()
                    op = lease.power("cycle", off_time=args.off_time, timeout=60)
                    if (op.result or {}).get("verdict") != "verified":
                        raise SystemExit(f"the cycle was not verified: {op.message}")
                    ours.append(until_banner(uart, began))
                    first_bytes.append((op.result or {})["first_byte_s"])
                    drain(uart)
                    began = time.monotonic()
                    url = (f"http://127.0.0.1:{port}/power/control/reboot?hostname=pdu01&port=1"
                           f"&delay={args.off_time:g}")
                    with urllib.request.urlopen(url, timeout=60) as answer:
                        answer.read()
                    theirs.append(until_banner(uart, began))
            lab.api.close()
    finally:
        pdu.kill()
        pdu.wait(10)
        shutil.rmtree(folder, ignore_errors=True)
    mine, hand = statistics.median(ours), statistics.median(theirs)
    print(f"power cycle of a simulated board through pdudaemon, off {args.off_time:g} s, {args.n} rounds each "
          "(median, asked -> the console's banner again):")
    print(f"  device-loop power cycle    {ms(mine)}   (first console byte {ms(statistics.median(first_bytes))} "
          "after on, as the result says)")
    print(f"  pdudaemon reboot by hand   {ms(hand)}")
    ratio = mine / hand
    print(f"  ratio {ratio:.2f}x (target <= {TARGET}x): {'ok' if ratio <= TARGET else 'OVER'}; "
          f"device-loop adds {ms(mine - hand)}")
    sys.exit(0 if ratio <= TARGET else 1)


if __name__ == "__main__":
    main()
