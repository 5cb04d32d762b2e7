"""A lease that lives exactly as long as a command: ``device-loop with`` (docs/architecture.md,
"A lease bound to a command").

Reserve (a keepalive lease, queueing when asked), wait until ready (``timeout`` bounds it),
flash ``image`` first unless the device already runs it (verified by read-back), run the
command in a process group of its own (``client/command_group.py``) with the lease's
environment, keep the lease alive meanwhile, and give it back however the command ends.
What happened is a ``CommandOutcome`` (``core/command_outcome.py``), the exit status in it.

A signal (SIGINT, SIGTERM, SIGHUP: ``client/command_signals.py``) while waiting for a device
gives back what the wait held (the ticket, the lease); while the command runs it is passed to
the command's group, the lease is released once the command has ended or a second later, and
a second signal kills the group. The lab failing the command (the lease lost, the device
offline or faulty, as ``client/lease_watch.py`` sees it) ends it: SIGTERM, then SIGKILL a
second later, exit 75 with the reason.
"""
from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import signal
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from device_loop.core.command_outcome import (TIMEOUT_STATUS, CommandOutcome, Timings, cancelled_status,
                                              command_status_outcome, signal_name)
from device_loop.core.durations import format_duration, keepalive_problem
from device_loop.core.errors import ErrorCode
from device_loop.core.usage import LEASE_ANSWER_ENV, environment
from device_loop.core.vocabulary import LAB_FAILURE_STATUS, LIVE_OP_STATES, FailureKind

from .command_group import CommandGroup
from .command_signals import CANCEL_SIGNALS, CancelSignals, Cancelled, Wake
from .give_back import give_back
from .http import CoordinatorError
from .keepalive import KeepAlive
from .lab import Lab, Lease, LeaseFailed, Ticket, telling_place
from .lab_trouble import lab_trouble, wrong_request
from .lease_watch import LeaseWatch, device_reader

if TYPE_CHECKING:  # (pydantic is heavy: a with starts its command without loading it)
    from device_loop.core.answers import LeaseAnswer, OperationAnswer

#: A command line's bounds (docs/architecture.md, "A lease bound to a command").
MAX_ARGUMENTS = 10_000
MAX_COMMAND_BYTES = 1 << 20
DEFAULT_KEEPALIVE_S = 30.0
DEFAULT_TIMEOUT_S = 15 * 60.0
MAX_WAIT_S = 7 * 24 * 3600.0     # --timeout and --max-time: a week at most
GRACE_S = 1.0                    # after the first signal: the lease given back; after a SIGTERM of ours: SIGKILL
OWN_BIN = Path(sys.executable).parent  # where this Python's device-loop script is

Say = Callable[[str], None]


class WrongRequest(ValueError):
    """A request ``with`` refuses before anything is reserved (exit 2)."""


@dataclass(frozen=True)
class CommandRequest:
    """What to run, and on what: a ``device``, or any device of ``class_`` with ``tags`` (and what it ``needs``)."""
    command: tuple[str, ...]
    device: str | None = None
    class_: str | None = None
    tags: tuple[str, ...] = ()
    needs: str | None = None
    queue: bool = False
    image: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    keepalive_s: float = DEFAULT_KEEPALIVE_S
    max_time_s: float | None = None


