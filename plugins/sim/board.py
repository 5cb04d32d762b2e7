"""A simulated board: a pty whose other end is a small scripted console.

It prints a boot banner at power-on, echoes what it is sent like a shell on a serial
line does, and answers ``help``, ``uname``, ``hostname``, ``echo``, ``reboot`` (which
prints the banner again), ``temp`` (its cpu's temperature) and ``stress [SECONDS]``
(loads its cpu: the board heats up some 30 °C in 5 seconds, then cools down; see
``thermal.py``). Every command handled warms it a little. Ctrl-C drops the line being
typed, as a shell does.
"""
from __future__ import annotations

import os
import select
import threading
import tty
from pathlib import Path

from .thermal import DEFAULT_STRESS_S, MAX_STRESS_S, Thermal

COMMANDS = {
    "help": "commands: help uname hostname echo reboot temp stress [SECONDS]",
    "uname": "Linux {name} 6.1.0-sim #1 SMP PREEMPT riscv64 GNU/Linux",
    "hostname": "{name}",
}
INTERRUPT = b"\x03"  # Ctrl-C


class SimBoard:
    """One powered-on board; ``node`` is the pty its UART appears on."""

    def __init__(self, name: str, link: Path, thermal: Thermal | None = None):
        self.name = name
        self.thermal = thermal or Thermal()
        self._master, self._slave = os.openpty()
        tty.setraw(self._slave)  # a real UART has no line discipline of its own
        os.set_blocking(self._master, False)
        self.node = os.ttyname(self._slave)
        self.link = link
        link.parent.mkdir(parents=True, exist_ok=True)
        link.unlink(missing_ok=True)
        link.symlink_to(self.node)
        self._line = b""
        self._last = b""
        self._typing = threading.Lock()  # the line being typed: the console's thread, and fresh_line()
        self._stop_r, self._stop_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name=f"sim-{name}", daemon=True)
        self._thread.start()
        self._boot()

    def banner(self) -> str:
        return (f"\r\ndevice-loop simulated board {self.name}\r\n"
                f"Linux {self.name} 6.1.0-sim riscv64\r\n\r\n{self.prompt()}")

    def prompt(self) -> str:
        return f"{self.name}:~# "

    def _write(self, text: str) -> None:
        try:
            os.write(self._master, text.encode())
        except BlockingIOError:
            pass  # nobody reads the line and its buffer is full: bytes are lost, as on a wire

    def _boot(self) -> None:
        self._write(self.banner())

    def fresh_line(self) -> None:
        """Forget what was typed but not entered: the next user's first command starts a
        line of its own (a new lease is not glued to what the previous holder left)."""
        with self._typing:
            self._line = b""

    def answer(self, line: str) -> str:
        """What the console prints after ``line`` is entered, up to the next prompt."""
        command, _, rest = line.strip().partition(" ")
        if command:
            self.thermal.heat()
        if command == "reboot":
            return "Rebooting...\r\n" + self.banner()
        if not command:
            output = ""
        elif command == "stress":
            output = self._stress(rest.strip())
        elif command == "temp":
            output = f"cpu: {self.thermal.read():.1f} °C\r\n"
        elif command == "echo":
            output = rest + "\r\n"
        elif command in COMMANDS:
            output = COMMANDS[command].format(name=self.name) + "\r\n"
        else:
            output = f"sh: {command}: not found\r\n"
        return output + self.prompt()

    def _stress(self, argument: str) -> str:
        try:
            seconds = float(argument) if argument else DEFAULT_STRESS_S
        except ValueError:
            seconds = -1.0
        if not 0 < seconds <= MAX_STRESS_S:
            return f"stress: SECONDS is a number of seconds up to {MAX_STRESS_S:g}, not {argument!r}\r\n"
        self.thermal.stress(seconds)
        return f"stress: loading the cpu for {seconds:g} s (it is {self.thermal.read():.1f} °C)\r\n"

    def _run(self) -> None:
        while True:
            ready, _, _ = select.select([self._master, self._stop_r], [], [])
            if self._stop_r in ready:
                return
            try:
                data = os.read(self._master, 4096)
            except (BlockingIOError, OSError):
                continue
            with self._typing:
                for byte in data:
                    self._typed(bytes([byte]))

    def _typed(self, char: bytes) -> None:
        previous, self._last = self._last, char
        if char == b"\n" and previous == b"\r" or char == b"\0":
            return  # CR LF and telnet's CR NUL end one line, not two
        if char in (b"\r", b"\n"):
            self._write("\r\n" + self.answer(self._line.decode(errors="replace")))
            self._line = b""
        elif char == INTERRUPT:  # as a terminal shows it, then a fresh prompt
            self._write("^C\r\n" + self.prompt())
            self._line = b""
        elif char in (b"\x7f", b"\x08"):
            self._line = self._line[:-1]
        else:
            self._line += char
            self._write(char.decode(errors="replace"))

    def power_off(self) -> None:
        os.write(self._stop_w, b"x")
        self._thread.join(5)
        for fd in (self._master, self._slave, self._stop_r, self._stop_w):
            os.close(fd)
        self.link.unlink(missing_ok=True)
