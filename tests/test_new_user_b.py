"""What a new user tripped on (issue 17, part B), each with real processes: Ctrl-C on
``device-loop forward`` and while following a flash, a console on a lease that expired,
and a simulated board's next lease not glued to what the last holder left typed."""
import json
import os
import pty
import re
import select
import signal
import socket
import subprocess
import sys
import time

import httpx2
import pytest

from conftest import Coordinator, Exporter, lab_tokens, wait_for
from device_loop.client import Lab
from device_loop.cli.forward import WATCH_S
from helpers import WAIT_S, port_open, read_until, reserve, run_cli, wait_active, wait_state
from test_flash import flashable, image_file
from test_video import with_camera
from test_vnc import upgrade

pytestmark = [pytest.mark.service, pytest.mark.timeout(90)]
CLI = [sys.executable, "-m", "device_loop.cli"]


@pytest.fixture
def camera_lab_with_tokens(tmp_path, env):
    """A lab with tokens, its board with a camera (an HTTP endpoint): (coordinator, alice's env)."""
    coordinator = Coordinator(tmp_path, env, extra=())
    tokens, token_file = lab_tokens(env, coordinator, tmp_path, "alice")
    exporter = Exporter(tmp_path, env, coordinator.url, [with_camera("sim-board-0")], token_file=str(token_file))
    wait_state(coordinator, "sim-board-0", "idle")
    yield coordinator, {**env, "DEVICE_LOOP_TOKEN": tokens["alice"]}
    exporter.stop()
    coordinator.stop()


