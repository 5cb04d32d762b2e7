"""A simulated board: a pty whose other end is a small shell (``shell.py``), and a power switch.

It prints a boot banner at power-on and echoes what it is sent like a shell on a serial
line does. Each line entered runs in a thread of its own (the foreground job), so the
console's reading thread never blocks: while a job runs, Ctrl-C interrupts it (``^C``, status
130) and anything else typed waits its turn, as a terminal's type-ahead does. Ctrl-C at the
prompt drops the line being typed. Each line entered warms the board a little, ``stress``
and ``run-workload`` much more (``thermal.py``, ``workload.py``). A line is at most
``MAX_LINE`` bytes, as a tty's in canonical mode: what is typed past it is dropped.

Power. The board powers on when it is made (the exporter's start) and off with
``power_off()`` (its stop). Between the two it follows its switch file (``switch``, by
default ``NAME.power`` beside its ``link``), watched by ``switches.WATCHER``: when what the
file says changes and its first word is ``off``, the board powers off: its job is
interrupted, its ``link`` removed, then its pty closed on both sides, so that whoever reads
the UART gets a hang-up (EIO, POLLHUP); it prints nothing while off. When the word is
``on``, it powers on: a new pty (a new ``/dev/pts/N``), the ``link`` pointed at it, the boot
banner printed, a fresh shell (its temperature stays: the board is as warm as it was). A
missing or unreadable switch, or any other word, changes nothing; what the switch says
when the board is made does not either (it powers on at the exporter's start, as before).
Each time it looked at a change of its switch (whatever the change said), and at power-on
and power-off, the board writes what it is, ``on`` or ``off`` and a newline, to
``SWITCH.state`` (atomically), which a power backend reads back.

``hang`` on its shell hangs it (a kernel panic): after its last words it answers nothing,
and drops whatever is typed, until it is power-cycled.
"""
from __future__ import annotations

import logging
import os
import select
import threading
import tty
from pathlib import Path

from .facts import BoardFacts
from .switches import WATCHER
from .shell import Shell
from .thermal import Thermal
from .workload import Workload, WorkloadModel

log = logging.getLogger(__name__)

INTERRUPT = b"\x03"  # Ctrl-C
MAX_LINE = 4095      # the kernel's tty line buffer, less the newline
RETRY_S = 0.05  # a console read that failed (the pty between two power-ons) is tried again this late
ON, OFF = "on", "off"


def state_path(switch: Path) -> Path:
    """Where a board whose switch is ``switch`` says what it is."""
    return switch.with_name(switch.name + ".state")


