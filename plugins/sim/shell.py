"""The simulated board's shell: as much of a POSIX sh as ``exec``'s wrapper and a
fingerprint's reads need, and no more.

A line is commands separated by ``;``, ``&&`` and ``||``, with ``'single'`` and ``"double"``
quotes, backslashes, ``$?`` (the last status), ``*``/``?`` globs over the board's files, the
redirections ``N>/dev/null`` and ``N>&M``, and ``#`` comments. Anything else a real shell has
(pipes, ``$(...)``, variables, ``<``, ``&``) is refused with status 2, as a syntax error is.
An unknown command is ``sh: NAME: not found``, status 127. Commands: ``echo [-n]``, ``true``,
``false``, ``uname [-asnrvmo]`` (bare, it prints what ``-a`` does, as the board always has),
``hostname``, ``nproc``, ``cat FILE...`` (``facts.py``'s files, else "No such file or
directory", status 1), ``sleep S``, ``sh -c LINE`` (a shell of its own: ``exit N`` ends it),
``exit [N]``, ``help``, ``temp``, ``stress [SECONDS]``, ``reboot``, ``run-workload [--cost
C]`` (``workload.py``) and ``hang`` (a kernel panic: the board answers nothing more until it
is power-cycled, ``board.py``). Ctrl-C interrupts ``sleep`` and ``run-workload`` and abandons
the rest of the line, status 130, as an interactive shell does.
"""
from __future__ import annotations

import fnmatch
import json
import math
import threading
from dataclasses import dataclass
from typing import Callable

from .facts import BoardFacts, files
from .thermal import DEFAULT_STRESS_S, MAX_STRESS_S, Thermal
from .workload import MAX_COST, Workload

MAX_DEPTH = 8   # sh -c within sh -c ...
MAX_SLEEP_S = 86400.0
PANIC = "Kernel panic - not syncing: hung by request"  # what ``hang`` prints, its last words
HELP = ("commands: help uname hostname echo reboot temp stress [SECONDS] run-workload [--cost C] cat FILE nproc "
        "true false sleep SECONDS sh -c LINE exit hang (a kernel panic: nothing answers until a power cycle)")


class Interrupted(Exception):
    """Ctrl-C: the rest of the line is abandoned."""


class _Exit(Exception):
    def __init__(self, status: int):
        self.status = status


class _Syntax(Exception):
    """What the line says cannot be run (status 2)."""


@dataclass(frozen=True)
class _Word:
    parts: tuple[tuple[str, str], ...]  # (kind, text): "lit" (unquoted), "quoted", "status" ($?)


@dataclass(frozen=True)
class _Redirect:
    fd: int
    target: str | None = None  # a file (only /dev/null is writable)
    dup: int | None = None     # N>&M


_OPERATORS = (";", "&&", "||")
_Token = _Word | _Redirect | str


def tokenize(line: str) -> list[_Token]:
    """The line's words, redirections and operators (``_Syntax`` for what is not supported)."""
    tokens: list[_Token] = []
    parts: list[tuple[str, str]] = []
    i, n = 0, len(line)

    def flush() -> None:
        if parts:
            tokens.append(_Word(tuple(parts)))
            parts.clear()

    while i < n:
        c = line[i]
        if c in " \t":
            flush()
            i += 1
        elif c == "'":
            end = line.find("'", i + 1)
            if end < 0:
                raise _Syntax("Syntax error: Unterminated quoted string")
            parts.append(("quoted", line[i + 1:end]))
            i = end + 1
        elif c == '"':
            i = _double_quoted(line, i + 1, parts)
        elif c == "\\":
            parts.append(("quoted", line[i + 1:i + 2]))
            i += 2
        elif c == "$" and line[i + 1:i + 2] == "?":
            parts.append(("status", ""))
            i += 2
        elif c == ";":
            flush()
            tokens.append(";")
            i += 1
        elif line[i:i + 2] in ("&&", "||"):
            flush()
            tokens.append(line[i:i + 2])
            i += 2
        elif c == ">":
            fd = 1
            if parts in ([("lit", "1")], [("lit", "2")]):
                fd = int(parts.pop()[1])
            flush()
            i = _redirect(line, i + 1, fd, tokens)
        elif c == "#" and not parts:
            break
        elif c in "|&<>()`$":
            raise _Syntax(f"the simulated board's shell has no {c!r}")
        else:
            parts.append(("lit", c))
            i += 1
    flush()
    return tokens


