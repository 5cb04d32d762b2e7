"""A scope reaches the data plane (docs/architecture.md, "Shares of one lab"): a lease shows a
token only the endpoints of the parts of the data plane its scope names (``uart``, ``adb``,
``camera``, ``screen``, ``ssh``, a plugin's resource kind), each with its own gate's secret,
and no more than the scope of the token it was reserved with allows. Every endpoint role,
through REST and MCP, with a token allowed it and one not; the gates' own refusal of another
part's secret is tests/test_gate_inner.py's, on real gates."""
from __future__ import annotations

import json
from typing import Any

import pytest
import httpx2
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client

from conftest import SQLITE_ONLY
from device_loop.coordinator.identity import issue_token
from device_loop.core.gate import gate_secret
from device_loop.core.protocol import ResourceReport
from device_loop.core.scopes import DATA_PLANE, TokenScope, data_plane_operation
from device_loop.core.vocabulary import EndpointRole, HealthStatus, TokenKind
from lab_in_process import FakeExporter, device, in_process_lab

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120), pytest.mark.usefixtures("database")]

# the rules here run the same SQL on either database, which the store's own tests, the
# statement counts and the OpenAPI run check on PostgreSQL: SQLite only (docs/architecture.md, "Testing")
DATABASES = SQLITE_ONLY

PLUGIN_KIND = "relay-box"  # a third-party plugin's resource kind: its endpoints are its own part
# resource kind -> the endpoints its service has (each role a client knows, and a plugin's own)
SERVED: dict[str, list[dict[str, Any]]] = {
    "uart": [{"role": EndpointRole.CONSOLE, "protocol": "raw"}, {"role": EndpointRole.CONSOLE, "protocol": "rfc2217"}],
    "adb": [{"role": EndpointRole.ADB, "protocol": "adb"}],
    "video": [{"role": EndpointRole.HTTP_STREAM, "protocol": "http"}],
    "vnc": [{"role": EndpointRole.RFB, "protocol": "rfb"}, {"role": EndpointRole.WEB_VIEWER, "protocol": "http"}],
    "ssh": [{"role": EndpointRole.SSH, "protocol": "ssh"}],
    PLUGIN_KIND: [{"role": "relay", "protocol": "raw"}],
}


def every_part(name: str) -> dict:
    """A device whose resources are every kind of ``SERVED``, as its exporter reports it."""
    report = device(name, kind="uart")
    for kind in SERVED:
        if kind != "uart":
            report["resources"].append(ResourceReport.model_construct(
                kind=kind, plugin="sim", identifier=f"{kind}:{name}", health=HealthStatus.OK, reason="", service=True,
                operations=[]).model_dump(by_alias=True))
    return report


def services_of(lease: dict, secret: str) -> list[dict]:
    """Its services up, each endpoint with its gate's secret in its URL, as gates publish them."""
    services, port = [], 4000
    for kind, endpoints in SERVED.items():
        part = gate_secret(secret, data_plane_operation(kind))
        shown = []
        for endpoint in endpoints:
            port += 1
            url = {"url": f"http://127.0.0.1:{port}/{part}/"} if endpoint["protocol"] == "http" else {}
            shown.append({"kind": kind if endpoint["role"] != EndpointRole.WEB_VIEWER else "vnc-web",
                          "host": "127.0.0.1", "port": port, **endpoint, **url})
        identifier = "sim:" + lease["device"] if kind == "uart" else f"{kind}:{lease['device']}"
        services.append({"lease": lease["id"], "device": lease["device"], "identifier": identifier, "kind": kind,
                         "endpoints": shown})
    return services


async def served_lease(rules, exporter: FakeExporter, api: httpx2.AsyncClient, name: str,
                       running: list[dict]) -> tuple[dict, str]:
    """A lease of ``name`` reserved through ``api``, its services up beside those ``running``."""
    lease = (await api.post("/leases", json={"device": name})).json()
    assert "id" in lease, lease
    (row,) = await rules.store.read("SELECT secret FROM leases WHERE id = :id", id=lease["id"])
    running += services_of(lease, row["secret"])
    await exporter.beat([every_part("b0"), every_part("b1")], running, sorted({s["lease"] for s in running}))
    return lease, row["secret"]


def agent(app, token: str) -> Client:
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), headers={"Authorization": f"Bearer {token}"},
                              timeout=30)
    return Client(streamable_http_client("http://127.0.0.1/mcp", http_client=http))


