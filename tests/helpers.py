"""Small helpers for talking to boards and checking processes in tests."""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path


def uart_exchange(host: str, port: int, send: bytes, expect: bytes, timeout: float = 5.0) -> bytes:
    """Send ``send`` over a raw TCP endpoint and read until ``expect`` shows up."""
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(send)
        received = b""
        deadline = time.monotonic() + timeout
        while expect not in received:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = sock.recv(4096)
            except socket.timeout:
                break
            if not chunk:
                break
            received += chunk
        assert expect in received, f"expected {expect!r}, board said {received!r}"
        return received


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def recorded_pids(state_dir: Path) -> dict[int, dict]:
    """The service processes an exporter recorded in its state folder."""
    records = {}
    for path in (Path(state_dir) / "processes").glob("*.json"):
        record = json.loads(path.read_text())
        records[record["pid"]] = record
    return records


def processes_with(text: str) -> list[int]:
    """Pids whose command line contains ``text``."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                if text in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    if pid_alive(int(proc.name)):
                        pids.append(int(proc.name))
            except OSError:
                continue
    return pids
