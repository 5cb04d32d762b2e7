"""A misbehaving plugin cannot take the exporter down, leak processes, or drop leases."""
import dataclasses
import os
import sys

import pytest

from device_loop.core.hookspecs import hookimpl
from device_loop.core.model import Resource
from device_loop.exporter.config import parse_config
from device_loop.exporter.daemon import Exporter
from device_loop.core.ports import free_port
from helpers import pid_alive

pytestmark = pytest.mark.timeout(30)


class Flaky:
    """A plugin whose hooks fail on demand; its service is a real process."""

    def __init__(self):
        self.discover_fails = self.stop_fails = self.start_fails_after_spawn = self.startup_fails = False
        self.endpoint_fields = {}  # what its service's endpoints say, besides where they are

    @hookimpl
    def devloop_startup(self, host):
        if self.startup_fails:
            raise OSError("cannot open /dev/flaky")

    @hookimpl
    def devloop_discover(self, host):
        if self.discover_fails:
            raise OSError("sysfs read failed")
        return [e.resource("uart", f"flaky:{e.device}") for e in host.configured("flaky")]

    @hookimpl
    def devloop_start(self, host, resource, lease):
        service = host.serve_on_free_port([sys.executable, "-c", "import time; time.sleep(60)"], resource, lease,
                                          name="flaky")
        if self.start_fails_after_spawn:
            raise RuntimeError("helper did not answer")
        service.endpoints = [dataclasses.replace(e, **self.endpoint_fields) for e in service.endpoints]
        return service

    @hookimpl
    def devloop_stop(self, host, service):
        if self.stop_fails:
            raise RuntimeError("stop hook broke")
        return None  # fall through to the default: stop the processes


def make(tmp_path, plugin):
    config = parse_config({
        "exporter": {"name": "host-a", "state_dir": str(tmp_path / "state"),
                     "coordinator": f"http://127.0.0.1:{free_port()}"},  # nobody listens there
        "devices": [{"name": "x0", "plugin": "flaky"}]})
    exporter = Exporter(config)
    exporter.plugins.pm.register(plugin, name="flaky")
    exporter.setup()
    return exporter


def desired(lease="lease-1"):
    return {"services": [{"lease": lease, "holder": "alice", "device": "x0", "identifier": "flaky:x0",
                          "kind": "uart", "plugin": "flaky"}], "etag": "e1"}


def test_failed_discovery_keeps_the_last_result_and_the_lease(tmp_path):
    plugin = Flaky()
    exporter = make(tmp_path, plugin)
    try:
        resources = exporter.discover()
        exporter.reconcile(desired(), resources)
        plugin.discover_fails = True
        again = exporter.discover()
        assert again == resources and isinstance(again[0], Resource)
        (failing,) = exporter.report().plugins.failing  # and hosts says so
        assert failing.name == "flaky" and "sysfs read failed" in failing.reason
        assert not exporter.reconcile(desired(), again), "the running service must be left alone"
        assert ("lease-1", "flaky:x0") in exporter.running
    finally:
        exporter.shutdown()


def test_a_stop_hook_that_raises_is_retried_and_nothing_leaks(tmp_path):
    plugin = Flaky()
    exporter = make(tmp_path, plugin)
    try:
        resources = exporter.discover()
        exporter.reconcile(desired(), resources)
        (run,) = exporter.running.values()
        pid = run.service.processes[0].pid
        plugin.stop_fails = True
        exporter.reconcile({"services": [], "etag": "e2"}, resources)  # lease over; stop hook raises
        assert exporter.running == {}
        exporter.reconcile({"services": [], "etag": "e2"}, resources)  # next pass: the stray is stopped
        assert not pid_alive(pid)
        assert exporter.host.processes.recorded() == []
    finally:
        exporter.shutdown()


def test_a_start_that_fails_after_spawning_leaves_no_process(tmp_path):
    plugin = Flaky()
    plugin.start_fails_after_spawn = True
    exporter = make(tmp_path, plugin)
    try:
        exporter.reconcile(desired(), exporter.discover())
        assert exporter.start_errors[("lease-1", "flaky:x0")]["error"] == "uart: helper did not answer"
        assert exporter.host.processes.recorded() == []
        report = exporter.report(scan=True)
        assert [s.error for s in report.services] == ["uart: helper did not answer"]
    finally:
        exporter.shutdown()


