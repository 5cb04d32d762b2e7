"""The UART plugin end to end: a socat pty pair is the board's serial line, the real
ser2net (or the built-in bridge) serves it through a lease."""
import os
import pty
import select
import subprocess
import sys
import termios
import threading

import pytest

from conftest import WAIT_S, Exporter, uart_device, wait_for
from device_loop.core.uart_client import open_uart
from helpers import port_open, recorded_pids, reserve, run_cli, wait_active, wait_state

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]


def line_speed(path) -> int:
    fd = os.open(path, os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK)  # opening a pty resets nothing
    try:
        return termios.tcgetattr(fd)[4]
    finally:
        os.close(fd)


def change_speed(endpoint, line, before, before_code, after, after_code):
    """While a client is connected the line runs at the configured speed, until the client
    changes it over RFC 2217 (with nobody connected a pty falls back to 38400)."""
    client = open_uart(endpoint)
    try:
        assert client.baudrate == before
        wait_for(lambda: line_speed(line) == before_code, what=f"{before} baud on the line")
        client.baudrate = after
        wait_for(lambda: line_speed(line) == after_code, what=f"{after} baud on the line")
    finally:
        client.close()


def bytes_both_ways(endpoint, far, baud=None):
    client = open_uart(endpoint, baud)
    try:
        client.write(b"to the board\n")
        assert far.read_until(b"\n") == b"to the board\n"
        far.write(b"from the board\n")
        client.timeout = 3
        assert client.read_until(b"\n") == b"from the board\n"
    finally:
        client.close()


def test_ser2net_serves_the_uart_both_ways_with_baud_change(tmp_path, env, coordinator, pty_pair):
    exporter = Exporter(tmp_path, env, coordinator.url, uart_device(pty_pair, raw=True))
    try:
        wait_state(coordinator, "jupiter", "idle")
        lease = wait_active(coordinator, reserve(coordinator, "jupiter")["id"])
        by_protocol = {e["protocol"]: e for e in lease["endpoints"]}
        assert set(by_protocol) == {"rfc2217", "raw"}
        assert by_protocol["rfc2217"]["params"] == {"baud": 115200, "framing": "8N1"}
        (server,) = recorded_pids(exporter.state_dir).values()
        assert server["argv"][0].endswith("/ser2net") and "-u" in server["argv"]

        far = pty_pair.far()
        bytes_both_ways(by_protocol["rfc2217"], far)
        change_speed(by_protocol["rfc2217"], pty_pair.board_side, 115200, termios.B115200, 9600, termios.B9600)
        bytes_both_ways(by_protocol["raw"], far)

        coordinator.api(f"/leases/{lease['id']}/release", "POST")
        wait_state(coordinator, "jupiter", "idle")
        assert not any(port_open(e["host"], e["port"]) for e in lease["endpoints"])
        assert recorded_pids(exporter.state_dir) == {}
        assert "serving with ser2net" in exporter.output()
    finally:
        exporter.stop()


def test_built_in_bridge_serves_the_same_endpoint(tmp_path, env, coordinator, pty_pair):
    exporter = Exporter(tmp_path, env, coordinator.url, uart_device(pty_pair, server="bridge", raw=True))
    try:
        wait_state(coordinator, "jupiter", "idle")
        lease = wait_active(coordinator, reserve(coordinator, "jupiter")["id"])
        (endpoint,) = lease["endpoints"]
        assert endpoint["protocol"] == "rfc2217"
        far = pty_pair.far()
        bytes_both_ways(endpoint, far)
        change_speed(endpoint, pty_pair.board_side, 115200, termios.B115200, 57600, termios.B57600)
        assert "the built-in bridge serves RFC 2217 only" in exporter.output()  # raw = true was asked for
    finally:
        exporter.stop()


