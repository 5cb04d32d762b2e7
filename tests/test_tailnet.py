"""Callers known by their tailnet login, from a stand-in for tailscaled's LocalAPI socket
that answers ``whois`` the way tailscaled does (404 for an address it does not know)."""
import asyncio
import json
from urllib.parse import parse_qs, urlparse

import pytest

from device_loop.coordinator.identity import issue_token
from lab_in_process import FakeExporter, device, in_process_lab

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30), pytest.mark.usefixtures("database")]


async def fake_tailscaled(path, peers: dict[str, str]):
    """peers: 'ip:port' -> login. Returns the server; close it when done."""
    async def handle(reader, writer):
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        target = head.split(" ")[1]
        addr = parse_qs(urlparse(target).query).get("addr", [""])[0]
        if urlparse(target).path == "/localapi/v0/whois" and addr in peers:
            body, status = json.dumps({"Node": {"Name": "laptop.tailnet.ts.net."},
                                       "UserProfile": {"LoginName": peers[addr], "DisplayName": "A"}}), "200 OK"
        else:
            body, status = f"no match for IP:port {addr}\n", "404 Not Found"
        writer.write(f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}".encode())
        await writer.drain()
        writer.close()

    return await asyncio.start_unix_server(handle, path=str(path))


async def test_a_tailnet_peer_is_known_without_a_token(tmp_path):
    sock = tmp_path / "tailscaled.sock"
    server = await fake_tailscaled(sock, {"100.64.0.7:51000": "alice@example.com",
                                          "100.64.0.8:52000": "root@example.com"})
    try:
        async with in_process_lab(tmp_path, single_user=False, tailnet_socket=str(sock),
                                  tailnet_admins=["root@example.com"]) as (client, rules, clock):
            exporter_token = (await issue_token(rules.store, rules.clock, host="host-a"))["token"]
            await FakeExporter(client(token=exporter_token), "host-a").beat([device("b0")])
            alice, root = client(peer=("100.64.0.7", 51000)), client(peer=("100.64.0.8", 52000))
            lease = await alice.post("/leases", json={"device": "b0"})
            assert lease.status_code == 201 and lease.json()["holder"] == "alice@example.com"
            assert (await alice.get("/admin/tokens")).status_code == 403
            assert (await root.get("/admin/tokens")).status_code == 200
    finally:
        server.close()


async def test_an_unknown_peer_or_a_dead_socket_is_anonymous(tmp_path):
    sock = tmp_path / "tailscaled.sock"
    server = await fake_tailscaled(sock, {"100.64.0.9:4242": "bob@example.com"})
    try:
        async with in_process_lab(tmp_path, single_user=False, tailnet_socket=str(sock)) as (client, rules, clock):
            assert (await client().get("/leases")).status_code == 401
    finally:
        server.close()
    server = await fake_tailscaled(sock, {"127.0.0.1:123": "tagged-devices"})  # a tagged server node
    try:
        async with in_process_lab(tmp_path, single_user=False, tailnet_socket=str(sock)) as (client, rules, clock):
            assert (await client().get("/leases")).status_code == 401
    finally:
        server.close()
    async with in_process_lab(tmp_path, single_user=False, tailnet_socket=str(tmp_path / "none.sock")) as (
            client, rules, clock):
        assert (await client().get("/leases")).status_code == 401
