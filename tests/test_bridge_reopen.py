"""The serial bridge (core/serial_bridge.py) opens its device only while a client is
connected: a socat pty pair is the board's UART (unplugging it hangs the line up and removes
it), real TCP clients connect. With nobody connected nobody holds the node (another program
may read it); a device that goes away while a client is connected is looked for again and the
client stays connected across; a client that comes while it is away is told once; RFC 2217
still works after a reopen; the activity record says it all, and is each service's own."""
import fcntl
import os
import socket
import struct
import termios
import threading
import time
from contextlib import ExitStack, contextmanager

import pytest

from conftest import PtyPair, wait_for
from device_loop.core.console_activity import ActivityWriter, read_activity, record_path
from device_loop.core.holders import holders
from device_loop.core.host import HostContext
from device_loop.core.model import LeaseRef, Resource
from device_loop.core.ports import listen_socket
from device_loop.core.serial_bridge import serve, start_bridge
from device_loop.core.uart_client import open_uart
from helpers import recorded_pids
from test_uart import line_speed

pytestmark = [pytest.mark.service, pytest.mark.timeout(30)]


@contextmanager
def bridge(device, activity, rfc2217=False, removes=True):
    """``serve()`` in a thread, as the exporter runs it for a simulated board: its port
    (``removes``: its record is gone once it ended)."""
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
    assert not removes or not activity.exists(), "a bridge that ended has no record"


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


def held_by(node, pid=None) -> bool:
    """Whether process ``pid`` (this one, where the bridge is a thread) holds ``node`` open."""
    return (pid or os.getpid()) in holders({str(node)})[str(node)]


def waiting(fd) -> int:
    """How many bytes wait to be read on the tty ``fd``."""
    return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4))[0]


def record(path, **expected):
    """The activity record once it shows ``expected`` (``bytes_above``: more bytes than that)."""
    above = expected.pop("bytes_above", -1)

    def shows():
        now = read_activity(path)
        return now if now is not None and now.bytes > above and all(
            getattr(now, k) == v for k, v in expected.items()) else None

    return wait_for(shows, what=f"the record to show {expected}, more than {above} bytes")


def test_with_nobody_connected_the_node_is_free_and_a_client_opens_it(tmp_path):
    """(This process holds no fd of the node but the bridge's: whether it holds the node is
    whether the bridge does.)"""
    pair, activity = PtyPair(tmp_path), tmp_path / "record"
    try:
        with bridge(pair.board_side, activity) as port, pair.far(timeout=3) as far:
            idle = record(activity, open=False, hangups=0, bytes=0, typed=0)
            assert idle.pid == os.getpid() and idle.typed_ns == 0 and not held_by(pair.board_side)
            probe = os.open(pair.board_side, os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK)
            try:
                far.write(b"before anyone came\n")  # left in the line: the bridge does not read it
                wait_for(lambda: waiting(probe) == len(b"before anyone came\n"), what="socat to pass it on")
                client = socket.create_connection(("127.0.0.1", port), timeout=5)
                record(activity, open=True)
            finally:
                os.close(probe)
            with client:
                assert held_by(pair.board_side)
                far.write(b"after\n")
                assert recv_until(client, b"after\n") == b"after\n", "its first open drops what came before"
                client.sendall(b"to the board\n")
                assert far.read_until(b"\n") == b"to the board\n"
                one = record(activity, typed=len(b"to the board\n"))
                assert one.bytes == len(b"after\n") and one.typed_ns > one.last_ns > 0
                client.sendall(b"more\n")
                assert far.read_until(b"\n") == b"more\n"
                two = record(activity, typed=len(b"to the board\nmore\n"))
                assert two.typed_ns > one.typed_ns
            left = record(activity, open=False)
            assert left.hangups == 0, "a client leaving is no hang-up"
            assert (left.bytes, left.typed) == (two.bytes, two.typed)
            wait_for(lambda: not held_by(pair.board_side), what="the bridge to let the node go")
            reader = os.open(pair.board_side, os.O_RDONLY | os.O_NOCTTY)  # another program reads it
            try:
                far.write(b"for the reader\n")
                said = b""
                while not said.endswith(b"\n"):
                    said += os.read(reader, 4096)
                assert said == b"for the reader\n", "nobody took a byte of it"
            finally:
                os.close(reader)
            assert read_activity(activity).bytes == left.bytes
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
                    wait_for(lambda: closed(first), what="the newcomer to take over")
                    pair.plug()
                    back = record(activity, open=True, hangups=1)
                    with pair.far(timeout=0.5) as far:
                        far.write(b"two\n")
                        said = recv_until(second, b"two\n")
                        assert b"device open failure" not in said, "told once"
                        second.sendall(b"three\n")
                        assert far.read_until(b"\n") == b"three\n", "and nothing typed while it was away"
                    assert record(activity, bytes_above=back.bytes).last_ns > gone.last_ns
                    assert record(activity, typed=len(b"three\n")).hangups == 1
            left = record(activity, open=False)
            assert left.hangups == 1, "the client leaving counts no hang-up"
            assert not held_by(pair.board_side)
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
                wait_for(lambda: line_speed(pair.board_side) == termios.B57600, what="57600 baud on the line")
            finally:
                client.close()
            newcomer = open_uart(endpoint, timeout=3)  # a new client starts at the configured speed
            try:
                wait_for(lambda: line_speed(pair.board_side) == termios.B115200, what="115200 baud again")
            finally:
                newcomer.close()
    finally:
        if pair.proc.poll() is None:
            pair.unplug()


