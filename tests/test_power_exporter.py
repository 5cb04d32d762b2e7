"""Power operations in an in-process exporter (docs/architecture.md, "Power"), with a backend
written as a third party writes one: a plugin whose resource is of kind power and that
implements devloop_power. One that never returns, one that answers junk, one that says the
wrong state: the exporter bounds each and says so."""
import dataclasses
import threading
import time

import pytest

from conftest import WAIT_S, wait_for
from device_loop.plugin import POWER_KIND, Duration, PluginConfig, PowerReading, hookimpl
from device_loop.exporter.config import parse_config
from device_loop.exporter.daemon import Exporter
from device_loop.exporter.power import BACKSTOP_S
from device_loop.core.ports import free_port
from exporter_testkit import converge

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]


class RelayConfig(PluginConfig):
    timeout: Duration = 1.0  # (read by the exporter from resource.config, as the built-in backends give it)


class Relay:
    """A relay board's plugin: ``answer`` says how devloop_power answers."""

    @hookimpl
    def devloop_config_model(self):
        return RelayConfig

    def __init__(self):
        self.answer = "ok"
        self.release = threading.Event()
        self.asked: list[str] = []

    @hookimpl
    def devloop_discover(self, host):
        return [dataclasses.replace(e.resource(POWER_KIND, f"relay:{e.device}"), serves_lease=False)
                for e in host.entries]

    @hookimpl
    def devloop_power(self, host, resource, action):
        self.asked.append(action)
        if self.answer == "hang":
            self.release.wait(60)
        if self.answer == "junk":
            return {"state": "on"}
        if self.answer == "wrong":
            return PowerReading("on", "relay 3 closed")
        return PowerReading("off" if action == "off" else "on", f"relay {action}")


@pytest.fixture
def exporter(tmp_path):
    config = parse_config({"exporter": {"name": "host-a", "state_dir": str(tmp_path / "state"), "cdi_dir": str(tmp_path / "cdi"),
                                        "coordinator": f"http://127.0.0.1:{free_port()}"},
                           "devices": [{"name": "b0", "resources": [{"plugin": "relay"}]}]})
    made = Exporter(config)
    relay = Relay()
    made.plugins.pm.register(relay, name="relay")
    made.setup()
    made.relay = relay
    yield made
    relay.release.set()
    made.shutdown()


def power(exporter, op: str, **args) -> None:
    converge(exporter, {"operations": [{"op": op, "kind": "power", "device": "b0", "identifier": "relay:b0",
                                        "plugin": "relay", "requester": "alice", "args": args}]})


def ended(exporter, op: str, timeout=WAIT_S):
    def report():
        found = next((r for r in exporter.operations.reports() if r.op == op), None)
        return found if found is not None and found.state != "running" else None
    return wait_for(report, timeout, what=f"{op} to end")


def test_the_exporter_declares_power_for_a_third_party_switch_and_its_read_back_verifies(exporter):
    [device] = exporter.report(scan=True).devices
    [switch] = device.resources
    assert [k.kind for k in switch.operations] == ["power"] and switch.kind == POWER_KIND
    power(exporter, "op-off", action="off")
    done = ended(exporter, "op-off")
    assert done.state == "done" and done.result["verdict"] == "verified", done
    assert "no console" in done.result["console"] and done.result["state_after_off"] == "off"
    power(exporter, "op-status", action="status")
    assert ended(exporter, "op-status").result["state"] == "on"


def test_a_backend_that_never_returns_fails_the_operation_and_the_next_call_is_refused(exporter):
    exporter.relay.answer = "hang"
    began = time.monotonic()
    power(exporter, "op-hang", action="on")
    failed = ended(exporter, "op-hang", timeout=1 + BACKSTOP_S + 10)
    assert failed.state == "failed" and "did not answer on within 6 s (its timeout is 1 s)" in failed.message, failed
    assert time.monotonic() - began < 2 * (1 + BACKSTOP_S)
    power(exporter, "op-again", action="off")  # the hung call has not returned: one at a time
    again = ended(exporter, "op-again")
    assert again.state == "failed" and "has not returned yet" in again.message, again


def test_junk_and_a_contradicting_read_back_fail_with_what_was_said(exporter):
    exporter.relay.answer = "junk"
    power(exporter, "op-junk", action="on")
    junk = ended(exporter, "op-junk")
    assert junk.state == "failed" and "answered dict, not a PowerReading" in junk.message
    exporter.relay.answer = "wrong"
    power(exporter, "op-wrong", action="off")
    wrong = ended(exporter, "op-wrong")
    assert wrong.state == "failed" and "the switch reads on after it was switched off" in wrong.message
    power(exporter, "op-bad", action="off", off_time_s=3)
    assert "off_time_s goes with a cycle" in ended(exporter, "op-bad").message
