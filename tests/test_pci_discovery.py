"""The pci plugin on fake PCI trees (the kernel's layout, real character nodes): what it
discovers and names, the health it reads from sysfs, and what a container gets."""
from __future__ import annotations

import os
import stat

import pytest
from pydantic import ValidationError

from device_loop.core.host import HostContext
from device_loop.core.model import ConfiguredResource
from device_loop.core.vocabulary import HealthKind
from device_loop.plugins.pci import CORRECTABLE_HOLD_S, PciPlugin
from device_loop.plugins.pci.config import PciConfig
from fake_pci import (DRM_MAJOR, ETHERNET, GEN, PROCESSING_ACCELERATOR, VGA, bind, dev_node, nvidia_information,
                      pci_card, put_back, remove_card, set_attr)
from lab_in_process import FakeClock

GPU = "0000:01:00.0"
NPU = "0000:02:00.0"


def entry(device: str, device_class: str = "generic", tags=(), **config) -> ConfiguredResource:
    return ConfiguredResource(device=device, device_class=device_class, tags=tuple(tags), plugin="pci",
                              config=PciConfig.model_validate(config))


@pytest.fixture
def tree(tmp_path):
    return tmp_path / "sys"


def host_of(tmp_path, tree, entries=()):
    return HostContext(name="host-a", state_dir=tmp_path / "state", sysfs_root=tree, entries=list(entries))


def discover(plugin, host):
    return {r.device: r for r in plugin.devloop_discover(host=host)}


def test_a_gpu_with_its_render_node_is_a_device_and_a_container_gets_its_nodes(tmp_path, tree):
    pci_card(tree, GPU, class_code=VGA, vendor="1002", device="744c", subsystem=("1002", "0e3b"), driver="amdgpu",
             drm=("card0", "renderD128"))
    render = dev_node(tree, "/dev/dri/renderD128", DRM_MAJOR, 128, mode=0o666)
    dev_node(tree, "/dev/dri/card0", DRM_MAJOR, 0)
    dev_node(tree, "/dev/kfd", 511, 0)
    plugin, host = PciPlugin(), host_of(tmp_path, tree)
    (name, gpu), = discover(plugin, host).items()
    assert name == "host-a-pci-01-00.0" and gpu.device_class == "gpu" and gpu.kind == "pci"
    assert gpu.identifier == "pci:host-a:0000:01:00.0:1002:744c:1002:0e3b"
    assert gpu.tags == ("vendor-amd", "driver-amdgpu") and gpu.node == str(render)
    assert plugin.devloop_health(host=host, resource=gpu).status == "ok"
    env = plugin.devloop_environment(host=host, resource=gpu, service=None)
    assert [(n.path, n.host_path, n.type, n.major, n.minor) for n in env.nodes] == [
        ("/dev/dri/renderD128", str(render), "c", DRM_MAJOR, 128),
        ("/dev/dri/card0", str(tree.parent / "dev/dri/card0"), "c", DRM_MAJOR, 0),
        ("/dev/kfd", str(tree.parent / "dev/kfd"), "c", 511, 0)]
    assert env.nodes[0].file_mode == 0o664  # (never world-writable in a container, whatever the host's mode)
    assert env.env == {"DEVICE_LOOP_PCI_ADDRESS": GPU}


def test_a_processing_accelerator_and_its_accel_node(tmp_path, tree):
    pci_card(tree, NPU, class_code=PROCESSING_ACCELERATOR, vendor="8086", device="7d1d", subsystem=("8086", "0000"),
             driver="intel_vpu", accel=("accel0",), serial="0x1a2b3c4d5e6f")
    dev_node(tree, "/dev/accel/accel0", 261, 0)
    pci_card(tree, "0000:03:00.0", class_code=ETHERNET, vendor="8086", device="1533")  # a NIC: not an accelerator
    plugin, host = PciPlugin(), host_of(tmp_path, tree)
    (name, npu), = discover(plugin, host).items()
    assert name == "pci-0x1a2b3c4d5e6f" and npu.device_class == "accelerator"
    assert npu.identifier == "pci:8086:7d1d:8086:0000:sn:0x1a2b3c4d5e6f"  # (its serial: the same on any host)
    env = plugin.devloop_environment(host=host, resource=npu, service=None)
    assert [(n.path, n.major) for n in env.nodes] == [("/dev/accel/accel0", 261)]


