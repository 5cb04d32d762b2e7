"""A lease's CDI spec (docs/architecture.md, "Containers and CDI"): valid for the CDI JSON
schema (Debian's golang-github-container-orchestrated-devices-container-device-interface-dev),
at the lowest cdiVersion its fields need by the reference library's rules, named as CDI
allows; a plugin's hostile environment is dropped, never the lease."""
import json
import logging
import os
import threading
from pathlib import Path

import pytest

from device_loop.core.cdi_spec import CdiRefused, cdi_spec, spec_file_name
from device_loop.core.cdi_version import required_version, version_key
from device_loop.core.container_env import ContainerEnvironment, DeviceNode, Mount, tty_environment
from device_loop.core.host import HostContext
from device_loop.core.model import Resource, Service
from device_loop.core.plugins import PluginSet
from device_loop.core.protocol import EnvironmentReport
from device_loop.exporter.cdi import CdiFolder, ask_environment, environment_report
from device_loop.exporter.hook_deadlines import HookDeadlines
from device_loop.plugin import hookimpl

SCHEMA_PACKAGE = "golang-github-container-orchestrated-devices-container-device-interface-dev"


def schema_folder() -> Path:
    found = sorted(Path("/usr/share/gocode").glob("src/github.com/*/container-device-interface/schema/schema.json"))
    if not found:
        pytest.skip(f"the CDI JSON schema is not installed (apt-get install {SCHEMA_PACKAGE})")
    return found[0].parent


def validate(spec: dict) -> None:
    """``spec`` against the CDI schema (schema.json, which refers to defs.json)."""
    import jsonschema
    from referencing import Registry
    from referencing.jsonschema import DRAFT7

    folder = schema_folder()
    schema = json.loads((folder / "schema.json").read_text())
    defs = DRAFT7.create_resource(json.loads((folder / "defs.json").read_text()))
    jsonschema.Draft7Validator(schema, registry=Registry().with_resource("defs.json", defs)).validate(spec)


def node(path="/dev/device-loop/console", host_path="/dev/ttyUSB0", major=188, minor=0, mode=0o660):
    return {"path": path, "host_path": host_path, "node_type": "c", "major": major, "minor": minor, "file_mode": mode,
            "permissions": "rw"}


def env_report(**fields) -> EnvironmentReport:
    return EnvironmentReport.model_validate(fields)


SIM = env_report(mounts=[{"host_path": "/state/sim/sim-board-0", "container_path": "/dev/device-loop/console",
                          "options": ["bind", "rw"]}], env={"DEVICE_LOOP_CONSOLE": "/dev/device-loop/console"})
UART = env_report(nodes=[node()], env={"DEVICE_LOOP_CONSOLE": "/dev/device-loop/console"})
ADB = env_report(env={"ADB_SERVER_SOCKET": "tcp:127.0.0.1:5037", "ANDROID_SERIAL": "R58M12345"})
PCI = env_report(nodes=[node("/dev/dri/renderD128", "/dev/dri/renderD128", 226, 128),
                        node("/dev/nvidia0", "/dev/nvidia0", 195, 0), node("/dev/nvidiactl", "/dev/nvidiactl", 195, 255)],
                 env={"NVIDIA_VISIBLE_DEVICES": "0"})


@pytest.mark.parametrize("environment", [SIM, UART, ADB, PCI], ids=["sim-pty", "uart-tty", "adb", "pci"])
def test_what_the_plugins_state_makes_a_valid_spec_podman_4_3_reads(environment):
    spec = cdi_spec("sim-board", "sim-board-0", [environment])
    validate(spec.spec)
    assert spec.spec["kind"] == "device-loop.dev/sim-board"
    assert [d["name"] for d in spec.spec["devices"]] == ["sim-board-0"]
    assert spec.qualified == "device-loop.dev/sim-board=sim-board-0"
    assert version_key(spec.version) <= version_key("0.5.0") and spec.old_runtimes_read_it
    assert json.loads(spec.text()) == spec.spec


