"""Network discovery is not ownership: a candidate is listed, never booked, until an admin
adopts it under a name; then its host serves it like any device."""
import socket

import pytest

from conftest import wait_for
from device_loop.core.hookspecs import hookimpl
from device_loop.core.model import Resource
from device_loop.core.tcp_relay import start_relay
from device_loop.core.protocol import MAX_TAG_CHARS, MAX_TAGS
from device_loop.exporter.config import parse_config
from device_loop.exporter.daemon import Exporter
from lab_in_process import FakeExporter, in_process_lab

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]


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
                                        "state_dir": str(tmp_path / "state"), "cdi_dir": str(tmp_path / "cdi")}})
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
        lease = wait_for(lambda: (l := coordinator.api(f"/leases/{lease['id']}").json())["ready"] and l,
                         what="lease ready")
        (endpoint,) = lease["endpoints"]
        with socket.create_connection((endpoint["host"], endpoint["port"]), timeout=5) as conn:
            conn.sendall(b"hello")
            assert conn.recv(100) == b"console: hello"
        audit = [(a["action"], a["device"]) for a in coordinator.api("/admin/audit").json()]
        assert ("adopt", "bmc-7") in audit
    finally:
        exporter.shutdown()


@pytest.mark.anyio
@pytest.mark.usefixtures("database")
async def test_an_adoption_takes_the_protocol_s_tags(tmp_path):
    """The tags an admin gives are what the exporter reports back of the device: a tag the
    protocol refuses would fail every heartbeat of that host (it went offline 20 s later)."""
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        exporter = FakeExporter(api, "host-a")
        found = {"identifier": "net:CS3-7", "kind": "uart", "plugin": "netscan"}
        assert (await exporter.beat(candidates=[found])).status_code == 200
        for tags in (["ok", ""], ["ok", "x" * (MAX_TAG_CHARS + 1)], [f"t{n}" for n in range(MAX_TAGS + 1)], [7]):
            refused = await api.post("/admin/candidates/net:CS3-7/adopt", json={"name": "bmc-7", "tags": tags})
            assert refused.status_code == 422 and refused.json()["error"] == "invalid", refused.text
        tags = ["ok", "x" * MAX_TAG_CHARS, *(f"t{n}" for n in range(MAX_TAGS - 2))]
        adopted = await api.post("/admin/candidates/net:CS3-7/adopt", json={"name": "bmc-7", "tags": tags})
        assert adopted.status_code == 201, adopted.text
        answer = await exporter.beat(candidates=[found])
        assert answer.status_code == 200 and answer.json()["adopted"][0]["tags"] == tags, answer.text

        # one stored before adoption took the protocol's tags does not fail its host's heartbeats
        await rules.admin.hosts_sql.insert_adoption({"identifier": "net:CS3-8", "name": "bmc-8", "class": "bmc",
                                           "tags": ["ok", "", "x" * 65], "host": "host-a", "adopted_by": "alice",
                                           "at": clock()})
        answer = await exporter.beat(candidates=[found])
        assert answer.status_code == 200, answer.text
        assert {a["name"]: a["tags"] for a in answer.json()["adopted"]}["bmc-8"] == ["ok"]
