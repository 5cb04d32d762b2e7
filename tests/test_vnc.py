"""Screens over VNC with real components: a virtual display (Xvfb), x11vnc serving it, the
vnc plugin's relay and its noVNC viewer (websockify), in the trust mode and behind the
gate of a lab with tokens."""
import base64
import json
import os
import socket
import urllib.parse

import pytest

from conftest import wait_for
from device_loop.core.gate import connect_gated
from device_loop.core.ports import free_port
from helpers import run_cli, token_lab, wait_state

pytestmark = [pytest.mark.service, pytest.mark.timeout(90)]


def banner(sock: socket.socket) -> bytes:
    sock.settimeout(10)
    got = b""
    while len(got) < 12:
        got += sock.recv(12 - len(got))
    return got


def upgrade(host: str, port: int, path: str) -> str:
    """The status line of a websocket upgrade request for ``path``."""
    with socket.create_connection((host, port), timeout=10) as sock:
        key = base64.b64encode(os.urandom(16)).decode()
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: binary\r\n"
                     f"\r\n".encode())
        return sock.recv(4096).split(b"\r\n")[0].decode()


def screen_of(lease: dict) -> tuple[dict, dict]:
    by_kind = {e["kind"]: e for e in lease["endpoints"]}
    return by_kind["vnc"], by_kind["vnc-web"]


def test_a_declared_vnc_server_is_relayed_and_viewable(tmp_path, env, coordinator, exporter_factory, vnc_server):
    port, _ = vnc_server
    exporter_factory([{"name": "desk", "class": "vm", "plugin": "vnc", "upstream": f"127.0.0.1:{port}"}])
    wait_state(coordinator, "desk", "idle")
    lease = json.loads(run_cli(env, coordinator.url, "reserve", "desk", "--wait", "--json").stdout)
    rfb, web = screen_of(lease)
    assert rfb["protocol"] == "rfb" and rfb["port"] != port, "the lease gets a relay of its own"
    with socket.create_connection((rfb["host"], rfb["port"])) as sock:
        assert banner(sock).startswith(b"RFB 003.00")
    assert web["url"].startswith(f"http://{web['host']}:{web['port']}/vnc.html?")
    assert upgrade(web["host"], web["port"], "/websockify").startswith("HTTP/1.1 101")
    said = json.loads(run_cli(env, coordinator.url, "vnc", "desk", "--json").stdout)
    assert said == {"browser": web["url"], "vncviewer": f"vncviewer {rfb['host']}::{rfb['port']}"}


def test_an_x_display_is_served_by_x11vnc_for_the_lease_only(tmp_path, env, coordinator, exporter_factory, display):
    exporter_factory([{"name": "host-screen", "class": "x-display", "plugin": "vnc", "display": f":{display}"}])
    wait_state(coordinator, "host-screen", "idle")
    lease = json.loads(run_cli(env, coordinator.url, "reserve", "host-screen", "--wait", "--json").stdout)
    rfb, _ = screen_of(lease)
    with socket.create_connection((rfb["host"], rfb["port"])) as sock:
        assert banner(sock).startswith(b"RFB 003.00")
    run_cli(env, coordinator.url, "release", lease["id"])
    wait_state(coordinator, "host-screen", "idle")
    with pytest.raises(OSError):
        socket.create_connection((rfb["host"], rfb["port"]), timeout=2).close()


def test_behind_the_gate_the_screen_needs_the_lease(tmp_path, env, vnc_server):
    port, _ = vnc_server
    desk = {"name": "desk", "class": "vm", "plugin": "vnc", "upstream": f"127.0.0.1:{port}"}
    with token_lab(tmp_path, env, [desk], "alice") as (coordinator, exporter, users):
        alice = users["alice"]
        lease = json.loads(run_cli(alice, coordinator.url, "reserve", "desk", "--wait", "--json").stdout)
        rfb, web = screen_of(lease)
        with connect_gated(rfb["host"], rfb["port"], rfb["secret"]) as sock:
            assert banner(sock).startswith(b"RFB 003.00")
        with socket.create_connection((rfb["host"], rfb["port"]), timeout=10) as sock:
            sock.sendall(b"RFB 003.008\n")
            assert not sock.recv(100).startswith(b"RFB"), "no RFB byte without the lease's secret"
        secret = web["secret"]
        socket_path = urllib.parse.quote(f"{secret}/websockify?token={secret}", safe="")
        assert f"/{secret}/vnc.html?" in web["url"] and f"path={socket_path}" in web["url"]
        assert upgrade(web["host"], web["port"], f"/{secret}/websockify?token={secret}").startswith("HTTP/1.1 101")
        assert upgrade(web["host"], web["port"], "/websockify").startswith("HTTP/1.1 403")
        # websockify can only listen on a port: a local process that skips the gate finds it, and
        # gets no screen without the lease's secret as its token
        (inner,) = [int(word.rsplit(":", 1)[1]) for record in (exporter.state_dir / "processes").glob("*.json")
                    if (argv := json.loads(record.read_text())["argv"])[0] == "websockify"
                    for word in argv if word.startswith("127.0.0.1:")]
        assert not upgrade("127.0.0.1", inner, "/websockify").startswith("HTTP/1.1 101")
        assert not upgrade("127.0.0.1", inner, "/websockify?token=guessed").startswith("HTTP/1.1 101")
        assert upgrade("127.0.0.1", inner, f"/websockify?token={secret}").startswith("HTTP/1.1 101")
        said = json.loads(run_cli(alice, coordinator.url, "vnc", "desk", "--json").stdout)
        assert said["vncviewer"].startswith(f"device-loop forward {lease['id']}")


def test_a_vnc_server_that_does_not_answer_fails_the_start_with_the_reason(env, coordinator, exporter_factory):
    nobody = free_port()
    exporter_factory([{"name": "desk", "class": "vm", "plugin": "vnc", "upstream": f"127.0.0.1:{nobody}"}])
    wait_state(coordinator, "desk", "idle")
    lease = json.loads(run_cli(env, coordinator.url, "reserve", "desk", "--json").stdout)

    def reason():
        said = coordinator.api(f"/leases/{lease['id']}").json()["reason"]
        return said if "cannot reach" in said else None
    assert f"cannot reach the VNC server 127.0.0.1:{nobody}" in wait_for(reason, what="the start's failure")