def test_a_link_trained_down_is_degraded_and_a_slow_slot_is_not(tmp_path, tree):
    pci_card(tree, GPU, link=(1, 16), max_link=(4, 16), port_link=(4, 16))
    pci_card(tree, "0000:05:00.0", link=(4, 4), max_link=(4, 16), port_link=(4, 16))
    pci_card(tree, "0000:06:00.0", link=(3, 16), max_link=(4, 16), port_link=(3, 16))  # a Gen4 card in a Gen3 slot
    plugin, host = PciPlugin(), host_of(tmp_path, tree)
    found = discover(plugin, host)
    health = {name: plugin.devloop_health(host=host, resource=r) for name, r in found.items()}
    assert (health["host-a-pci-01-00.0"].status, health["host-a-pci-01-00.0"].reason) == (
        "degraded", "link at 2.5 GT/s of 16 GT/s")
    assert health["host-a-pci-01-00.0"].kind == HealthKind.TRANSIENT
    assert (health["host-a-pci-05-00.0"].status, health["host-a-pci-05-00.0"].reason) == ("degraded", "link x4 of x16")
    assert health["host-a-pci-06-00.0"].status == "ok"
    set_attr(tree, GPU, current_link_speed=GEN[4])  # retrained
    assert plugin.devloop_health(host=host, resource=found["host-a-pci-01-00.0"]).status == "ok"


def test_an_entry_may_leave_the_link_speed_alone(tmp_path, tree):
    pci_card(tree, GPU, link=(1, 16))  # (NVIDIA's cards slow their link when idle)
    plugin = PciPlugin()
    host = host_of(tmp_path, tree, [entry("h100", address=GPU, check_link_speed=False)])
    (gpu,) = plugin.devloop_discover(host=host)
    assert plugin.devloop_health(host=host, resource=gpu).status == "ok"
    set_attr(tree, GPU, current_link_width=8)
    assert plugin.devloop_health(host=host, resource=gpu).reason == "link x8 of x16"


def test_aer_fatal_errors_fail_the_card_for_good_and_others_degrade_it(tmp_path, tree):
    pci_card(tree, GPU, aer=(3, 0, 0))
    pci_card(tree, "0000:05:00.0", aer=(0, 2, 7))
    plugin, host = PciPlugin(), host_of(tmp_path, tree)
    plugin.clock = clock = FakeClock(1000.0)
    found = discover(plugin, host)
    fatal = plugin.devloop_health(host=host, resource=found["host-a-pci-01-00.0"])
    assert (fatal.status, fatal.reason, fatal.kind) == ("failed", "AER fatal errors: 3", HealthKind.PERMANENT)
    other = found["host-a-pci-05-00.0"]
    nonfatal = plugin.devloop_health(host=host, resource=other)
    assert (nonfatal.status, nonfatal.reason, nonfatal.kind) == ("degraded", "AER non-fatal errors: 2",
                                                                 HealthKind.TRANSIENT)
    set_attr(tree, "0000:05:00.0", aer_dev_nonfatal="TOTAL_ERR_NONFATAL 0", aer_dev_correctable="TOTAL_ERR_COR 9")
    assert plugin.devloop_health(host=host, resource=other).reason == \
        "AER correctable errors: 9 (2 more since the last check)"  # (a count that grows, not one that is)
    clock.now += 1.5  # the re-check after a change: still degraded, so the two results agree
    again = plugin.devloop_health(host=host, resource=other)
    assert (again.status, again.reason) == ("degraded", "AER correctable errors: 9, grown 2 s ago")
    clock.now += CORRECTABLE_HOLD_S
    assert plugin.devloop_health(host=host, resource=other).status == "ok"


def test_a_card_without_driver_or_disabled(tmp_path, tree):
    pci_card(tree, GPU, driver=None)
    pci_card(tree, "0000:05:00.0", enable=0)
    pci_card(tree, "0000:06:00.0", enable=0, driver="vfio-pci")  # (enabled only while a VM has it open)
    plugin, host = PciPlugin(), host_of(tmp_path, tree)
    found = discover(plugin, host)
    said = {n: (h.status, h.reason) for n, r in found.items()
            for h in [plugin.devloop_health(host=host, resource=r)]}
    assert said == {"host-a-pci-01-00.0": ("failed", "no driver is bound to it"),
                    "host-a-pci-05-00.0": ("degraded", "not enabled by its driver nouveau"),
                    "host-a-pci-06-00.0": ("ok", "")}
    bind(tree, GPU, "nouveau")
    assert plugin.devloop_health(host=host, resource=found["host-a-pci-01-00.0"]).status == "ok"


