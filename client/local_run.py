"""A job's command on the worker (docs/architecture.md, "Jobs and evidence"): ``sh -c`` in a
cgroup of its own (``client/job_cgroups.py``) where the worker has cgroups, under the
account of the job's owner where the worker serves others (``client/accounts.py``), killed
whole at its deadline and when it ends, and gone with the worker however the worker ends;
and the samples its output holds.

A command may start anything (``device-loop exec``, ``adb push``, a build): killing ``sh``
alone would leave those running. Its first process, the leader, waits for a line on its
standard input before it runs the command, and the worker moves it into the command's
cgroup before it writes that line: nothing the command starts is ever outside. Without
cgroups (a worker that serves only its own user, on a machine that has none it may use),
the leader leads a process group of its own, and should the worker die
(``PR_SET_PDEATHSIG``, a SIGTERM) kills that group; a process that leaves the group
(``setsid``) is then out of reach.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from device_loop.core.ab.jobs import (METRIC_CPU_S_PER_MIB, MAX_METRICS, MAX_TEXT_CHARS, MetricSpec, Sample,
                                      metric_pattern, metric_regex_refusal)
from device_loop.core.process import term_when_parent_dies

from .accounts import Account
from .job_cgroups import JobCgroup

#: What a command's output keeps: the metrics are read from the last MiB of stdout.
KEEP_BYTES = 1 << 20
_MIB = 1 << 20
TAIL_CHARS = MAX_TEXT_CHARS // 2
# The leader: the go-ahead read first, then the command in the background, and a dead
# worker's SIGTERM turned into a SIGKILL of the whole group ("$1" is the command, passed as an
# argument: no quoting). No go-ahead (the worker could not place it): it ends, having run nothing.
_LEADER = 'read -r _ || exit 125; trap "kill -KILL 0" TERM; sh -c "$1" </dev/null & wait $!'


@dataclass(frozen=True)
class LocalResult:
    """What one command did: its status (negative: the signal that ended it), its output."""
    status: int
    stdout: str
    stderr: str
    started_at: float
    ended_at: float
    timed_out: bool = False
    killed: bool = False     # stopped from outside (the worker stopping), not by its deadline

    def tail(self, chars: int = TAIL_CHARS) -> str:
        """The end of stdout and stderr, for a failed run's reason."""
        both = self.stdout.rstrip("\n") + ("\n" + self.stderr.rstrip("\n") if self.stderr.strip() else "")
        return both[-chars:].lstrip("\n")


class _Tail:
    """The last ``KEEP_BYTES`` read from a pipe, read on a thread of its own."""

    def __init__(self, pipe):
        self.chunks: list[bytes] = []
        self.size = 0
        self.thread = threading.Thread(target=self._read, args=(pipe,), daemon=True, name="local-run-output")
        self.thread.start()

    def _read(self, pipe) -> None:
        with pipe:
            for chunk in iter(lambda: pipe.read1(65536), b""):
                self.chunks.append(chunk)
                self.size += len(chunk)
                while self.size - len(self.chunks[0]) >= KEEP_BYTES:
                    self.size -= len(self.chunks.pop(0))

    def text(self, timeout: float) -> str:
        self.thread.join(timeout)  # (a process that left the group may hold the pipe open)
        return b"".join(self.chunks)[-KEEP_BYTES:].decode(errors="replace")


class LocalCommand:
    """One command running on this machine. Start it, then ``wait``; ``kill`` from any thread.

    ``job``: the cgroup of its job, in which it gets one of its own; ``account``: whom it runs as
    (default: the worker's account), starting in that account's home."""

    def __init__(self, command: str, env: Mapping[str, str], cwd: str | None = None, clock=time.time,
                 job: JobCgroup | None = None, account: Account | None = None):
        self.clock = clock
        self.started_at = clock()
        self._killed = threading.Event()
        self.job = job
        self.cgroup = job.command() if job is not None else None
        # PR_SET_PDEATHSIG is tied to the thread that forks: the caller's thread waits for the
        # command to end, so it outlives it unless the whole worker dies
        self.popen = subprocess.Popen(
            ["sh", "-c", _LEADER, "device-loop-job", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env=dict(env), cwd=account.workdir if account is not None else cwd,
            start_new_session=True, preexec_fn=term_when_parent_dies(os.getpid()),
            user=None if account is None else account.uid, group=None if account is None else account.gid,
            extra_groups=None if account is None else list(account.groups))
        self._stdout, self._stderr = _Tail(self.popen.stdout), _Tail(self.popen.stderr)
        gate = self.popen.stdin
        assert gate is not None
        try:
            if self.cgroup is not None:
                self.cgroup.add(self.popen.pid)
        except OSError:
            self.popen.kill()  # (it has run nothing yet: it waits for the go-ahead)
            self.popen.wait()
            self._discard()
            gate.close()
            raise
        with contextlib.suppress(BrokenPipeError):  # (killed meanwhile: wait() says so)
            with gate:
                gate.write(b"go\n")

    @property
    def pid(self) -> int:
        """The leader: its pid is the process group's id."""
        return self.popen.pid

    def kill(self) -> None:
        """Kill everything the command started (its cgroup, else its process group)."""
        self._killed.set()
        if self.job is not None and self.cgroup is not None:
            self.job.kill(self.cgroup)
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)

    def wait(self, timeout_s: float) -> LocalResult:
        """Wait for the command to end, at most ``timeout_s`` (then all it started is killed)."""
        timed_out = False
        try:
            self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            self.kill()
            self.popen.wait()
        self._discard()  # what the command left behind
        ended_at = self.clock()
        status = self.popen.returncode
        return LocalResult(status=max(-255, min(255, status)), stdout=self._stdout.text(5), stderr=self._stderr.text(5),
                           started_at=self.started_at, ended_at=ended_at, timed_out=timed_out,
                           killed=self._killed.is_set() and not timed_out)

    def _discard(self) -> None:
        if self.job is not None and self.cgroup is not None:
            self.job.discard(self.cgroup)
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)