def check_request(request: CommandRequest, path: str | None = None) -> None:
    """Refuse (``WrongRequest``) what cannot be right whatever the lab holds: no command, a
    command line over ``MAX_ARGUMENTS`` or ``MAX_COMMAND_BYTES``, a program not found on
    ``path``, no target or two, a keepalive or a time out of range."""
    command = request.command
    if not command:
        raise WrongRequest("give the command to run after --")
    if len(command) > MAX_ARGUMENTS:
        raise WrongRequest(f"the command has {len(command):,} arguments; at most {MAX_ARGUMENTS:,}")
    size = sum(len(arg.encode(errors="surrogateescape")) + 1 for arg in command)
    if size > MAX_COMMAND_BYTES:
        raise WrongRequest(f"the command line is {size:,} bytes; at most {MAX_COMMAND_BYTES:,} (1 MiB)")
    if any("\0" in arg for arg in command):
        raise WrongRequest("an argument of the command holds a NUL character")
    if request.device is None and request.class_ is None and not request.tags and request.needs is None:
        raise WrongRequest("name a DEVICE, or give --class and/or --tags (or --needs)")
    if request.device is not None and (request.class_ is not None or request.tags):
        raise WrongRequest("name a DEVICE, or give --class and/or --tags, not both")
    if problem := keepalive_problem(request.keepalive_s):
        raise WrongRequest(f"--keepalive: {problem}")
    for name, value in (("--timeout", request.timeout_s), ("--max-time", request.max_time_s)):
        if value is not None and not 0 < value <= MAX_WAIT_S:
            raise WrongRequest(f"{name} {format_duration(value)} is out of range: at most "
                               f"{format_duration(MAX_WAIT_S)}")
    program = command[0]
    if shutil.which(program, path=path) is None:
        raise WrongRequest(f"{program!r}: no such program" + ("" if "/" in program else " on PATH"))


class _LabFailed(Exception):
    """The lab failed the request before the command ran."""


@dataclass
class _Held:
    """What the wait for a device holds, to give back, and what keeps its lease alive."""
    ticket: Ticket | None = None
    lease: Lease | None = None
    flashed: bool = False
    keeper: KeepAlive | None = None
    lost: str | None = None                               # why the keepalive lost the lease
    listener: Callable[[str], None] | None = None         # told at once (the command's loop)

    def on_lost(self, reason: str) -> None:
        """The keepalive was refused (from its thread)."""
        self.lost = reason
        if self.listener is not None:
            self.listener(reason)

    def stop_keeping(self) -> None:
        """Stop the keep-alives (before the lease is given back: none may follow its release)."""
        if self.keeper is not None:
            self.keeper.stop()
            self.keeper = None


def run_command(lab: Lab, request: CommandRequest, say: Say, base_env: Mapping[str, str] | None = None,
                clock: Callable[[], float] = time.monotonic) -> CommandOutcome:
    """Run ``request`` on a leased device, from the reservation to the lease given back; how it
    ended. ``WrongRequest`` when the request is wrong (nothing was reserved then). Handles
    SIGINT, SIGTERM and SIGHUP while it runs: call it on the main thread."""
    env = dict(os.environ if base_env is None else base_env)
    check_request(request, _path_of(env))
    started, wall = clock(), time.time()
    base = CommandOutcome(command=request.command, status=LAB_FAILURE_STATUS, image=request.image, started_at=wall)
    held = _Held()
    with CancelSignals() as signals:
        try:
            digest, request = _image_and_where(lab, request)
            lease = _acquire(lab, request, held, signals, say, started, clock)
            waited = clock() - started
            flash_s = _flash_if_needed(lab, lease, request, digest, held, say, started, clock)
        except Cancelled as stop:
            with signals.quiet():
                gave_back = _give_back(lab, held)
            outcome = replace(base, status=cancelled_status(stop.number), cancelled=signal_name(stop.number),
                              reason=f"cancelled by {signal_name(stop.number)} while waiting for a device: "
                                     f"{gave_back}", **_where(held))
            return _timed(outcome, clock() - started)
        except _LabFailed as failed:
            with signals.quiet():
                gave_back = _give_back(lab, held)
            reason = str(failed) + (f" ({gave_back})" if held.lease or held.ticket else "")
            return _timed(replace(base, failure=FailureKind.LAB, reason=reason, **_where(held)), clock() - started)
        except BaseException:
            with signals.quiet():
                _give_back(lab, held)
            raise
        signals.raising = False
        outcome = _Run(lab, held, request, env, signals, say, clock).run()
    return replace(outcome, image=request.image, flashed=held.flashed, started_at=wall,
                   timings=Timings(wait_s=waited, flash_s=flash_s, run_s=outcome.timings.run_s,
                                   total_s=clock() - started))