def parse(line: str) -> list[tuple[str, list[_Token]]]:
    """The line's commands, each with the operator before it (``;`` for the first)."""
    chain: list[tuple[str, list[_Token]]] = []
    command: list[_Token] = []
    operator = ";"
    for token in tokenize(line):
        if not isinstance(token, str):
            command.append(token)
            continue
        if not command:
            raise _Syntax(f'Syntax error: "{token}" unexpected')
        chain.append((operator, command))
        command, operator = [], token
    if command:
        chain.append((operator, command))
    elif operator != ";":
        raise _Syntax("Syntax error: end of file unexpected")
    return chain


def _double_quoted(line: str, i: int, parts: list[tuple[str, str]]) -> int:
    """Read a "double-quoted" string from ``i`` (past its quote) into ``parts``; where it ends."""
    text = ""
    while i < len(line):
        c = line[i]
        if c == '"':
            parts.append(("quoted", text))
            return i + 1
        if c == "\\" and line[i + 1:i + 2] in ('"', "\\", "$", "`"):
            text += line[i + 1]
            i += 2
        elif c == "$" and line[i + 1:i + 2] == "?":
            parts += [("quoted", text), ("status", "")]
            text = ""
            i += 2
        elif c in "$`":
            raise _Syntax(f"the simulated board's shell has no {c!r}")
        else:
            text += c
            i += 1
    raise _Syntax("Syntax error: Unterminated quoted string")


def _redirect(line: str, i: int, fd: int, tokens: list[_Token]) -> int:
    """Read a redirection's target from ``i`` (past its ``>``); where it ends."""
    if line[i:i + 1] == "&":
        digit = line[i + 1:i + 2]
        if digit not in ("1", "2"):
            raise _Syntax("Syntax error: Bad fd number")
        tokens.append(_Redirect(fd, dup=int(digit)))
        return i + 2
    while line[i:i + 1] in (" ", "\t"):
        i += 1
    start = i
    while i < len(line) and line[i] not in " \t;&|<>":
        i += 1
    if i == start:
        raise _Syntax("Syntax error: newline unexpected")
    tokens.append(_Redirect(fd, target=line[start:i]))
    return i


class _Output:
    """Where a command's stdout (1) and stderr (2) go: the console, or nowhere."""

    def __init__(self, write: Callable[[str], None]):
        self.streams: dict[int, Callable[[str], None] | None] = {1: write, 2: write}

    def redirected(self, redirects: list[_Redirect]) -> _Output:
        other = _Output(lambda text: None)
        other.streams = dict(self.streams)
        for r in redirects:
            other.streams[r.fd] = other.streams[r.dup] if r.dup is not None else None
        return other

    def out(self, text: str) -> None:
        if (write := self.streams[1]) is not None:
            write(text)

    def err(self, text: str) -> None:
        if (write := self.streams[2]) is not None:
            write(text)


Builtin = Callable[[list[str], _Output, threading.Event], int]


