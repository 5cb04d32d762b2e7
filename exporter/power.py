"""Power operations (docs/architecture.md, "Power"): switch a device off, on, or off and on
again through its power backend, and say what was *observed*, not only what was asked.

The backend is the plugin whose resource of kind ``power`` the device has; its one hook,
``devloop_power(action)``, switches or reads the switch and says what it read back (a BMC,
uhubctl and Redfish can; pdudaemon cannot). The exporter adds what the device's console
showed meanwhile (``console_watch.py``): silent (or hung up) while the power was off, and
its first byte after the power came back, timed. A result is ``verified`` when the switch's
read-back or the console showed the change and nothing contradicted it, else
``unverified``, with the reason: an operation that cannot show its effect never reads as done.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from device_loop.core import POWER_KIND
from device_loop.core.host import HostContext
from device_loop.core.model import OperationError, OperationKind, PowerReading, Resource
from device_loop.core.plugins import PluginSet
from device_loop.core.vocabulary import PowerAction, PowerState, PowerVerdict

from .console_watch import ConsoleWatch, Seen, watch_console
from .interrupted import Interrupted

log = logging.getLogger("device_loop.exporter")
CONSOLE_KINDS = ("uart",)  # the resources whose node is the device's console (the sim boards' too)
DEFAULT_OFF_TIME_S = 2.0
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_CONSOLE_TIMEOUT_S = 20.0
MAX_OFF_TIME_S = 600.0
GRACE_S = 0.25     # what a console still prints just after the switch (bytes in flight) is not "not silent"
HANGUP_WAIT_S = 1.0  # how long an ``off`` watches for its console to hang up
MIN_SILENT_S = 1.0   # the least silence (after the grace) that shows a console went dark, without a hang-up
QUIET_S = 1.0        # an ``on`` watches the console this long first: output after on counts only after quiet
POLL_S = 0.01      # the console is looked at this often while a first byte is awaited
BACKSTOP_S = 5.0   # past its timeout, this long more before a call that has not returned is given up

#: The operation a power resource runs (declared by the exporter for every resource of kind
#: ``power`` whose plugin implements ``devloop_power``).
POWER = OperationKind(
    POWER_KIND, "switch the device's power: action on, off, cycle (off, the off-time, on) or status; the result says "
                "what was observed (verified or unverified: the switch's read-back, the console's silence and its "
                "first byte after on)",
    args={"action": "on, off, cycle or status", "off_time_s": "a cycle's seconds off (default: the switch's)"},
    exclusive=True, destructive=False)

Progress = Callable[..., None]


@dataclass
class Observed:
    """What one power operation saw, as its result says it."""

    action: str
    backend: str
    console: str
    how: list[str] = field(default_factory=list)
    contradicted: list[str] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)  # what showed the change
    values: dict[str, Any] = field(default_factory=dict)

    def result(self) -> dict[str, Any]:
        verdict = PowerVerdict.VERIFIED if self.evidence and not self.contradicted else PowerVerdict.UNVERIFIED
        said = "; ".join(self.how + self.contradicted)
        if verdict == PowerVerdict.VERIFIED:
            message = f"verified ({', '.join(self.evidence)}): {said}"
        else:
            why = "; ".join(self.contradicted) or "nothing showed the change: the switch has no read-back and " \
                                                  f"the console was not watched or said nothing ({self.console})"
            message = f"unverified ({why}): {'; '.join(self.how)}"
        return {"message": message[:1000], "verdict": verdict.value, "action": self.action, "backend": self.backend,
                "console": self.console[:200], "how": [h[:300] for h in self.how][:20], **self.values}


class PowerRunner:
    """Runs ``power`` operations and ``power-cycle`` steps on this host's devices."""

    def __init__(self, host: HostContext, plugins: PluginSet, stopping: threading.Event | None = None):
        self.host, self.plugins = host, plugins
        self.stopping = stopping or threading.Event()
        self._busy: dict[str, float] = {}  # a power resource whose backend call has not returned -> since when
        self._lock = threading.Lock()

    @staticmethod
    def switch_of(resources: Sequence[Resource]) -> Resource | None:
        """The device's power switch: its first resource of kind ``power``."""
        return next((r for r in resources if r.kind == POWER_KIND), None)

    def run(self, args: dict[str, Any], switch: Resource, resources: Sequence[Resource], progress: Progress,
            within_s: float | None = None) -> dict[str, Any]:
        """Run a ``power`` operation (``args``: ``action``, a cycle's ``off_time_s``) on the device
        whose power is ``switch`` and whose resources are ``resources``, within ``within_s``
        seconds if given (a step's timeout); its result."""
        action, off_time = self._checked(args, switch)
        deadline = time.monotonic() + within_s if within_s is not None else math.inf
        console = next((r for r in resources if r.kind in CONSOLE_KINDS and r.node), None)
        watch = watch_console(self.host, console) if action != PowerAction.STATUS else "not needed to read the switch"
        observed = Observed(action.value, _backend(switch), "")
        try:
            if action == PowerAction.STATUS:
                self._status(switch, observed, deadline)
            elif action == PowerAction.OFF:
                self._off(switch, watch, observed, progress, deadline)
            elif action == PowerAction.ON:
                self._on(switch, watch, observed, progress, deadline)
            else:
                self._cycle(switch, watch, off_time, observed, progress, deadline)
        finally:
            if isinstance(watch, ConsoleWatch):
                watch.close()
            observed.console = watch.how if isinstance(watch, ConsoleWatch) else f"not watched: {watch}"
        return observed.result()

    def cycle(self, switch: Resource, resources: Sequence[Resource], off_time_s: float | None,
              progress: Progress, within_s: float | None = None) -> dict[str, Any]:
        """A power cycle, as the ``power-cycle`` step between leases runs it."""
        args: dict[str, Any] = {"action": PowerAction.CYCLE.value}
        if off_time_s is not None:
            args["off_time_s"] = off_time_s
        return self.run(args, switch, resources, progress, within_s)

    # ---- the actions -------------------------------------------------------------------------

    def _status(self, switch: Resource, observed: Observed, deadline: float) -> None:
        reading = self._switch(switch, PowerAction.STATUS, deadline)
        observed.values["state"] = reading.state
        if reading.state is not None:
            observed.evidence.append("read back from the switch")
            observed.how.append(f"the switch reads {reading.state}"
                                + (f" ({reading.detail})" if reading.detail else ""))
        else:
            observed.how.append(reading.detail or f"{observed.backend} cannot read its state back")

    def _off(self, switch: Resource, watch, observed: Observed, progress: Progress, deadline: float) -> None:
        progress("off", detail=f"switching {switch.device} off")
        before = _seen(watch)
        reading = self._switch(switch, PowerAction.OFF, deadline)
        before_ns = time.monotonic_ns()
        self._read_back(reading, PowerState.OFF, observed)
        if isinstance(watch, ConsoleWatch):
            until = min(time.monotonic() + HANGUP_WAIT_S, deadline)
            while time.monotonic() < until and watch.seen().hangups == before.hangups:
                self._wait(POLL_S, "watching the console")
            after = watch.seen()
            if after.hangups > before.hangups:
                observed.evidence.append("the console hung up")
                observed.how.append("its console hung up")
            elif after.last_ns > (settled_ns := before_ns + int(GRACE_S * 1e9)) and after.bytes > before.bytes:
                observed.contradicted.append(f"its console kept printing after it was switched off "
                                             f"({(after.last_ns - settled_ns) / 1e9:.2f} s past the grace)")
            else:
                observed.how.append(f"its console did not hang up within {HANGUP_WAIT_S:g} s (silence alone does "
                                    "not show it is off: an idle board is silent too)")

    def _on(self, switch: Resource, watch, observed: Observed, progress: Progress, deadline: float) -> None:
        quiet = False
        if isinstance(watch, ConsoleWatch):  # what it prints before on is not what on made it print
            progress("on", detail=f"watching {switch.device}'s console for {QUIET_S:g} s before switching it on")
            start = watch.seen()
            self._wait(min(QUIET_S, max(0.0, deadline - time.monotonic())), "watching the console")
            end = watch.seen()
            quiet = end.bytes == start.bytes and end.blind_ns == start.blind_ns
            if not quiet:
                observed.how.append("its console was not silent (or not seen) just before on: what it prints "
                                    "after on shows nothing")
        progress("on", detail=f"switching {switch.device} on")
        mark = _settled(watch)  # (all it printed before is counted: what comes after is the on's)
        began = time.monotonic()
        reading = self._switch(switch, PowerAction.ON, deadline)
        switched = time.monotonic()
        self._read_back(reading, PowerState.ON, observed)
        observed.values["switch_s"] = round(switched - began, 3)
        if isinstance(watch, ConsoleWatch) and reading.console_follows:
            printed = self._first_byte(watch, mark, switched, _console_timeout(switch), observed, progress,
                                       deadline)
            if printed and quiet and not _typed_since(mark, watch.seen()):
                observed.evidence.append("the console printed after on")
            elif printed and _typed_since(mark, watch.seen()):
                observed.how.append("someone typed on the console meanwhile: its output may be their echo")

    def _cycle(self, switch: Resource, watch, off_time: float, observed: Observed, progress: Progress,
               deadline: float) -> None:
        before = _seen(watch)
        timeout_s = _seconds(getattr(switch.config, "timeout", None), DEFAULT_TIMEOUT_S)
        if time.monotonic() + off_time + timeout_s > deadline:  # (a cycle begun must end: on comes)
            raise OperationError(f"a {off_time:g} s cycle with a switch that may take {timeout_s:g} s a call does "
                                 "not fit in the step's timeout: nothing was switched", changed=False)
        progress("off", detail=f"switching {switch.device} off for {off_time:g} s")
        off = self._switch(switch, PowerAction.OFF, deadline)
        switched_off = time.monotonic()
        deadline = max(deadline, switched_off + off_time + timeout_s + BACKSTOP_S)  # never refuse the on
        self._read_back(off, PowerState.OFF, observed, evidence=False)
        try:
            settled = None
            if isinstance(watch, ConsoleWatch):
                self._wait(min(GRACE_S, off_time), "the power was off")
                settled = watch.seen()
            self._wait(max(0.0, switched_off + off_time - time.monotonic()), "the power was off")
        except OperationError as stopped:  # the exporter stops: not a board left off for the next lease
            try:
                self._switch(switch, PowerAction.ON, min(deadline, time.monotonic() + DEFAULT_TIMEOUT_S))
            except OperationError as exc:
                raise OperationError(f"{stopped}; switching it back on failed too: {exc}") from None
            raise OperationError(f"{stopped}; it was switched back on") from None
        observed.values["off_s"] = round(time.monotonic() - switched_off, 3)
        silent = False
        if isinstance(watch, ConsoleWatch) and settled is not None:
            during = watch.seen()
            window = observed.values["off_s"] - GRACE_S
            hung = during.hangups > before.hangups
            seen_all = during.blind_ns == settled.blind_ns
            silent = during.bytes == settled.bytes and seen_all and (hung or window >= MIN_SILENT_S)
            observed.values["console_silent"] = during.bytes == settled.bytes and seen_all
            observed.values["console_hung_up"] = hung
            if during.bytes != settled.bytes:
                observed.contradicted.append(f"its console printed {during.bytes - settled.bytes} bytes while the "
                                             "power was off: the switch may not feed this board")
            elif not seen_all:
                observed.how.append("its console was not watched the whole off-time")
            elif silent:
                observed.how.append(f"its console was silent for the {off_time:g} s off"
                                    + (" (it hung up)" if hung else ""))
            else:
                observed.how.append(f"its console was silent, but {window:.2f} s of silence (off-time less "
                                    f"{GRACE_S:g} s) shows nothing: an idle board is silent too (an off-time of "
                                    f"{MIN_SILENT_S + GRACE_S:g} s or more can show it)")
        progress("on", detail=f"switching {switch.device} on again")
        mark = _settled(watch)  # (all it printed before is counted: what comes after is the on's)
        began = time.monotonic()
        on = self._switch(switch, PowerAction.ON, deadline)
        switched_on = time.monotonic()
        observed.values["switch_s"] = round(switched_on - began, 3)
        self._read_back(on, PowerState.ON, observed, evidence=False)
        if off.state == PowerState.OFF and on.state == PowerState.ON:
            observed.evidence.append("read back from the switch: off, then on")
        if isinstance(watch, ConsoleWatch) and on.console_follows:
            printed = self._first_byte(watch, mark, switched_on, _console_timeout(switch), observed, progress,
                                       deadline)
            echoed = _typed_since(mark, watch.seen()) and not observed.values.get("console_hung_up")
            if echoed:
                observed.how.append("someone typed on the console after on: its output may be their echo")
            if printed and silent and not echoed:
                observed.evidence.append("the console went silent while off and printed again after on")

    # ---- what they share -------------------------------------------------------------------------

    def _wait(self, seconds: float, what: str) -> None:
        if self.stopping.wait(seconds):
            raise Interrupted(what)

    def _first_byte(self, watch: ConsoleWatch, mark: Seen, since: float, timeout_s: float,
                    observed: Observed, progress: Progress, deadline: float) -> bool:
        """Wait for the console's first byte after ``mark`` (settled before the switch was asked
        to turn on: nothing printed before is in it); its time after ``since`` (when the switch
        said it was on) goes in the result."""
        timeout_s = max(0.0, min(timeout_s, deadline - since))
        progress("booting", detail=f"waiting for the console's first byte (up to {timeout_s:g} s)")
        while True:
            seen = watch.seen()
            if seen.bytes > mark.bytes:
                # the latest chunk's time: a first chunk seen within one poll of its arrival
                first = max(0.0, min(seen.last_ns / 1e9, time.monotonic()) - since)
                observed.values["first_byte_s"] = round(first, 3)
                observed.how.append(f"its console printed again {first:.2f} s after on")
                return True
            if time.monotonic() >= since + timeout_s:
                observed.values["first_byte_s"] = None
                observed.how.append(f"its console printed nothing within {timeout_s:g} s of on")
                return False
            self._wait(POLL_S, "waiting for the console")

    @staticmethod
    def _read_back(reading: PowerReading, wanted: PowerState, observed: Observed, evidence: bool = True) -> None:
        observed.values[f"state_after_{wanted.value}"] = reading.state
        if reading.detail:
            observed.how.append(reading.detail)
        if reading.state is None:
            return
        if reading.state != wanted:
            raise OperationError(f"the switch reads {reading.state} after it was switched {wanted.value}"
                                 + (f" ({reading.detail})" if reading.detail else ""))
        if evidence:
            observed.evidence.append(f"read back from the switch: {wanted.value}")

    def _switch(self, switch: Resource, action: PowerAction, deadline: float = math.inf) -> PowerReading:
        """The backend's ``devloop_power``, within the switch's timeout: a call that overstays is
        left to run (no thread can be killed) and the operation fails."""
        timeout_s = _seconds(getattr(switch.config, "timeout", None), DEFAULT_TIMEOUT_S)
        wait_s = min(timeout_s + BACKSTOP_S, deadline - time.monotonic())
        if wait_s <= 0:
            raise OperationError(f"no time is left to switch {switch.device} {action.value} (the step's timeout)")
        with self._lock:
            if switch.identifier in self._busy:
                raise OperationError(f"the last call to {switch.identifier}'s backend has not returned yet (it began "
                                     f"{time.monotonic() - self._busy[switch.identifier]:.0f} s ago)", changed=False)
            self._busy[switch.identifier] = time.monotonic()
        outcome: dict[str, Any] = {}
        ended = threading.Event()

        def call() -> None:
            try:
                outcome["reading"] = self.plugins.call(switch.plugin, "devloop_power", host=self.host,
                                                       resource=switch, action=action.value)
            except BaseException as exc:  # (handed to the operation's thread, which says what it was)
                outcome["error"] = exc
            finally:
                with self._lock:
                    self._busy.pop(switch.identifier, None)
                ended.set()
        threading.Thread(target=call, name=f"power-{action.value}-{switch.device}", daemon=True).start()
        # the backend kills its own programs at its timeout and says what they printed: this is the
        # backstop for a backend that does not return at all
        if not ended.wait(wait_s):
            log.warning("power %s of %s has not returned after %g s; left to run", action.value, switch.device,
                        wait_s)
            raise OperationError(f"the power backend ({_backend(switch)}) did not answer {action.value} within "
                                 f"{wait_s:g} s (its timeout is {timeout_s:g} s); left it")
        if "error" in outcome:
            error = outcome["error"]
            if isinstance(error, OperationError):
                raise error
            raise OperationError(f"the power backend ({_backend(switch)}) crashed: {error!r}") from None
        reading = outcome.get("reading")
        if not isinstance(reading, PowerReading):
            raise OperationError(f"the power backend ({_backend(switch)}) answered {type(reading).__name__:.40}, "
                                 "not a PowerReading")
        return reading

    def _checked(self, args: dict[str, Any], switch: Resource) -> tuple[PowerAction, float]:
        unknown = sorted(set(args) - {"action", "off_time_s"})
        if unknown:
            raise OperationError(f"power takes action and off_time_s, not {', '.join(unknown)}", changed=False)
        try:
            action = PowerAction(str(args.get("action")))
        except ValueError:
            raise OperationError(f"action must be one of {', '.join(PowerAction)}, not {args.get('action')!r:.40}",
                                 changed=False) from None
        off_time = args.get("off_time_s")
        if off_time is not None and action != PowerAction.CYCLE:
            raise OperationError("off_time_s goes with a cycle", changed=False)
        if off_time is None:
            off_time = _seconds(getattr(switch.config, "off_time", None), DEFAULT_OFF_TIME_S)
        if isinstance(off_time, bool) or not isinstance(off_time, (int, float)) or not math.isfinite(off_time) \
                or not 0 <= off_time <= MAX_OFF_TIME_S:
            raise OperationError(f"off_time_s must be a number of seconds from 0 to {MAX_OFF_TIME_S:g}, not "
                                 f"{off_time!r:.40}", changed=False)
        return action, float(off_time)


def _seen(watch) -> Seen:
    return watch.seen() if isinstance(watch, ConsoleWatch) else Seen()


def _settled(watch) -> Seen:
    return watch.settled() if isinstance(watch, ConsoleWatch) else Seen()


def _typed_since(mark: Seen, now: Seen) -> bool:
    return now.typed > mark.typed


def _console_timeout(switch: Resource) -> float:
    return _seconds(getattr(switch.config, "console_timeout", None), DEFAULT_CONSOLE_TIMEOUT_S)


def _seconds(value: Any, default: float) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
        return float(value)
    return default


def _backend(switch: Resource) -> str:
    """The switch's backend, as its result names it: the config's ``backend``, else its plugin."""
    backend = getattr(switch.config, "backend", None)
    return backend if isinstance(backend, str) and backend else switch.plugin