def _path_of(env: Mapping[str, str]) -> str:
    return _with_own_bin(env.get("PATH", os.defpath))


def _with_own_bin(path: str) -> str:
    """``PATH`` with this Python's ``device-loop`` first, so the command's own calls reach the same lab code."""
    if not (OWN_BIN / "device-loop").exists():
        return path
    return os.pathsep.join([str(OWN_BIN), *[p for p in path.split(os.pathsep) if p and p != str(OWN_BIN)]])


def _where(held: _Held) -> dict[str, Any]:
    lease = held.lease
    return {"device": lease.device, "lease": lease.id} if lease is not None else {}


def _timed(outcome: CommandOutcome, total_s: float) -> CommandOutcome:
    return replace(outcome, timings=replace(outcome.timings, total_s=total_s))


# --- before the command -----------------------------------------------------------------------

def _refused(exc: CoordinatorError, what: str) -> Exception:
    """A refusal as ``WrongRequest`` (no retry cures it) or ``_LabFailed``."""
    if wrong_request(exc):
        return WrongRequest(exc.message)
    return _LabFailed(f"{what}: {exc.message}")


def _image_and_where(lab: Lab, request: CommandRequest) -> tuple[str | None, CommandRequest]:
    """The registry's digest of ``request.image`` and the request narrowed to what the image is
    for: its device, or its class (docs/architecture.md, "A lease bound to a command"), looked
    up before anything is reserved; ``WrongRequest`` for an unknown image, or one for no
    device the request could take (a device of another class, another device by name)."""
    if request.image is None:
        return None, request
    image = request.image
    try:
        found = lab.api.get(f"/images/{urllib.parse.quote(image, safe='')}")  # (a name is no path)
    except CoordinatorError as exc:
        if exc.status == 404:  # (also a name the router took for a path: no such image either way)
            raise WrongRequest(f"no image is called {image!r} (device-loop images ls: the registry's)") from None
        raise _refused(exc, f"could not look {image!r} up") from None
    kind, _, name = str(found.get("for") or "").partition(":")
    if kind == "device":
        if request.device not in (None, name):
            raise WrongRequest(f"{image} is for {name}, not {request.device}: flash it there, or name an image "
                               f"for {request.device} (device-loop images ls --device {request.device})")
        if request.device is None:  # the image's device, if it is what the request asks for (its needs: the reserve's)
            device = lab.api.get(f"/devices/{urllib.parse.quote(name, safe='')}")
            missing = sorted(set(request.tags) - set(device.get("tags") or ()))
            if request.class_ not in (None, device["class"]) or missing:
                raise WrongRequest(f"{image} is for {name}, which is not " + (
                    f"of class {request.class_}" if request.class_ not in (None, device["class"])
                    else f"tagged {', '.join(missing)}"))
            request = replace(request, device=name, class_=None, tags=())
    elif kind == "class":
        if request.class_ not in (None, name):
            raise WrongRequest(f"{image} is for class {name}, not {request.class_}")
        if request.device is not None:
            device_class = lab.api.get(f"/devices/{urllib.parse.quote(request.device, safe='')}")["class"]
            if device_class != name:
                raise WrongRequest(f"{image} is for class {name}; {request.device} is of class {device_class}")
        else:
            request = replace(request, class_=name)
    return found["sha256"], request


