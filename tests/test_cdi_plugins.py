"""What the uart and adb plugins say a container needs (docs/architecture.md, "Containers and
CDI"): a UART's tty (a pty as a bind mount, at /dev/device-loop/console), a phone's lease
server as ADB_SERVER_SOCKET with its serial; both as the exporter writes them."""
import json

import pytest

from conftest import uart_device
from device_loop.core.host import HostContext
from device_loop.core.model import Endpoint, Resource, Service
from device_loop.core.vocabulary import EndpointRole
from device_loop.plugins.adb import AdbPlugin
from exporter_testkit import converge, in_process_exporter
from test_cdi_spec import validate


def adb_service(host: str, port: int) -> Service:
    return Service(endpoints=[Endpoint("adb", host, port, protocol="adb", role=EndpointRole.ADB,
                                       params={"serial": "8AAY0GCXH"})])


@pytest.mark.parametrize("host, socket", [("127.0.0.1", "tcp:127.0.0.1:5137"), ("::1", "tcp:[::1]:5137")])
def test_a_phones_container_reaches_the_leases_adb_server(tmp_path, host, socket):
    resource = Resource(device="pixel-7", kind="adb", identifier="adb:8AAY0GCXH", plugin="adb")
    environment = AdbPlugin().devloop_environment(HostContext(name="host-a", state_dir=tmp_path), resource,
                                                  adb_service(host, 5137))
    assert environment.nodes == () and environment.mounts == ()
    assert dict(environment.env) == {"ADB_SERVER_SOCKET": socket, "ANDROID_SERIAL": "8AAY0GCXH"}
    assert AdbPlugin().devloop_environment(HostContext(name="host-a", state_dir=tmp_path), resource, None) is None


@pytest.mark.service
@pytest.mark.timeout(60)
def test_a_uart_lease_on_a_pty_writes_a_bind_mount_of_it(tmp_path, pty_pair):
    exporter = in_process_exporter(tmp_path, uart_device(pty_pair, server="bridge"))
    try:
        lease = "lease-00000000000000aa"
        (resource,) = exporter.discover()
        converge(exporter, {"services": [{"lease": lease, "holder": "alice", "device": "jupiter",
                                          "identifier": resource.identifier, "kind": "uart", "plugin": "uart"}],
                            "etag": "x"})
        spec = json.loads((tmp_path / "cdi" / f"device-loop_host-a_{lease}.json").read_text())
        validate(spec)
        assert spec["kind"] == "device-loop.dev/riscv-sbc" and spec["cdiVersion"] == "0.3.0"
        assert spec["devices"] == [{"name": "jupiter", "containerEdits": {
            "env": ["DEVICE_LOOP_CONSOLE=/dev/device-loop/console"],
            "mounts": [{"hostPath": str(pty_pair.board_side), "containerPath": "/dev/device-loop/console",
                        "options": ["bind", "rw"]}]}}]
        (service,) = exporter.report().services
        assert service.environment is not None and service.environment.env == {
            "DEVICE_LOOP_CONSOLE": "/dev/device-loop/console"}

        converge(exporter, {"services": [], "etag": "y"})
        assert list((tmp_path / "cdi").iterdir()) == []
    finally:
        exporter.shutdown()


@pytest.mark.service
@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["world-writable", "raises", "not-an-environment"])
def test_a_hostile_environment_is_dropped_and_the_lease_served_without_a_spec(tmp_path, monkeypatch, caplog, how):
    from device_loop.core.container_env import ContainerEnvironment, DeviceNode
    from device_loop.plugin import hookimpl
    from device_loop.plugins.sim import SimPlugin

    @hookimpl
    def devloop_environment(self, host, resource, service):
        if how == "raises":
            raise RuntimeError("boom")
        if how == "not-an-environment":
            return {"env": {"A": "1"}}
        environment = ContainerEnvironment(nodes=(DeviceNode("/dev/x", "/dev/null", "c", 1, 3, 0o660),))
        object.__setattr__(environment.nodes[0], "file_mode", 0o666)  # past the check made at its making
        return environment

    monkeypatch.setattr(SimPlugin, "devloop_environment", devloop_environment)
    exporter = in_process_exporter(tmp_path, [{"name": "sim-board-0", "plugin": "sim", "class": "sim-board"}])
    try:
        (resource,) = [r for r in exporter.discover() if r.plugin == "sim"]
        converge(exporter, {"services": [{"lease": "lease-00000000000000aa", "holder": "alice",
                                          "device": "sim-board-0", "identifier": resource.identifier,
                                          "kind": "uart", "plugin": "sim"}], "etag": "x"})
        (service,) = exporter.report().services
        assert service.endpoints and service.error is None and service.environment is None
        assert not (tmp_path / "cdi").exists() or list((tmp_path / "cdi").iterdir()) == []
        assert "devloop_environment" in caplog.text or "dropped" in caplog.text
    finally:
        exporter.shutdown()