class SimBoard:
    """One board: ``node`` is the pty its UART appears on while it is powered (None while it
    is off; a new one at each power-on), ``link`` a stable path to it (like a
    ``/dev/serial/by-id`` link, there only while the board is on), ``switch`` its power switch."""

    def __init__(self, name: str, link: Path, thermal: Thermal | None = None, facts: BoardFacts | None = None,
                 workload: WorkloadModel | None = None, switch: Path | None = None):
        self.name = name
        self.thermal = thermal or Thermal()
        self.facts = facts or BoardFacts(name)
        self.workload = Workload(workload or WorkloadModel(), self.thermal)
        self.link = Path(link)
        self.switch = Path(switch) if switch is not None else self.link.with_name(self.link.name + ".power")
        self.state_file = state_path(self.switch)
        self.shell = self._new_shell()
        self.node: str | None = None
        self.powered = False
        self.hung = False
        self.looks = 0  # how many changes of its switch the board has looked at
        # Locks, always taken in this order: _power (one power change at a time), _typing (the
        # line being typed and the job: the console's thread, jobs, fresh_line()), _out (the
        # pty's master: a write against its close).
        self._power = threading.RLock()
        self._typing = threading.Lock()
        self._out = threading.Lock()
        self._master = self._slave = -1
        self._generation = 0             # one per power-on and power-off: what an older one's threads do is dropped
        self._console: threading.Thread | None = None
        self._off_r = self._off_w = -1   # tells the console's thread that the power went
        self._line = b""
        self._last = b""
        self._job: threading.Thread | None = None
        self._typeahead = b""            # what came while a job ran
        self._interrupt = threading.Event()
        self._closed = threading.Event()  # power_off(): the board is gone for good
        self.link.parent.mkdir(parents=True, exist_ok=True)
        self._seen = self._switch_signature()  # what the switch says already is not acted on
        self.power_on()
        WATCHER.watch(self.switch, self._switch_changed)

    def _new_shell(self) -> Shell:
        return Shell(self.facts, self.thermal, self.workload, self._banner_text, hang=self._hang)

    def _banner_text(self) -> str:
        return (f"\ndevice-loop simulated board {self.name}\n"
                f"Linux {self.name} 6.1.0-sim {self.facts.arch}\n\n")

    def banner(self) -> str:
        return self._banner_text().replace("\n", "\r\n") + self.prompt()

    def prompt(self) -> str:
        return f"{self.name}:~# "

    def _write(self, text: str, generation: int | None = None) -> None:
        """Print on the console (``generation``: only if the power did not go since it was that)."""
        with self._out:
            if self._master < 0 or self.hung or generation is not None and generation != self._generation:
                return  # off, hung, or a job of a power-on that is over
            try:
                os.write(self._master, text.encode())
            except BlockingIOError:
                pass  # nobody reads the line and its buffer is full: bytes are lost, as on a wire

    # ---- power -------------------------------------------------------------------------------

    def power_on(self) -> bool:
        """Power it on (a new pty, the link to it, the boot banner); False if it was on already
        (or is gone for good). Raises ``OSError`` when no pty can be had."""
        with self._power:
            if self.powered or self._closed.is_set():
                return False
            master, slave = os.openpty()
            try:
                tty.setraw(slave)  # a real UART has no line discipline of its own
                os.set_blocking(master, False)
                node = os.ttyname(slave)
                self._point_link(node)
                off_r, off_w = os.pipe()
            except BaseException:
                os.close(master)
                os.close(slave)
                raise
            with self._typing, self._out:
                self._generation += 1
                self._master, self._slave, self.node = master, slave, node
                self._off_r, self._off_w = off_r, off_w
                self.powered, self.hung = True, False
                self._line = self._last = self._typeahead = b""
                self._job = None
                self._interrupt.clear()
                self.shell = self._new_shell()  # a fresh board: its shell's $? too
                generation = self._generation
            self._console = threading.Thread(target=self._run, args=(master, off_r, generation),
                                             name=f"sim-{self.name}", daemon=True)
            self._console.start()
            self._write(self.banner(), generation)
            self._write_state()
            return True

    def switch_off(self) -> bool:
        """Power it off as its switch does: the job interrupted, the link removed, then the pty
        closed on both sides (its reader gets a hang-up); False if it was off already."""
        with self._power:
            if not self.powered:
                return False
            with self._typing:
                self._generation += 1  # from now on, what this power-on's threads would do is dropped
                self.powered = False
                self._interrupt.set()
                job, self._job = self._job, None
                self._line = self._typeahead = b""
            os.write(self._off_w, b"x")
            for thread in (self._console, job):
                if thread is not None and thread is not threading.current_thread():
                    thread.join(5)
            # the link goes first: once the pty is closed the kernel may give its /dev/pts/N to
            # another board, which something reopening the link every 100 ms must never open
            self.link.unlink(missing_ok=True)
            with self._out:
                for fd in (self._master, self._slave, self._off_r, self._off_w):
                    os.close(fd)
                self._master = self._slave = self._off_r = self._off_w = -1
                self.node, self.hung = None, False
            self._console = None
            self._write_state()
            return True

    def power_off(self) -> None:
        """The exporter stops: off for good (its switch is no longer looked at)."""
        self._closed.set()
        WATCHER.unwatch(self.switch)
        with self._power:
            if not self.switch_off():
                self._write_state()

    def _point_link(self, node: str) -> None:
        temporary = self.link.with_name(f".{self.link.name}.{os.getpid()}.link")
        temporary.unlink(missing_ok=True)
        temporary.symlink_to(node)
        os.replace(temporary, self.link)  # never a moment without a link, nor one to an old pty

    def _write_state(self) -> None:
        with self._power:
            temporary = self.state_file.with_name(f".{self.state_file.name}.{os.getpid()}.tmp")
            try:
                self.state_file.parent.mkdir(parents=True, exist_ok=True)
                temporary.write_text((ON if self.powered else OFF) + "\n")
                os.replace(temporary, self.state_file)
            except OSError as exc:
                log.warning("sim: %s: cannot write %s: %s", self.name, self.state_file, exc)

    def _switch_signature(self):
        try:
            st = os.stat(self.switch)
        except OSError:
            return None
        return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns

    def _switch_word(self) -> str | None:
        try:
            with open(self.switch, "rb") as f:
                words = f.read(64).decode("ascii", "replace").split()
        except OSError:
            return None
        return words[0].lower() if words else None

    def _switch_changed(self) -> None:
        """The switch file may have changed (``switches.WATCHER`` says so): act on what it says now."""
        now = self._switch_signature()
        if now == self._seen:
            return
        self._seen = now
        word = self._switch_word()  # missing, unreadable, or another word: nothing changes
        with self._power:
            if self._closed.is_set():
                return
            try:
                if word == ON:
                    self.power_on()
                elif word == OFF:
                    self.switch_off()
            except OSError as exc:
                log.error("sim: %s: cannot power on: %s", self.name, exc)
            self._write_state()  # (also when nothing changed: it looked, and says what it is)
            self.looks += 1

    def _hang(self) -> None:
        """``hang``: from now on the board answers nothing, until it is power-cycled."""
        with self._out:
            self.hung = True

    # ---- the console -------------------------------------------------------------------------

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

    def _run(self, master: int, off: int, generation: int) -> None:
        """The console's thread of one power-on: what is typed on ``master`` until ``off`` is readable."""
        while True:
            ready, _, _ = select.select([master, off], [], [])
            if off in ready:
                return
            try:
                data = os.read(master, 4096)
            except BlockingIOError:
                continue
            except OSError:  # (not while the board holds its slave side; never a busy loop)
                select.select([off], [], [], RETRY_S)
                continue
            with self._typing:
                if generation != self._generation:
                    return
                if not self.hung:  # a hung board reads and drops
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
            self._job = threading.Thread(target=self._foreground, args=(line, self._generation),
                                         name=f"sim-{self.name}-job", daemon=True)
            self._job.start()
        elif char == INTERRUPT:  # as a terminal shows it, then a fresh prompt
            self._write("^C\r\n" + self.prompt())
            self._line = b""
        elif char in (b"\x7f", b"\x08"):
            self._line = self._line[:-1]
        elif len(self._line) < MAX_LINE:
            self._line += char
            self._write(char.decode(errors="replace"))

    def _foreground(self, line: str, generation: int) -> None:
        """A line's job: run it, print the prompt, then take what was typed meanwhile."""
        self._execute(line, lambda text: self._write(text.replace("\n", "\r\n"), generation), self._interrupt)
        with self._typing:
            if generation != self._generation:
                return  # the power went meanwhile: this board is not the one that runs now
            self._job = None
            if self.hung:
                self._typeahead = b""
                return
            self._write(("\r\n" if self._interrupt.is_set() else "") + self.prompt())
            pending, self._typeahead = self._typeahead, b""
            self._feed(pending)
