"""The steps a device runs between two leases (docs/architecture.md, "Steps between leases"):
where each runs, and the exporter's own.

A device's config lists its steps (``[[devices.steps]]``, or its class's); after every lease
the coordinator asks for each, in order, as an operation whose kind is the step's name, of
purpose ``step``, with its place in the list (``DesiredOperation.step``): what the step does stays in
this exporter's config, never in the request. ``plan`` says where each runs, from the
resources as last scanned: a ``reflash`` on the device's flash resource (the coordinator
asks for it as a ``flash``), a plugin's step on the first resource whose plugin offers it
(``devloop_steps``), the others (``cooldown``, ``command``, ``reboot``) by the exporter
itself, on any resource of the device. The executor (``operations.py``) hands an operation
to ``StepRunner`` when ``match`` says it is a step; a ``settle`` (asked for inside a lease)
runs the device's steps that settle (its cooldowns), in order.

Every step ends within its timeout: cooldown, command and reboot hold to it themselves; a
plugin's step past it is failed, and its thread is left to run (no thread can be killed),
as ``hook_deadlines.py`` leaves a hung hook. A step may be interrupted (the exporter
killed) and run again from the first: each is repeatable.
"""
from __future__ import annotations

import functools
import logging
import math
import re
import shlex
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import serial
from pydantic import TypeAdapter, ValidationError

from device_loop.core import FLASH_KIND, SETTLE_KIND
from device_loop.core.durations import format_duration
from device_loop.core.host import HostContext
from device_loop.core.model import Operation, OperationError, Resource, StepKind
from device_loop.core.plugins import PluginSet
from device_loop.core.process import last_lines
from device_loop.core.vocabulary import PowerVerdict, Purpose
from device_loop.core.protocol import (EXPORTER_STEPS, MAX_DETAIL_CHARS, ArgName, DesiredOperation, PluginStep,
                                       StepReport, Word)

from .config import (BUILT_IN_STEPS, MAX_STEP_TIMEOUT_S, STEP_MODELS, CommandStep, CooldownStep, PluginStepConfig,
                     PowerCycleStep, RebootStep, ReflashStep, StepConfig)
from .hook_deadlines import DEFAULT_TIMEOUT_S, HookDeadlines, HookTimedOut
from .interrupted import Interrupted
from .power import PowerRunner

log = logging.getLogger("device_loop.exporter")
POLL_S = 1.0  # a cooldown reads the device's temperatures this often
QUIET_S = 0.3  # a console that printed its prompt and then nothing for this long has booted
BOOT_LINES = 2  # lines a console prints between a reboot's echo and its prompt, at least: an error prints one
INTERRUPT = b"\x03"  # Ctrl-C: drops what was left typed on the console (or running there), as a shell does
CONSOLE_KINDS = ("uart", "sim")
DEFAULT_BAUD = 115200
MAX_CONSOLE_CHARS = 64 << 10  # what a reboot keeps of what its console printed (the prompt is at its end)
CONSOLE_RESULT_CHARS = 4000  # what its result carries of it: the end of the boot
_WORD = TypeAdapter(Word)
_ARG_NAME = TypeAdapter(ArgName)
_RESERVED_SETTINGS = {*StepConfig.model_fields, "timeout_s"}  # every step entry's own keys, and the one added

Progress = Callable[..., None]  # (phase, done, total, unit, detail), as Operation.progress takes them


@dataclass(frozen=True)
class PlannedStep:
    """A configured step as it runs here: who runs it (``plugin``: the exporter's own
    ``EXPORTER_STEPS``, or the plugin whose resource offers it), on which resource, within
    what time. ``problem``: why it cannot run here (a plugin step no resource offers, a
    reflash without a flash resource); the exporter then runs it, to fail it with that."""

    index: int
    config: StepConfig
    plugin: str
    identifier: str
    timeout_s: float
    kind: StepKind | None = None
    problem: str | None = None

    @property
    def name(self) -> str:
        return self.config.step

    @property
    def operation_kind(self) -> str:
        """The kind of the operation the coordinator asks for it as (a reflash: a flash)."""
        return FLASH_KIND if isinstance(self.config, ReflashStep) else self.name

    def report(self) -> StepReport:
        return StepReport(step=self.name, plugin=self.plugin, identifier=self.identifier,
                          timeout_s=min(self.timeout_s, MAX_STEP_TIMEOUT_S), settle=self.config.settles)