def test_the_bridge_process_holds_the_node_only_while_a_client_is_connected(tmp_path, pty_pair):
    host = HostContext(name="h", state_dir=tmp_path / "state")
    resource = Resource(device="jupiter", kind="uart", identifier="uart:h:x", node=str(pty_pair.board_side))
    service = start_bridge(host, resource, LeaseRef("lease-1", "alice"), str(pty_pair.board_side), 115200)
    (proc,) = service.processes
    path = record_path(host.state_dir, resource.identifier)
    try:
        (argv,) = [r["argv"] for r in recorded_pids(host.state_dir).values()]
        assert argv[argv.index("--activity") + 1] == str(path)
        assert record(path, open=False).pid == proc.pid
        assert not held_by(pty_pair.board_side, proc.pid), "nobody connected: the node is free"
        for n in range(2):  # a client comes, and goes, twice
            with socket.create_connection(("127.0.0.1", service.endpoints[0].port), timeout=5) as client, \
                    pty_pair.far() as far:
                record(path, open=True)
                assert held_by(pty_pair.board_side, proc.pid)
                far.write(b"hello\n")
                recv_until(client, b"hello\n")
                client.sendall(b"hi\n")
                assert far.read_until(b"\n") == b"hi\n"
                assert record(path, bytes_above=6 * n + 5, typed=3 * (n + 1)).hangups == 0
            assert record(path, open=False).hangups == 0
            wait_for(lambda: not held_by(pty_pair.board_side, proc.pid), what="the bridge to let the node go")
    finally:
        proc.stop()
    assert not path.exists(), "stopped with SIGTERM, it removed its record"


def test_each_service_makes_its_own_record_and_removes_only_that(tmp_path):
    path = tmp_path / "console" / "x.activity"
    old = ActivityWriter(path)
    try:
        first = os.stat(path).st_ino
        old.printed(5)
        new = ActivityWriter(path)  # the next lease's service, started before the old one stopped
        try:
            assert os.stat(path).st_ino != first, "a new record is a new file"
            assert read_activity(path).bytes == 0
            old.printed(7)  # what the old one writes goes to its own file, not the new record
            old.close()
            assert path.exists(), "an old service stopping leaves the new one's record"
            new.opened()
            new.typed(4)
            now = read_activity(path)
            assert (now.open, now.typed, now.bytes) == (True, 4, 0) and now.typed_ns > 0
        finally:
            new.close()
        assert not path.exists()
        assert [p.name for p in path.parent.iterdir()] == [], "no temporary file is left"
    finally:
        old.close()
    device = tmp_path / "ttyS"  # through the bridge: a service stopping late, after the next began
    master, slave = os.openpty()
    try:
        device.symlink_to(os.ttyname(slave))
        with ExitStack() as late, ExitStack() as next_one:
            late.enter_context(bridge(device, path, removes=False))
            first = record(path, open=False) and os.stat(path).st_ino
            port = next_one.enter_context(bridge(device, path))
            wait_for(lambda: os.stat(path).st_ino != first, what="the next service's record: a new file")
            late.close()
            assert path.exists(), "the late one stopping left the next one's record"
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                record(path, open=True)
    finally:
        os.close(master)
        os.close(slave)


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
