"""The steps between leases, run by the exporter's one executor for operations as the
coordinator asks for them ({"step": INDEX}, or a settle), on a real simulated board (its pty
console, its thermal model) in an in-process exporter, with no coordinator: what each step
does, how it fails, and what the report says of them."""
import dataclasses
import os
import threading
import time

import pytest
import serial
from pydantic import ValidationError

from device_loop.core.hookspecs import hookimpl
from device_loop.core import FLASH_KIND
from device_loop.core.model import OperationError, OperationKind, StepKind
from device_loop.core.ports import free_port
from device_loop.core.protocol import EXPORTER_STEPS, DesiredOperation
from device_loop.exporter.config import parse_config
from device_loop.exporter.daemon import Exporter
from conftest import WAIT_S, wait_for
from exporter_testkit import converge

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]

BOARD = {"plugin": "sim", "ambient": "30C", "tau": "1s"}  # a board that cools fast: tests wait for conditions


class Bench:
    """A plugin whose resource offers steps: ``relay-cycle`` notes what it was handed, ``hang``
    never returns until the test lets it."""

    def __init__(self):
        self.handed: list = []
        self.release = threading.Event()

    @hookimpl
    def devloop_discover(self, host):
        return [dataclasses.replace(e.resource("bench", f"bench:{e.device}"), serves_lease=False)
                for e in host.entries]

    @hookimpl
    def devloop_steps(self, host, resource):
        return [StepKind("relay-cycle", "switch the outlet off and on",
                         settings={"outlet": "which outlet", "off_s": "how long it stays off"}, timeout_s=30),
                StepKind("hang", "never end", timeout_s=3600)]

    @hookimpl
    def devloop_operate(self, host, resource, op):
        self.handed.append((op.kind, resource.identifier, dict(op.args), op.requester))
        if op.kind == "hang":
            self.release.wait(30)
            return "released"
        if op.args.get("outlet") == 0:
            raise OperationError("outlet 0 does not answer")
        if op.args.get("outlet") == 13:  # a plugin's words, like the exporter's own
            raise OperationError("interrupted while cycling: the exporter stopped")
        op.progress("cycling", 1, 2, "steps", detail="outlet off")
        return {"message": f"cycled outlet {op.args['outlet']}", "outlet": op.args["outlet"]}


class AcmeWriter:
    """A third-party flash plugin (not named flash): its resource is of kind flash."""

    @hookimpl
    def devloop_discover(self, host):
        return [dataclasses.replace(e.resource(FLASH_KIND, f"acme:{e.device}"), serves_lease=False)
                for e in host.entries if e.plugin == "acme-writer"]

    @hookimpl
    def devloop_operations(self, host, resource):
        return [OperationKind(FLASH_KIND, "write an image", destructive=True)]

    @hookimpl
    def devloop_operate(self, host, resource, op):
        return f"wrote {op.image.name if op.image else 'nothing'}"


@pytest.fixture
def lab(tmp_path):
    """``lab(devices)``: an in-process exporter on them (its plugins loaded, the bench among them);
    the test's simulated boards, its bench, and what each operation ended as."""
    made = []

    def make(devices):
        config = parse_config({"exporter": {"name": "host-a", "state_dir": str(tmp_path / "state"), "cdi_dir": str(tmp_path / "cdi"),
                                            "coordinator": f"http://127.0.0.1:{free_port()}"},
                               "devices": devices})
        exporter = Exporter(config)
        bench = Bench()
        exporter.plugins.pm.register(bench, name="bench")
        exporter.plugins.pm.register(AcmeWriter(), name="acme-writer")
        exporter.setup()
        exporter.bench = bench
        made.append(exporter)
        return exporter

    yield make
    for exporter in made:
        exporter.bench.release.set()
        if not getattr(exporter, "shut_down", False):
            exporter.shutdown()


def board_of(exporter, device="b0"):
    return exporter.plugins.pm.get_plugin("sim").boards[device]


def steps_reported(exporter, device="b0"):
    return next(d for d in exporter.report(scan=True).devices if d.name == device).steps


def begin(exporter, op: str, kind: str, device="b0", args=None, plugin=EXPORTER_STEPS, identifier=None,
          purpose="step", step=0):
    """Ask for an operation as the coordinator does: in a desired state, after a scan."""
    if identifier is None:
        identifier = next(r.identifier for r in exporter.reporter.scan(set()) if r.device == device)
    converge(exporter, {"operations": [{"op": op, "kind": kind, "device": device, "identifier": identifier,
                                        "plugin": plugin, "requester": "coordinator", "args": args or {},
                                        "purpose": purpose, "step": step if purpose == "step" else None}]})


