"""The plugin surface is one public module, pinned: changing it is a deliberate act. And
docs/plugins.md, which plugin authors write from, names that surface and nothing else."""
import ast
import dataclasses
import re
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import device_loop.plugin
from device_loop.core import hookspecs
from device_loop.core.host import HostContext
from device_loop.core.model import ConfiguredResource, Operation, Resource
from device_loop.core import plugins
from device_loop.core.plugins import PluginSet
from device_loop.core.usage import commands, environment
from conftest import SRC

PUBLIC = [
    "API_VERSION", "CONSOLE_COMMAND", "ConfiguredResource", "Duration", "Endpoint", "EndpointRole", "FlashError",
    "FlashImage",
    "Health", "HealthKind", "ContainerEnvironment", "DeviceNode", "Mount", "device_node", "tty_environment", "HostContext", "LeaseRef", "Operation", "OperationError", "OperationKind", "PluginConfig", "Resource",
    "Service", "ServiceError", "StepKind", "UsbDevice", "UsbTty", "hookimpl", "inherited_listener", "parse_duration",
    "parse_framing", "port_is_free", "python_module", "run", "start_bridge", "start_relay", "usb_devices", "usb_ttys",
    "wait_port_free", "wait_port_open", "command_of", "holders", "PowerReading", "POWER_KIND",
    "find_program", "last_lines", "public_host_key", "pinned_host_key", "LOGIN_NAME_PATTERN", "Fidelity",
    "Purpose", "DiskFormat", "disk_format", "disk_problem",
]
DOCS = SRC / "docs" / "plugins.md"
# what the docs call the objects hooks are handed (``host.entries``, ``op.args``...), and their
# classes (a ``lease`` there may be the client's too: ``lease.operate``)
HANDED = {"host": HostContext, "entry": ConfiguredResource, "resource": Resource, "op": Operation}


def section(title: str) -> str:
    text = DOCS.read_text()
    assert f"\n## {title}\n" in text, f"docs/plugins.md has no section {title!r}"
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def first_cells(text: str, heading: str) -> list[str]:
    """The first cell of each row of the table whose header row starts with ``| heading |``."""
    lines = text.splitlines()
    start = next(n for n, line in enumerate(lines) if line.startswith(f"| {heading} |"))
    rows = []
    for line in lines[start + 2:]:  # (past the header and its | --- | line)
        if not line.startswith("| "):
            break
        rows.append(line.split(" | ")[0])
    assert rows, f"the table under '| {heading} |' has no rows"
    return rows


def documented_names() -> set[str]:
    """The names the table under "The public API" in docs/plugins.md tells plugins to use:
    each `name` (or `name(...)`) in the first cell of its rows."""
    return {name for cell in first_cells(section("The public API"), "name")
            for name in re.findall(r"`([A-Za-z_]\w*)", cell)}


def imported_in_docs() -> set[str]:
    """The names the Python examples of docs/plugins.md import from device_loop.plugin."""
    names = set()
    for block in re.findall(r"```python\n(.*?)```", DOCS.read_text(), re.S):
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.ImportFrom) and node.module == "device_loop.plugin":
                names |= {alias.name for alias in node.names}
    return names


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
    assert len(set(device_loop.plugin.__all__)) == len(device_loop.plugin.__all__), "a name twice in __all__"
    public = sorted(name for name in vars(device_loop.plugin) if not name.startswith("_"))
    assert public == sorted(PUBLIC), "the module has public names that __all__ leaves out (or lacks some of it)"
    plugin_sees = {}
    exec("from device_loop.plugin import *", plugin_sees)  # fails on a name of __all__ the module lacks
    assert sorted(set(plugin_sees) - {"__builtins__"}) == sorted(PUBLIC), "a star import gives exactly the pinned names"
    assert device_loop.plugin.API_VERSION == 2


def test_the_documented_names_are_the_pinned_ones():
    documented = documented_names()
    assert sorted(documented - set(PUBLIC)) == [], "docs/plugins.md tells plugins to use names the API does not have"
    assert sorted(set(PUBLIC) - documented) == [], "public names that docs/plugins.md does not describe"
    imported = imported_in_docs()
    assert {"hookimpl", "start_relay"} <= imported, "the examples of docs/plugins.md were not found"
    assert sorted(imported - set(PUBLIC)) == [], "docs/plugins.md's examples import names the API does not have"
    assert f"| `API_VERSION` | {device_loop.plugin.API_VERSION};" in section("The public API")


