"""The plugin surface is one public module, pinned: changing it is a deliberate act."""
import ast
import re
from pathlib import Path

import device_loop.plugin
from device_loop.core.plugins import PluginSet
from device_loop.core.usage import commands, environment
from conftest import SRC

PUBLIC = [
    "API_VERSION", "CONSOLE_COMMAND", "ConfiguredResource", "Endpoint", "EndpointRole", "FlashError", "FlashImage",
    "Health", "HostContext", "LeaseRef", "Operation", "OperationError", "OperationKind", "PluginConfig", "Resource",
    "Service", "ServiceError", "UsbDevice", "UsbTty", "hookimpl", "inherited_listener", "parse_duration",
    "parse_framing", "port_is_free", "python_module", "run", "start_bridge", "start_relay", "usb_devices", "usb_ttys",
    "wait_port_free", "wait_port_open",
]
DOCS = SRC / "docs" / "plugins.md"


def documented_names() -> set[str]:
    """The names the table under "The public API" in docs/plugins.md tells plugins to use:
    each `name` (or `name(...)`) in the first cell of its rows."""
    section = DOCS.read_text().split("\n## The public API\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| ---")][1:]
    return {name for row in rows for name in re.findall(r"`([A-Za-z_]\w*)", row.split(" | ")[0])}


def imports_of(path: Path) -> set[str]:
    """The absolute modules a file imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.add(node.module)
    return found


def test_the_public_names_are_pinned():
    assert sorted(device_loop.plugin.__all__) == sorted(PUBLIC), \
        "the plugin API changed: update PUBLIC, docs/plugins.md and API_VERSION together"
    plugin_sees = {}
    exec("from device_loop.plugin import *", plugin_sees)  # fails on a name of __all__ the module lacks
    assert sorted(set(plugin_sees) - {"__builtins__"}) == sorted(PUBLIC), "a star import gives exactly the pinned names"
    assert device_loop.plugin.API_VERSION == 2


def test_the_documented_names_are_the_pinned_ones():
    documented = documented_names()
    assert len(documented) > 20, "the table under 'The public API' in docs/plugins.md was not found"
    assert sorted(documented - set(PUBLIC)) == [], "docs/plugins.md tells plugins to use names the API does not have"
    assert sorted(set(PUBLIC) - documented) == [], "public names that docs/plugins.md does not describe"


def test_plugins_import_only_the_public_api():
    files = [*SRC.glob("plugins/**/*.py"), *SRC.glob("examples/*/*/*.py")]
    assert len(files) >= 9
    for path in files:
        ours = {m for m in imports_of(path) if m.split(".")[0] == "device_loop"}
        assert ours <= {"device_loop.plugin"}, f"{path.relative_to(SRC)} imports {sorted(ours)}"


def test_core_does_not_import_the_plugins():
    for path in SRC.glob("core/*.py"):
        assert not any(m.startswith("device_loop.plugins") for m in imports_of(path)), path.name


def test_each_exporter_has_its_own_plugin_objects():
    first, second = PluginSet(), PluginSet()
    assert first.pm.get_plugin("sim") is not second.pm.get_plugin("sim"), "plugin state must not be shared"
    assert first.pm.get_plugin("adb").serving is not second.pm.get_plugin("adb").serving


def test_a_new_endpoint_kind_says_how_it_is_used():
    power = {"kind": "power", "host": "10.0.0.7", "port": 4000, "params": {"outlet": 3},
             "command": "relayctl --host {host} --port {port} --outlet {outlet} on",
             "env": {"RELAY_ADDRESS": "{host}:{port}", "RELAY_LEASE": "{lease}"}}
    lease = {"id": "lease-1", "endpoints": [power], "secret": None}
    assert commands(lease) == ["relayctl --host 10.0.0.7 --port 4000 --outlet 3 on"]
    assert environment(lease) == {"RELAY_ADDRESS": "10.0.0.7:4000", "RELAY_LEASE": "lease-1"}
    gated = {**lease, "secret": "s3cret"}
    assert commands(gated)[0] == "device-loop forward lease-1"