def report_of(exporter, op: str):
    return next((r for r in exporter.operations.reports() if r.op == op), None)


def ended(exporter, op: str, timeout=WAIT_S):
    return wait_for(lambda: (r := report_of(exporter, op)) and r.state != "running" and r, timeout,
                    what=f"{op} to end")


def heat(exporter, above: float, device="b0"):
    board = board_of(exporter, device)
    board.thermal.stress(2)
    wait_for(lambda: board.thermal.read() > above, what=f"the board to pass {above} °C")


# ---- what is reported --------------------------------------------------------------------------

def test_the_report_lists_each_device_s_steps_where_they_run(lab, tmp_path):
    exporter = lab([{"name": "b0", "resources": [BOARD, {"plugin": "bench"},
                                                 {"plugin": "flash", "target": str(tmp_path / "b0.img")}],
                     "steps": [{"step": "cooldown", "below": "33C"}, {"step": "reflash"},
                               {"step": "relay-cycle", "outlet": 3, "timeout": "1m"}, {"step": "reboot"}]},
                    {"name": "b1", "class": "board", "resources": [BOARD]}])
    cooldown, reflash, cycle, reboot = steps_reported(exporter)
    resources = {r.plugin: r.identifier for r in exporter.reporter.resources if r.device == "b0"}
    first = next(r.identifier for r in exporter.reporter.resources if r.device == "b0")
    assert (cooldown.step, cooldown.plugin, cooldown.identifier, cooldown.timeout_s, cooldown.settle) == (
        "cooldown", EXPORTER_STEPS, first, 600.0, True)
    assert (reflash.plugin, reflash.identifier, reflash.timeout_s, reflash.settle) == (
        "flash", resources["flash"], 1800.0, False), "a reflash is the flash resource's: the coordinator flashes"
    assert (cycle.plugin, cycle.identifier, cycle.timeout_s) == ("bench", resources["bench"], 60.0)
    assert (reboot.plugin, reboot.timeout_s, reboot.settle) == (EXPORTER_STEPS, 300.0, False)
    assert steps_reported(exporter, "b1") == []
    listed = {(s.plugin, s.step) for s in exporter.report().plugins.steps}
    assert {(EXPORTER_STEPS, "cooldown"), (EXPORTER_STEPS, "command"), (EXPORTER_STEPS, "reboot"),
            (EXPORTER_STEPS, "reflash"), ("bench", "relay-cycle"), ("bench", "hang"), ("adb", "wait-boot")} <= listed


# ---- cooldown --------------------------------------------------------------------------------------

def test_a_cooldown_waits_until_the_board_is_below_its_threshold_saying_how_hot_it_is(lab):
    exporter = lab([{"name": "b0", "resources": [BOARD], "steps": [{"step": "cooldown", "below": "33C"}]}])
    heat(exporter, 45)
    begin(exporter, "op-cool", "cooldown")
    running = wait_for(lambda: (r := report_of(exporter, "op-cool")) and r.progress.detail and r,
                       what="the cooldown's progress")
    assert running.state == "running" and running.phase == "cooldown"
    assert running.progress.detail.startswith("cooling down: ") and "°C (cpu), waiting for < 33 °C" in \
        running.progress.detail, running.progress.detail
    done = ended(exporter, "op-cool")
    assert done.state == "done" and done.message.startswith("cool: ") and "below 33 °C" in done.message, done
    assert board_of(exporter).thermal.read() < 33


def test_a_cooldown_past_its_timeout_fails_with_the_last_reading(lab):
    exporter = lab([{"name": "b0", "resources": [BOARD],
                     "steps": [{"step": "cooldown", "below": 20, "timeout": "2s"}]}])
    begin(exporter, "op-cool", "cooldown")
    failed = ended(exporter, "op-cool")
    assert failed.state == "failed", failed
    assert failed.message.startswith("still 3") and failed.message.endswith(
        " °C (cpu) after 2s (threshold 20 °C)"), failed.message


def test_a_cooldown_of_a_device_nothing_measures_fails_at_once(lab):
    exporter = lab([{"name": "b0", "resources": [{"plugin": "bench"}],
                     "steps": [{"step": "cooldown", "below": 40}]}])
    begin(exporter, "op-cool", "cooldown")
    failed = ended(exporter, "op-cool")
    assert (failed.state, failed.message) == (
        "failed", "no thermal zone to read on b0 (no plugin of its resources reports one)")
    assert not failed.changed