def test_the_documented_hooks_are_the_hooks():
    hooks = {name for name in vars(hookspecs) if name.startswith("devloop_")}
    tabled = {name for cell in first_cells(section("The hooks"), "hook") for name in re.findall(r"`(devloop_\w+)", cell)}
    assert sorted(tabled - hooks) == [], "docs/plugins.md's table lists hooks that do not exist"
    assert sorted(hooks - tabled) == [], "hooks that the table in docs/plugins.md does not list"
    named = set(re.findall(r"`(devloop_[a-z_]+)", DOCS.read_text())) - {"devloop_discovr"}  # (its misspelt one)
    for block in re.findall(r"```python\n(.*?)```", DOCS.read_text(), re.S):  # and what its examples implement
        named |= {node.name for node in ast.walk(ast.parse(block))
                  if isinstance(node, ast.FunctionDef) and node.name.startswith("devloop_")}
    assert {"devloop_start", "devloop_operate", "devloop_config_model"} <= named
    assert sorted(named - hooks) == [], "docs/plugins.md names hooks that do not exist"


def test_what_the_docs_say_hooks_are_handed_exists():
    """``host.entries``, ``entry.config``, ``op.progress(...)``: each attribute docs/plugins.md
    names of an object a hook is handed is one that object has."""
    def has(cls, name):
        return hasattr(cls, name) or name in {f.name for f in dataclasses.fields(cls)}
    named = set(re.findall(rf"\b({'|'.join(HANDED)})\.([a-z_]\w*)", DOCS.read_text()))
    assert ("host", "entries") in named, "docs/plugins.md no longer says where a plugin's config entries are"
    assert sorted(f"{obj}.{name}" for obj, name in named if not has(HANDED[obj], name)) == [], \
        "docs/plugins.md names attributes the objects hooks are handed do not have"
    host_row = next(row for row in section("The public API").splitlines() if row.startswith("| `HostContext` |"))
    listed = re.findall(r"`([a-z_]\w*)", host_row.split(" | ", 1)[1].split(" is:", 1)[1])
    assert len(listed) > 10 and sorted(n for n in listed if not has(HostContext, n)) == [], \
        "the HostContext row of docs/plugins.md names what a host does not have"


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
    lease = {"id": "lease-1", "endpoints": [power]}
    assert commands(lease) == ["relayctl --host 10.0.0.7 --port 4000 --outlet 3 on"]
    assert environment(lease) == {"RELAY_ADDRESS": "10.0.0.7:4000", "RELAY_LEASE": "lease-1"}
    gated = {**lease, "endpoints": [{**power, "secret": "s3cret"}]}
    assert commands(gated)[0] == "device-loop forward lease-1"


def test_a_plugin_for_a_newer_api_is_refused_saying_which_version_it_lacks(tmp_path, monkeypatch):
    """A plugin needing API 4 (with a hook this exporter has never heard of) is skipped for
    its version, not for a "typo"; one needing this API, or declaring none, loads."""
    newer, current = device_loop.plugin.API_VERSION + 2, device_loop.plugin.API_VERSION
    for name, needs in (("devloop_newer", newer), ("devloop_current", current)):
        (tmp_path / f"{name}.py").write_text(
            "from device_loop.plugin import hookimpl\n"
            f"DEVLOOP_API_VERSION = {needs}\n"
            "@hookimpl\ndef devloop_discover(host):\n    return []\n"
            + ("@hookimpl\ndef devloop_hook_of_the_future(host):\n    return None\n" if needs == newer else ""))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(plugins.LOAD_ENV, raising=False)
    monkeypatch.setattr(plugins, "entry_points", lambda group: [
        EntryPoint(name, f"devloop_{name}", group) for name in ("newer", "current")])
    try:
        loaded = PluginSet()
    finally:
        for name in ("devloop_newer", "devloop_current"):
            sys.modules.pop(name, None)
    skipped = {s["name"]: s["reason"] for s in loaded.skipped}
    assert loaded.names() == ["current"] and list(skipped) == ["newer"]
    assert f"needs device-loop's plugin API {newer}" in skipped["newer"]
    assert f"this exporter has API {current}: it lacks versions {current + 1}, {newer}" in skipped["newer"]
    assert "typo" not in skipped["newer"]
