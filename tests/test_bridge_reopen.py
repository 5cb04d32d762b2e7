"""The serial bridge (core/serial_bridge.py) holds its device for its whole life: a socat pty
pair is the board's UART (unplugging it hangs the line up and removes it), real TCP clients
connect. What the device prints with nobody connected is dropped; a device that goes away is
looked for again and a client stays connected across; a client that comes while it is away
is told once; RFC 2217 still works after a reopen; the activity record says it all."""
import os
import socket
import termios
import threading
import time
from contextlib import contextmanager

import pytest

from conftest import PtyPair, wait_for
from device_loop.core.console_activity import read_activity, record_path
from device_loop.core.host import HostContext
from device_loop.core.model import LeaseRef, Resource
from device_loop.core.ports import listen_socket
from device_loop.core.serial_bridge import serve, start_bridge
from device_loop.core.uart_client import open_uart
from helpers import recorded_pids
from test_uart import line_speed

pytestmark = pytest.mark.timeout(30)


@contextmanager
def bridge(device, activity, rfc2217=False):
    """``serve()`` in a thread, as the exporter runs it for a simulated board: its port."""
    listener = listen_socket("127.0.0.1")
    stop_r, stop_w = os.pipe()
    thread = threading.Thread(target=serve, args=(listener, str(device), 115200, "8N1", rfc2217, stop_r, activity),
                              daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        os.write(stop_w, b"x")
        thread.join(5)
        assert not thread.is_alive(), "the bridge ends once told to"
        listener.close()
        os.close(stop_r)
        os.close(stop_w)
    assert not activity.exists(), "a bridge that ended has no record"


def recv_until(sock, marker: bytes, timeout=5.0) -> bytes:
    data, deadline = b"", time.monotonic() + timeout
    sock.settimeout(0.1)
    while marker not in data:
        assert time.monotonic() < deadline, f"no {marker!r} from the bridge; it said {data!r}"
        try:
            chunk = sock.recv(4096)
        except socket.timeout:
            continue
        assert chunk, f"the bridge closed the connection; it had said {data!r}"
        data += chunk
    return data


def closed(sock) -> bool:
    sock.settimeout(0.1)
    try:
        return sock.recv(4096) == b""
    except socket.timeout:
        return False
    except ConnectionResetError:
        return True


def record(path, **expected):
    """The activity record once it shows ``expected`` (``bytes_above``: more bytes than that)."""
    above = expected.pop("bytes_above", -1)

    def shows():
        now = read_activity(path)
        return now if now is not None and now.bytes > above and all(
            getattr(now, k) == v for k, v in expected.items()) else None

    return wait_for(shows, 10, what=f"the record to show {expected}, more than {above} bytes")


def test_what_the_device_prints_with_nobody_connected_is_read_and_dropped(tmp_path):
    pair, activity = PtyPair(tmp_path), tmp_path / "record"
    try:
        with bridge(pair.board_side, activity) as port, pair.far(timeout=3) as far:
            record(activity, open=True, hangups=0)
            far.write(b"before anyone came\n")
            before = record(activity, bytes_above=0)
            assert before.bytes == len(b"before anyone came\n") and before.pid == os.getpid()
            with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
                far.write(b"after\n")
                assert recv_until(client, b"after\n") == b"after\n", "nothing of before"
                client.sendall(b"to the board\n")
                assert far.read_until(b"\n") == b"to the board\n"
    finally:
        pair.unplug()


def test_a_client_stays_across_an_unplug_and_one_coming_meanwhile_is_told_once(tmp_path):
    pair, activity = PtyPair(tmp_path), tmp_path / "record"
    try:
        with bridge(pair.board_side, activity) as port:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as first:
                record(activity, open=True)
                with pair.far() as far:
                    far.write(b"one\n")
                    recv_until(first, b"one\n")
                pair.unplug()
                gone = record(activity, open=False, hangups=1)
                assert not closed(first), "a client stays while the device is away"
                first.sendall(b"typed while it is away\n")  # dropped
                with socket.create_connection(("127.0.0.1", port), timeout=5) as second:
                    told = recv_until(second, b"\r\n")
                    assert told.startswith(b"device open failure: ") and b"ttyA" in told, told
                    wait_for(lambda: closed(first), 5, what="the newcomer to take over")
                    pair.plug()
                    back = record(activity, open=True, hangups=1)
                    with pair.far(timeout=0.5) as far:
                        far.write(b"two\n")
                        said = recv_until(second, b"two\n")
                        assert b"device open failure" not in said, "told once"
                        second.sendall(b"three\n")
                        assert far.read_until(b"\n") == b"three\n", "and nothing typed while it was away"
                    assert record(activity, bytes_above=back.bytes).last_ns > gone.last_ns
    finally:
        if pair.proc.poll() is None:
            pair.unplug()


def test_an_rfc2217_client_across_a_reopen_still_changes_the_speed(tmp_path):
    pair, activity = PtyPair(tmp_path), tmp_path / "record"
    try:
        with bridge(pair.board_side, activity, rfc2217=True) as port:
            endpoint = {"protocol": "rfc2217", "host": "127.0.0.1", "port": port, "params": {"baud": 115200}}
            client = open_uart(endpoint, timeout=3)
            try:
                with pair.far() as far:
                    client.write(b"hello\n")
                    assert far.read_until(b"\n") == b"hello\n"
                pair.unplug()
                record(activity, open=False, hangups=1)
                pair.plug()
                record(activity, open=True)
                with pair.far() as far:
                    client.write(b"again\n")
                    assert far.read_until(b"\n") == b"again\n"
                    far.write(b"from the board\n")
                    assert client.read_until(b"\n") == b"from the board\n"
                client.baudrate = 57600
                wait_for(lambda: line_speed(pair.board_side) == termios.B57600, 5, what="57600 baud on the line")
            finally:
                client.close()
            newcomer = open_uart(endpoint, timeout=3)  # a new client starts at the configured speed
            try:
                wait_for(lambda: line_speed(pair.board_side) == termios.B115200, 5, what="115200 baud again")
            finally:
                newcomer.close()
    finally:
        if pair.proc.poll() is None:
            pair.unplug()


def test_the_bridge_process_records_and_removes_its_record(tmp_path, pty_pair):
    host = HostContext(name="h", state_dir=tmp_path / "state")
    resource = Resource(device="jupiter", kind="uart", identifier="uart:h:x", node=str(pty_pair.board_side))
    service = start_bridge(host, resource, LeaseRef("lease-1", "alice"), str(pty_pair.board_side), 115200)
    (proc,) = service.processes
    path = record_path(host.state_dir, resource.identifier)
    try:
        (argv,) = [r["argv"] for r in recorded_pids(host.state_dir).values()]
        assert argv[argv.index("--activity") + 1] == str(path)
        assert record(path, open=True).pid == proc.pid
        with socket.create_connection(("127.0.0.1", service.endpoints[0].port), timeout=5) as client, \
                pty_pair.far() as far:
            far.write(b"hello\n")
            recv_until(client, b"hello\n")
            assert record(path, bytes_above=5).hangups == 0
    finally:
        proc.stop()
    assert not path.exists(), "stopped with SIGTERM, it removed its record"


def test_a_link_pointed_at_another_device_is_followed(tmp_path):
    """A node that names another device now (a by-id link made again for a new tty) is closed
    and the new one opened, though the old one never hung up."""
    link, activity = tmp_path / "ttyS", tmp_path / "record"
    old_master, old_slave = os.openpty()
    new_master, new_slave = os.openpty()
    try:
        link.symlink_to(os.ttyname(old_slave))
        with bridge(link, activity) as port, socket.create_connection(("127.0.0.1", port), timeout=5) as client:
            record(activity, open=True)
            os.write(old_master, b"old\n")
            recv_until(client, b"old\n")
            temporary = tmp_path / "ttyS.new"
            temporary.symlink_to(os.ttyname(new_slave))
            os.replace(temporary, link)
            record(activity, open=True, hangups=1)
            os.write(new_master, b"new\n")
            assert recv_until(client, b"new\n").endswith(b"new\n")
    finally:
        for fd in (old_master, old_slave, new_master, new_slave):
            os.close(fd)
