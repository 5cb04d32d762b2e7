"""A test is in the areas of the code it touches (tests/areas.py): ``./lab test --area X`` runs them."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import areas

TESTS = Path(__file__).resolve().parent


def test_every_package_and_plugin_is_an_area():
    plugins = {p.name for p in (TESTS.parent / "plugins").iterdir() if (p / "__init__.py").exists()}
    assert plugins and plugins <= areas.all_areas().keys()
    assert {"core", "coordinator", "store", "web", "exporter", "cli", "client", "suite"} <= areas.all_areas().keys()


@pytest.mark.parametrize(("module", "area"), [
    ("device_loop.plugins.uart.ser2net", "uart"), ("device_loop.coordinator.store.core", "store"),
    ("device_loop.coordinator.leases", "coordinator"), ("device_loop.core.protocol", "core"),
    ("device_loop.plugin", None), ("device_loop", None), ("httpx2", None)])
def test_a_module_s_area(module, area):
    assert areas.area_of(module) == area


def test_a_test_module_is_in_what_it_imports_through_helpers_and_what_its_name_says(tmp_path):
    probe = tmp_path / "test_flash_probe.py"
    probe.write_text("import lab_in_process\nfrom device_loop.plugins.uart import ser2net\n")
    assert {"flash", "uart", "coordinator", "core"} <= areas.module_areas(probe)  # (lab_in_process: the coordinator)
    assert "vnc" not in areas.module_areas(probe)
    assert areas.item_areas(TESTS / "test_suite_rules.py", ()) == {"suite"}
    assert {"coordinator", "exporter"} <= areas.item_areas(TESTS / "test_suite_rules.py", {"coordinator", "exporters"})


@pytest.mark.service  # (a pytest of its own: a run that selects by marker)
def test_the_collected_tests_carry_their_areas_as_markers_where_a_run_selects_by_marker():
    def collected(*options: str) -> list[str]:
        listed = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                                 *options, __file__], capture_output=True, text=True, cwd=TESTS.parent)
        return [line.split("::")[1] for line in listed.stdout.splitlines() if "::" in line]
    selected = collected("-m", "suite and not uart")  # (this module's tests are the suite's alone)
    assert "test_every_package_and_plugin_is_an_area" in selected and len(selected) > 5, selected


@pytest.mark.service
def test_an_unknown_area_is_refused_naming_the_areas():
    refused = subprocess.run(["python3", str(TESTS / "areas.py"), "uart", "uartt"], capture_output=True, text=True)
    assert refused.returncode != 0 and "no such area: uartt" in refused.stderr and " vnc " in refused.stderr
    assert subprocess.run(["python3", str(TESTS / "areas.py"), "uart", "store"]).returncode == 0
