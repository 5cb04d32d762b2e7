"""A plugin installed with pip is found through the entry point and serves its device."""
import os
import socket
import subprocess
import sys

import pytest

from conftest import BUILT_IN_PLUGINS, SRC, Exporter, wait_for
from device_loop.core.plugins import LOAD_ENV
from helpers import reserve, wait_active, wait_state

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]


def test_pip_installed_plugin_serves_its_device(tmp_path, env, coordinator, echo_server):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--disable-pip-version-check",
                    "--target", str(target), str(SRC / "examples" / "devloop-netconsole")],
                   check=True, capture_output=True, timeout=120)
    plugin_env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(target), env.get("PYTHONPATH")])),
                  LOAD_ENV: f"{BUILT_IN_PLUGINS},netconsole"}
    devices = [{"name": "bmc-7", "class": "bmc", "plugin": "netconsole",
                "address": f"127.0.0.1:{echo_server}", "serial": "CS3-PORT7"}]
    exporter = Exporter(tmp_path, plugin_env, coordinator.url, devices)
    try:
        wait_state(coordinator, "bmc-7", "idle")
        info = coordinator.api("/devices/bmc-7").json()
        assert info["resources"][0] | {} == {**info["resources"][0], "plugin": "netconsole",
                                             "identifier": "netconsole:CS3-PORT7"}
        host = coordinator.api("/hosts").json()[0]
        assert "netconsole" in host["plugins"]["loaded"]

        lease = wait_active(coordinator, reserve(coordinator, "bmc-7")["id"])
        (endpoint,) = lease["endpoints"]
        with socket.create_connection((endpoint["host"], endpoint["port"]), timeout=5) as conn:
            conn.sendall(b"hello\n")
            assert wait_for(lambda: conn.recv(1024), what="relay answer") == b"console: hello\n"
        coordinator.api(f"/leases/{lease['id']}/release", "POST")
        wait_state(coordinator, "bmc-7", "idle")
    finally:
        exporter.stop()


def test_plugin_is_absent_without_the_package(tmp_path, env, coordinator):
    devices = [{"name": "sim-board-0", "plugin": "sim"},
               {"name": "bmc-7", "plugin": "netconsole", "address": "127.0.0.1:1", "serial": "X"}]
    exporter = Exporter(tmp_path, env, coordinator.url, devices)
    try:
        wait_state(coordinator, "sim-board-0", "idle")
        assert coordinator.api("/devices/bmc-7").status_code == 404
        (host,) = coordinator.api("/hosts").json()
        assert host["plugins"]["unserved"] == [{"device": "bmc-7", "plugin": "netconsole",
                                                "reason": "plugin 'netconsole' is not installed (or disabled in [plugins])"}]
        assert "device bmc-7 will not be served" in exporter.output()
    finally:
        exporter.stop()
