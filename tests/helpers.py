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


def spawned_by(state_dir: Path) -> set[int]:
    """Live processes whose environment says the process registry of an exporter with
    ``state_dir`` started them: recorded or not, whichever run of it started them."""
    from device_loop.core.process import SPAWNED_BY

    mark = f"{SPAWNED_BY}={Path(state_dir) / 'processes'}".encode()
    pids = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if mark in (proc / "environ").read_bytes().split(b"\0") and pid_alive(int(proc.name)):
                    pids.add(int(proc.name))
            except OSError:
                continue
    return pids


def kill_spawned(state_dir: Path) -> None:
    """SIGKILL whatever an exporter with ``state_dir`` started and left running (for a
    test's teardown, after a failure: each is the leader of its own process group)."""
    for pid in spawned_by(state_dir):
        try:
            os.killpg(pid, 9)
        except OSError:
            pass


def write_clip(path: Path) -> Path:
    """A one-second MJPEG clip at ``path``: a 160x120 screen going from black to white."""
    import cv2
    import numpy as np

    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10, (160, 120))
    for shade in range(0, 250, 25):
        writer.write(np.full((120, 160, 3), shade, np.uint8))
    writer.release()
    return path