def test_the_edits_are_the_union_of_the_resources_environments_the_first_keeping_a_path():
    other = env_report(mounts=[{"host_path": "/elsewhere", "container_path": "/dev/device-loop/console"}],
                       env={"DEVICE_LOOP_CONSOLE": "/x", "EXTRA": "1"})
    edits = cdi_spec("sim-board", "sim-board-0", [SIM, ADB, other]).spec["devices"][0]["containerEdits"]
    assert [m["hostPath"] for m in edits["mounts"]] == ["/state/sim/sim-board-0"]
    assert edits["env"] == ["DEVICE_LOOP_CONSOLE=/dev/device-loop/console", "ADB_SERVER_SOCKET=tcp:127.0.0.1:5037",
                            "ANDROID_SERIAL=R58M12345", "EXTRA=1"]
    (device_node,) = cdi_spec("uart", "jupiter", [UART]).spec["devices"][0]["containerEdits"]["deviceNodes"]
    assert device_node == {"path": "/dev/device-loop/console", "hostPath": "/dev/ttyUSB0", "type": "c", "major": 188,
                           "minor": 0, "fileMode": 0o660, "permissions": "rw"}


def test_nothing_a_container_needs_is_no_spec():
    assert cdi_spec("camera", "cam-1", []) is None
    assert cdi_spec("camera", "cam-1", [env_report()]) is None


def base() -> dict:
    return {"cdiVersion": "", "kind": "device-loop.dev/board",
            "devices": [{"name": "b0", "containerEdits": {"env": ["A=1"]}}]}


def with_edit(key, value) -> dict:
    spec = base()
    spec["devices"][0]["containerEdits"][key] = value
    return spec


