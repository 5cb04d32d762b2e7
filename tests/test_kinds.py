"""Kinds are registered, not spelled (docs/architecture.md, "Operations"): the coordinator's
words for a kind come from one entry (coordinator/kinds.py), and a kind with none (a
plugin's) has the words every operation has."""
from device_loop.coordinator import kinds
from device_loop.core import FLASH_KIND


def test_a_kind_s_words_come_from_its_entry_and_a_plugin_s_kind_has_the_common_ones():
    flash = kinds.of(FLASH_KIND)
    assert (flash.busy_code, flash.doing, flash.missing_code) == ("flash_running", "flashed", "no_flash_target")
    assert "{device} has no flash target" in flash.missing
    plugin_s = kinds.of("capture-boot-log")
    assert (plugin_s.busy_code, plugin_s.doing, plugin_s.missing) == (
        "operation_running", "operated on (capture-boot-log)", None)
    assert kinds.of(None).doing == "operated on"
