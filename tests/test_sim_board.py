"""The simulated board's console, spoken to through its pty like a real UART."""
import time

import pytest
import serial

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
