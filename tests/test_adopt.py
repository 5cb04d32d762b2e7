"""Network discovery is not ownership: a candidate is listed, never booked, until an admin
adopts it under a name; then its host serves it like any device."""
import socket

import pytest

from conftest import wait_for
from device_loop.core.hookspecs import hookimpl
from device_loop.core.model import Resource
from device_loop.core.tcp_relay import start_relay
from device_loop.exporter.config import parse_config
from device_loop.exporter.daemon import Exporter

pytestmark = pytest.mark.timeout(60)


class NetScanner:
    """A plugin that finds a console server port on the network (here: a local echo)."""

    def __init__(self, address):
        self.address, self.visible = address, True

    @hookimpl
    def devloop_discover(self, host):
        if not self.visible:
            return []
        return [Resource(device="console-server-3 port 7", kind="uart", identifier="net:CS3-7", candidate=True,
                         config={"address": self.address})]

    @hookimpl
    def devloop_start(self, host, resource, lease):
        return start_relay(host, resource, lease, resource.config["address"])


def test_a_candidate_is_adopted_then_served(tmp_path, coordinator, echo_server):
    config = parse_config({"exporter": {"name": "host-a", "coordinator": coordinator.url,
                                        "state_dir": str(tmp_path / "state")}})
    exporter = Exporter(config)
    scanner = NetScanner(f"127.0.0.1:{echo_server}")
    exporter.plugins.pm.register(scanner, name="netscan")
    exporter.setup()
    try:
        exporter.cycle()
        (candidate,) = coordinator.api("/admin/candidates").json()
        assert candidate | {} == {**candidate, "identifier": "net:CS3-7", "host": "host-a", "adopted_as": None,
                                  "label": "console-server-3 port 7"}
        assert coordinator.api("/devices").json() == [], "a candidate is nobody's device"
        scanner.visible = False
        exporter.cycle()
        assert len(coordinator.api("/admin/candidates").json()) == 1, "missing from one scan is not gone"
        scanner.visible = True

        adopt = coordinator.api("/admin/candidates/net:CS3-7/adopt", "POST", json={"name": "bmc-7", "class": "bmc"})
        assert adopt.status_code == 201, adopt.text
        again = coordinator.api("/admin/candidates/net:CS3-7/adopt", "POST", json={"name": "bmc-8"})
        assert again.status_code == 409
        assert coordinator.api("/admin/candidates/net:nope/adopt", "POST", json={"name": "x"}).status_code == 404
        exporter.cycle()
        device = coordinator.api("/devices/bmc-7").json()
        assert (device["state"], device["host"], device["class"]) == ("idle", "host-a", "bmc")
        assert coordinator.api("/admin/candidates").json()[0]["adopted_as"] == "bmc-7"

        lease = coordinator.api("/leases", "POST", json={"device": "bmc-7"}).json()
        exporter.cycle()
        lease = wait_for(lambda: (l := coordinator.api(f"/leases/{lease['id']}").json())["ready"] and l, 10,
                         what="lease ready")
        (endpoint,) = lease["endpoints"]
        with socket.create_connection((endpoint["host"], endpoint["port"]), timeout=5) as conn:
            conn.sendall(b"hello")
            assert conn.recv(100) == b"console: hello"
        audit = [(a["action"], a["device"]) for a in coordinator.api("/admin/audit").json()]
        assert ("adopt", "bmc-7") in audit
    finally:
        exporter.shutdown()
