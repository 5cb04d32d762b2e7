"""Plugin hooks the report loop calls with a deadline, so that one hung hook cannot stop
the heartbeats of its whole host.

A batch of calls (every plugin's discovery, every resource's health check) runs in worker
threads, a few at a time, and each call gets ``timeout_s`` from its start. A Python thread
cannot be killed: a call past its deadline is left to run, and until it returns no other
call of the same key (the same hook of the same plugin, for the same resource) starts; the
batch reports it as timed out meanwhile. Workers are reused, so a batch that hangs nowhere
costs a queue hand-over a call, not a thread start.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Hashable

log = logging.getLogger("device_loop.exporter")

DEFAULT_TIMEOUT_S = 5.0
PARALLEL_CALLS = 8  # a batch's calls under way at once
IDLE_WORKERS = 8  # threads kept for the next batch; more end once their call returns


class HookTimedOut(Exception):
    """A hook call did not return within its deadline; the message says so ("timed out after 5 s")."""


@dataclass(frozen=True)
class Returned:
    value: Any

    def result(self) -> Any:
        return self.value


@dataclass(frozen=True)
class Raised:
    error: Exception

    def result(self) -> Any:
        raise self.error


@dataclass(frozen=True)
class TimedOut:
    """The call had not returned by its deadline (``timeout_s``); ``started``
    (time.monotonic()) says when it began, in this batch or in an earlier one, if it is
    still running from then."""

    started: float
    timeout_s: float

    def result(self) -> Any:
        raise HookTimedOut(f"timed out after {self.timeout_s:g} s")


Outcome = Returned | Raised | TimedOut


class _Call:
    def __init__(self, key: Hashable, fn: Callable[[], Any], deadline: float):
        self.key, self.fn = key, fn
        self.started = time.monotonic()
        self.deadline = self.started + deadline
        self.finished = False  # set under the runner's lock
        self.outcome: Outcome | None = None


class HookDeadlines:
    """Runs batches of calls, each within ``timeout_s``, never two of one key at once."""

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S):
        self.timeout_s = timeout_s
        self._changed = threading.Condition()
        self._hung: dict[Hashable, _Call] = {}  # key -> its call past its deadline, still running
        self._idle: list[queue.SimpleQueue[_Call]] = []  # the job queues of idle workers

    def hung(self) -> list[Hashable]:
        """The keys whose call is still running past its deadline."""
        with self._changed:
            return list(self._hung)

    def run(self, calls: dict[Hashable, Callable[[], Any]]) -> dict[Hashable, Outcome]:
        """Call each of ``calls`` (key -> a function of no argument) and wait for it until its
        deadline; the outcome of each key (``outcome.result()`` returns what the call
        returned, or raises what it raised or ``HookTimedOut``). A key whose earlier call is
        still running is not called again: its outcome is ``TimedOut`` at once."""
        outcomes: dict[Hashable, Outcome] = {}
        running: list[_Call] = []
        with self._changed:
            for key, fn in calls.items():
                if key in self._hung:
                    outcomes[key] = TimedOut(self._hung[key].started, self.timeout_s)
                    continue
                self._settle(running, outcomes, room_for=1)
                running.append(self._start(key, fn))
            self._settle(running, outcomes, room_for=PARALLEL_CALLS)
        return outcomes

    def _settle(self, running: list[_Call], outcomes: dict, room_for: int) -> None:
        """Wait (the lock held) until fewer than ``PARALLEL_CALLS - room_for + 1`` calls run,
        collecting the outcomes of those that ended or passed their deadline."""
        while True:
            now = time.monotonic()
            for call in list(running):
                if call.finished:
                    outcomes[call.key] = call.outcome
                elif now >= call.deadline:
                    log.warning("%s has not returned after %g s; not called again until it does", _what(call.key),
                                self.timeout_s)
                    self._hung[call.key] = call
                    outcomes[call.key] = TimedOut(call.started, self.timeout_s)
                else:
                    continue
                running.remove(call)
            if len(running) <= PARALLEL_CALLS - room_for:
                return
            self._changed.wait(min(call.deadline for call in running) - now)

    def _start(self, key: Hashable, fn: Callable[[], Any]) -> _Call:
        call = _Call(key, fn, self.timeout_s)
        jobs: queue.SimpleQueue[_Call] | None = self._idle.pop() if self._idle else None
        if jobs is None:
            jobs = queue.SimpleQueue()
            threading.Thread(target=self._work, args=(jobs,), name="plugin-hook", daemon=True).start()
        jobs.put(call)
        return call

    def _work(self, jobs: queue.SimpleQueue[_Call]) -> None:
        while True:
            call = jobs.get()
            try:
                outcome: Outcome = Returned(call.fn())
            except Exception as exc:
                outcome = Raised(exc)
            with self._changed:
                call.outcome, call.finished = outcome, True
                if self._hung.get(call.key) is call:
                    del self._hung[call.key]
                    log.warning("%s returned after %.1f s", _what(call.key), time.monotonic() - call.started)
                keep = len(self._idle) < IDLE_WORKERS
                if keep:
                    self._idle.append(jobs)
                self._changed.notify_all()
            if not keep:
                return


def _what(key: Hashable) -> str:
    """A key ``(hook, plugin[, identifier])`` in words, for the log."""
    if not isinstance(key, tuple):
        return str(key)
    hook, plugin, *resource = key
    return f"{hook} of plugin {plugin}" + (f" for {resource[0]}" if resource else "")