class Shell:
    """One board's shell: its last status, its files and commands."""

    def __init__(self, facts: BoardFacts, thermal: Thermal, workload: Workload, banner: Callable[[], str],
                 hang: Callable[[], None] | None = None):
        """``hang``: what hangs the board (``hang``); without it, the command says it cannot."""
        self.facts, self.thermal, self.workload, self.banner, self.hang = facts, thermal, workload, banner, hang
        self.status = 0
        self.files = files(facts, thermal, workload.slowdown, thermal.working)
        self.commands: dict[str, Builtin] = {
            "echo": self._echo, "true": lambda a, o, i: 0, "false": lambda a, o, i: 1, "uname": self._uname,
            "hostname": self._hostname, "nproc": self._nproc, "cat": self._cat, "sleep": self._sleep,
            "sh": self._sh, "exit": self._exit, "help": self._help, "temp": self._temp, "stress": self._stress,
            "reboot": self._reboot, "run-workload": self._run_workload, "hang": self._hang,
        }
        self._depth = 0

    def run(self, line: str, write: Callable[[str], None], interrupted: threading.Event) -> int:
        """Run one line typed at the console, its output (``\\n`` line ends) to ``write``; its status."""
        try:
            self.status = self._line(line, _Output(write), interrupted)
        except Interrupted:
            self.status = 130
        except _Exit:
            write("sh: exit: the console's own shell stays (a simulated board has no login to go back to)\n")
            self.status = 1
        return self.status

    def _line(self, line: str, output: _Output, interrupted: threading.Event) -> int:
        try:
            chain = parse(line)
        except _Syntax as exc:
            output.err(f"sh: 1: {exc}\n")
            return 2
        for operator, command in chain:
            if operator == "&&" and self.status != 0 or operator == "||" and self.status == 0:
                continue  # skipped: the status stays
            self.status = self._simple(command, output, interrupted)
        return self.status

    def _simple(self, tokens: list[_Token], output: _Output, interrupted: threading.Event) -> int:
        redirects = [t for t in tokens if isinstance(t, _Redirect)]
        bad = next((r.target for r in redirects if r.target is not None and r.target != "/dev/null"), None)
        if bad is not None:
            output.err(f"sh: 1: cannot create {bad}: Read-only file system\n")
            return 2
        output = output.redirected(redirects)
        argv = [word for t in tokens if isinstance(t, _Word) for word in self._expand(t)]
        if not argv:
            return 0
        if interrupted.is_set():
            raise Interrupted()
        builtin = self.commands.get(argv[0])
        if builtin is None:
            output.err(f"sh: {argv[0]}: not found\n")
            return 127
        return builtin(argv[1:], output, interrupted)

    def _expand(self, word: _Word) -> list[str]:
        """A word's text ($? replaced), or the files its unquoted glob matches (sorted; itself if none)."""
        text = "".join(str(self.status) if kind == "status" else value for kind, value in word.parts)
        globbed = any(kind == "lit" and any(c in value for c in "*?[") for kind, value in word.parts)
        if not globbed:
            return [text]
        return sorted(path for path in self.files if fnmatch.fnmatchcase(path, text)) or [text]

    # ---- the commands --------------------------------------------------------------------

    def _echo(self, args: list[str], output: _Output, interrupted: threading.Event) -> int:
        newline = not args or args[0] != "-n"
        output.out(" ".join(args if newline else args[1:]) + ("\n" if newline else ""))
        return 0

    def _uname(self, args: list[str], output: _Output, interrupted: threading.Event) -> int:
        if not args:
            output.out(f"{self.facts.uname('-a')}\n")
            return 0
        flags = "".join(a[1:] for a in args if a.startswith("-"))
        if any(not a.startswith("-") for a in args) or not flags or any(f not in "asnrvmo" for f in flags):
            output.err(f"uname: invalid option -- '{(flags or args[0]).strip('asnrvmo')[:1] or args[0]}'\n")
            return 1
        if "a" in flags:
            flags = "snrvmo"
        output.out(" ".join(str(self.facts.uname(f"-{f}")) for f in "snrvmo" if f in flags) + "\n")
        return 0

    def _hostname(self, args: list[str], output: _Output, interrupted: threading.Event) -> int:
        output.out(self.facts.name + "\n")
        return 0

    def _nproc(self, args: list[str], output: _Output, interrupted: threading.Event) -> int:
        output.out(f"{self.facts.cores}\n")
        return 0

    def _cat(self, args: list[str], output: _Output, interrupted: threading.Event) -> int:
        if not args:
            output.err("cat: reading the console itself is not simulated: name a file\n")
            return 1
        status = 0
        for path in args:
            read = self.files.get(path)
            if read is None:
                output.err(f"cat: {path}: No such file or directory\n")
                status = 1
            else:
                output.out(read())
        return status

    def _sleep(self, args: list[str], output: _Output, interrupted: threading.Event) -> int:
        seconds = _number(args[0]) if len(args) == 1 else None
        if seconds is None or not 0 <= seconds <= MAX_SLEEP_S:
            output.err(f"sleep: invalid time interval '{' '.join(args)}'\n")
            return 1
        if interrupted.wait(seconds):
            raise Interrupted()
        return 0

    def _sh(self, args: list[str], output: _Output, interrupted: threading.Event) -> int:
        if len(args) < 2 or args[0] != "-c":
            output.err("sh: the simulated board runs 'sh -c LINE' only\n")
            return 2
        if self._depth >= MAX_DEPTH:
            output.err("sh: too deeply nested\n")
            return 2
        saved, self.status = self.status, 0  # a new shell's $? is 0
        self._depth += 1
        try:
            return self._line(args[1], output, interrupted)
        except _Exit as exit_:
            return exit_.status
        finally:
            self._depth -= 1
            self.status = saved

    def _exit(self, args: list[str], output: _Output, interrupted: threading.Event) -> int:
        code = _number(args[0]) if args else self.status
        if code is None or code != int(code):
            output.err(f"sh: 1: exit: Illegal number: {args[0]}\n")
            return 2
        raise _Exit(int(code) & 0xFF)

    def _help(self, args: list[str], output: _Output, interrupted: threading.Event) -> int:
        output.out(HELP + "\n")
        return 0

    def _temp(self, args: list[str], output: _Output, interrupted: threading.Event) -> int:
        output.out(f"cpu: {self.thermal.read():.1f} °C\n")
        return 0

    def _stress(self, args: list[str], output: _Output, interrupted: threading.Event) -> int:
        argument = " ".join(args)
        seconds = _number(argument) if argument else DEFAULT_STRESS_S
        if seconds is None or not 0 < seconds <= MAX_STRESS_S:
            output.err(f"stress: SECONDS is a number of seconds up to {MAX_STRESS_S:g}, not {argument!r}\n")
            return 1
        self.thermal.stress(seconds)
        output.out(f"stress: loading the cpu for {seconds:g} s (it is {self.thermal.read():.1f} °C)\n")
        return 0

    def _reboot(self, args: list[str], output: _Output, interrupted: threading.Event) -> int:
        output.out("Rebooting...\n" + self.banner())
        return 0

    def _hang(self, args: list[str], output: _Output, interrupted: threading.Event) -> int:
        if self.hang is None:
            output.err("hang: this shell has no board to hang\n")
            return 1
        output.out(f"{PANIC}\n")
        self.hang()
        return 0

    def _run_workload(self, args: list[str], output: _Output, interrupted: threading.Event) -> int:
        cost: float | None = 1.0
        if args:
            given = args[1] if args[0] == "--cost" and len(args) == 2 else \
                args[0].removeprefix("--cost=") if len(args) == 1 and args[0].startswith("--cost=") else None
            cost = _number(given) if given is not None else None
        if cost is None or not 0 < cost <= MAX_COST:
            output.err(f"run-workload: usage: run-workload [--cost C], C a positive number up to {MAX_COST:g} "
                       f"(not {' '.join(args)!r})\n")
            return 2
        seconds = self.workload.start(cost)
        if interrupted.wait(seconds):
            self.thermal.rest()
            raise Interrupted()
        output.out(json.dumps({"metric": "workload_ms", "value": round(seconds * 1000, 3), "unit": "ms"}) + "\n")
        return 0


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None