def plan(steps: Sequence[StepConfig], resources: Sequence[Resource],
         offered: Mapping[str, Sequence[StepKind]]) -> list[PlannedStep]:
    """Where each of a device's ``steps`` runs, given its ``resources`` (as last scanned, in
    the order reported) and the steps each offers (``offered``: identifier -> its plugin's
    ``devloop_steps``). Empty for a device with no resource here."""
    if not resources:
        return []
    anywhere = resources[0].identifier  # the exporter's own steps run on the device, not on a resource of it
    planned = []
    for index, step in enumerate(steps):
        if isinstance(step, ReflashStep):
            # the flash target is found by the kind it serves, whichever plugin serves it (docs/architecture.md,
            # "Steps between leases"): a third-party flash plugin's target reflashes as the built-in one's does
            target = next((r for r in resources if r.kind == FLASH_KIND), None)
            planned.append(PlannedStep(index, step, target.plugin, target.identifier, step.timeout_for()) if target
                           else PlannedStep(index, step, EXPORTER_STEPS, anywhere, step.timeout_for(),
                                            problem=f"{resources[0].device} has no flash resource here to reflash "
                                                    f"(a resource of kind {FLASH_KIND!r}: is its plugin loaded?)"))
        elif isinstance(step, PluginStepConfig):
            found = next(((r, k) for r in resources for k in offered.get(r.identifier, ()) if k.name == step.step),
                         None)
            if found is None:
                planned.append(PlannedStep(index, step, EXPORTER_STEPS, anywhere, step.timeout_for(),
                                           problem=f"no resource of {resources[0].device} offers step {step.step!r} "
                                                   "here (is its plugin loaded, and the resource found?)"))
            else:
                resource, kind = found
                planned.append(PlannedStep(index, step, resource.plugin, resource.identifier, step.timeout_for(kind),
                                           kind=kind))
        else:
            planned.append(PlannedStep(index, step, EXPORTER_STEPS, anywhere, step.timeout_for()))
    return planned


def step_kinds(answer: Any) -> list[StepKind]:
    """What ``devloop_steps`` answered, checked; ValueError says why it cannot be used."""
    kinds = list(answer or [])
    if not all(isinstance(kind, StepKind) for kind in kinds):
        raise ValueError(f"it answered {answer!r:.200}, not a list of StepKind")
    for kind in kinds:
        try:
            _WORD.validate_python(kind.name)
            for key in kind.settings:
                _ARG_NAME.validate_python(key)
        except ValidationError:
            raise ValueError(f"step {kind.name!r} or one of its settings ({', '.join(kind.settings)}) is not a "
                             "name a config can give (lowercase letters, digits, - in a step, _ in a key)") from None
        if kind.name in (*BUILT_IN_STEPS, SETTLE_KIND):
            raise ValueError(f"step {kind.name!r} is one of the exporter's own: a plugin's step needs a name of its "
                             "own")
        if _RESERVED_SETTINGS & set(kind.settings):
            raise ValueError(f"step {kind.name!r} declares {', '.join(sorted(_RESERVED_SETTINGS & set(kind.settings)))}"
                             ": every step entry has those keys already")
        if not (isinstance(kind.timeout_s, (int, float)) and 0 < kind.timeout_s <= MAX_STEP_TIMEOUT_S):
            raise ValueError(f"step {kind.name!r} has a timeout_s of {kind.timeout_s!r}, not a positive number of "
                             f"seconds up to {MAX_STEP_TIMEOUT_S}")
        if len(kind.description) > 500:
            raise ValueError(f"step {kind.name!r} has a description of more than 500 characters")
    names = [kind.name for kind in kinds]
    if len(set(names)) < len(names):
        raise ValueError(f"it declares a step twice ({', '.join(names)})")
    return kinds


def plugin_steps(offered: Mapping[str, Sequence[StepKind]]) -> list[PluginStep]:
    """Every step this exporter can run, as ``device-loop hosts`` lists them: its own, then
    those its plugins offer (``offered``: plugin -> its steps), each once."""
    listed = [PluginStep(plugin=EXPORTER_STEPS, step=name, description=model.DESCRIPTION)
              for name, model in STEP_MODELS.items()]
    seen = {(s.plugin, s.step) for s in listed}
    for plugin, kinds in offered.items():
        for kind in kinds:
            if (plugin, kind.name) not in seen:
                seen.add((plugin, kind.name))
                listed.append(PluginStep(plugin=plugin, step=kind.name, description=kind.description[:500]))
    return listed


