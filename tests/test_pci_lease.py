"""A PCI card leased through real coordinator and exporter processes (docs/architecture.md,
"Containers and CDI", "Health that heals"): the lease's CDI spec carries the card's render
node, read from the node itself, and its address; a card gone from the bus is reported faulty
with the reason, and the same device again once it is back; AER fatal errors are a fault
that waits for a person."""
import json

import pytest

from conftest import wait_for
from fake_pci import DRM_MAJOR, aer_text, dev_node, pci_card, put_back, remove_card, set_attr
from helpers import device, reserve, run_cli, wait_active, wait_state
from test_cdi_spec import validate

pytestmark = [pytest.mark.service, pytest.mark.timeout(90)]
GPU = "0000:01:00.0"
SCHEDULE = {"health_period": 0.5, "health_recheck": 0.25}  # (a change is seen in a second, not ten)


def test_a_leased_gpu_s_spec_has_its_nodes_and_address(tmp_path, coordinator, exporter_factory):
    sysfs = tmp_path / "sys"
    pci_card(sysfs, GPU, class_code="0x030000", vendor="1002", device="744c", subsystem=("1002", "0e3b"),
             driver="amdgpu", drm=("card1", "renderD129"))
    render = dev_node(sysfs, "/dev/dri/renderD129", DRM_MAJOR, 129)
    card = dev_node(sysfs, "/dev/dri/card1", DRM_MAJOR, 1)
    exporter_factory(devices=[{"name": "rx-7900", "plugin": "pci", "address": GPU, "tags": ["rack-2"]}],
                     sysfs_root=str(sysfs))
    wait_state(coordinator, "rx-7900", "idle")
    said = device(coordinator, "rx-7900")
    assert said["class"] == "gpu" and set(said["tags"]) >= {"rack-2", "vendor-amd", "driver-amdgpu"}
    lease = wait_active(coordinator, reserve(coordinator, "rx-7900")["id"])
    path = tmp_path / "cdi" / f"device-loop_host-a_{lease['id']}.json"
    wait_for(path.exists, what="the lease's CDI spec")
    spec = json.loads(path.read_text())
    validate(spec)
    assert spec["kind"] == "device-loop.dev/gpu" and [d["name"] for d in spec["devices"]] == ["rx-7900"]
    edits = spec["devices"][0]["containerEdits"]
    assert edits["env"] == [f"DEVICE_LOOP_PCI_ADDRESS={GPU}"]
    assert [(n["path"], n["hostPath"], n["type"], n["major"], n["minor"]) for n in edits["deviceNodes"]] == [
        ("/dev/dri/renderD129", str(render), "c", DRM_MAJOR, 129), ("/dev/dri/card1", str(card), "c", DRM_MAJOR, 1)]
    coordinator.api(f"/leases/{lease['id']}/release", "POST")
    wait_for(lambda: not path.exists(), what="the released lease's spec gone")


def test_a_card_pulled_out_is_faulty_with_the_reason_and_back_when_it_is(tmp_path, coordinator, exporter_factory):
    sysfs = tmp_path / "sys"
    real = pci_card(sysfs, GPU, driver="amdgpu", drm=("renderD128",))
    exporter_factory(devices=[{"name": "gpu-a", "plugin": "pci", "address": GPU}], sysfs_root=str(sysfs),
                     **SCHEDULE)
    wait_state(coordinator, "gpu-a", "idle")
    kept = remove_card(sysfs, GPU)
    wait_for(lambda: device(coordinator, "gpu-a").get("health") == "failed", what="gpu-a failed")
    said = device(coordinator, "gpu-a")
    assert said["state"] == "faulty" and f"{GPU} is gone from the PCI bus" in json.dumps(said)
    put_back(sysfs, GPU, kept, real)
    wait_state(coordinator, "gpu-a", "idle")


def test_aer_fatal_errors_are_a_fault_that_waits_for_a_person(tmp_path, coordinator, exporter_factory):
    sysfs = tmp_path / "sys"
    pci_card(sysfs, GPU, driver="amdgpu")
    exporter = exporter_factory(devices=[{"name": "gpu-b", "plugin": "pci", "address": GPU}], sysfs_root=str(sysfs),
                                **SCHEDULE)
    wait_state(coordinator, "gpu-b", "idle")
    set_attr(sysfs, GPU, aer_dev_fatal=aer_text("TOTAL_ERR_FATAL", 3).strip())
    wait_state(coordinator, "gpu-b", "faulty")
    shown = device(coordinator, "gpu-b")
    assert (shown["fault_kind"], shown["fault"]) == ("health-permanent",
                                                     "health failed for good: pci: AER fatal errors: 3"), shown
    set_attr(sysfs, GPU, aer_dev_fatal=aer_text("TOTAL_ERR_FATAL", 0).strip())  # (a reset card: counters at 0)
    wait_for(lambda: device(coordinator, "gpu-b")["health"] == "ok", what="health ok again")
    assert device(coordinator, "gpu-b")["state"] == "faulty", "a permanent fault waits for a person"
    run_cli(exporter.env, coordinator.url, "admin", "clear-fault", "gpu-b")
    wait_state(coordinator, "gpu-b", "idle")
