"""The simulated board's console, spoken to through its pty like a real UART."""
import os
import time

import pytest
import serial

from device_loop.plugins.sim import board as board_module
from device_loop.plugins.sim.board import SimBoard

pytestmark = pytest.mark.timeout(10)


def read_until(port, marker: bytes, timeout=3.0) -> bytes:
    data, deadline = b"", time.monotonic() + timeout
    while marker not in data and time.monotonic() < deadline:
        data += port.read(4096)
    assert marker in data, data
    return data


@pytest.fixture
def board(tmp_path):
    board = SimBoard("jupiter", tmp_path / "sim" / "jupiter")
    yield board
    board.power_off()


def test_console_answers_like_a_shell(board):
    assert board.link.resolve().as_posix() == board.node
    with serial.Serial(str(board.link), 115200, timeout=0.1) as port:
        port.reset_input_buffer()
        port.write(b"uname\r\n")
        said = read_until(port, b"jupiter:~# ")
        assert said.startswith(b"uname\r\n") and b"Linux jupiter 6.1.0-sim" in said
        assert said.count(b"jupiter:~# ") == 1, "CR LF must end one line, not two"
        port.write(b"frobnicate\r")
        assert b"sh: frobnicate: not found" in read_until(port, b"jupiter:~# ")
        port.write(b"reboot\r")
        assert b"simulated board jupiter" in read_until(port, b"jupiter:~# ")


def test_power_off_removes_the_node_link(tmp_path):
    board = SimBoard("b", tmp_path / "b")
    board.power_off()
    assert not (tmp_path / "b").exists()


def test_switching_off_removes_the_link_before_its_pty_is_given_up(board, monkeypatch):
    """Once its pty is closed the kernel may give its /dev/pts/N to another board: a reader
    reopening the link every 100 ms must find no link by then, not the other board's pty."""
    pty_fds = {board._master: "master", board._slave: "slave"}
    link_when_closed = {}
    real_close = os.close

    def close(fd):
        if fd in pty_fds:
            link_when_closed[pty_fds[fd]] = os.path.lexists(board.link)
        real_close(fd)

    monkeypatch.setattr(board_module.os, "close", close)
    assert os.path.lexists(board.link) and board.switch_off()
    monkeypatch.undo()
    assert link_when_closed == {"master": False, "slave": False}, link_when_closed
    assert not os.path.lexists(board.link)


def test_ctrl_c_drops_the_line_as_a_shell_does(board):
    with serial.Serial(str(board.link), 115200, timeout=0.1) as port:
        port.reset_input_buffer()
        port.write(b"abc\x03")
        said = read_until(port, b"jupiter:~# ")
        assert said == b"abc^C\r\njupiter:~# ", "^C shown, then a fresh prompt"
        port.write(b"uname\r")
        said = read_until(port, b"jupiter:~# ")
        assert b"Linux jupiter" in said and b"not found" not in said, said


def test_a_fresh_line_forgets_what_was_typed(board):
    with serial.Serial(str(board.link), 115200, timeout=0.1) as port:
        port.reset_input_buffer()
        port.write(b"left by the last user")
        read_until(port, b"user")  # the board has read it (its echo came back)
        board.fresh_line()
        port.write(b"hostname\r")
        said = read_until(port, b"jupiter:~# ")
        assert said.endswith(b"hostname\r\njupiter\r\njupiter:~# ") and b"not found" not in said, said


@pytest.mark.service
def test_a_board_s_fingerprint_facts_are_reported_and_bounded(tmp_path, monkeypatch):
    """devloop_fingerprint: the sim plugin's facts reach the device's report; a plugin's junk is
    cut to the report's bounds, and one that fails keeps what it said before."""
    from exporter_testkit import in_process_exporter

    exporter = in_process_exporter(tmp_path, [{"name": "b0", "plugin": "sim", "seed": 7, "workload_s": 0.5}])
    try:
        (device,) = exporter.report(scan=True).devices
        assert device.facts == {"sim.seed": "7", "sim.workload_s": "0.5"}
        assert device.fidelity == "simulated", "a sim board says what it is in a type, not in a fact's words"
        real_call = exporter.plugins.call
        answers = iter([{"Bad Key": "x", "ok": "v" * 5000, "n": 3, "nested": {"a": 1},
                         **{f"k{n:03}": "x" for n in range(100)}},
                        "not a dict", RuntimeError("the board's EEPROM is unreadable")])

        def call(plugin, hook, **kwargs):
            if hook != "devloop_fingerprint":
                return real_call(plugin, hook, **kwargs)
            answer = next(answers)
            if isinstance(answer, Exception):
                raise answer
            return answer

        monkeypatch.setattr(exporter.plugins, "call", call)
        (device,) = exporter.report(scan=True).devices
        assert len(device.facts) == 64 and device.facts["ok"] == "v" * 1000 and device.facts["n"] == "3"
        assert "Bad Key" not in device.facts and "nested" not in device.facts
        for _ in range(2):  # junk, then an exception: what it said before stands, and it is said to fail
            report = exporter.report(scan=True)
            assert report.devices[0].facts == device.facts
            assert any(f.name == "sim" and "devloop_fingerprint" in f.reason for f in report.plugins.failing)
    finally:
        exporter.shutdown()


def test_the_health_file_says_the_health_and_a_fifo_there_is_never_read(tmp_path):
    from device_loop.plugins.sim import injected_health
    path = tmp_path / "b0.health"
    assert injected_health(path) is None, "no file: the board's own health"
    path.write_text("failed permanent AER fatal errors: 3\n")
    health = injected_health(path)
    assert (health.status, health.kind, health.reason) == ("failed", "permanent", "AER fatal errors: 3")
    path.unlink()
    os.mkfifo(path)  # nobody writes it: a read would block the health check
    assert injected_health(path) is None
