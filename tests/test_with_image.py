"""``device-loop with --image`` (docs/architecture.md, "A lease bound to a command" and
"Leases that live as long as their client"): a device that does not run the image is flashed
first, through the mediated path; one whose last flash wrote it and read it back is taken as
it is; a flash that fails is the lab's failure (75) and the command never runs; an unknown
image is a usage error before anything is reserved."""
from __future__ import annotations

import os

import pytest

from helpers import run_cli, wait_state
from test_flash import flashable
from test_with_command import outcome_of, start_with

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]


def test_with_image_flashes_first_only_where_the_device_does_not_run_it(tmp_path, env, coordinator, exporter_factory):
    targets = {name: tmp_path / f"{name}.img" for name in ("sim-board-0", "sim-board-1")}
    for target in targets.values():
        target.write_bytes(b"factory")
    broken = tmp_path / "not-a-file"
    broken.mkdir()  # (it exists and may be written in: healthy, until a flash tries)
    exporter_factory([flashable(name, target=str(target)) for name, target in targets.items()]
                     + [{**flashable("sim-board-2", target=str(broken)), "class": "sim-broken"}])
    for name in (*targets, "sim-board-2"):
        wait_state(coordinator, name, "idle")
    build = tmp_path / "build.img"
    build.write_bytes(os.urandom(1 << 20))
    run_cli(env, coordinator.url, "images", "upload", str(build), "--name", "build-1", "--for", "sim-board")

    for hostile in ("no-such", "no-such?x=1#y", "../leases", "%2e%2e", "x" * 5000):  # (a name is looked up as a name)
        refused = run_cli(env, coordinator.url, "with", "--class", "sim-board", "--image", hostile, "--", "true",
                          check=False)
        assert refused.returncode == 2 and (hostile if len(hostile) < 100 else "128 characters") in refused.stderr, \
            refused.stderr
    assert coordinator.api("/leases").json() == [], "nothing is reserved for a wrong request"

    status, first, err = outcome_of(start_with(env, coordinator, "--class", "sim-board", "--image", "build-1",
                                               "--json", "--", "true"), timeout=60)
    assert (status, first["flashed"]) == (0, True), err
    assert targets[first["device"]].read_bytes() == build.read_bytes()
    audit = coordinator.api("/admin/audit").json()
    assert any(a["action"] == "flash" and a["lease"] == first["lease"] for a in audit), "the mediated path, audited"

    wait_state(coordinator, first["device"], "idle")
    status, again, err = outcome_of(start_with(env, coordinator, "--class", "sim-board", "--image", "build-1",
                                               "--json", "--", "true"), timeout=60)
    assert (status, again["device"], again["flashed"]) == (0, first["device"], False), err
    assert "runs build-1 already" in err

    other = next(name for name in targets if name != first["device"])
    status, flashed, err = outcome_of(start_with(env, coordinator, other, "--image", "build-1", "--json", "--",
                                                 "true"), timeout=60)
    assert (status, flashed["device"], flashed["flashed"]) == (0, other, True), err
    assert targets[other].read_bytes() == build.read_bytes()

    other_build = tmp_path / "build-2.img"
    other_build.write_bytes(os.urandom(1 << 16))
    run_cli(env, coordinator.url, "images", "upload", str(other_build), "--name", "build-2", "--for", "sim-board-2")
    status, failed, err = outcome_of(start_with(env, coordinator, "sim-board-2", "--image", "build-2", "--json", "--",
                                                "true"), timeout=60)
    assert (status, failed["failure"], failed["flashed"], failed["command_status"]) == (75, "lab", False, None), err
    assert failed["reason"].startswith("the flash of build-2 onto sim-board-2 failed")
    assert coordinator.api(f"/leases/{failed['lease']}").json()["state"] == "released"

    # an image for one device: another named is a wrong request (2) before anything is reserved; a
    # request by class or tags takes the image's device, never another
    wait_state(coordinator, "sim-board-2", "idle")
    leases_before = coordinator.api("/leases").json()
    for_1 = tmp_path / "for-1.img"
    for_1.write_bytes(os.urandom(1 << 16))
    run_cli(env, coordinator.url, "images", "upload", str(for_1), "--name", "for-1", "--for", "sim-board-1")
    wrong = run_cli(env, coordinator.url, "with", "sim-board-0", "--image", "for-1", "--", "true", check=False)
    assert wrong.returncode == 2 and "for-1 is for sim-board-1, not sim-board-0" in wrong.stderr, wrong.stderr
    wrong = run_cli(env, coordinator.url, "with", "sim-board-2", "--image", "build-1", "--", "true", check=False)
    assert wrong.returncode == 2 and "build-1 is for class sim-board; sim-board-2 is of class sim-broken" \
        in wrong.stderr, wrong.stderr
    assert coordinator.api("/leases").json() == leases_before, "nothing is reserved for a wrong request"
    wait_state(coordinator, "sim-board-1", "idle")
    status, taken, err = outcome_of(start_with(env, coordinator, "--class", "sim-board", "--image", "for-1", "--json",
                                               "--", "true"), timeout=60)
    assert (status, taken.get("device")) == (0, "sim-board-1"), (taken, err)
