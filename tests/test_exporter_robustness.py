"""A misbehaving plugin cannot take the exporter down, leak processes, or drop leases."""
import sys
import threading

import pytest

from conftest import wait_for
from device_loop.core.model import Resource
from device_loop.core.protocol import DesiredState
from exporter_testkit import FakeCoordinator, converge, in_process_exporter, installed_testkit, load_testkit
from helpers import pid_alive

pytestmark = [pytest.mark.service, pytest.mark.timeout(30)]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    return installed_testkit(tmp_path_factory)


@pytest.fixture
def make(tmp_path, monkeypatch, site):
    """An exporter in this process serving x0 with the test kit's ``flaky`` plugin (loaded
    through its entry point, as every plugin is); ``flaky(exporter)`` is that plugin's
    object, whose attributes make its hooks fail."""
    load_testkit(monkeypatch, site)
    made = []

    def make_exporter(devices=({"name": "x0", "plugin": "flaky"},)):
        made.append(in_process_exporter(tmp_path, list(devices)))
        return made[-1]

    yield make_exporter
    for exporter in made:
        exporter.shutdown()


def flaky(exporter):
    return exporter.plugins.pm.get_plugin("flaky")


def desired(lease="lease-1", as_of=0.0):
    return {"services": [{"lease": lease, "holder": "alice", "device": "x0", "identifier": "flaky:x0",
                          "kind": "uart", "plugin": "flaky"}], "etag": f"e-{lease}", "as_of": as_of}


def test_failed_discovery_keeps_the_last_result_and_the_lease(make):
    exporter = make()
    resources = exporter.discover()
    converge(exporter, desired())
    flaky(exporter).discover_fails = True
    again = exporter.discover()
    assert again == resources and isinstance(again[0], Resource)
    (failing,) = exporter.report().plugins.failing  # and hosts says so
    assert failing.name == "flaky" and "sysfs read failed" in failing.reason
    assert not converge(exporter, desired()), "the running service must be left alone"
    assert ("lease-1", "flaky:x0") in exporter.running


def test_of_two_desired_states_that_cross_the_later_wins(make):
    """The heartbeat's answer and the long-poll's may cross on their way: one read before the
    one applied last (an older ``as_of``) changes nothing, whichever way it came; a newer
    one applies."""
    exporter = make()
    exporter.step(scan=True)
    assert exporter._apply(DesiredState.model_validate(desired("lease-2", as_of=20.0)))
    exporter.reconciler.wait_idle()
    assert not exporter._apply(DesiredState.model_validate(desired("lease-1", as_of=10.0)))  # a long-poll's, late
    assert not exporter._apply(DesiredState.model_validate({"services": [], "etag": "e-15", "as_of": 15.0}),
                               from_heartbeat=True)
    exporter.reconciler.wait_idle()
    assert list(exporter.running) == [("lease-2", "flaky:x0")] and exporter.etag == "e-lease-2"
    assert exporter._apply(DesiredState.model_validate({"services": [], "etag": "e-30", "as_of": 30.0}),
                           from_heartbeat=True)
    exporter.reconciler.wait_idle()
    assert exporter.running == {} and exporter.etag == "e-30"


def test_a_stop_hook_that_raises_is_retried_and_nothing_leaks(make):
    exporter = make()
    converge(exporter, desired())
    (run,) = exporter.running.values()
    pid = run.service.processes[0].pid
    flaky(exporter).stop_fails = True
    converge(exporter, {"services": [], "etag": "e2"})  # lease over; stop hook raises
    assert exporter.running == {}
    converge(exporter, {"services": [], "etag": "e2"})  # next pass: the stray is stopped
    assert not pid_alive(pid)
    assert exporter.host.processes.recorded() == []


def test_a_start_that_fails_after_spawning_leaves_no_process(make):
    exporter = make()
    flaky(exporter).start_fails_after_spawn = True
    converge(exporter, desired())
    assert exporter.start_errors[("lease-1", "flaky:x0")]["error"] == "uart: helper did not answer"
    assert exporter.host.processes.recorded() == []
    report = exporter.report(scan=True)
    assert [s.error for s in report.services] == ["uart: helper did not answer"]