@dataclass(frozen=True)
class MetricsRead:
    """What a run's output gave: its samples, and why a declared metric's regex was not read
    to the end (refused, or cut at the CPU it is given: ``METRIC_CPU_S_PER_MIB``), one
    sentence a metric."""
    samples: list[Sample]
    unread: list[str]


def read_metrics(result: LocalResult, metrics: Sequence[MetricSpec]) -> MetricsRead:
    """The samples a run's output gives: each declared metric's last value (from its regex,
    over stdout then stderr, else from JSON lines on stdout); with none declared, every
    metric the JSON lines name (at most ``MAX_METRICS``). Values that are not finite
    numbers, and lines that are not metric objects, are skipped; a regex refused, or cut at
    the CPU it is given, is said in ``unread``."""
    reported = _json_lines(result.stdout)
    if not metrics:
        named = list(reported.items())[:MAX_METRICS]
        return MetricsRead([Sample(metric=name, value=value, unit=unit) for name, (value, unit) in named], [])
    found: list[Sample] = []
    unread: list[str] = []
    for metric in metrics:
        if metric.regex is not None:
            refusal = metric_regex_refusal(metric)  # (a spec stored before the coordinator refused such regexes)
            if refusal is not None:
                unread.append(refusal)
                continue
            pattern = metric_pattern(metric.regex)
            try:
                value = _last_match(pattern, result.stdout)
                if value is None:
                    value = _last_match(pattern, result.stderr)
            except _Cut as exc:
                unread.append(f"metric {metric.name}: its regex was cut {exc}")
                continue
            if value is not None:
                found.append(Sample(metric=metric.name, value=value, unit=metric.unit))
        elif metric.name in reported:
            value, unit = reported[metric.name]
            found.append(Sample(metric=metric.name, value=value, unit=metric.unit or unit))
    return MetricsRead(found, unread)


def _json_lines(stdout: str) -> dict[str, tuple[float, str]]:
    reported: dict[str, tuple[float, str]] = {}
    for line in stdout.splitlines():
        line = line.strip()
        if not (line.startswith("{") and '"metric"' in line):
            continue
        try:
            said = json.loads(line)
            sample = Sample(metric=said["metric"], value=float(said["value"]), unit=str(said.get("unit", "")))
        except (ValueError, TypeError, KeyError):  # (pydantic's ValidationError is a ValueError)
            continue
        reported.pop(sample.metric, None)  # the last value counts, in the order last seen
        reported[sample.metric] = (sample.value, sample.unit)
    return reported


class _Cut(Exception):
    """A regex's search ran past the CPU it is given."""


def _last_match(pattern: Any, text: str) -> float | None:
    """The last value ``pattern`` finds in ``text``, within ``METRIC_CPU_S_PER_MIB`` of this
    thread's CPU a MiB of it (and as much for less), else ``_Cut``. RE2's work at each byte
    is bounded (``metric_pattern``), not how many matches the output makes it find, nor how
    far past each its search reads: a match at every byte of a MiB took 4 s here, and
    ``(?P<value>[0-9])(?s:.*x)?`` over a MiB of digits, a search to the end for each, would
    take some 40 minutes."""
    data = text.encode()  # (read as bytes: half the time a match that str costs)
    budget_s = METRIC_CPU_S_PER_MIB * max(len(data), _MIB) / _MIB
    started = time.thread_time()
    value = None
    for match in pattern.finditer(data):
        if time.thread_time() - started > budget_s:
            raise _Cut(f"after {budget_s:g} s of CPU over {len(data) / _MIB:.2g} MiB of output (a worker gives a "
                       f"metric's regex {METRIC_CPU_S_PER_MIB:g} s a MiB, and as much for less): it matched too "
                       f"often, or searched far past its matches")
        said = match.group("value")
        if said is None:
            continue
        try:
            number = float(said.decode(errors="replace"))
        except ValueError:
            continue
        if number == number and abs(number) != float("inf"):
            value = number
    return value