def _acquire(lab: Lab, request: CommandRequest, held: _Held, signals: CancelSignals, say: Say, started: float,
             clock: Callable[[], float]) -> Lease:
    """Reserve (queueing when asked) and wait until the lease is ready, within ``timeout_s`` from ``started``."""
    key = uuid.uuid4().hex
    arguments: dict[str, Any] = dict(class_=request.class_, tags=list(request.tags), queue=request.queue,
                                     needs=request.needs, keepalive=request.keepalive_s, idempotency_key=key)
    if request.image is not None and request.device is None:
        arguments["image"] = request.image  # (a device already running it is preferred)
    try:
        try:
            got = lab.reserve(request.device, **arguments)
        except Cancelled:  # its answer never came: the same request again says what it made, to give back
            with signals.quiet():
                lab.api.close()
                with contextlib.suppress(CoordinatorError):
                    _hold(held, lab.reserve(request.device, **arguments))
            raise
    except CoordinatorError as exc:
        raise _refused(exc, "no device") from None
    _hold(held, got)
    if isinstance(got, Ticket):
        try:
            got = got.wait(timeout=_left(request, started, clock), on_change=telling_place(say))
        except CoordinatorError as exc:
            if exc.code == ErrorCode.TIMEOUT:
                raise _LabFailed(f"no device within {format_duration(request.timeout_s)} (still queued at position "
                                 f"{held.ticket.position if held.ticket else '?'})") from None
            raise _LabFailed(f"the queue ticket ended: {exc.message}") from None
        _hold(held, got)
    lease = held.lease
    assert lease is not None
    held.keeper = KeepAlive(lease, held.on_lost).start()
    say(f"{lease.device}: {lease.id}, yours while the command runs")
    _ready(lease, request, started, clock)
    return lease


def _hold(held: _Held, got: Lease | Ticket) -> None:
    if isinstance(got, Ticket):
        held.ticket = got
    else:
        held.lease = got


def _left(request: CommandRequest, started: float, clock: Callable[[], float]) -> float:
    return max(0.1, request.timeout_s - (clock() - started))


def _ready(lease: Lease, request: CommandRequest, started: float, clock: Callable[[], float]) -> None:
    try:
        lease.wait_ready(timeout=_left(request, started, clock))
    except LeaseFailed as exc:
        if exc.code == ErrorCode.TIMEOUT:
            raise _LabFailed(f"{lease.device} not ready within {format_duration(request.timeout_s)}: "
                             f"{lease.data.get('reason')}") from None
        raise _LabFailed(exc.message) from None
    except CoordinatorError as exc:
        raise _LabFailed(f"{lease.id}: {exc.message}") from None


def _flash_if_needed(lab: Lab, lease: Lease, request: CommandRequest, digest: str | None, held: _Held, say: Say,
                     started: float, clock: Callable[[], float]) -> float:
    """Flash ``image`` unless the device's last completed flash wrote it and read it back; the seconds it took."""
    if request.image is None:
        return 0.0
    try:
        flashes = lab.api.get(f"/devices/{lease.device}/operations", kind="flash")
    except CoordinatorError as exc:
        raise _LabFailed(f"could not read {lease.device}'s flashes: {exc.message}") from None
    if runs_image(flashes, digest):
        say(f"{lease.device} runs {request.image} already (verified by read-back): not flashed")
        return 0.0
    begun = clock()
    say(f"{lease.device}: flashing {request.image}")
    try:
        op = lease.flash(request.image)
    except CoordinatorError as exc:
        raise _LabFailed(f"the flash of {request.image} onto {lease.device} was refused: {exc.message}") from None
    if op.state != "done":
        raise _LabFailed(f"the flash of {request.image} onto {lease.device} failed: {op.message or op.state}")
    held.flashed = True
    _ready(lease.refresh(), request, started, clock)
    return clock() - begun


def runs_image(flashes: list[OperationAnswer], digest: str | None) -> bool:
    """Whether the device whose flashes (newest first) these are runs the image of ``digest``:
    its latest flash that ended is one the coordinator says ``verified`` (it completed and read
    back the digest it wrote; docs/architecture.md, "Leases that live as long as their client")
    of that digest. A label or a fingerprint's word never counts."""
    ended = next((op for op in flashes if op["state"] not in LIVE_OP_STATES), None)
    return ended is not None and ended.get("verified") is True and ended["image"]["sha256"] == digest