@pytest.mark.parametrize("spec, version", [
    (base(), "0.3.0"),
    (with_edit("mounts", [{"hostPath": "/a", "containerPath": "/b"}]), "0.3.0"),
    (with_edit("mounts", [{"hostPath": "/a", "containerPath": "/b", "type": "bind"}]), "0.4.0"),
    (with_edit("deviceNodes", [{"path": "/dev/a"}]), "0.3.0"),
    (with_edit("deviceNodes", [{"path": "/dev/a", "hostPath": "/dev/b"}]), "0.5.0"),
    ({**base(), "devices": [{"name": "0board", "containerEdits": {}}]}, "0.5.0"),
    ({**base(), "containerEdits": {"deviceNodes": [{"path": "/dev/a", "hostPath": "/dev/b"}]}}, "0.5.0"),
    ({**base(), "annotations": {"a": "b"}}, "0.6.0"),
    ({**base(), "devices": [{"name": "b0", "annotations": {"a": "b"}, "containerEdits": {}}]}, "0.6.0"),
    ({**base(), "kind": "device-loop.dev/sim.board"}, "0.6.0"),
    (with_edit("additionalGids", [5]), "0.7.0"),
    (with_edit("intelRdt", {"closID": "x"}), "0.7.0"),
    (with_edit("intelRdt", {"schemata": ["L3:0=f"]}), "1.1.0"),
    ({**base(), "containerEdits": {"netDevices": [{"hostInterfaceName": "eth1", "name": "eth0"}]}}, "1.1.0"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_a_field_needing_a_newer_cdi_version_raises_it(spec, version):
    assert required_version(spec) == version


def test_a_dotted_class_is_written_at_0_6_0_and_said_to_be_past_podman_4_3():
    spec = cdi_spec("sim.board", "b0", [SIM])
    assert spec.version == "0.6.0" and not spec.old_runtimes_read_it


@pytest.mark.parametrize("device_class, device, why", [
    ("x", "b0", "one-letter"),            # valid CDI, but podman 4.3 panics on it
    ("0board", "b0", "begins with a letter"),
    ("sim board", "b0", "begins with a letter"),
    ("board-", "b0", "begins with a letter"),
    ("board", "b0-", "begins and ends"),
    ("board", "b0/..", "begins and ends"),
])
def test_a_name_cdi_cannot_take_is_refused_not_renamed(device_class, device, why):
    with pytest.raises(CdiRefused, match=why):
        cdi_spec(device_class, device, [SIM])


# ---- a plugin's answer, held to the bounds --------------------------------------------------

def test_hostile_environments_are_refused_as_they_are_made():
    with pytest.raises(ValueError, match="world-writable"):
        DeviceNode("/dev/a", "/dev/a", "c", 1, 3, 0o666)
    with pytest.raises(ValueError, match="at most 32 nodes"):
        ContainerEnvironment(nodes=tuple(DeviceNode(f"/dev/a{n}", "/dev/a", "c", 1, 3, 0o660) for n in range(33)))
    with pytest.raises(ValueError, match="name"):
        ContainerEnvironment(env={"lower-case": "x"})
    with pytest.raises(ValueError, match=r"'\.\.'"):
        Mount("/dev/../etc", "/x")


def test_an_answer_altered_after_it_was_made_is_still_held_to_the_bounds():
    environment = ContainerEnvironment(nodes=(DeviceNode("/dev/a", "/dev/a", "c", 1, 3, 0o660),))
    object.__setattr__(environment.nodes[0], "file_mode", 0o666)
    with pytest.raises(ValueError, match="world-writable"):
        environment_report(environment)
    with pytest.raises(ValueError, match="ContainerEnvironment"):
        environment_report({"env": {"A": "1"}})
    huge = ContainerEnvironment(env={f"V{n}": "x" * 1024 for n in range(64)})
    with pytest.raises(ValueError, match="bytes"):
        environment_report(huge)


class Hostile:
    """A plugin whose devloop_environment does what ``how`` says."""

    def __init__(self, how: str):
        self.how, self.release = how, threading.Event()

    @hookimpl
    def devloop_environment(self, host, resource, service):
        if self.how == "raise":
            return ContainerEnvironment(env={"bad name": "x"})
        if self.how == "dict":
            return {"env": {"A": "1"}}
        if self.how == "hang":
            self.release.wait(30)
        return ContainerEnvironment(env={"A": "1"})


@pytest.mark.parametrize("how, logged", [("raise", "dropped"), ("dict", "dropped"), ("hang", "timed out"),
                                         ("fine", None)])
def test_a_hostile_answer_is_dropped_and_logged(tmp_path, caplog, how, logged):
    plugins = PluginSet(enable=[])
    plugin = Hostile(how)
    plugins.pm.register(plugin, name="hostile")
    host = HostContext(name="host-a", state_dir=tmp_path)
    resource = Resource(device="b0", kind="thing", identifier="thing:1", plugin="hostile")
    with caplog.at_level(logging.ERROR, logger="device_loop.exporter"):
        answer = ask_environment(plugins, HookDeadlines(0.2), host, resource, Service(endpoints=[]))
    plugin.release.set()
    if logged is None:
        assert answer == EnvironmentReport(env={"A": "1"})
    else:
        assert answer is None and logged in caplog.text


def test_a_tty_is_a_node_and_a_pty_a_mount(tmp_path):
    leader, follower = os.openpty()
    try:
        link = tmp_path / "console"
        link.symlink_to(os.ttyname(follower))
        pty = tty_environment(str(link))
        assert pty.nodes == () and [(m.host_path, m.container_path, m.options) for m in pty.mounts] == [
            (str(link), "/dev/device-loop/console", ("bind", "rw"))]
        assert dict(pty.env) == {"DEVICE_LOOP_CONSOLE": "/dev/device-loop/console"}
    finally:
        os.close(leader)
        os.close(follower)
    tty = tty_environment("/dev/null")  # a character device that is not a pty: a node
    assert [(n.path, n.host_path, n.type, n.major, n.minor) for n in tty.nodes] == [
        ("/dev/device-loop/console", "/dev/null", "c", 1, 3)]
    assert tty.nodes[0].file_mode & 0o002 == 0
    with pytest.raises(ValueError, match="not a character device"):
        tty_environment(str(tmp_path))


# ---- the folder ----------------------------------------------------------------------------

def test_the_folder_holds_this_hosts_specs_and_never_touches_another_hosts(tmp_path):
    spec = cdi_spec("sim-board", "sim-board-0", [SIM])
    ours, theirs = CdiFolder(tmp_path, "host-a"), CdiFolder(tmp_path, "host-a_b")
    theirs.sync({"lease-00000000000000bb": spec})
    (tmp_path / "other-vendor.json").write_text("{}")
    ours.sync({"lease-00000000000000aa": spec})
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "device-loop_host-a_b_lease-00000000000000bb.json", "device-loop_host-a_lease-00000000000000aa.json",
        "other-vendor.json"]
    assert json.loads(ours.path("lease-00000000000000aa").read_text()) == spec.spec
    ours.sync({})
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "device-loop_host-a_b_lease-00000000000000bb.json", "other-vendor.json"]
    assert theirs.leases() == {"lease-00000000000000bb"}


def test_a_folder_that_cannot_be_written_is_logged_not_raised(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with caplog.at_level(logging.ERROR, logger="device_loop.exporter"):
        CdiFolder(blocker / "cdi", "host-a").sync({"lease-00000000000000aa": cdi_spec("sim-board", "b0", [SIM])})
    assert "cannot write the CDI spec" in caplog.text


def test_two_exporters_of_one_name_remove_only_the_specs_each_wrote(tmp_path):
    """Two labs on one machine: both exporters take its host name; each keeps a list of the
    specs it wrote in its state folder, and a restarted one still removes what it left."""
    spec = cdi_spec("sim-board", "sim-board-0", [SIM])
    folder = tmp_path / "cdi"
    first = CdiFolder(folder, "vm", ledger=tmp_path / "one" / "cdi-specs")
    second = CdiFolder(folder, "vm", ledger=tmp_path / "two" / "cdi-specs")
    first.sync({"lease-00000000000000aa": spec})
    second.sync({"lease-00000000000000bb": spec})
    second.sync({})  # the second lab's pass: the first's spec is not its own
    assert sorted(p.name for p in folder.iterdir()) == ["device-loop_vm_lease-00000000000000aa.json"]
    restarted = CdiFolder(folder, "vm", ledger=tmp_path / "one" / "cdi-specs")  # after a crash
    assert restarted.leases() == {"lease-00000000000000aa"}
    restarted.sync({})
    assert list(folder.iterdir()) == []
    assert (tmp_path / "one" / "cdi-specs").read_text() == ""


@pytest.mark.parametrize("lease", ["lease-../../../tmp/x", "lease-a/b", "lease-a_b", "../lease-aa", "lease-"])
def test_a_lease_id_that_is_no_file_name_gets_no_spec(tmp_path, caplog, lease):
    folder = tmp_path / "cdi"
    with caplog.at_level(logging.ERROR, logger="device_loop.exporter"):
        CdiFolder(folder, "host-a", ledger=tmp_path / "cdi-specs").sync(
            {lease: cdi_spec("sim-board", "b0", [SIM]), "lease-00000000000000aa": cdi_spec("sim-board", "b0", [SIM])})
    assert [p.name for p in folder.iterdir()] == ["device-loop_host-a_lease-00000000000000aa.json"]
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == [
        "cdi-specs", "device-loop_host-a_lease-00000000000000aa.json"]
    assert "not a lease id" in caplog.text
    with pytest.raises(ValueError):
        spec_file_name("host-a", lease)


def test_the_report_holds_an_environment_to_the_plugins_own_bounds():
    """An exporter's report is held to what ContainerEnvironment allows a plugin: one set of bounds."""
    from pydantic import ValidationError

    from device_loop.core import container_env
    from device_loop.core.protocol import EnvironmentReport
    for hostile in ({"env": {"lower_case": "x"}}, {"env": {f"V{i}": "x" for i in range(container_env.MAX_ENV + 1)}},
                    {"mounts": [{"host_path": "/a", "container_path": "/b",
                                 "options": ["bind"] * (container_env.MAX_OPTIONS + 1)}]},
                    {"nodes": [{"path": "/dev/x", "host_path": "/dev/x", "node_type": "c", "major": 1, "minor": 3,
                                "file_mode": 0o660, "permissions": "wr"}]}):
        with pytest.raises(ValidationError):
            EnvironmentReport.model_validate(hostile)
    assert EnvironmentReport.model_validate({"env": {"DEVICE_LOOP_CONSOLE": "/dev/device-loop/console"}}).env