# ---- reboot --------------------------------------------------------------------------------------

def test_a_reboot_goes_through_the_console_and_waits_for_the_prompt_after_the_banner(lab):
    exporter = lab([{"name": "b0", "resources": [BOARD], "steps": [{"step": "reboot", "timeout": "20s"}]}])
    board = board_of(exporter)
    with serial.Serial(str(board.link), 115200, timeout=0.1) as port:  # a half-typed line, left by the last lease
        port.write(b"ech")
    begin(exporter, "op-reboot", "reboot")
    done = ended(exporter, "op-reboot")
    # (the console's node is the board's stable link, not the pty of the moment)
    assert done.state == "done" and done.message.startswith(f"rebooted through {board.link}"), done
    console = done.result["console"]
    assert "Rebooting..." in console and "device-loop simulated board b0" in console, console
    assert console.endswith("b0:~# "), "done once the prompt ended what the console said"


def test_a_reboot_whose_prompt_never_comes_fails_with_what_the_console_said(lab):
    exporter = lab([{"name": "b0", "resources": [BOARD],
                     "steps": [{"step": "reboot", "prompt": "login: $", "timeout": "2s"}]}])
    begin(exporter, "op-reboot", "reboot")
    failed = ended(exporter, "op-reboot")
    assert failed.state == "failed" and "no prompt matching 'login: $'" in failed.message, failed.message
    assert "within 2s of sending 'reboot'; it last said: 'Linux b0 6.1.0-sim riscv64 / b0:~#'" in failed.message, \
        failed.message


def test_a_reboot_the_console_refuses_is_no_reboot(lab):
    exporter = lab([{"name": "b0", "resources": [BOARD],
                     "steps": [{"step": "reboot", "command": "restart", "timeout": "2s"}]}])
    begin(exporter, "op-reboot", "reboot")
    failed = ended(exporter, "op-reboot")
    assert failed.state == "failed", "one line of error and a prompt are not a boot"
    assert "it last said: 'sh: restart: not found / b0:~#'" in failed.message, failed.message


def test_a_reboot_of_a_device_without_a_console_fails_before_touching_it(lab):
    exporter = lab([{"name": "b0", "resources": [{"plugin": "bench"}], "steps": [{"step": "reboot"}]}])
    begin(exporter, "op-reboot", "reboot")
    failed = ended(exporter, "op-reboot")
    assert failed.state == "failed" and "b0 has no console to reboot it through" in failed.message
    assert not failed.changed


# ---- command ---------------------------------------------------------------------------------------

def test_a_command_that_exits_3_fails_with_its_status_and_what_it_said(lab):
    exporter = lab([{"name": "b0", "resources": [BOARD],
                     "steps": [{"step": "command", "command": ["sh", "-c", "echo resetting {device}; exit 3"]}]}])
    begin(exporter, "op-cmd", "command")
    failed = ended(exporter, "op-cmd")
    assert (failed.state, failed.message) == ("failed", "sh failed (exit status 3); it said: resetting b0")


def test_a_command_that_succeeds_is_done(lab, tmp_path):
    mark = tmp_path / "ran"
    exporter = lab([{"name": "b0", "resources": [BOARD], "steps": [{"step": "command",
                                                                    "command": f"touch '{mark}'"}]}])
    begin(exporter, "op-cmd", "command")
    done = ended(exporter, "op-cmd")
    assert (done.state, done.message) == ("done", "touch ran (exit status 0)") and mark.exists()


def test_a_command_that_hangs_is_killed_at_its_timeout_with_all_it_started(lab, tmp_path):
    pids = tmp_path / "pids"
    exporter = lab([{"name": "b0", "resources": [BOARD], "steps": [{
        "step": "command", "timeout": "1s",
        "command": ["sh", "-c", f"sleep 60 & echo $$ $! > {pids}; echo started; wait"]}]}])
    begin(exporter, "op-cmd", "command")
    failed = ended(exporter, "op-cmd")
    assert failed.state == "failed", failed
    assert failed.message == "sh did not finish within 1s; killed it and all it started; it said: started"
    for pid in map(int, pids.read_text().split()):
        assert not os.path.exists(f"/proc/{pid}") or "Z" in open(f"/proc/{pid}/stat").read().split(")")[1][:3], \
            f"pid {pid} outlived the step"


