"""The command of ``device-loop with``, in a process group of its own (docs/architecture.md,
"A lease bound to a command"): signals reach all of it, it is killed whole at its end, and
it dies with ``with`` however ``with`` ends.

Three things see to the last: the command's first process gets SIGKILL when ``with`` dies
(``PR_SET_PDEATHSIG``); and a keeper, a ``sh`` of a session of its own that ignores the
signals a CI runner sends, reads a lifeline pipe only ``with`` holds the write end of: the
kernel closes it when ``with`` dies (kill -9 too), and the keeper then kills the whole
group. At a normal end ``with`` writes a line first, and the keeper leaves. A process that
leaves the group (``setsid``) is out of reach, as in a job's worker without cgroups.

When standard input is a terminal whose foreground ``with`` is, the command's group is
made the terminal's foreground: it reads the terminal, and a Ctrl-C typed there goes to it
(its status then says so, 130), as a shell does for the command it runs.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence

from device_loop.core.process import PR_SET_PDEATHSIG

# "$1": the group's id. A line read: `with` ended it; the end of the pipe: `with` is gone.
_KEEPER = "trap '' INT TERM HUP QUIT; read -r _ && exit 0; kill -9 -\"$1\" 2>/dev/null; exit 0"


def _terminal() -> int | None:
    """Standard input, when it is a terminal whose foreground process group is ours."""
    try:
        return 0 if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp() else None
    except OSError:
        return None


def _give_terminal(fd: int, group: int) -> None:
    """Make ``group`` the terminal's foreground (a background group asking gets SIGTTOU: ignored meanwhile)."""
    previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(fd, group)
    finally:
        signal.signal(signal.SIGTTOU, previous)


class CommandGroup:
    """A command started in a process group of its own; ``fileno`` is readable once its
    first process ended (a pidfd, for ``selectors``)."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str]):
        parent = os.getpid()
        self.terminal = _terminal()
        terminal = self.terminal

        def arrange() -> None:  # in the child, after setpgid, before exec
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != parent:  # `with` died before we asked
                os._exit(1)
            if terminal is not None:
                _give_terminal(terminal, os.getpid())

        # PR_SET_PDEATHSIG is tied to the thread that forks: `with` forks on its main thread
        self.popen = subprocess.Popen(list(argv), env=dict(env), process_group=0, preexec_fn=arrange)
        self.pid = self.popen.pid  # the group's id
        self._lifeline_read, self._lifeline = os.pipe()  # (neither end inherited by the command)
        try:
            self._keeper: subprocess.Popen | None = subprocess.Popen(
                ["sh", "-c", _KEEPER, "device-loop-with-keeper", str(self.pid)], stdin=self._lifeline_read,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError:
            self._keeper = None  # (no sh: PR_SET_PDEATHSIG still ends the first process)
        os.close(self._lifeline_read)
        self._pidfd = os.pidfd_open(self.pid)
        self.status: int | None = None

    def fileno(self) -> int:
        """Readable once the command's first process has ended."""
        return self._pidfd

    def poll(self) -> int | None:
        """Its first process's status once it ended (negative: the signal that ended it), else None."""
        if self.status is None:
            self.status = self.popen.poll()
        return self.status

    def signal(self, number: int) -> None:
        """Send signal ``number`` to the whole group (nothing when it has ended)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, number)

    def close(self) -> int:
        """End it: SIGKILL to what is left of the group, the terminal back to ``with``, the
        keeper sent away; the first process's status."""
        self.signal(signal.SIGKILL)
        status = self.popen.wait()
        self.status = status
        if self.terminal is not None:
            with contextlib.suppress(OSError):
                _give_terminal(self.terminal, os.getpgrp())
        if self._lifeline >= 0:
            with contextlib.suppress(OSError):
                os.write(self._lifeline, b"done\n")
            os.close(self._lifeline)
            self._lifeline = -1
        if self._keeper is not None:
            self._keeper.wait()
        os.close(self._pidfd)
        return status