def _give_back(lab: Lab, held: _Held) -> str:
    """Give back what the wait held (``client/give_back.py``); what was done, in words."""
    held.stop_keeping()
    given = give_back(lab.api, held.ticket, held.lease)
    held.lease = held.lease or given.lease
    return given.said


# --- while the command runs -------------------------------------------------------------------

class _Run:
    """The command on its lease, from its start to the lease given back."""

    def __init__(self, lab: Lab, held: _Held, request: CommandRequest, base_env: Mapping[str, str],
                 signals: CancelSignals, say: Say, clock: Callable[[], float]):
        assert held.lease is not None
        self.lab, self.held, self.lease, self.request, self.say, self.clock = lab, held, held.lease, request, say, clock
        self.base_env = base_env
        self.wake = Wake()
        self._signals = signals
        signals.wake = self.wake.wake
        self.lost: str | None = None
        self._lost_lock = threading.Lock()
        self._closed = False
        self._forwards: list[Any] = []
        self.released = False
        held.listener = self.on_lost
        if held.lost is not None:  # (lost while the lease got ready or was flashed)
            self.on_lost(held.lost)

    def on_lost(self, reason: str) -> None:
        """The lease was lost, or the device failed (from any thread; the first reason counts)."""
        with self._lost_lock:  # (the pipe is closed under it: a late watch must not write to a reused fd)
            if self.lost is None:
                self.lost = reason
            if not self._closed:
                self.wake.wake()

    @property
    def signals(self) -> list[int]:
        return self._signals.received

    def run(self) -> CommandOutcome:
        outcome = CommandOutcome(command=self.request.command, status=LAB_FAILURE_STATUS, device=self.lease.device,
                                 lease=self.lease.id)
        watch = None
        try:
            env = self._environment()
            watch = LeaseWatch(self.lease, self.on_lost)
            begun = self.clock()
            try:
                group = CommandGroup(self.request.command, env)
            except OSError as exc:  # found by check_request, gone or not runnable since
                status = 126 if isinstance(exc, PermissionError) else 127
                return replace(outcome, status=status, failure=FailureKind.TEST, command_status=status,
                               reason=f"{self.request.command[0]}: {exc.strerror or exc}")
            try:
                ended = self._loop(group)
            finally:
                command_status = group.close()
            run_s = self.clock() - begun
            watch.stop()
            outcome = replace(outcome, command_status=command_status, timings=Timings(run_s=run_s))
            return self._verdict(outcome, ended, command_status, watch)
        finally:
            if watch is not None:
                watch.stop()
            self._release()
            for forward in self._forwards:
                with contextlib.suppress(Exception):
                    forward.close()
            self._signals.wake = None
            self.held.listener = None
            with self._lost_lock:
                self._closed = True
                self.wake.close()

    def _loop(self, group: CommandGroup) -> str | None:
        """Wait until the command's first process ends, acting on signals, a lost lease and
        ``--max-time`` meanwhile; what cut it short (``cancelled``, ``lost``, ``timeout``), or None."""
        max_time = self.request.max_time_s
        deadline = None if max_time is None else self.clock() + max_time
        kill_at: float | None = None
        release_at: float | None = None
        cut: str | None = None
        with selectors.DefaultSelector() as selector:
            selector.register(group, selectors.EVENT_READ)
            selector.register(self.wake.read_fd, selectors.EVENT_READ)
            while group.poll() is None:
                now = self.clock()
                if self.signals:
                    first, later = self.signals[0], len(self.signals) > 1
                    if cut != "cancelled":
                        cut = "cancelled"
                        group.signal(first)
                        release_at = now + GRACE_S
                    if later:
                        group.signal(signal.SIGKILL)
                elif self.lost is not None and cut is None:
                    cut, kill_at = "lost", now + GRACE_S
                    # (the lab failure itself is said once, as the outcome: with_command.py)
                    self.say("the lease was lost: ending the command (SIGTERM, then SIGKILL after a grace)")
                    group.signal(signal.SIGTERM)
                elif deadline is not None and now >= deadline and cut is None:
                    cut, kill_at = "timeout", now + GRACE_S
                    group.signal(signal.SIGTERM)
                if kill_at is not None and now >= kill_at:
                    group.signal(signal.SIGKILL)
                    kill_at = None
                if release_at is not None and now >= release_at:
                    self._release()  # a cancelled job's board is free at once, whatever its command does
                    release_at = None
                moments = [m for m in (kill_at, release_at, deadline if cut is None else None) if m is not None]
                wait = None if not moments else max(0.0, min(moments) - now)
                for key, _ in selector.select(wait):
                    if key.fileobj == self.wake.read_fd:
                        self.wake.drain()
        return cut

    def _verdict(self, outcome: CommandOutcome, cut: str | None, command_status: int,
                 watch: LeaseWatch) -> CommandOutcome:
        if cut == "cancelled":
            number = self.signals[0]
            return replace(outcome, status=cancelled_status(number), cancelled=signal_name(number),
                           reason=f"cancelled by {signal_name(number)}")
        if cut == "lost":
            return replace(outcome, status=LAB_FAILURE_STATUS, failure=FailureKind.LAB, reason=self.lost)
        if cut == "timeout":
            assert self.request.max_time_s is not None
            return replace(outcome, status=TIMEOUT_STATUS, failure=FailureKind.TIMEOUT,
                           reason=f"--max-time {format_duration(self.request.max_time_s)} cut the command")
        if -command_status in CANCEL_SIGNALS:  # (Ctrl-C at the terminal it was given reaches it, not `with`)
            return replace(outcome, status=cancelled_status(-command_status), cancelled=signal_name(-command_status),
                           reason=f"cancelled by {signal_name(-command_status)}")
        status, failure = command_status_outcome(command_status)
        if failure == FailureKind.LAB:
            return replace(outcome, status=status, failure=failure,
                           reason=f"the command exited {LAB_FAILURE_STATUS}: it says the lab failed it")
        if failure is None:
            return replace(outcome, status=status)
        trouble = self.lost or self._trouble(watch)
        if trouble is not None:  # (docs/architecture.md, "Lab failures"): its failure is not the test's
            return replace(outcome, status=LAB_FAILURE_STATUS, failure=FailureKind.LAB, reason=trouble)
        return replace(outcome, status=status, failure=failure, reason=f"the command exited {status}")

    def _trouble(self, watch: LeaseWatch) -> str | None:
        data: LeaseAnswer
        try:
            data = self.lease.refresh().data
        except CoordinatorError as exc:
            if exc.status in (403, 404):
                return f"{self.lease.id} is no longer yours: {exc.message}"
            data = watch.last  # (unreachable now: what was last seen)
        return lab_trouble(data, device_reader(self.lease))

    def _release(self) -> None:
        if self.released:
            return
        self.released = True
        self.held.stop_keeping()
        with contextlib.suppress(CoordinatorError):
            self.lease.release()

    def _environment(self) -> dict[str, str]:
        """What the command sees: the caller's environment, what ``device-loop env`` exports
        (through local forwards in a lab with gates), the lease, and who to be to the lab."""
        lease = self.lease
        endpoints: list[Any] = [e for e in lease.endpoints if e.get("env")]
        if endpoints:
            from device_loop.core.gate import local_forwards

            self._forwards, endpoints = local_forwards(endpoints)
        env = {**self.base_env, **environment(lease.data, endpoints),
               "DEVICE_LOOP_LEASE": lease.id, "DEVICE_LOOP_DEVICE": lease.device,
               "DEVICE_LOOP_COORDINATOR": self.lab.api.url,
               LEASE_ANSWER_ENV: json.dumps(lease.data)}
        env["PATH"] = _with_own_bin(env.get("PATH", os.defpath))
        if "Authorization" not in self.lab.api.headers:  # a lab without tokens: be the lease's holder
            env["DEVICE_LOOP_USER"] = self.lab.api.user
        return env
