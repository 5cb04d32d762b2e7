"""Behind a lease's gates, nothing listens where a local process could skip them
(docs/architecture.md, "The lease gate"): a token lab serves a board's UART through ser2net,
a sim board's console and camera, a screen through x11vnc and noVNC, and every one of those
services listens on a unix socket in a folder only the exporter's account enters, or (noVNC's
websockify, which can only take a port) asks for the lease's secret itself. The ports the
lab's processes listen on are the gates' and that one, nothing else; another account cannot
even reach the sockets' folder."""
from __future__ import annotations

import json
import os
import pwd
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import Coordinator, Exporter, lab_tokens, uart_device, wait_for
from helpers import run_cli, wait_state
from test_video import with_camera

from device_loop.core.gate import connect_gated
from device_loop.core.holders import listening_ports

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]
# another account runs this one (this venv's Python may lie in a folder only root enters)
SYSTEM_PYTHON = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"


def lab_processes(exporter: Exporter) -> dict[int, str]:
    """The exporter and every process it recorded (its services, its gates): pid -> name."""
    found = {exporter.popen.pid: "exporter"}
    for record in (exporter.state_dir / "processes").glob("*.json"):
        said = json.loads(record.read_text())
        found[said["pid"]] = said["name"]
    return found


def test_every_service_behind_a_gate_listens_where_only_its_gate_reaches_it(tmp_path, env, pty_pair, display):
    coordinator = Coordinator(tmp_path, env, extra=())
    made, token_file = lab_tokens(env, coordinator, tmp_path, "alice")
    devices = [*uart_device(pty_pair, raw=True, server="ser2net"), with_camera("sim-board-0"),
               {"name": "desk", "class": "vm", "plugin": "vnc", "display": f":{display}"}]
    exporter = Exporter(tmp_path, env, coordinator.url, devices, token_file=str(token_file))
    alice = {**env, "DEVICE_LOOP_TOKEN": made["alice"]}
    try:
        for device in ("jupiter", "sim-board-0", "desk"):
            wait_for(lambda: coordinator.api(f"/devices/{device}", headers={}).json().get("state") == "idle", 20,
                     what=f"{device} idle")
        leases = [json.loads(run_cli(alice, coordinator.url, "reserve", device, "--wait", "--json").stdout)
                  for device in ("jupiter", "sim-board-0", "desk")]
        endpoints = [e for lease in leases for e in lease["endpoints"]]
        assert {e["role"] for e in endpoints} >= {"console", "http-stream", "rfb", "web-viewer"}, endpoints
        gates = {e["port"] for e in endpoints}

        listening = {port: name for pid, name in lab_processes(exporter).items() for port in listening_ports(pid)}
        skipping = {port: name for port, name in listening.items() if port not in gates}
        assert set(skipping.values()) <= {f"websockify-desk-{leases[2]['id']}"}, \
            f"services a local process reaches without a gate: {skipping}"

        # the sockets, and who may reach them: the exporter's account alone
        (root,) = Path(exporter.state_dir / "sockets-folder").read_text().split()
        sockets = sorted(Path(root).glob("*/*.sock"))
        assert len(sockets) >= 4, sockets  # (ser2net's two, the bridge's, the stream's, x11vnc's)
        assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
        assert all(stat.S_IMODE(p.parent.stat().st_mode) == 0o700 for p in sockets)
        nobody = pwd.getpwnam("nobody")
        probe = ("import socket, sys\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect(sys.argv[1])\n"
                 "    print('reached')\nexcept OSError as e:\n    print(type(e).__name__)\n")
        for path in sockets:
            said = subprocess.run([SYSTEM_PYTHON, "-I", "-S", "-c", probe, str(path)], capture_output=True, text=True,
                                  timeout=30,
                                  user=nobody.pw_uid, group=nobody.pw_gid, extra_groups=[], cwd="/")
            assert said.stdout.strip() == "PermissionError", (path, said.stdout, said.stderr)

        # the gates themselves still let the holder in
        console = next(e for e in endpoints if e["role"] == "console" and e["protocol"] == "raw")
        with connect_gated(console["host"], console["port"], leases[0]["secret"]):
            pass
        for lease in leases:
            run_cli(alice, coordinator.url, "release", lease["id"])
        for device in ("jupiter", "sim-board-0", "desk"):
            wait_state(coordinator, device, "idle")
        assert not list(Path(root).iterdir()), "a lease's sockets go with its services"
    finally:
        exporter.stop()
        coordinator.stop()
    assert not Path(root).exists(), "the exporter's socket folder goes with it"
