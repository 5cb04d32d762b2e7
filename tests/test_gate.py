"""The data plane of an authenticated lab: endpoints admit only the lease's holder.
A socat pty pair is the board's line (so we can see that it gets no byte), the real
ser2net serves it, and device-loop forward opens local ports for unmodified tools."""
import json
import socket
import subprocess
import sys

import pytest

from conftest import Coordinator, Exporter, lab_tokens
from device_loop.core.ports import free_port
from fake_sysfs import ADB, VENDOR_SPECIFIC, usb_device
from helpers import run_cli, wait_state
from conftest import PtyPair
from test_uart import bytes_both_ways

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]


@pytest.fixture
def gated_lab(tmp_path, env):
    """A lab with tokens: a UART on a pty pair and a phone (fake sysfs, real adb)."""
    env = {**env, "ANDROID_ADB_SERVER_PORT": str(free_port())}
    coordinator = Coordinator(tmp_path, env, extra=())
    tokens, token_file = lab_tokens(env, coordinator, tmp_path, "alice")
    pair = PtyPair(tmp_path)
    sysfs = tmp_path / "sys"
    usb_device(sysfs, "2-1", vendor="18d1", product="4ee7", serial="8AAY0GCXH", interfaces=(VENDOR_SPECIFIC, ADB))
    devices = [{"name": "jupiter", "plugin": "uart", "path": str(pair.board_side), "raw": True},
               {"name": "pixel", "plugin": "adb", "serial": "8AAY0GCXH"}]
    exporter = Exporter(tmp_path, env, coordinator.url, devices, token_file=str(token_file),
                        sysfs_root=str(sysfs))
    alice = {**env, "DEVICE_LOOP_TOKEN": tokens["alice"]}
    wait_state(coordinator, "jupiter", "idle")
    yield coordinator, pair, alice
    exporter.stop()
    pair.unplug()
    coordinator.stop()


def test_no_secret_no_byte_to_the_board(gated_lab):
    coordinator, pair, alice = gated_lab
    lease = json.loads(run_cli(alice, coordinator.url, "reserve", "jupiter", "--wait", "--json").stdout)
    far = pair.far(timeout=1)
    for endpoint in lease["endpoints"]:
        with socket.create_connection((endpoint["host"], endpoint["port"]), timeout=5) as sock:
            sock.sendall(b"reboot now\r\n")
            answer = sock.recv(200)
            assert answer.startswith(b"DENIED") and sock.recv(200) == b""
        with socket.create_connection((endpoint["host"], endpoint["port"]), timeout=5) as sock:
            sock.sendall(b"DEVLOOP not-the-secret\n")
            assert sock.recv(200).startswith(b"DENIED")
    assert far.read(100) == b"", "the board saw bytes from a connection without the secret"
    assert all(e["host"] == "127.0.0.1" for e in lease["endpoints"])


def forward(env, url, lease_id):
    proc = subprocess.Popen([sys.executable, "-m", "device_loop.cli", "--coordinator", url, "forward", lease_id,
                             "--json"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return proc, json.loads(proc.stdout.readline())


def test_forward_gives_unmodified_tools_the_uart_and_adb(gated_lab):
    coordinator, pair, alice = gated_lab
    url = coordinator.url
    uart = json.loads(run_cli(alice, url, "reserve", "jupiter", "--wait", "--json").stdout)
    phone = json.loads(run_cli(alice, url, "reserve", "pixel", "--wait", "--json").stdout)
    procs = []
    try:
        proc, local = forward(alice, url, uart["id"])
        procs.append(proc)
        assert {e["protocol"] for e in local} == {"rfc2217", "raw"} and all(e["host"] == "127.0.0.1" for e in local)
        for endpoint in local:
            bytes_both_ways(endpoint, pair.far())

        proc, (adb_local,) = forward(alice, url, phone["id"])
        procs.append(proc)
        listed = subprocess.run(["adb", "-H", "127.0.0.1", "-P", str(adb_local["port"]), "devices"],
                                capture_output=True, text=True, timeout=30, env=alice)
        assert listed.returncode == 0 and "List of devices attached" in listed.stdout
        through_cli = run_cli(alice, url, "adb", "pixel", "--", "devices")
        assert "List of devices attached" in through_cli.stdout
        gated_env = run_cli(alice, url, "env", "pixel", "--json", check=False)
        assert gated_env.returncode == 1 and "device-loop forward" in json.loads(gated_env.stdout)["message"]

        run_cli(alice, url, "release", phone["id"])  # the forward of a lease that ended says so, and exits
        assert proc.wait(15) == 1
        assert json.loads(proc.stdout.read())["error"] == "lease_ended"
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)