def test_a_third_party_flash_plugin_s_target_serves_the_reflash_step(lab):
    exporter = lab([{"name": "b0", "resources": [BOARD, {"plugin": "acme-writer"}], "steps": [{"step": "reflash"}]}])
    (reflash,) = steps_reported(exporter)
    assert (reflash.step, reflash.plugin, reflash.identifier) == ("reflash", "acme-writer", "acme:b0"), \
        "found by the kind it serves, not by the plugin's name"


# ---- a plugin's step --------------------------------------------------------------------------------

def test_a_plugin_step_is_handed_to_its_devloop_operate_with_the_config_s_settings(lab):
    exporter = lab([{"name": "b0", "resources": [BOARD, {"plugin": "bench"}],
                     "steps": [{"step": "cooldown", "below": 90},
                               {"step": "relay-cycle", "outlet": 3, "off_s": 2.5, "timeout": "45s"}]}])
    step = steps_reported(exporter)[1]
    begin(exporter, "op-cycle", "relay-cycle", step=1, plugin=step.plugin, identifier=step.identifier)
    done = ended(exporter, "op-cycle")
    assert (done.state, done.message, done.result) == ("done", "cycled outlet 3", {"outlet": 3})
    assert done.progress.detail == "outlet off"
    assert exporter.bench.handed == [("relay-cycle", "bench:b0", {"outlet": 3, "off_s": 2.5, "timeout_s": 45.0},
                                      "coordinator")]


def test_a_plugin_step_past_its_timeout_fails_and_its_thread_is_left(lab):
    exporter = lab([{"name": "b0", "resources": [{"plugin": "bench"}], "steps": [{"step": "hang", "timeout": "1s"}]}])
    (step,) = steps_reported(exporter)
    begin(exporter, "op-hang", "hang", plugin=step.plugin, identifier=step.identifier)
    failed = ended(exporter, "op-hang")
    assert (failed.state, failed.message) == ("failed", "timed out after 1s")
    begin(exporter, "op-hang-again", "hang", plugin=step.plugin, identifier=step.identifier)
    again = ended(exporter, "op-hang-again")
    assert again.state == "failed" and "the last hang of bench:b0 has not returned yet" in again.message
    assert not again.changed
    exporter.bench.release.set()
    assert [kind for kind, *_ in exporter.bench.handed] == ["hang"], "never two calls of one step at once"


def test_a_plugin_operation_whose_args_are_not_a_step_goes_to_the_plugin_as_ever(lab):
    exporter = lab([{"name": "b0", "resources": [{"plugin": "bench"}],
                     "steps": [{"step": "relay-cycle", "outlet": 0}]}])
    (step,) = steps_reported(exporter)
    begin(exporter, "op-cycle", "relay-cycle", plugin=step.plugin, identifier=step.identifier)
    failed = ended(exporter, "op-cycle")
    assert (failed.state, failed.message) == ("failed", "outlet 0 does not answer"), "a plugin's failure, as said"


# ---- settle ------------------------------------------------------------------------------------------

def test_a_settle_runs_only_the_steps_that_settle_in_order(lab, tmp_path):
    exporter = lab([{"name": "b0", "resources": [BOARD], "steps": [
        {"step": "command", "command": ["touch", str(tmp_path / "not-settled")]},
        {"step": "cooldown", "below": "33C"},
        {"step": "command", "command": ["touch", str(tmp_path / "settled")], "settle": True},
        {"step": "cooldown", "below": "90C", "settle": False}]},
        {"name": "b1", "resources": [BOARD], "steps": [{"step": "reboot"}]}])
    assert [s.settle for s in steps_reported(exporter)] == [False, True, True, False]
    heat(exporter, 40)
    begin(exporter, "op-settle", "settle", purpose="settle")
    done = ended(exporter, "op-settle")
    assert done.state == "done" and done.message.startswith("cooldown: cool: "), done.message
    assert done.message.endswith("; command: touch ran (exit status 0)"), done.message
    assert (tmp_path / "settled").exists() and not (tmp_path / "not-settled").exists()
    begin(exporter, "op-settle-b1", "settle", device="b1", purpose="settle")
    assert (ended(exporter, "op-settle-b1").state, ended(exporter, "op-settle-b1").message) == (
        "done", "nothing to settle")


# ---- what is refused before anything is touched ---------------------------------------------------------

