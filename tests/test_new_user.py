"""What a new user tripped on (issue 17), as they met it: real coordinator, exporter and CLI
processes. The suite itself never reaching a lab on the default port is here too."""
import json
import os
import subprocess
import sys

import pytest

from conftest import DEFAULT_COORDINATOR_GUARD
from device_loop.client import Lab
from device_loop.client.http import CoordinatorError
from device_loop.exporter.config import parse_config
from helpers import run_cli, wait_state

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]


def test_every_default_coordinator_is_the_guard_and_the_guard_sees_who_reaches_it(env):
    assert parse_config({}).exporter.coordinator == DEFAULT_COORDINATOR_GUARD.url  # an exporter's default
    with pytest.raises(CoordinatorError, match="cannot reach the coordinator"):
        Lab(token="dl_not-sent-anywhere-real").devices()  # the library's default
    cli = subprocess.run([sys.executable, "-m", "device_loop.cli", "ls"], env=env, capture_output=True, text=True,
                         timeout=60)  # the CLI's default, in a process of the tests' own environment
    assert cli.returncode == 1 and DEFAULT_COORDINATOR_GUARD.url in cli.stderr
    reached = DEFAULT_COORDINATOR_GUARD.take()  # (taken here: the guard would fail this test otherwise)
    assert any(r.startswith(f"pid {os.getpid()}: ") for r in reached), reached
    assert any(r.endswith("-m device_loop.cli ls") for r in reached), reached


def test_admin_forget_removes_the_host_and_devices_of_an_exporter_that_is_gone(coordinator, exporter_factory, env):
    exporter = exporter_factory()
    wait_state(coordinator, "sim-board-1", "idle")
    url = coordinator.url
    refused = run_cli(env, url, "admin", "forget", "sim-board-0", check=False)
    assert refused.returncode == 1 and "sim-board-0 is not offline: host host-a still reports it" in refused.stderr
    exporter.stop()  # its last heartbeat says it is going: the host is offline at once
    assert not json.loads(run_cli(env, url, "hosts", "--json").stdout)[0]["online"]

    forgot = run_cli(env, url, "admin", "forget", "host-a").stdout
    assert forgot.strip() == "forgot host host-a and its devices: sim-board-0, sim-board-1"
    assert run_cli(env, url, "ls").stdout.strip() == "no devices yet"
    assert run_cli(env, url, "hosts").stdout.strip() == "no exporter has reported yet"
    audit = json.loads(run_cli(env, url, "admin", "audit", "--json").stdout)
    assert [(e["action"], e["device"]) for e in audit[:3]] == [
        ("forget_host", None), ("forget", "sim-board-1"), ("forget", "sim-board-0")]


def test_admin_release_takes_a_device_name(coordinator, exporter_factory, env):
    exporter_factory()
    url = coordinator.url
    wait_state(coordinator, "sim-board-1", "idle")
    held = json.loads(run_cli({**env, "DEVICE_LOOP_USER": "bob"}, url, "reserve", "sim-board-1", "--json").stdout)
    revoked = json.loads(run_cli(env, url, "admin", "release", "sim-board-1", "--force", "--json").stdout)
    assert (revoked["id"], revoked["state"], revoked["end_reason"]) == (held["id"], "revoked", "revoked by admin alice")
    again = run_cli(env, url, "admin", "release", "sim-board-1", "--force", check=False)
    assert again.returncode == 1 and "sim-board-1 has no live lease (it is " in again.stderr
    unknown = run_cli(env, url, "admin", "release", "nosuch", "--force", "--json", check=False)
    assert json.loads(unknown.stdout)["error"] == "unknown_device"


def test_ls_and_log_say_why_a_device_is_faulty(coordinator, exporter_factory, env):
    exporter = exporter_factory([{"name": "cam-0", "class": "camera", "plugin": "video", "source": "sim"}])
    url = coordinator.url
    wait_state(coordinator, "cam-0", "idle")
    switch = exporter.state_dir / "video" / "cam-0.fail"  # the simulated camera fails while it exists
    switch.parent.mkdir(parents=True, exist_ok=True)
    switch.write_text("lens cap on")
    wait_state(coordinator, "cam-0", "faulty")
    row = next(line for line in run_cli(env, url, "ls").stdout.splitlines() if line.startswith("cam-0"))
    assert "faulty (video: lens cap on)" in row
    switch.unlink()
    wait_state(coordinator, "cam-0", "idle")
    log = run_cli(env, url, "log", "cam-0").stdout
    changes = [line.split(None, 1)[1].strip() for line in log.splitlines()[1:]]  # without the time
    assert [" ".join(change.split()) for change in changes] == [
        "unregistered -> idle exporter:host-a registered: first reported by host host-a",
        "idle -> faulty exporter:host-a health failed: video: lens cap on",
        "faulty -> idle exporter:host-a health is ok again"]
