"""A simulated board: a pty whose other end is a small shell (``shell.py``).

It prints a boot banner at power-on and echoes what it is sent like a shell on a serial
line does. Each line entered runs in a thread of its own (the foreground job), so the
console's reading thread never blocks: while a job runs, Ctrl-C interrupts it (``^C``, status
130) and anything else typed waits its turn, as a terminal's type-ahead does. Ctrl-C at the
prompt drops the line being typed. Each line entered warms the board a little, ``stress``
and ``run-workload`` much more (``thermal.py``, ``workload.py``). A line is at most
``MAX_LINE`` bytes, as a tty's in canonical mode: what is typed past it is dropped.
"""
from __future__ import annotations

import os
import select
import threading
import tty
from pathlib import Path

from .facts import BoardFacts
from .shell import Shell
from .thermal import Thermal
from .workload import Workload, WorkloadModel

INTERRUPT = b"\x03"  # Ctrl-C
MAX_LINE = 4095      # the kernel's tty line buffer, less the newline


class SimBoard:
    """One powered-on board; ``node`` is the pty its UART appears on."""

    def __init__(self, name: str, link: Path, thermal: Thermal | None = None, facts: BoardFacts | None = None,
                 workload: WorkloadModel | None = None):
        self.name = name
        self.thermal = thermal or Thermal()
        self.facts = facts or BoardFacts(name)
        self.workload = Workload(workload or WorkloadModel(), self.thermal)
        self.shell = Shell(self.facts, self.thermal, self.workload, self._banner_text)
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
        self._typing = threading.Lock()  # the line being typed and the job: the console's thread, jobs, fresh_line()
        self._job: threading.Thread | None = None
        self._typeahead = b""            # what came while a job ran
        self._interrupt = threading.Event()
        self._stop_r, self._stop_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name=f"sim-{name}", daemon=True)
        self._thread.start()
        self._boot()

    def _banner_text(self) -> str:
        return (f"\ndevice-loop simulated board {self.name}\n"
                f"Linux {self.name} 6.1.0-sim {self.facts.arch}\n\n")

    def banner(self) -> str:
        return self._banner_text().replace("\n", "\r\n") + self.prompt()

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
            self._line = self._typeahead = b""

    def answer(self, line: str) -> str:
        """Run ``line`` here and now: what the console prints after it is entered, up to the
        next prompt."""
        said: list[str] = []
        self._execute(line, said.append, threading.Event())
        return "".join(said).replace("\n", "\r\n") + self.prompt()

    def _execute(self, line: str, write, interrupted: threading.Event) -> None:
        if line.strip():
            self.thermal.heat()
        self.shell.run(line, write, interrupted)

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
                self._feed(data)

    def _feed(self, data: bytes) -> None:
        """Take what was typed (the lock held): at the prompt, or while a job runs."""
        for n, byte in enumerate(data):
            char = bytes([byte])
            if self._job is None:
                self._typed(char)
            elif char == INTERRUPT:  # as a terminal shows it; the job ends and prints the prompt
                self._write("^C")
                self._interrupt.set()
                self._typeahead = b""  # a tty flushes its input on an interrupt
            else:
                self._typeahead += data[n:n + 1]

    def _typed(self, char: bytes) -> None:
        previous, self._last = self._last, char
        if char == b"\n" and previous == b"\r" or char == b"\0":
            return  # CR LF and telnet's CR NUL end one line, not two
        if char in (b"\r", b"\n"):
            self._write("\r\n")
            line, self._line = self._line.decode(errors="replace"), b""
            if not line.strip():
                self._write(self.prompt())
                return
            self._interrupt.clear()
            self._job = threading.Thread(target=self._foreground, args=(line,), name=f"sim-{self.name}-job",
                                         daemon=True)
            self._job.start()
        elif char == INTERRUPT:  # as a terminal shows it, then a fresh prompt
            self._write("^C\r\n" + self.prompt())
            self._line = b""
        elif char in (b"\x7f", b"\x08"):
            self._line = self._line[:-1]
        elif len(self._line) < MAX_LINE:
            self._line += char
            self._write(char.decode(errors="replace"))

    def _foreground(self, line: str) -> None:
        """A line's job: run it, print the prompt, then take what was typed meanwhile."""
        self._execute(line, lambda text: self._write(text.replace("\n", "\r\n")), self._interrupt)
        with self._typing:
            self._write(("\r\n" if self._interrupt.is_set() else "") + self.prompt())
            self._job = None
            pending, self._typeahead = self._typeahead, b""
            self._feed(pending)

    def power_off(self) -> None:
        self._interrupt.set()
        job = self._job
        if job is not None:
            job.join(5)
        os.write(self._stop_w, b"x")
        self._thread.join(5)
        for fd in (self._master, self._slave, self._stop_r, self._stop_w):
            os.close(fd)
        self.link.unlink(missing_ok=True)