def test_a_card_pulled_out_stays_reported_failed_until_it_is_back(tmp_path, tree):
    real = pci_card(tree, GPU, drm=("renderD128",))
    plugin, host = PciPlugin(), host_of(tmp_path, tree)
    (gpu,) = plugin.devloop_discover(host=host)
    kept = remove_card(tree, GPU)
    (still,) = plugin.devloop_discover(host=host)
    assert still == gpu
    health = plugin.devloop_health(host=host, resource=still)
    assert (health.status, health.reason, health.kind) == ("failed", f"{GPU} is gone from the PCI bus",
                                                           HealthKind.TRANSIENT)
    put_back(tree, GPU, kept, real)
    (back,) = plugin.devloop_discover(host=host)
    assert back == gpu and plugin.devloop_health(host=host, resource=back).status == "ok"


def test_another_card_in_the_slot_is_another_identity(tmp_path, tree):
    pci_card(tree, GPU)
    plugin, host = PciPlugin(), host_of(tmp_path, tree)
    (old,) = plugin.devloop_discover(host=host)
    remove_card(tree, GPU)
    pci_card(tree, GPU, vendor="1002", device="744c", port_link=None)
    (new,) = plugin.devloop_discover(host=host)  # (the slot's name is the new card's: the old one is not reported)
    assert new.device == old.device and new.identifier == f"pci:host-a:{GPU}:1002:744c:10de:16c1"
    assert plugin.devloop_health(host=host, resource=old).reason == f"another card (1002:744c) is at {GPU} now"


def test_entries_name_cards_by_address_or_ids(tmp_path, tree):
    pci_card(tree, "0000:03:00.0", class_code=ETHERNET, vendor="15b3", device="a2dc", subsystem=("15b3", "0009"),
             driver="mlx5_core")  # a DPU: a NIC by its class, a device because an entry names it
    pci_card(tree, "0000:04:00.0", class_code="0x120000", vendor="1e52", device="401e", subsystem=("1e52", "0001"),
             driver="tenstorrent")
    pci_card(tree, "0000:05:00.0", class_code=ETHERNET, vendor="8086", device="1533")
    pci_card(tree, "0000:06:00.0", class_code=ETHERNET, vendor="8086", device="1533")
    entries = [entry("dpu-1", address="03:00.0", tags=["rack-2"]),
               entry("wormhole", "tt-card", pci_id="1E52:401E"),
               entry("nic", pci_id="8086:1533"),  # two cards have these ids: neither is taken
               entry("absent", address="0000:09:00.0")]
    plugin, host = PciPlugin(), host_of(tmp_path, tree, entries)
    found = discover(plugin, host)
    assert sorted(found) == ["dpu-1", "wormhole"]
    assert found["dpu-1"].device_class == "accelerator" and found["dpu-1"].tags == (
        "rack-2", "vendor-15b3", "driver-mlx5_core")
    assert found["wormhole"].device_class == "tt-card" and found["wormhole"].config.pci_id == "1e52:401e"
    assert plugin.devloop_check_config(host=host, entry=entries[2]) == (
        "2 PCI cards have the ids 8086:1533 (0000:05:00.0, 0000:06:00.0): name one by address")
    assert plugin.devloop_check_config(host=host, entry=entries[3]) == "no PCI device at 0000:09:00.0"


@pytest.mark.parametrize("config, says", [
    ({}, "give exactly one of address, pci_id"),
    ({"address": GPU, "pci_id": "10de:2330"}, "give exactly one of address, pci_id"),
    ({"address": "1:0.0"}, "a PCI address is"),
    ({"address": "0000:01:00.0; rm -rf /"}, "a PCI address is"),
    ({"pci_id": "10de"}, "pci_id is vendor:device"),
    ({"address": GPU, "speed": 1}, "Extra inputs are not permitted"),
])
def test_a_bad_entry_is_refused(config, says):
    with pytest.raises(ValidationError, match=says):
        PciConfig.model_validate(config)