@pytest.mark.parametrize("part", list(dict.fromkeys([*DATA_PLANE.values(), PLUGIN_KIND])))
async def test_a_scope_shows_the_endpoints_of_the_parts_it_names_and_their_secrets_alone(tmp_path, part):
    async with in_process_lab(tmp_path, single_user=False, gated=True) as (client, rules, clock):
        exporter = FakeExporter(client(token=(await issue_token(rules.store, clock, host="host-a"))["token"]),
                                "host-a")
        await exporter.beat([every_part("b0"), every_part("b1")])
        allowed = (await issue_token(rules.store, clock, "bot", kind=TokenKind.AGENT,
                                     scope=TokenScope(operations=(part, "power.cycle"))))["token"]
        denied = (await issue_token(rules.store, clock, "bot", kind=TokenKind.AGENT,
                                    scope=TokenScope(operations=("power.cycle", "exec"))))["token"]
        unscoped = (await issue_token(rules.store, clock, "bot"))["token"]

        running: list[dict] = []
        lease, secret = await served_lease(rules, exporter, client(token=allowed), "b0", running)
        shown = (await client(token=allowed).get(f"/leases/{lease['id']}")).json()
        assert shown["ready"] and shown["endpoints"], shown
        assert {e["scope"] for e in shown["endpoints"]} == {part}, "only the endpoints of the part it names"
        assert shown["withheld"] == sorted({data_plane_operation(kind) for kind in SERVED} - {part}), shown
        roles = {e.get("role") for e in shown["endpoints"]}
        expected = {e["role"] for kind, served in SERVED.items() if data_plane_operation(kind) == part for e in served}
        assert roles == expected, roles
        assert all(e["secret"] == gate_secret(secret, part) for e in shown["endpoints"])
        assert secret not in json.dumps(shown), "the lease's own secret never leaves the coordinator for a client"
        others = {gate_secret(secret, data_plane_operation(kind)) for kind in SERVED} - {gate_secret(secret, part)}
        assert not any(other in json.dumps(shown) for other in others), "no other part's secret, in a URL either"

        # the same lease read with a token of the same person that is not scoped: no more than
        # the scope of the token it was reserved with
        through_unscoped = (await client(token=unscoped).get(f"/leases/{lease['id']}")).json()
        assert {e["scope"] for e in through_unscoped["endpoints"]} == {part}
        # and with a token that names none of the data plane: nothing
        nothing = (await client(token=denied).get(f"/leases/{lease['id']}")).json()
        assert nothing["endpoints"] == [] and nothing["state"] == "active", nothing
        listed = (await client(token=denied).get("/leases")).json()
        assert [e for lease_shown in listed for e in lease_shown["endpoints"]] == []

        async with agent(client.app, denied) as mcp:
            said = await mcp.call_tool("lease_status", {"lease_id": lease["id"]})
            assert not said.is_error and said.structured_content["endpoints"] == [], said
        async with agent(client.app, allowed) as mcp:
            said = await mcp.call_tool("lease_status", {"lease_id": lease["id"]})
            assert {e["scope"] for e in said.structured_content["endpoints"]} == {part}

        # a lease an unscoped token reserved shows every part to it, and one part to the scoped token
        other, other_secret = await served_lease(rules, exporter, client(token=unscoped), "b1", running)
        everything = (await client(token=unscoped).get(f"/leases/{other['id']}")).json()
        assert {e["scope"] for e in everything["endpoints"]} == {data_plane_operation(kind) for kind in SERVED}
        assert all(e["secret"] == gate_secret(other_secret, e["scope"]) for e in everything["endpoints"])
        narrowed = (await client(token=allowed).get(f"/leases/{other['id']}")).json()
        assert {e["scope"] for e in narrowed["endpoints"]} == {part}


async def test_a_data_plane_word_is_a_scope_an_admin_may_give_and_a_kind_nothing_has_is_refused(tmp_path):
    async with in_process_lab(tmp_path, single_user=False, gated=True) as (client, rules, clock):
        root = client(token=(await issue_token(rules.store, clock, "root", admin=True))["token"])
        exporter = FakeExporter(client(token=(await issue_token(rules.store, clock, host="host-a"))["token"]),
                                "host-a")
        await exporter.beat([every_part("b0")])
        for words in (["uart", "adb", "camera", "screen", "ssh"], [PLUGIN_KIND]):
            made = await root.post("/admin/tokens", json={"user": "bot", "scope": {"operations": words}})
            assert made.status_code == 201, made.text
        refused = await root.post("/admin/tokens", json={"user": "bot", "scope": {"operations": ["teleport"]}})
        assert refused.status_code == 422 and "teleport" in refused.json()["message"], refused.text
