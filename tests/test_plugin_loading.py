"""A broken plugin cannot take the exporter down: real packages, installed with pip."""
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import BUILT_IN_PLUGINS, Exporter, sim_devices
from device_loop.core.plugins import LOAD_ENV
from helpers import wait_state

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]

PACKAGES = {
    # fails to import (a dependency that is not there); says so in a file when it is tried
    "broken": """
        import os
        open(os.environ["DEVLOOP_TEST_MARKER"], "w").close()
        raise ImportError("needs libfoo, which is not installed")
    """,
    # a misspelt hook: pluggy alone would never call it, and nobody would know why
    "typo": """
        from device_loop.plugin import hookimpl

        @hookimpl
        def devloop_discovr(host):
            return []
    """,
}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The two packages, pip-installed into a folder of their own."""
    root = tmp_path_factory.mktemp("plugins")
    for name, source in PACKAGES.items():
        package = root / name
        (package / f"devloop_{name}").mkdir(parents=True)
        (package / f"devloop_{name}" / "__init__.py").write_text(textwrap.dedent(source))
        (package / "pyproject.toml").write_text(textwrap.dedent(f"""
            [build-system]
            requires = ["setuptools>=61"]
            build-backend = "setuptools.build_meta"
            [project]
            name = "devloop-{name}"
            version = "0.1.0"
            [project.entry-points.device_loop]
            {name} = "devloop_{name}"
            [tool.setuptools]
            packages = ["devloop_{name}"]
        """))
    target = root / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--disable-pip-version-check",
                    "--target", str(target), *(str(root / name) for name in PACKAGES)],
                   check=True, capture_output=True, timeout=120)
    return target


def plugin_env(env, site, marker):
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")])),
            LOAD_ENV: f"{BUILT_IN_PLUGINS},broken,typo",
            "DEVLOOP_TEST_MARKER": str(marker)}


def test_broken_plugins_are_skipped_with_their_reason_and_the_rest_serves(tmp_path, env, coordinator, site):
    marker = tmp_path / "imported"
    exporter = Exporter(tmp_path, plugin_env(env, site, marker), coordinator.url, sim_devices("sim-board-0"))
    try:
        wait_state(coordinator, "sim-board-0", "idle")
        (host,) = coordinator.api("/hosts").json()
        skipped = {s["name"]: s["reason"] for s in host["plugins"]["skipped"]}
        assert marker.exists() and "needs libfoo, which is not installed" in skipped["broken"]
        assert "devloop_discovr is not a device-loop hook" in skipped["typo"]
        assert "sim" in host["plugins"]["loaded"]
    finally:
        exporter.stop()


def test_a_plugin_left_out_by_the_config_is_never_imported(tmp_path, env, coordinator, site):
    marker = tmp_path / "imported"
    exporter = Exporter(tmp_path, plugin_env(env, site, marker), coordinator.url, sim_devices("sim-board-0"),
                        plugins={"enable": ["sim"]})
    try:
        wait_state(coordinator, "sim-board-0", "idle")
        (host,) = coordinator.api("/hosts").json()
        assert host["plugins"]["loaded"] == ["sim"] and host["plugins"]["skipped"] == []
        assert not marker.exists(), "the uninstallable package was imported though [plugins] left it out"
    finally:
        exporter.stop()