@pytest.mark.parametrize("kind, purpose, step, args, complaint", [
    ("cooldown", "step", 1, {}, "b0 has 1 step(s) here: there is no step 1"),
    ("cooldown", "step", 0, {"below": 20}, "a step takes no arguments"),
    ("reboot", "step", 0, {}, "step 0 of b0 is 'cooldown' here, not 'reboot'"),
    ("settle", "settle", None, {"step": 0}, "a settle takes no arguments"),
])
def test_a_step_the_device_does_not_have_there_is_refused_untouched(lab, kind, purpose, step, args, complaint):
    exporter = lab([{"name": "b0", "resources": [BOARD], "steps": [{"step": "cooldown", "below": 90}]}])
    begin(exporter, "op-x", kind, args=args, purpose=purpose, step=step)
    failed = ended(exporter, "op-x")
    assert failed.state == "failed" and complaint in failed.message, failed.message
    assert not failed.changed
    assert not (exporter.host.state_dir / "operations" / "op-x.json").exists(), "no marker: nothing was begun"


def test_an_operation_is_a_step_by_its_purpose_never_by_an_argument_called_step(lab):
    """(docs/architecture.md, "Operations"): the protocol says why an operation runs; a
    plugin's operation with an argument called step is the plugin's, and a step has its place."""
    exporter = lab([{"name": "b0", "resources": [{"plugin": "bench"}], "steps": [{"step": "relay-cycle"}]}])
    mine = exporter.reporter.scan(set())
    asked = {"op": "op-1", "kind": "relay-cycle", "device": "b0", "identifier": "bench:b0", "plugin": "bench",
             "requester": "ann"}
    offered = {"bench:b0": exporter.bench.devloop_steps(exporter.host, None)}
    plain = DesiredOperation.model_validate({**asked, "args": {"step": 0}})
    assert plain.purpose == "lease" and exporter.step_runner.match(plain, mine, offered) is None
    step = DesiredOperation.model_validate({**asked, "purpose": "step", "step": 0})
    assert exporter.step_runner.match(step, mine, offered).steps[0].name == "relay-cycle"
    for wrong in ({"purpose": "step"}, {"step": 0}, {"purpose": "settle", "step": 0}):
        with pytest.raises(ValidationError, match="exactly when its purpose is step"):
            DesiredOperation.model_validate({**asked, **wrong})


def test_a_step_on_a_resource_of_another_device_is_refused(lab):
    exporter = lab([{"name": "b0", "resources": [BOARD], "steps": [{"step": "cooldown", "below": 90}]},
                    {"name": "b1", "resources": [BOARD]}])
    other = next(r.identifier for r in exporter.reporter.scan(set()) if r.device == "b1")
    begin(exporter, "op-x", "cooldown", identifier=other)
    failed = ended(exporter, "op-x")
    assert failed.state == "failed" and f"{other} is not a resource of b0" in failed.message


def test_a_stopping_exporter_interrupts_a_waiting_step_so_the_steps_run_again(lab):
    timeout_s = 60
    exporter = lab([{"name": "b0", "resources": [BOARD],
                     "steps": [{"step": "cooldown", "below": 20, "timeout": f"{timeout_s}s"}]}])
    begin(exporter, "op-cool", "cooldown")
    wait_for(lambda: (r := report_of(exporter, "op-cool")) and r.progress.detail, what="the cooldown to wait")
    began = time.monotonic()
    exporter.shutdown()
    exporter.shut_down = True
    assert time.monotonic() - began < timeout_s / 6, "a stop does not wait out a cooldown"
    failed = report_of(exporter, "op-cool")
    assert (failed.state, failed.message) == ("failed", "interrupted while cooling down: the exporter stopped")
    assert failed.interrupted, "the report says so: the coordinator never reads the words for it"
    assert failed.changed, "marked: its result reaches the coordinator after a restart too"


def test_a_plugin_s_error_that_reads_like_an_interruption_is_its_step_s_failure(lab):
    exporter = lab([{"name": "b0", "resources": [{"plugin": "bench"}],
                     "steps": [{"step": "relay-cycle", "outlet": 13}]}])
    (step,) = steps_reported(exporter)
    begin(exporter, "op-cycle", "relay-cycle", plugin=step.plugin, identifier=step.identifier)
    failed = ended(exporter, "op-cycle")
    assert (failed.state, failed.message) == ("failed", "interrupted while cycling: the exporter stopped")
    assert not failed.interrupted, "(docs/architecture.md, \"Operations\"): only the exporter's stop interrupts"