def test_unplugging_turns_the_device_offline_and_back(tmp_path, env, coordinator, pty_pair):
    """...and a console on it ends with an error, not as if nothing happened."""
    exporter = Exporter(tmp_path, env, coordinator.url, uart_device(pty_pair))
    try:
        wait_state(coordinator, "jupiter", "idle")
        lease = wait_active(coordinator, reserve(coordinator, "jupiter")["id"])
        console = subprocess.Popen([sys.executable, "-m", "device_loop.cli", "--coordinator", coordinator.url,
                                    "console", "jupiter", "--timeout", "30"], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        with pty_pair.far(timeout=0.1) as board:  # connected: what it sends reaches the board
            console.stdin.write(b"are you there\n")
            console.stdin.flush()
            heard = bytearray()
            wait_for(lambda: heard.extend(board.read(256)) or b"are you there" in heard,
                     what="the console's line on the board's side")
        pty_pair.unplug()
        _, err = console.communicate(timeout=WAIT_S)
        assert console.returncode == 1 and b"the connection to jupiter's UART was lost" in err
        offline = wait_for(lambda: (l := coordinator.api(f"/leases/{lease['id']}").json())["device_state"] == "offline"
                           and l, what="lease shows the device offline")
        assert offline["state"] == "active" and not offline["ready"] and "offline" in offline["reason"]
        assert exporter.popen.poll() is None, "the exporter must survive an unplug"
        pty_pair.plug()
        back = wait_active(coordinator, lease["id"])
        (endpoint,) = back["endpoints"]
        bytes_both_ways(endpoint, pty_pair.far())
        causes = [e["cause"] for e in coordinator.api("/devices/jupiter/log").json()]
        assert "host host-a no longer reports it (unplugged?)" in causes and "host host-a reports it again" in causes
    finally:
        exporter.stop()


def test_console_command_piped_and_logged(tmp_path, env, coordinator, pty_pair):
    exporter = Exporter(tmp_path, env, coordinator.url, uart_device(pty_pair))
    far = pty_pair.far(timeout=0.2)
    stop = threading.Event()

    def board():  # answers each line like a shell would
        typed = b""
        while not stop.is_set():
            typed += far.read_until(b"\n")  # (what came before its timeout is a part of a line)
            while b"\n" in typed:
                line, typed = typed.split(b"\n", 1)
                if line.strip():
                    far.write(b"you said: " + line.strip() + b"\r\njupiter# ")

    thread = threading.Thread(target=board, daemon=True)
    thread.start()
    try:
        wait_state(coordinator, "jupiter", "idle")
        run_cli(env, coordinator.url, "reserve", "jupiter", "--wait")
        log = tmp_path / "session.log"
        result = subprocess.run([sys.executable, "-m", "device_loop.cli", "--coordinator", coordinator.url,
                                 "console", "jupiter", "--timeout", "1", "--log", str(log)],
                                input=b"uname -a\n", env=env, capture_output=True, timeout=30)
        assert result.returncode == 0, result.stderr
        assert b"you said: uname -a" in result.stdout
        assert b"you said: uname -a" in log.read_bytes()
        nobody = run_cli(env, coordinator.url, "console", "nope", check=False)
        assert nobody.returncode == 1 and "unknown device 'nope'" in nobody.stderr
    finally:
        stop.set()
        thread.join(2)
        exporter.stop()


def test_console_interactive_on_a_terminal_until_ctrl_bracket(tmp_path, env, coordinator, exporter_factory):
    exporter_factory()
    wait_state(coordinator, "sim-board-0", "idle")
    run_cli(env, coordinator.url, "reserve", "sim-board-0", "--wait")
    master, slave = pty.openpty()
    console = subprocess.Popen([sys.executable, "-m", "device_loop.cli", "--coordinator", coordinator.url,
                                "console", "sim-board-0"], stdin=slave, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    screen = b""

    def read_until(marker: bytes) -> bytes:
        nonlocal screen
        def seen():
            nonlocal screen
            if select.select([master], [], [], 0.1)[0]:
                screen += os.read(master, 4096)
            return marker in screen
        wait_for(seen, what=f"{marker!r} on the terminal")
        return screen

    try:
        read_until(b"Ctrl-] leaves")
        os.write(master, b"uname\r")
        assert b"Linux sim-board-0" in read_until(b"sim-board-0:~# ")
        os.write(master, b"\x1d")
        assert console.wait(10) == 0
    finally:
        if console.poll() is None:
            console.kill()
        os.close(master)


def test_ser2net_whose_port_was_taken_is_replaced(tmp_path, pty_pair):
    """Between our pick of a port and ser2net's bind another process can take it: the real
    ser2net then keeps running, bound to nothing, and ignores the first SIGTERM."""
    from device_loop.core.host import HostContext
    from device_loop.core.model import LeaseRef, Resource
    from device_loop.core.ports import listen_socket
    from device_loop.plugins.uart.ser2net import start_ser2net

    squatter = listen_socket()

    class RacyHost(HostContext):
        picks = [squatter.getsockname()[1]]

        def free_port(self):
            return self.picks.pop() if self.picks else super().free_port()

    host = RacyHost(name="h", state_dir=tmp_path / "state")
    resource = Resource(device="jupiter", kind="uart", identifier="uart:h:x", node=str(pty_pair.board_side))
    try:
        service = start_ser2net(host, resource, LeaseRef("lease-1", "alice"), "ser2net", str(pty_pair.board_side),
                                115200, "8N1", raw=False)
        (endpoint,) = service.endpoints
        assert endpoint.port != squatter.getsockname()[1]
        assert len(host.processes.recorded()) == 1, "the ser2net that lost its port is gone"
        bytes_both_ways(endpoint.to_json(), pty_pair.far())
        service.processes[0].stop()
    finally:
        squatter.close()