def duration(seconds: float) -> str:
    """A timeout in words: ``1.5s``, ``45s``, ``10m``."""
    return f"{seconds:.3g}s" if seconds < 60 else format_duration(seconds)


@dataclass(frozen=True)
class StepRun:
    """An operation that is a step, as ``StepRunner.match`` found it: the steps it runs, in
    order (one; a settle's, those that settle), on the device whose ``resources`` these are."""

    want: DesiredOperation
    steps: list[PlannedStep]
    resources: list[Resource]
    settle: bool = False


class StepRunner:
    """Runs the steps of this exporter's devices: its own, and plugins' through their
    ``devloop_operate``; ``steps_of(device, device_class)`` is what the config lists."""

    def __init__(self, host: HostContext, plugins: PluginSet, steps_of: Callable[[str, str], list[StepConfig]],
                 hook_timeout_s: float = DEFAULT_TIMEOUT_S, power: PowerRunner | None = None):
        self.host, self.plugins, self.steps_of = host, plugins, steps_of
        self.power = power  # runs the power-cycle step (None: this runner has none to run it)
        self.deadlines = HookDeadlines(hook_timeout_s)  # thermal readings: a hung one stops no cooldown's clock
        self._running: dict[tuple[str, str, str], float] = {}  # a plugin step's call -> when it began
        self._lock = threading.Lock()
        self.stopping = threading.Event()

    def stop(self) -> None:
        """The exporter stops: the steps that wait (a cooldown, a reboot, a plugin's step)
        end at once as interrupted, which makes the device's steps run again from the first."""
        self.stopping.set()

    def _interrupted(self, what: str) -> OperationError:
        return Interrupted(what)

    # ---- what the exporter asks --------------------------------------------------------------

    def offered_at_start(self, plugins: Sequence[str]) -> dict[str, list[StepKind]]:
        """Every step each of ``plugins`` may offer (``devloop_steps`` with no resource): what a
        config may name. A plugin whose answer is unusable offers none (logged)."""
        offered = {}
        for name in plugins:
            if not self.plugins.implements(name, "devloop_steps"):
                continue
            try:
                offered[name] = step_kinds(self.plugins.call(name, "devloop_steps", host=self.host, resource=None))
            except Exception as exc:
                log.error("devloop_steps of plugin %s: %s; it offers no step here", name, exc)
        return offered

    def plan_for(self, device: str, resources: Sequence[Resource],
                 offered: Mapping[str, Sequence[StepKind]]) -> list[PlannedStep]:
        """Where each configured step of ``device`` runs (``resources``: the host's, as last scanned)."""
        mine = [r for r in resources if r.device == device]
        return plan(self.steps_of(device, mine[0].device_class), mine, offered) if mine else []

    def match(self, want: DesiredOperation, resources: Sequence[Resource],
              offered: Mapping[str, Sequence[StepKind]]) -> StepRun | None:
        """The steps ``want`` runs, by its purpose (docs/architecture.md, "Operations"): a
        settle's, or the step at its place; None when it is no step, or a step that is an
        operation of a kind (a reflash: a flash, its kind's handler writes it). Refused
        (``OperationError(changed=False)``, nothing touched) when it asks for a step this
        device does not have at that place."""
        if want.purpose not in (Purpose.STEP, Purpose.SETTLE):
            return None
        mine = [r for r in resources if r.device == want.device]
        if not any(r.identifier == want.identifier for r in mine):
            raise OperationError(f"{want.identifier} is not a resource of {want.device} on host {self.host.name} "
                                 "(any more)", changed=False)
        planned = self.plan_for(want.device, mine, offered)
        step = self._at(want, planned) if want.purpose == Purpose.STEP else None
        if step is not None and (step.plugin, step.identifier) != (want.plugin, want.identifier):
            raise OperationError(f"step {step.index} of {want.device} ({step.name}) runs on {step.identifier} (plugin "
                                 f"{step.plugin}) here, not on {want.identifier}", changed=False)
        if step is not None and isinstance(step.config, ReflashStep):
            return None  # a flash, asked for as one: the flash target's plugin writes it
        if want.args:
            raise OperationError(f"a {want.purpose} takes no arguments (what it does is this exporter's config), not "
                                 f"{', '.join(sorted(want.args))}", changed=False)
        if step is None:
            return StepRun(want, [p for p in planned if p.config.settles], mine, settle=True)
        return StepRun(want, [step], mine)

    @staticmethod
    def _at(want: DesiredOperation, planned: list[PlannedStep]) -> PlannedStep:
        """The step at the place ``want`` names, checked against the device's steps."""
        index = want.step
        assert index is not None  # (the protocol gives every step its place)
        if not index < len(planned):
            raise OperationError(f"{want.device} has {len(planned)} step(s) here: there is no step {index}",
                                 changed=False)
        step = planned[index]
        if step.operation_kind != want.kind:
            raise OperationError(f"step {index} of {want.device} is {step.name!r} here, not {want.kind!r} "
                                 "(was the exporter's config changed?)", changed=False)
        return step

    # ---- running them --------------------------------------------------------------------------

    def run(self, run: StepRun, progress: Progress) -> str | dict | None:
        """Run the steps of ``run`` in order; what the last said (a sentence, or a plugin's
        answer), or raise ``OperationError`` with why one failed."""
        if run.settle:
            if not run.steps:
                return "nothing to settle"
            said = [self._message(self._one(run, step, progress)) for step in run.steps]
            return "; ".join(f"{step.name}: {message}" for step, message in zip(run.steps, said))
        return self._one(run, run.steps[0], progress)

    def _one(self, run: StepRun, step: PlannedStep, progress: Progress) -> str | dict | None:
        if step.problem:
            raise OperationError(step.problem, changed=False)
        runner = RUNNERS.get(type(step.config))
        if runner is not None:
            return runner(self, run.want.device, run.resources, step.config, step.timeout_s, progress)
        if isinstance(step.config, PluginStepConfig) and step.plugin != EXPORTER_STEPS:
            return self._plugin_step(run, step, progress)
        raise OperationError(f"the exporter does not run {step.name!r} itself", changed=False)

    @staticmethod
    def _message(said: Any) -> str:
        if isinstance(said, dict):
            said = said.get("message")
        return said if isinstance(said, str) and said else "done"

    # ---- cooldown ------------------------------------------------------------------------------

    def readings(self, resources: Sequence[Resource]) -> tuple[dict[str, float], list[str]]:
        """The temperatures of a device (zone -> °C, the union of its resources'
        ``devloop_thermal``, each call within the hook deadline), and what went wrong asking."""
        asked = [r for r in resources if self.plugins.implements(r.plugin, "devloop_thermal")]

        def key(r: Resource) -> tuple:
            return "devloop_thermal", r.plugin, r.identifier
        outcomes = self.deadlines.run({key(r): functools.partial(
            self.plugins.call, r.plugin, "devloop_thermal", host=self.host, resource=r) for r in asked})
        zones: dict[str, float] = {}
        problems = []
        for r in asked:
            try:
                answer = outcomes[key(r)].result()
            except HookTimedOut as exc:
                problems.append(f"{r.plugin}'s thermal reading {exc}")
                continue
            except Exception as exc:
                problems.append(f"{r.plugin}'s thermal reading failed: {exc!r}")
                continue
            if answer is None:
                continue
            if not (isinstance(answer, dict) and all(isinstance(z, str) and isinstance(t, (int, float))
                                                     and not isinstance(t, bool) and math.isfinite(t)
                                                     for z, t in answer.items())):
                problems.append(f"{r.plugin}'s devloop_thermal answered {answer!r:.100}, not zone -> °C")
                continue
            for zone, degrees in answer.items():
                zones[zone if zone not in zones else f"{zone} ({r.plugin})"] = float(degrees)
        return zones, problems

    def _cooldown(self, device: str, resources: Sequence[Resource], config: CooldownStep, timeout_s: float,
                  progress: Progress) -> str:
        below = config.below
        began = time.monotonic()
        deadline = began + timeout_s
        while True:
            zones, problems = self.readings(resources)
            if not zones and not problems:
                raise OperationError(f"no thermal zone to read on {device} (no plugin of its resources reports one)",
                                     changed=False)
            hottest = max(zones.items(), key=lambda item: item[1]) if zones else None
            if hottest is not None and hottest[1] < below:
                waited = time.monotonic() - began
                shown = math.floor(hottest[1] * 10) / 10  # (44.96 is below 45: not "45.0")
                return (f"cool: {shown:.1f} °C ({hottest[0]}) is below {below:g} °C"
                        + (f", after {duration(waited)}" if waited >= 1 else ""))
            if hottest is not None:
                where = f"{hottest[1]:.1f} °C ({hottest[0]})"
                progress(config.kind(), detail=f"cooling down: {where}, waiting for < {below:g} °C")
            else:
                where = "unread"
                progress(config.kind(), detail=f"cooling down: no reading yet ({problems[0]})"[:MAX_DETAIL_CHARS])
            now = time.monotonic()
            if now >= deadline:
                if hottest is None:
                    raise OperationError(f"no thermal reading of {device} in {duration(timeout_s)}: "
                                         + "; ".join(problems))
                raise OperationError(f"still {where} after {duration(timeout_s)} (threshold {below:g} °C)")
            if self.stopping.wait(min(POLL_S, deadline - now)):
                raise self._interrupted("cooling down")

    # ---- command -------------------------------------------------------------------------------

    def _command(self, device: str, resources: Sequence[Resource], config: CommandStep, timeout_s: float,
                 progress: Progress) -> str:
        argv = config.argv(device)
        progress(config.kind(), detail=f"running {shlex.join(argv)}"[:MAX_DETAIL_CHARS])
        try:
            code, output = self.host.run_to_end(argv, name=f"step-{device}", timeout=timeout_s)
        except OSError as exc:
            raise OperationError(f"cannot run {argv[0]}: {exc.strerror or exc}", changed=False) from None
        last = last_lines(output)
        said = f"; it said: {last}" if last else ""
        if code is None:
            raise OperationError(f"{argv[0]} did not finish within {duration(timeout_s)}; killed it and all it "
                                 f"started{said}")
        if code != 0:
            raise OperationError(f"{argv[0]} failed (exit status {code}){said}")
        return f"{argv[0]} ran (exit status 0)" + (f": {last}" if last else "")

    # ---- reboot through the console -----------------------------------------------------------------

    def _reboot(self, device: str, resources: Sequence[Resource], config: RebootStep, timeout_s: float,
                progress: Progress) -> dict:
        console = next((r for r in resources if r.kind in CONSOLE_KINDS and r.node), None)
        if console is None or console.node is None:
            raise OperationError(f"{device} has no console to reboot it through (a {' or '.join(CONSOLE_KINDS)} "
                                 "resource with a device node)", changed=False)
        baud = getattr(console.config, "baud", None)
        baud = baud if isinstance(baud, int) and not isinstance(baud, bool) and baud > 0 else DEFAULT_BAUD
        prompt = re.compile(config.prompt)
        try:
            port = serial.Serial(console.node, baud, timeout=0.1, exclusive=True)
        except (serial.SerialException, OSError, ValueError) as exc:
            raise OperationError(f"cannot open {device}'s console {console.node}: {exc}", changed=False) from None
        began = time.monotonic()
        deadline, shown = began + timeout_s, 0.0
        text, quiet_since = "", None
        with port:
            try:
                port.write(INTERRUPT)  # not glued to what the last holder left typed
                port.flush()
                time.sleep(QUIET_S)
                port.reset_input_buffer()
                port.write((config.command + config.line_ending).encode())
                progress(config.kind(), detail=f"rebooting: sent {config.command!r} on {console.node}")
                while True:
                    now = time.monotonic()
                    if self.stopping.is_set():
                        raise self._interrupted("rebooting")
                    if now >= deadline:
                        raise OperationError(f"no prompt matching {config.prompt!r} on {console.node} within "
                                             f"{duration(timeout_s)} of sending {config.command!r}"
                                             + (f"; it last said: {last_lines(text, 2, 160)!r}" if text.strip() else
                                                "; it said nothing"))
                    data = port.read(4096)
                    if data:
                        text = (text + data.decode(errors="replace").replace("\r", ""))[-MAX_CONSOLE_CHARS:]
                        quiet_since = now if _booted(text, prompt) else None
                    elif quiet_since is not None and now - quiet_since >= QUIET_S:
                        return {"message": f"rebooted through {console.node}: its prompt came after "
                                           f"{duration(now - began)}", "console": text[-CONSOLE_RESULT_CHARS:]}
                    if now - shown >= 1.0 and text.strip():
                        shown = now
                        progress(config.kind(), detail=f"rebooting: {last_lines(text, 1, 160)!r}"[:MAX_DETAIL_CHARS])
            except (serial.SerialException, OSError) as exc:
                raise OperationError(f"{device}'s console {console.node} failed: {exc}") from None

    # ---- power-cycle ------------------------------------------------------------------------------

    def _power_cycle(self, device: str, resources: Sequence[Resource], config: PowerCycleStep, timeout_s: float,
                     progress: Progress) -> dict:
        switch = PowerRunner.switch_of(resources)
        if switch is None or self.power is None:
            raise OperationError(f"{device} has no power switch here (a resource of kind power: is its plugin "
                                 "loaded?)", changed=False)
        result = self.power.cycle(switch, resources, config.off_time, progress, within_s=timeout_s)
        if result.get("verdict") != PowerVerdict.VERIFIED and config.verify:
            raise OperationError(f"the power cycle was not verified: {result.get('message')} (verify = false "
                                 "accepts that)")
        return result

    # ---- a plugin's step -----------------------------------------------------------------------

    def _plugin_step(self, run: StepRun, step: PlannedStep, progress: Progress) -> Any:
        resource = next((r for r in run.resources if r.identifier == step.identifier), None)
        if resource is None or not self.plugins.implements(step.plugin, "devloop_operate"):
            raise OperationError(f"plugin {step.plugin!r} cannot run step {step.name!r} on {step.identifier} here (it "
                                 "is not loaded, or has no devloop_operate hook)", changed=False)
        assert isinstance(step.config, PluginStepConfig)
        want = run.want
        op = Operation(id=want.op, kind=step.name, device=want.device, requester=want.requester,
                       args={**step.config.settings, "timeout_s": step.timeout_s}, purpose=want.purpose,
                       report_progress=progress)
        key = (step.plugin, step.identifier, step.name)
        with self._lock:
            if key in self._running:
                raise OperationError(f"the last {step.name} of {step.identifier} has not returned yet (it began "
                                     f"{duration(time.monotonic() - self._running[key])} ago)", changed=False)
            self._running[key] = time.monotonic()
        ended = threading.Event()
        outcome: dict[str, Any] = {}

        def call() -> None:
            try:
                outcome["said"] = self.plugins.call(step.plugin, "devloop_operate", host=self.host, resource=resource,
                                                    op=op)
            except BaseException as exc:  # (handed to the operation's thread, which says what it was)
                outcome["error"] = exc
            finally:
                with self._lock:
                    self._running.pop(key, None)
                ended.set()
        threading.Thread(target=call, name=f"step-{step.name}-{want.device}", daemon=True).start()
        deadline = time.monotonic() + step.timeout_s
        while not ended.wait(min(POLL_S, max(0.0, deadline - time.monotonic()))) and time.monotonic() < deadline:
            if self.stopping.is_set():
                raise self._interrupted(f"running {step.name}")
        if not ended.is_set():
            log.warning("step %s of %s has not returned after %s; left to run", step.name, want.device,
                        duration(step.timeout_s))
            raise OperationError(f"timed out after {duration(step.timeout_s)}")
        if isinstance(outcome.get("error"), Interrupted):  # (a plugin's, which no plugin's words make ours)
            raise OperationError(str(outcome["error"]))
        if "error" in outcome:
            raise outcome["error"]
        return outcome.get("said")


#: Who runs each of the exporter's own steps (its model, ``config.STEP_MODELS``, is the rest of its entry); a
#: reflash has none here: the coordinator asks for it as a flash, which the flash target's plugin writes.
RUNNERS: dict[type[StepConfig], Callable[..., Any]] = {
    CooldownStep: StepRunner._cooldown, CommandStep: StepRunner._command, RebootStep: StepRunner._reboot,
    PowerCycleStep: StepRunner._power_cycle}


def _booted(text: str, prompt: re.Pattern) -> bool:
    """Whether what a console printed since a reboot was sent (its first line: the command's
    echo) ends with its prompt after a boot's lines: a shell that prints a prompt before it
    goes down (busybox does), or one that refused the command ("reboot: not found"), has
    not rebooted."""
    lines = text.split("\n")
    booting = [line for line in lines[1:-1] if line.strip()]
    return len(booting) >= BOOT_LINES and prompt.search(lines[-1]) is not None


