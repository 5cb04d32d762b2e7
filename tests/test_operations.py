"""The exporter's one executor for operations of every kind: a real exporter process loading
real plugins (the test kit's ``steps``, installed as a package; the built-in ``flash``), with
the coordinator's side of the protocol played by the test (exporter_testkit.FakeCoordinator)."""
import hashlib
import os
import signal

import pytest

from conftest import Exporter, wait_for
from exporter_testkit import FakeCoordinator, installed_testkit, with_testkit

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]

BENCH = {"name": "b0", "class": "bench", "plugin": "steps"}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    return installed_testkit(tmp_path_factory)


@pytest.fixture
def fake():
    coordinator = FakeCoordinator()
    yield coordinator
    coordinator.close()


@pytest.fixture
def start(tmp_path, env, site, fake):
    """Start an exporter process (host-a) on the fake coordinator; stopped at the end."""
    started = []

    def start_exporter(devices, **settings):
        before = {beat.boot_id for beat in fake.heartbeats}
        proc = Exporter(tmp_path, with_testkit(env, site), fake.url, devices, **settings)
        started.append(proc)
        wait_for(lambda: any(b.boot_id not in before and b.devices for b in fake.heartbeats),
                 what="the exporter's first report")
        return proc

    yield start_exporter
    for proc in started:
        proc.stop(signal.SIGKILL)


def operation(op: str, kind: str, device: str = "b0", identifier: str = "steps:b0", plugin: str = "steps",
              **args) -> dict:
    return {"op": op, "kind": kind, "device": device, "identifier": identifier, "plugin": plugin,
            "requester": "alice", "args": args}


def begun(proc) -> list[str]:
    """The operations the steps plugin was called for, in order."""
    path = proc.state_dir / "steps-begun"
    return path.read_text().split() if path.exists() else []


def test_a_resource_reports_the_operations_its_plugin_runs_and_serves_no_lease(fake, start):
    start([BENCH])
    (device,) = fake.heartbeats[-1].devices
    (resource,) = device.resources
    assert resource.service is False
    assert [k.kind for k in resource.operations] == ["count", "fail", "crash", "answer"]
    assert resource.operations[1].destructive and resource.operations[0].args == {"to": "steps", "step_s": "seconds"}


def test_an_operation_reports_its_progress_then_its_result_once(fake, start):
    proc = start([BENCH], heartbeat_s=0.5)
    fake.begin(operation("op-count", "count", to=6, step_s=0.2))
    running = wait_for(lambda: (r := fake.last("op-count")) and r.progress.done >= 2 and r,
                       what="the count to be under way")
    assert (running.state, running.phase, running.progress.total, running.progress.unit) == (
        "running", "counting", 6, "steps")
    assert running.changed, "its plugin was called: the device may have been changed"
    done = wait_for(lambda: fake.ended("op-count"), what="the count's end")
    assert (done.state, done.message, done.result) == ("done", "counted to 6", {"counted": 6, "by": "alice"})
    assert done.progress.done == 6 and done.seconds["counting"] >= 1.0
    seen = [r.progress.done for _, r in fake.reports("op-count")]
    assert seen == sorted(seen) and len(set(seen)) >= 3, f"progress went {seen}"
    # the desired state carried it all along, until its end was reported: it was begun once
    wait_for(lambda: fake.heartbeats[-1].operations == [], what="the acknowledged result to leave the reports")
    assert begun(proc) == ["op-count"]


def test_progress_wakes_the_report_loop_at_most_twice_a_second(fake, start):
    start([BENCH], heartbeat_s=30)  # no periodic report while it runs: each is one of its wake-ups
    fake.begin(operation("op-fast", "count", to=300, step_s=0.005))
    wait_for(lambda: fake.ended("op-fast"), what="the count's end")
    running = [r for _, r in fake.reports("op-fast") if r.state == "running"]
    took = fake.ended("op-fast").seconds["counting"]
    # one at its start and at each phase it enters, then one a half second at most
    assert len(running) <= 3 + took / 0.5, f"{len(running)} reports of a {took:.1f} s count of 300 steps"


def test_each_outcome_says_why_and_whether_the_device_changed(fake, start):
    proc = start([BENCH, {"name": "s0", "class": "sim-board", "plugin": "sim"}])
    cases = {
        "op-fail-untouched": (operation("op-fail-untouched", "fail", changed=False),
                              "failed", "the bench did not answer", False),
        "op-fail-touched": (operation("op-fail-touched", "fail", changed=True), "failed", "the bench did not answer",
                            True),
        "op-crash": (operation("op-crash", "crash"), "failed", "the plugin crashed: RuntimeError('a bug in the plugin')",
                     True),
        "op-undeclared": (operation("op-undeclared", "reboot"), "failed",
                          "plugin 'steps' does not run 'reboot' on steps:b0", False),
        "op-no-hook": (operation("op-no-hook", "count", device="s0", identifier="sim:host-a:s0", plugin="sim"),
                       "failed", "plugin 'sim' runs no operations here", False),
        "op-gone": (operation("op-gone", "count", device="b9", identifier="steps:b9"), "failed",
                    "steps:b9 is not on host host-a any more", False),
        "op-big": (operation("op-big", "answer", give="big"), "failed", "a result may take 65536 bytes", True),
        "op-bad-key": (operation("op-bad-key", "answer", give="bad-key"), "failed", "result.Not A Key", True),
        "op-number": (operation("op-number", "answer", give="number"), "failed", "the plugin returned int", True),
        "op-sentence": (operation("op-sentence", "answer", give="sentence"), "done", "said in a sentence", True),
        "op-dict": (operation("op-dict", "answer", give="dict"), "done", "read 3 lines", True),
    }
    fake.begin(*(desired for desired, *_ in cases.values()))
    for op, (_, state, said, changed) in cases.items():
        report = wait_for(lambda: fake.ended(op), what=f"the end of {op}")
        assert (report.state, report.changed) == (state, changed), report
        assert said in report.message, report
    assert fake.ended("op-dict").result == {"lines": 3, "log": "a\nb\nc"}
    assert fake.ended("op-sentence").result is None
    assert fake.ended("op-sentence").phase == "running", "a phase that is not a word is not entered"
    refused_first = {"op-undeclared", "op-no-hook", "op-gone"}  # before its plugin was called
    assert sorted(begun(proc)) == sorted(set(cases) - refused_first)


