"""A leased PCI card in a container: podman from Debian (rootful, runc, the busybox image of
tests/podman_lab.py) given `--device device-loop.dev/<class>=<device>` sees the card's
render node with the numbers the node on the host has, and its address; after the release
podman cannot resolve the name any more. The card is a fake tree's (this machine has none)
and its node a real character node made for it."""
from __future__ import annotations

import os

import pytest

from conftest import Exporter, wait_for
from fake_pci import DRM_MAJOR, dev_node, pci_card
from helpers import reserve, wait_active, wait_state, written_cdi_spec
from podman_lab import CDI_DIR, UNRESOLVABLE

pytestmark = [pytest.mark.service, pytest.mark.timeout(180)]
GPU = "0000:01:00.0"


def test_a_leased_gpu_in_a_container(tmp_path, env, coordinator, podman, podman_names):
    sysfs = tmp_path / "sys"
    pci_card(sysfs, GPU, driver="amdgpu", drm=("renderD128",))
    node = dev_node(sysfs, "/dev/dri/renderD128", DRM_MAJOR, 128)
    device, qualified = podman_names["device"], f"device-loop.dev/{podman_names['class']}={podman_names['device']}"
    exporter = Exporter(tmp_path, env, coordinator.url,
                        [{"name": device, "plugin": "pci", "address": GPU, "class": podman_names["class"]}],
                        name=podman_names["host"], cdi_dir=str(CDI_DIR), sysfs_root=str(sysfs))
    try:
        wait_state(coordinator, device, "idle")
        lease = wait_active(coordinator, reserve(coordinator, device)["id"])
        spec = written_cdi_spec(CDI_DIR, podman_names["host"], lease["id"])
        said = podman.container(qualified, "stat -c %t:%T /dev/dri/renderD128; echo $DEVICE_LOOP_PCI_ADDRESS")
        assert said.returncode == 0, said.stderr
        rdev = os.stat(node).st_rdev
        assert said.stdout.split() == [f"{os.major(rdev):x}:{os.minor(rdev):x}", GPU], said.stdout
        assert coordinator.api(f"/leases/{lease['id']}/release", "POST").status_code == 200
        wait_for(lambda: not spec.exists(), what="the lease's CDI spec removed")
        gone = podman.container(qualified, "true")
        assert gone.returncode == 126 and UNRESOLVABLE in gone.stderr, gone.stderr
    finally:
        exporter.stop()
