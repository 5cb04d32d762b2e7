"""Behind a lease's gates, nothing listens where a local process could skip them
(docs/architecture.md, "The lease gate"): a token lab serves a board's UART through ser2net,
a sim board's console and camera, a screen through x11vnc and noVNC, and every one of those
services listens on a unix socket in a folder only the exporter's account enters, or (noVNC's
websockify, which can only take a port) asks for the lease's secret itself. The ports the
lab's processes listen on are the gates' and that one, nothing else; another account cannot
even reach the sockets' folder."""
from __future__ import annotations

import asyncio
import json
import os
import pwd
import stat
import subprocess
import sys
from pathlib import Path

import httpx2
import pytest

from conftest import Exporter, uart_device
from helpers import run_cli, token_lab, wait_state
from test_video import with_camera

from device_loop.core.gate import connect_gated
from device_loop.core.holders import listening_ports
from device_loop.core.scopes import TokenScope

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
    devices = [*uart_device(pty_pair, raw=True, server="ser2net"), with_camera("sim-board-0"),
               {"name": "desk", "class": "vm", "plugin": "vnc", "display": f":{display}"}]
    with token_lab(tmp_path, env, devices, "alice") as (coordinator, exporter, users):
        alice = users["alice"]
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

        # the gates themselves still let the holder in, to services that answer
        console = next(e for e in endpoints if e["role"] == "console" and e["protocol"] == "raw")
        with connect_gated(console["host"], console["port"], console["secret"]):
            pass
        rfb = next(e for e in endpoints if e["role"] == "rfb")
        with connect_gated(rfb["host"], rfb["port"], rfb["secret"]) as screen:
            screen.settimeout(10)
            assert screen.recv(12) == b"RFB 003.008\n"
            screen.sendall(b"RFB 003.008\n")
            assert screen.recv(2) == b"\x01\x01", "x11vnc takes a client on its unix socket (no security)"
        for lease in leases:
            run_cli(alice, coordinator.url, "release", lease["id"])
        for device in ("jupiter", "sim-board-0", "desk"):
            wait_state(coordinator, device, "idle")
        assert not list(Path(root).iterdir()), "a lease's sockets go with its services"
    assert not Path(root).exists(), "the exporter's socket folder goes with it"


async def agent_calls(url: str, token: str, calls: list[tuple[str, dict]]) -> list[str]:
    """What an agent is told by the MCP tools ``calls`` (name, arguments): each one's error text."""
    from mcp.client.client import Client
    from mcp.client.streamable_http import streamable_http_client

    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30)
    said = []
    async with Client(streamable_http_client(f"{url}/mcp", http_client=http)) as agent:
        for name, arguments in calls:
            result = await agent.call_tool(name, arguments)
            said.append(result.content[0].text if result.is_error and result.content else "ok")
    return said


def test_a_scope_without_the_console_gets_neither_its_endpoint_nor_a_secret_its_gate_takes(tmp_path, env):
    """A token scoped to the camera (and power): its lease shows the camera alone, whose secret
    opens the camera; the console's gate, found by whoever scans the host's ports, refuses
    that secret; the relayed exchange and exec are refused by the scope check."""
    scope = TokenScope(operations=("camera", "power.cycle"))
    with token_lab(tmp_path, env, [with_camera("sim-board-0")], "bot", scopes={"bot": scope}) as (
            coordinator, exporter, users):
        bot = users["bot"]
        lease = json.loads(run_cli(bot, coordinator.url, "reserve", "sim-board-0", "--wait", "--json").stdout)
        (camera,) = lease["endpoints"]
        assert (camera["role"], camera["scope"]) == ("http-stream", "camera"), lease["endpoints"]
        snapshot = httpx2.get(camera["url"] + "snapshot.jpg", timeout=10)
        assert snapshot.status_code == 200 and snapshot.content.startswith(b"\xff\xd8")

        (console_gate,) = [port for pid, name in lab_processes(exporter).items() if name.startswith("gate-raw-")
                           for port in listening_ports(pid)]
        with pytest.raises(ConnectionRefusedError, match="DENIED"):
            connect_gated("127.0.0.1", console_gate, camera["secret"], timeout=5)
        said = asyncio.run(agent_calls(coordinator.url, bot["DEVICE_LOOP_TOKEN"], [
            ("uart_exchange", {"lease_id": lease["id"], "send": "uname\r", "wait_s": 1}),
            ("exec", {"lease_id": lease["id"], "command": "uname"})]))
        assert all(text.endswith("[out_of_scope]") for text in said), said
        assert lease["withheld"] == ["uart"], lease
        said = run_cli(bot, coordinator.url, "console", lease["id"], check=False)
        assert said.returncode != 0 and "its scope does not name uart" in said.stderr, said
