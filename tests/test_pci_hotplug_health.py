"""A PCI card pulled out and put back (hot-plug) under the adaptive health schedule
(docs/architecture.md, "Health that heals"), through an exporter's own scan, schedule and
report on a fake clock: pulled out once and back before its re-check, it is never reported
failed; pulled out for good, it is failed (transient, with the reason) on its second failed
check and not its first, then ok again on its second good one."""
from __future__ import annotations

import pytest

from device_loop.core.ports import free_port
from device_loop.core.vocabulary import HealthKind
from device_loop.exporter.config import parse_config
from device_loop.exporter.daemon import Exporter
from fake_pci import pci_card, put_back, remove_card
from lab_in_process import FakeClock

pytestmark = pytest.mark.timeout(60)

GPU = "0000:01:00.0"
PERIOD_S, RECHECK_S = 10.0, 1.5


@pytest.fixture
def lab(tmp_path):
    """An exporter (in this process, never started: driven by hand) with one GPU in a fake tree."""
    sysfs = tmp_path / "sys"
    real = pci_card(sysfs, GPU, driver="amdgpu", drm=("renderD128",))
    exporter = Exporter(parse_config({
        "exporter": {"name": "host-a", "state_dir": str(tmp_path / "state"), "sysfs_root": str(sysfs),
                     "cdi_dir": str(tmp_path / "cdi"), "health_period": PERIOD_S, "health_recheck": RECHECK_S,
                     "coordinator": f"http://127.0.0.1:{free_port()}"},  # nobody listens: its goodbye goes nowhere
        "plugins": {"enable": ["pci"]},  # (the others' start-up runs tools: this test starts no process)
        "devices": [{"name": "gpu-a", "plugin": "pci", "address": GPU}]}))
    exporter.setup()
    clock = FakeClock(1000.0)
    exporter.reporter.schedule.clock = clock
    try:
        yield exporter, clock, sysfs, real
    finally:
        exporter.shutdown()


def reported(exporter) -> tuple[str, str]:
    """The GPU's health and reason in the exporter's next report."""
    (device,) = [d for d in exporter.report().devices if d.name == "gpu-a"]
    (resource,) = device.resources
    return resource.health, resource.reason


def next_check(exporter, clock, expected_gap: float) -> bool:
    """Go to the GPU's next due check (``expected_gap`` after now) and run what is due, as the
    exporter's loop does at that time (a scan first: discovery keeps a card that is gone)."""
    due = exporter.reporter.schedule.next_due()
    assert due == pytest.approx(clock.now + expected_gap), (due, clock.now)
    clock.now = due
    exporter.reporter.resources = exporter.discover()
    return exporter.reporter.check_health()


def test_pulled_out_once_and_back_is_never_failed_pulled_out_for_good_is_on_the_second_check(lab):
    exporter, clock, sysfs, real = lab
    exporter.report(scan=True)
    assert reported(exporter) == ("ok", "")
    identifier = exporter.reporter.resources[0].identifier

    kept = remove_card(sysfs, GPU)  # pulled out...
    assert next_check(exporter, clock, PERIOD_S) is False  # its first failed check: nothing reported yet
    assert reported(exporter) == ("ok", "")
    put_back(sysfs, GPU, kept, real)  # ...and back before the re-check, 1-2 s later
    assert next_check(exporter, clock, RECHECK_S) is False
    assert reported(exporter) == ("ok", "") and exporter.reporter.schedule.next_due() == clock.now + PERIOD_S

    kept = remove_card(sysfs, GPU)  # pulled out for good
    assert next_check(exporter, clock, PERIOD_S) is False
    assert reported(exporter) == ("ok", "")
    assert next_check(exporter, clock, RECHECK_S) is True  # the second failure in a row
    assert reported(exporter) == ("failed", f"{GPU} is gone from the PCI bus")
    assert exporter.reporter.schedule.reported(identifier).kind == HealthKind.TRANSIENT

    put_back(sysfs, GPU, kept, real)
    assert next_check(exporter, clock, PERIOD_S) is False  # one good check is not yet ok
    assert reported(exporter)[0] == "failed"
    assert next_check(exporter, clock, RECHECK_S) is True
    assert reported(exporter) == ("ok", "")