@pytest.mark.parametrize("bad, why", [
    ({"command": "nc {host:d} {port}"}, "command"),
    ({"params": {"not an identifier": "x"}}, "params"),
    ({"host": "10.9.9.9"}, "not at this host's address"),
])
def test_a_start_whose_endpoints_cannot_be_reported_fails_that_lease_alone(make, bad, why):
    """A plugin's endpoint the coordinator would refuse must not make the whole host's report
    invalid: that start fails with the reason, its process goes, the report stays valid."""
    exporter = make()
    flaky(exporter).endpoint_fields = bad
    converge(exporter, desired())
    error = exporter.start_errors[("lease-1", "flaky:x0")]["error"]
    assert why in error and "cannot be reported" in error or "not at this host's address" in error, error
    assert exporter.running == {} and exporter.host.processes.recorded() == []
    report = exporter.report(scan=True)  # valid: the model checks it as the coordinator would
    assert [s.error for s in report.services] == [error]


def test_a_plugin_that_fails_to_start_up_is_skipped_with_its_reason(make):
    exporter = make([{"name": "x0", "plugin": "flaky", "startup_fails": True}])
    assert "flaky" not in exporter.loaded
    (skipped,) = [s for s in exporter.skipped if s["name"] == "flaky"]
    assert "cannot open /dev/flaky" in skipped["reason"]
    assert exporter.heartbeat(scan=True) is None  # coordinator down: no exception


def test_what_a_plugin_changed_is_undone_after_its_exporter_died(tmp_path, monkeypatch, site):
    """The test kit's ``relay`` switches a relay (a file) on for a lease."""
    load_testkit(monkeypatch, site)
    devices = [{"name": "x0", "plugin": "relay", "relay_serial": "R1", "switch_dir": str(tmp_path)},
               {"name": "x1", "plugin": "relay"}]
    first = in_process_exporter(tmp_path, devices)
    converge(first, {"services": [{"lease": "lease-1", "holder": "alice", "device": "x0", "identifier": "relay:x0",
                                   "kind": "power", "plugin": "relay"}]})
    assert (tmp_path / "x0.on").exists()
    (run,) = first.running.values()
    pid = run.service.processes[0].pid
    # the exporter dies here (kill -9): no stop, no shutdown; a new one starts on the same state
    second = in_process_exporter(tmp_path, devices)
    try:
        assert not pid_alive(pid), "the service process of the dead exporter was left running"
        assert not (tmp_path / "x0.on").exists(), "the relay stayed on"
        (unserved,) = second.unserved(second.discover())
        assert unserved["reason"] == "plugin 'relay': relay_serial is missing"
    finally:
        second.shutdown()


def in_wait_idle(thread: threading.Thread) -> bool:
    """Whether ``thread`` (an exporter's loop) waits for its services' starts and stops now."""
    frame = sys._current_frames().get(thread.ident)
    while frame is not None:
        if frame.f_code.co_name == "wait_idle":
            return True
        frame = frame.f_back
    return False


@pytest.mark.timeout(120)
def test_a_stop_that_ends_while_the_loop_waits_for_it_is_reported_at_once(tmp_path, monkeypatch, site):
    """The loop, woken by its health schedule (not by a change), waits for a stop under way
    before it reports: the stop's end, which wakes it while it waits, is reported then, not
    a heartbeat period later (an hour here; a device stayed reclaiming that long)."""
    load_testkit(monkeypatch, site)
    fake = FakeCoordinator()
    exporter = in_process_exporter(tmp_path, [{"name": "x0", "plugin": "flaky"}], fake.url, set_up=False,
                                   heartbeat_s=3600, health_period=0.1, health_recheck=0.05)
    gate = threading.Event()
    loop = threading.Thread(target=exporter.run, name="exporter-loop")
    loop.start()
    try:
        service = {"lease": "lease-1", "holder": "alice", "device": "x0", "identifier": "flaky:x0", "kind": "uart",
                   "plugin": "flaky"}
        fake.serve(service)
        wait_for(lambda: fake.heartbeats and any(s.lease == "lease-1" and s.endpoints
                                                 for s in fake.heartbeats[-1].services), what="the service reported")
        flaky(exporter).stop_gate = gate
        fake.serve()  # the lease ended
        wait_for(lambda: exporter.reconciler.stopping, what="the stop under way")
        wait_for(lambda: in_wait_idle(loop), what="the loop waiting for the stop", interval=0.001)
        gate.set()
        wait_for(lambda: not fake.heartbeats[-1].services and "lease-1" not in fake.heartbeats[-1].applied,
                 what="a report without the service")
    finally:
        gate.set()  # (a stop held open would hold the exporter's own stop)
        exporter.stop()
        loop.join()
        fake.close()
