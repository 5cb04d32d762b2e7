"""NVIDIA cards' health beside sysfs: one nvidia-smi query (a fake one on PATH: this machine
has no NVIDIA driver) for all cards within a period, whatever the number of checks and
threads, with a timeout; what it says in words."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from device_loop.core.host import HostContext
from device_loop.plugins.pci import PciPlugin, nvidia
from fake_pci import nvidia_information, pci_card
from lab_in_process import FakeClock

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]  # (it runs the fake nvidia-smi)

CARDS = {"0000:01:00.0": "GPU-11111111-1111-1111-1111-111111111111",
         "0000:41:00.0": "GPU-22222222-2222-2222-2222-222222222222",
         "0000:81:00.0": "GPU-33333333-3333-3333-3333-333333333333",
         "0000:c1:00.0": "GPU-44444444-4444-4444-4444-444444444444"}
ROWS = ("00000000:01:00.0, GPU-11111111-1111-1111-1111-111111111111, 41, 0\n"
        "00000000:41:00.0, GPU-22222222-2222-2222-2222-222222222222, [GPU requires reset], [GPU requires reset]\n"
        "00000000:C1:00.0, GPU-44444444-4444-4444-4444-444444444444, 77, 2\n")  # (81:00.0: fallen off the bus)


@pytest.fixture
def lab(tmp_path, monkeypatch):
    """A fake tree of four NVIDIA GPUs and a fake nvidia-smi that counts its calls."""
    root = tmp_path / "sys"
    for number, (address, uuid) in enumerate(CARDS.items()):
        pci_card(root, address, driver="nvidia")
        nvidia_information(root, address, uuid, minor=number)
    pci_card(root, "0000:09:00.0", vendor="1002", device="744c", driver="amdgpu")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "rows").write_text(ROWS)
    script = bin_dir / "nvidia-smi"
    script.write_text(f"#!/bin/sh\necho call >> {tmp_path / 'calls'}\n"
                      f"[ -f {tmp_path / 'hang'} ] && exec sleep 30\n"
                      f"[ -f {tmp_path / 'broken'} ] && {{ echo \"NVIDIA-SMI has failed because it couldn't "
                      f"communicate with the NVIDIA driver.\"; exit 9; }}\n"
                      f"[ \"$1\" = \"--query-gpu={','.join(nvidia.FIELDS)}\" ] || exit 2\n"
                      f"cat {tmp_path / 'rows'}\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    plugin = PciPlugin()
    plugin.smi.clock = FakeClock(1000.0)
    host = HostContext(name="h", state_dir=tmp_path / "state", sysfs_root=root)
    resources = {plugin.cards[r.identifier].address: r for r in plugin.devloop_discover(host=host)}

    def calls():
        return len((tmp_path / "calls").read_text().splitlines()) if (tmp_path / "calls").exists() else 0
    return plugin, host, resources, calls, tmp_path


def health_of_all(plugin, host, resources):
    """Every card checked at once, in threads, as the exporter checks a scan's resources."""
    with ThreadPoolExecutor(len(resources)) as pool:
        answers = {a: pool.submit(plugin.devloop_health, host=host, resource=r) for a, r in resources.items()}
    return {a: (f.result().status, f.result().reason) for a, f in answers.items()}


def test_one_query_for_all_cards_in_a_period_and_what_it_says(lab):
    plugin, host, resources, calls, _ = lab
    assert health_of_all(plugin, host, resources) == {
        "0000:01:00.0": ("ok", ""),
        "0000:41:00.0": ("failed", "nvidia-smi: temperature.gpu is [GPU requires reset]"),
        "0000:81:00.0": ("failed", "nvidia-smi does not list it"),
        "0000:c1:00.0": ("degraded", "uncorrected ECC errors: 2"),
        "0000:09:00.0": ("ok", "")}  # (an AMD card: sysfs alone)
    assert calls() == 1
    assert plugin.devloop_thermal(host=host, resource=resources["0000:01:00.0"]) == {"gpu": 41.0}
    assert calls() == 1
    plugin.smi.clock.now += nvidia.TTL_S  # the next period (or a re-check 1-2 s after a change)
    health_of_all(plugin, host, resources)
    assert calls() == 2


def test_a_driver_that_does_not_answer(lab, monkeypatch):
    plugin, host, resources, calls, folder = lab
    (folder / "broken").touch()
    said = health_of_all(plugin, host, resources)
    assert said["0000:01:00.0"] == ("failed", "nvidia-smi failed: NVIDIA-SMI has failed because it couldn't "
                                              "communicate with the NVIDIA driver.")
    (folder / "broken").unlink()
    (folder / "hang").touch()
    monkeypatch.setattr(nvidia, "TIMEOUT_S", 0.5)
    plugin.smi.clock.now += nvidia.TTL_S
    said = health_of_all(plugin, host, resources)
    assert said["0000:01:00.0"][0] == "failed" and "did not finish within 0.5s" in said["0000:01:00.0"][1]
    assert calls() == 2 and said["0000:09:00.0"] == ("ok", "")


def test_no_nvidia_smi_no_query(lab, monkeypatch):
    plugin, host, resources, calls, _ = lab
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert set(health_of_all(plugin, host, resources).values()) == {("ok", "")}  # (sysfs says they are fine)
    assert calls() == 0