def test_kill_9_while_running_is_reported_interrupted_by_the_next_start(fake, start):
    devices = [BENCH]
    first = start(devices, heartbeat_s=0.5)
    fake.begin(operation("op-long", "count", to=1000, step_s=0.05))
    wait_for(lambda: (r := fake.last("op-long")) and r.progress.done >= 2, what="the count to be under way")
    first.stop(signal.SIGKILL)
    killed_boot = fake.heartbeats[-1].boot_id

    start(devices, heartbeat_s=0.5)  # the same host, its state folder, started again
    failed = wait_for(lambda: fake.ended("op-long"), what="the count to be found interrupted")
    assert failed.state == "failed" and failed.message == "interrupted while counting: the exporter stopped"
    assert failed.changed and failed.kind == "count" and failed.interrupted
    after = [(boot, r.state) for boot, r in fake.reports("op-long") if boot != killed_boot]
    assert after and all(state == "failed" for _, state in after), f"begun again after the restart: {after}"
    wait_for(lambda: fake.heartbeats[-1].operations == [], what="the acknowledged failure to leave the reports")
    assert not list((first.state_dir / "operations").glob("*.json")), "the marker outlived its acknowledgement"
    assert begun(first) == ["op-long"]


def test_sigterm_waits_for_a_running_operation_and_reports_its_end(fake, start):
    proc = start([BENCH], heartbeat_s=0.5)
    fake.begin(operation("op-finish", "count", to=10, step_s=0.2))
    wait_for(lambda: (r := fake.last("op-finish")) and r.progress.done >= 1, what="the count to be under way")
    assert proc.stop(signal.SIGTERM, timeout=30) == 0
    last = fake.heartbeats[-1]
    assert last.stopping, "the exporter's last report says it is going away"
    (report,) = last.operations
    assert (report.op, report.state, report.result) == ("op-finish", "done", {"counted": 10, "by": "alice"})
    assert not list((proc.state_dir / "operations").glob("*.json")), "its end was acknowledged: no marker is left"


def test_a_flash_fetches_writes_and_verifies_its_image_and_a_damaged_one_is_never_written(tmp_path, fake, start):
    target = tmp_path / "b0.img"
    target.write_bytes(b"factory")
    start([{"name": "b0", "class": "board", "resources": [{"plugin": "flash", "target": str(target)}]}],
          heartbeat_s=0.5)
    (resource,) = fake.heartbeats[-1].devices[0].resources
    assert resource.service is False
    assert [(k.kind, k.destructive, k.exclusive, k.args) for k in resource.operations] == [("flash", True, True, {})]
    image = os.urandom(3 << 20)
    digest = hashlib.sha256(image).hexdigest()
    fake.images[digest] = image
    flash = {"kind": "flash", "device": "b0", "identifier": "flash:host-a:b0", "plugin": "flash", "requester": "alice",
             "image": {"sha256": digest, "size": len(image), "name": "build-1"}}
    fake.begin({"op": "op-flash", **flash})
    done = wait_for(lambda: fake.ended("op-flash"), what="the flash's end")
    assert done.state == "done" and "verified by read-back" in done.message, done
    assert target.read_bytes() == image
    assert (done.phase, done.progress.done, done.progress.total, done.progress.unit) == (
        "verifying", len(image), len(image), "bytes")
    assert set(done.seconds) == {"fetching", "writing", "verifying"} and done.changed
    phases = [r.phase for _, r in fake.reports("op-flash")]
    assert phases == sorted(phases, key=["fetching", "writing", "verifying"].index)

    damaged = bytearray(image)
    damaged[1000] ^= 0xFF
    other = hashlib.sha256(b"another" + image).hexdigest()
    fake.images[other] = bytes(damaged)  # served under a digest its bytes do not have
    fake.begin({"op": "op-damaged", **flash, "image": {"sha256": other, "size": len(image), "name": "build-2"}})
    failed = wait_for(lambda: fake.ended("op-damaged"), what="the damaged flash's end")
    assert failed.state == "failed" and "nothing written" in failed.message, failed
    assert (failed.phase, failed.changed) == ("fetching", False)
    assert target.read_bytes() == image