@pytest.mark.parametrize("bad, why", [
    ({"command": "nc {host:d} {port}"}, "command"),
    ({"params": {"not an identifier": "x"}}, "params"),
    ({"host": "10.9.9.9"}, "not at this host's address"),
])
def test_a_start_whose_endpoints_cannot_be_reported_fails_that_lease_alone(tmp_path, bad, why):
    """A plugin's endpoint the coordinator would refuse must not make the whole host's report
    invalid: that start fails with the reason, its process goes, the report stays valid."""
    plugin = Flaky()
    plugin.endpoint_fields = bad
    exporter = make(tmp_path, plugin)
    try:
        exporter.reconcile(desired(), exporter.discover())
        error = exporter.start_errors[("lease-1", "flaky:x0")]["error"]
        assert why in error and "cannot be reported" in error or "not at this host's address" in error, error
        assert exporter.running == {} and exporter.host.processes.recorded() == []
        report = exporter.report(scan=True)  # valid: the model checks it as the coordinator would
        assert [s.error for s in report.services] == [error]
    finally:
        exporter.shutdown()


def test_a_plugin_that_fails_to_start_up_is_skipped_with_its_reason(tmp_path):
    plugin = Flaky()
    plugin.startup_fails = True
    exporter = make(tmp_path, plugin)
    try:
        assert "flaky" not in exporter.loaded
        (skipped,) = [s for s in exporter.skipped if s["name"] == "flaky"]
        assert "cannot open /dev/flaky" in skipped["reason"]
        assert exporter.heartbeat(scan=True) is None  # coordinator down: no exception
    finally:
        exporter.shutdown()


class Relay:
    """A 'power' plugin: switches a relay (a file here) on for a lease, off when it ends."""

    def __init__(self, folder):
        self.folder = folder

    @hookimpl
    def devloop_discover(self, host):
        return [e.resource("power", f"relay:{e.device}") for e in host.configured("relay") if "relay_serial" in e.settings]

    @hookimpl
    def devloop_check_config(self, entry):
        return None if "relay_serial" in entry.settings else "relay_serial is missing"

    @hookimpl
    def devloop_start(self, host, resource, lease):
        switch = self.folder / f"{resource.device}.on"
        switch.touch()
        service = host.serve_on_free_port([sys.executable, "-c", "import time; time.sleep(60)"], resource, lease,
                                          name="relay")
        service.data["switch"] = str(switch)
        return service

    @hookimpl
    def devloop_stop(self, host, service):
        os.unlink(service.data["switch"])

    @hookimpl
    def devloop_cleanup(self, host, data):
        os.unlink(data["switch"])


def test_what_a_plugin_changed_is_undone_after_its_exporter_died(tmp_path):
    config = parse_config({
        "exporter": {"name": "host-a", "state_dir": str(tmp_path / "state"),
                     "coordinator": f"http://127.0.0.1:{free_port()}"},
        "devices": [{"name": "x0", "plugin": "relay", "relay_serial": "R1"}, {"name": "x1", "plugin": "relay"}]})
    first = Exporter(config)
    first.plugins.pm.register(Relay(tmp_path), name="relay")
    first.setup()
    first.reconcile({"services": [{"lease": "lease-1", "holder": "alice", "device": "x0", "identifier": "relay:x0",
                                   "kind": "power", "plugin": "relay"}]}, first.discover())
    assert (tmp_path / "x0.on").exists()
    (run,) = first.running.values()
    pid = run.service.processes[0].pid
    # the exporter dies here (kill -9): no stop, no shutdown; a new one starts on the same state
    second = Exporter(config)
    second.plugins.pm.register(Relay(tmp_path), name="relay")
    try:
        second.setup()
        assert not pid_alive(pid), "the service process of the dead exporter was left running"
        assert not (tmp_path / "x0.on").exists(), "the relay stayed on"
        (unserved,) = second.unserved(second.discover())
        assert unserved["reason"] == "plugin 'relay': relay_serial is missing"
    finally:
        second.shutdown()
