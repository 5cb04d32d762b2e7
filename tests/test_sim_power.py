"""The simulated board's power switch (plugins/sim/board.py): a file whose first word powers
it off (its UART's pty hangs up, its link goes) and on (a new pty, the boot banner), what
the board says it is in ``SWITCH.state``, its health, and its serial bridge, which opens the
link while a client is connected (and only then) and keeps it across a power cycle, so that a
person at the console sees the board boot again."""
import errno
import os
import select
import socket
import threading
import time

import pytest
import serial

from conftest import WAIT_S, wait_for
from device_loop.core.console_activity import read_activity, record_path
from device_loop.core.model import LeaseRef
from device_loop.plugins.sim.board import SimBoard
from device_loop.plugins.sim.shell import PANIC
from exporter_testkit import in_process_exporter
from test_bridge_reopen import recv_until
from test_sim_board import read_until

pytestmark = [pytest.mark.service, pytest.mark.timeout(30)]

BANNER = b"device-loop simulated board b0"
ANSWERS_OF_SILENCE = 5  # a hung board's silence is watched for as long as this many of its answers took
PROMPT = b"b0:~# "


class Lab:
    """An exporter in this process with one simulated board, ``b0``."""

    def __init__(self, tmp_path, **settings):
        self.exporter = in_process_exporter(tmp_path, [{"name": "b0", "plugin": "sim", **settings}])
        self.board: SimBoard = self.exporter.plugins.pm.get_plugin("sim").boards["b0"]

    def resource(self):
        (resource,) = [r for r in self.exporter.discover() if r.device == "b0"]
        return resource

    def health(self):
        return self.exporter.health(self.resource())

    def start_console(self):
        """The lease's console service, as the exporter starts it: its TCP port and the service."""
        service = self.exporter.plugins.call("sim", "devloop_start", host=self.exporter.host,
                                             resource=self.resource(), lease=LeaseRef("lease-1", "alice"))
        return service.endpoints[0].port, service


@pytest.fixture
def lab(tmp_path):
    lab = Lab(tmp_path)
    yield lab
    lab.exporter.shutdown()


def state(board) -> str | None:
    try:
        return board.state_file.read_text()
    except FileNotFoundError:
        return None


def looked(board):
    """Something that tells when the board has looked at its switch again."""
    before = board.looks
    return lambda: board.looks > before


def flip(board, word: str) -> None:
    """Write the switch as a power supply's driver does (``echo off > SWITCH``) and wait until
    the board says it is ``word``."""
    done = looked(board)
    board.switch.write_text(word + "\n")
    wait_for(lambda: done() and state(board) == word + "\n", what=f"the board to say it is {word}")


def read_port_until(port, marker: bytes, timeout=WAIT_S) -> bytes:
    return read_until(port, marker, timeout)


def bridge_holds(board) -> bool:
    """Whether the bridge (a thread of this process, as the board is) holds the board's pty:
    an fd of this process on it other than the board's own side."""
    try:
        node = os.path.realpath(board.link, strict=True)
    except OSError:
        return False
    for fd in os.listdir("/proc/self/fd"):
        try:
            if int(fd) != board._slave and os.readlink(f"/proc/self/fd/{fd}") == node:
                return True
        except OSError:
            continue
    return False