def test_forward_ends_at_once_on_ctrl_c_and_gives_a_browser_its_url(camera_lab_with_tokens):
    coordinator, alice = camera_lab_with_tokens
    lease = json.loads(run_cli(alice, coordinator.url, "reserve", "sim-board-0", "--wait", "--json").stdout)
    proc = subprocess.Popen([*CLI, "--coordinator", coordinator.url, "forward", lease["id"]], env=alice, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        said = [proc.stdout.readline() for _ in range(3)]  # the heading, then a line per endpoint
        assert said[0].startswith(f"forwarding sim-board-0 ({lease['id']})"), said
        uart = re.search(r"uart\s+127\.0\.0\.1:(\d+)\s+nc 127\.0\.0\.1 (\d+)$", said[1].rstrip())
        video = re.search(r"video\s+127\.0\.0\.1:(\d+)\s+a browser: (http://127\.0\.0\.1:(\d+)/)$", said[2].rstrip())
        assert uart and video and video[1] == video[3], said
        secrets = [e["secret"] for e in lease["endpoints"]]
        assert all(secret not in said[2] for secret in secrets), "the local port spoke the gate's handshake: no " \
                                                                 "capability in its URL"
        snapshot = httpx2.get(video[2] + "snapshot.jpg", timeout=10)  # a browser's request, through the gate
        assert snapshot.status_code == 200 and snapshot.content.startswith(b"\xff\xd8")
        held = socket.create_connection(("127.0.0.1", int(uart[1])), timeout=WAIT_S)  # a console left open
        held.sendall(b"\r")
        read_until(held, b"sim-board-0:~# ", WAIT_S)

        proc.send_signal(signal.SIGINT)  # as Ctrl-C in its terminal
        # at once: not at its long poll's end (WATCH_S), nor once its clients let go
        assert WATCH_S > 10 and proc.wait(10) == 0
        with held:
            assert held.recv(1) == b"", "the console left open is closed with it"
        rest = proc.stdout.read()
        assert "Traceback" not in rest and "Error" not in rest, rest
        assert not port_open("127.0.0.1", int(uart[1])) and not port_open("127.0.0.1", int(video[1])), \
            "its listening ports are closed"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_forward_gives_a_browser_the_screen_s_viewer(tmp_path, env, vnc_server):
    coordinator = Coordinator(tmp_path, env, extra=())
    tokens, token_file = lab_tokens(env, coordinator, tmp_path, "alice")
    exporter = Exporter(tmp_path, env, coordinator.url,
                        [{"name": "desk", "class": "vm", "plugin": "vnc", "upstream": f"127.0.0.1:{vnc_server[0]}"}],
                        token_file=str(token_file))
    alice = {**env, "DEVICE_LOOP_TOKEN": tokens["alice"]}
    proc = None
    try:
        wait_state(coordinator, "desk", "idle")
        lease = json.loads(run_cli(alice, coordinator.url, "reserve", "desk", "--wait", "--json").stdout)
        proc = subprocess.Popen([*CLI, "--coordinator", coordinator.url, "forward", lease["id"], "--json"], env=alice,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        viewer = next(e for e in json.loads(proc.stdout.readline()) if e["kind"] == "vnc-web")
        port, secret = viewer["port"], next(e["secret"] for e in lease["endpoints"] if e["kind"] == "vnc-web")
        # (websockify asks for the secret itself, as its token: it listens where a gate cannot stand for it)
        assert viewer["url"] == (f"http://127.0.0.1:{port}/vnc.html?autoconnect=1&resize=scale&path=websockify"
                                 f"%3Ftoken%3D{secret}")
        page = httpx2.get(viewer["url"], timeout=10)
        assert page.status_code == 200 and "noVNC" in page.text
        assert upgrade("127.0.0.1", port, f"/websockify?token={secret}").startswith("HTTP/1.1 101"), \
            "the viewer's websocket"
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGINT)
            proc.wait(10)
        exporter.stop()
        coordinator.stop()


def test_a_new_lease_starts_on_a_fresh_line(coordinator, exporter_factory):
    exporter_factory()
    wait_state(coordinator, "sim-board-0", "idle")
    lab = Lab(coordinator.url, user="alice")
    with lab.reserve("sim-board-0", ttl="10m") as lease, lease.connect("uart") as console:
        console.sendall(b"half-typed")  # and left, without Enter
        said = b""
        while b"half-typed" not in said:  # its echo: the board has read it
            said += console.recv(4096)
    wait_state(coordinator, "sim-board-0", "idle")
    with lab.reserve("sim-board-0", ttl="10m") as lease, lease.connect("uart") as console:
        console.settimeout(5)
        console.sendall(b"uname\r")
        said = b""
        while not said.endswith(b"sim-board-0:~# "):
            said += console.recv(4096)
    assert b"Linux sim-board-0" in said and b"not found" not in said, said


def read_terminal(fd: int, until: bytes | None, timeout: float = 20) -> bytes:
    """What a program wrote to its terminal (a pty), up to ``until`` (None: until it closes)."""
    out, deadline = b"", time.monotonic() + timeout
    while until is None or until not in out:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"timed out waiting for {until!r}; the terminal shows {out!r}"
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: every end of the terminal is closed
            chunk = b""
        if not chunk:
            assert until is None, f"the terminal closed before {until!r}: {out!r}"
            break
        out += chunk
    return out


def test_ctrl_c_while_following_a_flash_says_so_on_a_line_of_its_own(tmp_path, env, coordinator, exporter_factory):
    slow_tool = f"sh -c 'sleep 3; cp \"$0\" \"$1\"' {{image}} {tmp_path / 'written.img'}"
    exporter_factory([flashable("sim-board-0", command=slow_tool)])
    wait_state(coordinator, "sim-board-0", "idle")
    build, _ = image_file(tmp_path, "build", 1 << 20)
    run_cli(env, coordinator.url, "images", "upload", str(build), "--name", "build-1", "--for", "sim-board")
    run_cli(env, coordinator.url, "reserve", "sim-board-0", "--wait")
    terminal, its_end = pty.openpty()
    proc = subprocess.Popen([*CLI, "--coordinator", coordinator.url, "flash", "sim-board-0", "build-1"], env=env,
                            stdin=its_end, stdout=its_end, stderr=its_end, start_new_session=True)
    os.close(its_end)
    try:
        shown = read_terminal(terminal, b"] 0/1 MiB")  # the progress bar is drawn
        proc.send_signal(signal.SIGINT)
        shown += read_terminal(terminal, None)
        assert proc.wait(10) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(terminal)
    bar, _, message = shown.rpartition(b"device-loop: no longer following")
    assert message, shown
    assert bar.endswith(b"\n") and b"MiB" in bar.splitlines()[-1], f"not on a line of its own: {shown!r}"
    op = wait_for(lambda: [o for o in coordinator.api("/devices/sim-board-0/flashes").json()
                           if o["state"] == "done"], what="the flash going on, to its end")
    assert op[0]["image"]["name"] == "build-1"


def test_a_console_on_an_expired_lease_says_it_expired(coordinator, exporter_factory, env):
    exporter_factory()
    wait_state(coordinator, "sim-board-0", "idle")
    lease = wait_active(coordinator, reserve(coordinator, "sim-board-0")["id"])
    console = subprocess.Popen([*CLI, "--coordinator", coordinator.url, "console", lease["id"], "--timeout", "60"],
                               env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        console.stdin.write(b"hostname\r")
        console.stdin.flush()
        said = b""
        while b"sim-board-0\r\n" not in said:
            said += console.stdout.read1(4096)
        renewed = coordinator.api(f"/leases/{lease['id']}/renew", "POST", json={"ttl_s": 1})
        assert renewed.status_code == 200, renewed.text
        assert console.wait(15) == 1, "the lease expired with the console open: it ends"
        message = console.stderr.read().decode()
    finally:
        if console.poll() is None:
            console.kill()
            console.wait()
    assert f"your lease {lease['id']} on sim-board-0 expired at " in message, message
    assert "device-loop reserve sim-board-0" in message and "lost" not in message, message

    later = run_cli(env, coordinator.url, "console", lease["id"], check=False)  # and when asked afterwards
    assert later.returncode == 1, later.stdout + later.stderr
    assert f"your lease {lease['id']} on sim-board-0 expired at " in later.stderr, later.stderr
    assert "ttl ran out" not in later.stderr and "not ready" not in later.stderr, later.stderr