def test_an_nvidia_gpu_is_named_by_its_uuid_and_a_container_gets_its_minor(tmp_path, tree):
    uuid = "GPU-8f6c1c52-3d1e-4b0e-a3c2-0d7a9f1e2b3c"
    pci_card(tree, GPU, driver="nvidia")
    nvidia_information(tree, GPU, uuid, minor=3)
    for path, minor in (("/dev/nvidia3", 3), ("/dev/nvidiactl", 255), ("/dev/nvidia-uvm", 0)):
        dev_node(tree, path, 195 if "uvm" not in path else 509, minor)
    plugin, host = PciPlugin(), host_of(tmp_path, tree)
    (gpu,) = plugin.devloop_discover(host=host)
    assert gpu.device == f"pci-{uuid}" and gpu.identifier == f"pci:10de:2330:10de:16c1:sn:{uuid}"
    assert gpu.node == str(tree.parent / "dev" / "nvidia3")
    env = plugin.devloop_environment(host=host, resource=gpu, service=None)
    assert [(n.path, n.major, n.minor) for n in env.nodes] == [("/dev/nvidia3", 195, 3), ("/dev/nvidiactl", 195, 255),
                                                                ("/dev/nvidia-uvm", 509, 0)]
    assert env.env == {"DEVICE_LOOP_PCI_ADDRESS": GPU, "NVIDIA_VISIBLE_DEVICES": uuid, "CUDA_VISIBLE_DEVICES": uuid}


def test_a_node_that_is_not_one_is_left_out(tmp_path, tree):
    pci_card(tree, GPU, drm=("renderD128", "card0"))
    (tree.parent / "dev" / "dri").mkdir(parents=True)
    (tree.parent / "dev" / "dri" / "renderD128").write_text("a file, not a node")
    dev_node(tree, "/dev/dri/card0", DRM_MAJOR, 0)
    plugin, host = PciPlugin(), host_of(tmp_path, tree)
    (gpu,) = plugin.devloop_discover(host=host)
    env = plugin.devloop_environment(host=host, resource=gpu, service=None)
    assert [n.path for n in env.nodes] == ["/dev/dri/card0"]
    assert stat.S_ISREG(os.stat(tree.parent / "dev" / "dri" / "renderD128").st_mode)


def test_automatic_names_fit_a_device_name_whatever_the_host(tmp_path, tree):
    pci_card(tree, "0001:81:00.0", class_code=PROCESSING_ACCELERATOR)
    long_host = "rack-12-shelf-3-" + "x" * 48  # 64 characters, as long as a host name may be
    plugin = PciPlugin()
    (card,) = plugin.devloop_discover(host=HostContext(name=long_host, state_dir=tmp_path / "state", sysfs_root=tree))
    assert len(card.device) == 64 and card.device.endswith("-pci-0001-81-00.0") and card.device.startswith("rack-12")
    (other,) = PciPlugin().devloop_discover(host=HostContext(name=long_host[:-1] + "y", state_dir=tmp_path / "state",
                                                               sysfs_root=tree))
    assert other.device != card.device  # (the host's digest keeps two long names apart)


def test_an_entry_whose_ids_no_card_has(tmp_path, tree):
    pci_card(tree, GPU)
    missing = entry("gone", pci_id="1e52:b140")
    plugin, host = PciPlugin(), host_of(tmp_path, tree, [missing])
    assert {r.device for r in plugin.devloop_discover(host=host)} == {"host-a-pci-01-00.0"}
    assert plugin.devloop_check_config(host=host, entry=missing) == "no PCI card has the ids 1e52:b140"


def test_two_cards_gone_from_one_slot_leave_one_device(tmp_path, tree):
    plugin, host = PciPlugin(), host_of(tmp_path, tree)
    for vendor in ("10de", "1002"):  # one card, then another in its slot, then none
        pci_card(tree, GPU, vendor=vendor, port_link=None)
        plugin.devloop_discover(host=host)
        remove_card(tree, GPU)
    (gone,) = plugin.devloop_discover(host=host)
    assert gone.identifier == f"pci:host-a:{GPU}:1002:2330:10de:16c1"  # the one seen last
    assert plugin.devloop_health(host=host, resource=gone).reason == f"{GPU} is gone from the PCI bus"