def hung_up(fd) -> bool:
    """Whether the pty ``fd`` reads hung up: drained, then EIO (or end of file)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP)
    if not poller.poll(0):
        return False
    try:
        return os.read(fd, 4096) == b""
    except OSError as exc:
        return exc.errno == errno.EIO


def test_switching_off_hangs_the_uart_up_and_on_boots_a_new_one(lab):
    board, resource = lab.board, lab.resource()
    assert resource.node == str(board.link), "the node is the stable link, not the pty of the moment"
    assert state(board) == "on\n" and lab.health().status == "ok"
    first = board.node
    assert os.path.realpath(board.link) == first
    reader = os.open(board.link, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
    try:
        flip(board, "off")
        wait_for(lambda: hung_up(reader), what="the old pty to hang up")
        assert not os.path.lexists(board.link) and board.node is None and not board.powered
        assert (lab.health().status, lab.health().reason) == ("degraded", "powered off (its switch says off)")
    finally:
        os.close(reader)
    flip(board, "on")
    assert os.path.realpath(board.link) == board.node
    with serial.Serial(str(board.link), 115200, timeout=0.1) as port:
        port.write(b"hostname\r")
        read_port_until(port, b"\r\nb0\r\n" + PROMPT)
    assert lab.health().status == "ok"


def test_the_banner_comes_on_the_new_pty_and_other_words_change_nothing(lab):
    board = lab.board
    flip(board, "off")
    done = looked(board)
    board.switch.write_text("maybe\n")  # another word: nothing changes
    wait_for(done, what="the board to look at its switch")
    assert state(board) == "off\n" and not board.powered
    done = looked(board)
    board.switch.unlink()  # a missing switch: nothing changes either
    wait_for(done, what="the board to look at its switch")
    assert state(board) == "off\n"
    done = looked(board)
    board.switch.write_text("on")  # no newline: the first word is what counts
    # (the board says it is on once its banner is written: powered comes first, the state file last)
    wait_for(lambda: done() and state(board) == "on\n", what="the board to say it is on")
    assert board.powered
    fd = os.open(board.link, os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK)  # (pyserial's open would flush it)
    try:
        said, deadline = b"", time.monotonic() + WAIT_S
        while PROMPT not in said and time.monotonic() < deadline:
            if select.select([fd], [], [], 0.1)[0]:
                said += os.read(fd, 4096)
    finally:
        os.close(fd)
    assert BANNER in said and said.endswith(PROMPT), "opened after the banner: it waited in the pty"


def test_a_console_client_stays_connected_across_a_power_cycle_and_the_record_shows_it(lab):
    board = lab.board
    port, service = lab.start_console()
    record = record_path(lab.exporter.host.state_dir, lab.resource().identifier)
    try:
        idle = wait_for(lambda: read_activity(record), what="a record")
        assert (idle.open, idle.bytes, idle.hangups, idle.typed) == (False, 0, 0, 0) and idle.pid == os.getpid()
        assert not bridge_holds(board), "nobody connected: the bridge leaves the link alone"
        with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
            client.sendall(b"hostname\r")
            recv_until(client, b"\r\nb0\r\n" + PROMPT, timeout=WAIT_S)
            seen = wait_for(lambda: (a := read_activity(record)) and a.bytes > 0 and a.typed == 9 and a,
                            what="a record of what was printed and typed")
            assert seen.open and seen.hangups == 0 and seen.typed_ns > 0 and bridge_holds(board)
            flip(board, "off")
            off = wait_for(lambda: (a := read_activity(record)) and not a.open and a, what="the record: hung up")
            assert off.hangups == 1 and off.bytes >= seen.bytes
            client.sendall(b"typed into the void\r")  # dropped: the device is not there
            flip(board, "on")
            banner = recv_until(client, PROMPT, timeout=WAIT_S)
            assert BANNER in banner and b"void" not in banner, banner
            back = wait_for(lambda: (a := read_activity(record)) and a.open and a.bytes > off.bytes and a,
                            what="the record: open again, bytes counted")
            assert back.hangups == 1 and back.last_ns > off.last_ns and back.typed == seen.typed
            client.sendall(b"hostname\r")
            said = recv_until(client, b"\r\nb0\r\n" + PROMPT, timeout=WAIT_S)
            assert b"not found" not in said, "what was typed while it was off never reached the new board"
            typed = wait_for(lambda: (a := read_activity(record)) and a.typed == 18 and a, what="typed counted")
            assert typed.typed_ns > seen.typed_ns
        left = wait_for(lambda: (a := read_activity(record)) and not a.open and a, what="the record: closed")
        assert left.hangups == 1, "the client leaving is no hang-up"
        wait_for(lambda: not bridge_holds(board), what="the bridge to let the link go")
    finally:
        service.processes[0].stop()
    assert read_activity(record) is None and not record.exists(), "a stopped service has no record"


def test_with_no_console_client_another_reader_has_the_board_to_itself(lab):
    """A plugin's operation reading the console itself during a lease: the console service
    runs, nobody is connected to it, and not a byte is taken from the reader."""
    board = lab.board
    port, service = lab.start_console()
    record = record_path(lab.exporter.host.state_dir, lab.resource().identifier)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5):  # someone came and went
            wait_for(lambda: (a := read_activity(record)) and a.open, what="the record: open")
        wait_for(lambda: (a := read_activity(record)) and not a.open and not bridge_holds(board),
                 what="the bridge to let the link go")
        for _ in range(2):  # also across a power cycle, which the bridge does not follow with nobody there
            with serial.Serial(str(board.link), 115200, timeout=0.1) as reader:
                reader.write(b"hostname\r")
                said = read_port_until(reader, b"\r\nb0\r\n" + PROMPT)
                assert said.startswith(b"hostname\r\n"), said
            flip(board, "off")
            flip(board, "on")
        assert read_activity(record).hangups == 0 and not bridge_holds(board)
    finally:
        service.processes[0].stop()


def test_a_hung_board_answers_nothing_and_fails_until_power_cycled(lab):
    board = lab.board
    with serial.Serial(str(board.link), 115200, timeout=0.1) as port:
        port.reset_input_buffer()
        asked = time.monotonic()
        port.write(b"hang\r")
        read_port_until(port, PANIC.encode())
        answered_s = time.monotonic() - asked  # how long this board takes to answer a line, on this machine now
        wait_for(lambda: lab.health().status == "failed", what="health to turn failed")
        assert lab.health().reason.startswith("console hung: "), lab.health().reason
        port.write(b"hostname\r\x03\r")
        # (a silence is waited for: nothing may come, in the time of a few answers; a hung board
        # reads and drops what is typed, and nothing marks that it did)
        silence_until = time.monotonic() + ANSWERS_OF_SILENCE * answered_s
        heard = b""
        while time.monotonic() < silence_until:
            heard += port.read(4096)
        assert heard in (b"", b"\r\n" + PROMPT) and b"b0\r\n" not in heard, heard
    flip(board, "off")
    assert lab.health().status == "degraded"
    flip(board, "on")
    with serial.Serial(str(board.link), 115200, timeout=0.1) as port:
        port.write(b"hostname\r")
        read_port_until(port, b"\r\nb0\r\n" + PROMPT)
    assert lab.health().status == "ok"


def test_a_power_cycle_interrupts_the_job_and_the_new_board_starts_clean(lab):
    board = lab.board
    with serial.Serial(str(board.link), 115200, timeout=0.1) as port:
        port.reset_input_buffer()
        port.write(b"sleep 100\r")
        read_port_until(port, b"sleep 100\r\n")
        wait_for(lambda: board._job is not None, what="the job to run")
        port.write(b"false")  # type-ahead of the old board: gone with its power
    flip(board, "off")
    flip(board, "on")
    with serial.Serial(str(board.link), 115200, timeout=0.1) as port:  # (its open flushes the banner)
        port.write(b"echo $?\r")
        said = read_port_until(port, PROMPT)
    assert said == b"echo $?\r\n0\r\n" + PROMPT, said


def test_power_changes_are_idempotent_and_safe_from_many_threads(tmp_path):
    board = SimBoard("b0", tmp_path / "sim" / "b0")
    try:
        assert not board.power_on(), "on already"
        assert board.switch_off() and not board.switch_off()
        assert board.power_on() and not board.power_on()
        errors = []

        def toggle(n):
            try:
                for i in range(10):
                    board.power_on() if (i + n) % 2 else board.switch_off()
                    board.fresh_line()
            except Exception as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=toggle, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT_S)
        assert not errors and not any(t.is_alive() for t in threads)
        board.power_on()
        with serial.Serial(str(board.link), 115200, timeout=0.1) as port:
            port.write(b"hostname\r")
            read_port_until(port, b"\r\nb0\r\n" + PROMPT)
    finally:
        board.power_off()
        board.power_off()
    assert not os.path.lexists(board.link) and state(board) == "off\n"


def test_a_configured_switch_is_followed_and_what_it_said_before_the_start_is_not(tmp_path):
    switch = tmp_path / "pdu" / "outlet-3"
    switch.parent.mkdir()
    switch.write_text("off\n")  # left from an earlier run: the board powers on at the start all the same
    lab = Lab(tmp_path, power_switch=str(switch))
    try:
        board = lab.board
        assert board.switch == switch and board.state_file == tmp_path / "pdu" / "outlet-3.state"
        assert state(board) == "on\n" and board.powered
        flip(board, "off")
        assert not board.powered
        flip(board, "on")
        assert board.powered and os.path.exists(board.link)
    finally:
        lab.exporter.shutdown()
    assert state(lab.board) == "off\n", "a stopped exporter's board is off"
