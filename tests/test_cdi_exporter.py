"""The exporter's CDI folder with real coordinator and exporter processes (docs/architecture.md,
"Containers and CDI"): a lease on a simulated board writes its spec with the board's console,
its release removes it, a spec a killed exporter left for a lease that is gone is removed at
the next start, and another host's spec in the same folder is never touched, nor another lab's
exporter's of the same name (it removes only the specs it wrote, as its state folder lists them)."""
import json
import os
import signal

import pytest

from conftest import wait_for
from helpers import reserve, wait_active, wait_state
from test_cdi_spec import validate

pytestmark = [pytest.mark.service, pytest.mark.timeout(90)]
OTHER_HOST = "device-loop_host-b_lease-00000000000000bb.json"
OTHER_LAB = "device-loop_host-a_lease-00000000000000cc.json"  # another lab's exporter of the same name


def leased_with_its_spec(tmp_path, coordinator, exporter_factory):
    """An exporter, a lease of sim-board-0 it serves, and the path of the lease's spec once written."""
    exporter = exporter_factory()
    wait_state(coordinator, "sim-board-0", "idle")
    lease = wait_active(coordinator, reserve(coordinator, "sim-board-0")["id"])
    path = tmp_path / "cdi" / f"device-loop_host-a_{lease['id']}.json"
    wait_for(path.exists, what="the lease's CDI spec")
    return exporter, lease, path


def spec_files(folder):
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_a_lease_writes_its_spec_with_the_boards_console_and_its_release_removes_it(tmp_path, coordinator,
                                                                                      exporter_factory):
    folder = tmp_path / "cdi"
    folder.mkdir()
    (folder / OTHER_HOST).write_text("{}")  # an exporter of another name on this machine
    exporter, lease, path = leased_with_its_spec(tmp_path, coordinator, exporter_factory)
    spec = json.loads(path.read_text())
    validate(spec)
    link = exporter.state_dir / "sim" / "sim-board-0"
    assert spec == {
        "cdiVersion": "0.3.0", "kind": "device-loop.dev/sim-board",
        "devices": [{"name": "sim-board-0", "containerEdits": {
            "env": ["DEVICE_LOOP_CONSOLE=/dev/device-loop/console"],
            "mounts": [{"hostPath": str(link), "containerPath": "/dev/device-loop/console",
                        "options": ["bind", "rw"]}]}}]}
    assert os.path.realpath(link).startswith("/dev/pts/")  # the pty of the moment, through its stable link
    assert oct(os.stat(path).st_mode & 0o777) == "0o644"

    coordinator.api(f"/leases/{lease['id']}/release", "POST")
    wait_for(lambda: not path.exists(), what="the released lease's spec gone")
    wait_state(coordinator, "sim-board-0", "idle")
    assert spec_files(folder) == [OTHER_HOST]


def test_a_killed_exporters_spec_of_an_ended_lease_goes_at_its_next_start(tmp_path, coordinator, exporter_factory):
    folder = tmp_path / "cdi"
    exporter, lease, path = leased_with_its_spec(tmp_path, coordinator, exporter_factory)
    (folder / OTHER_HOST).write_text("{}")
    (folder / OTHER_LAB).write_text("{}")  # not in this exporter's list of the specs it wrote

    exporter.stop(signal.SIGKILL)
    assert path.exists(), "a killed exporter removes nothing"
    assert coordinator.api(f"/leases/{lease['id']}/release", "POST").json()["state"] == "released"
    exporter.start()
    wait_for(lambda: not path.exists(), what="the ended lease's spec removed by the exporter's start")
    wait_state(coordinator, "sim-board-0", "idle")
    assert spec_files(folder) == [OTHER_LAB, OTHER_HOST]


def test_a_live_leases_spec_is_written_again_after_a_restart(tmp_path, coordinator, exporter_factory):
    exporter, lease, path = leased_with_its_spec(tmp_path, coordinator, exporter_factory)
    written = path.read_text()
    exporter.stop(signal.SIGKILL)
    path.write_text("{}")  # a spec the dead exporter was halfway through: never trusted
    exporter.start()
    wait_for(lambda: path.exists() and path.read_text() == written, what="the live lease's spec written again")
