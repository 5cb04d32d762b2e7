"""What exporters report is hostile too (docs/architecture.md, "What exporters report is data"): an exporter's token can be stolen.

What an exporter reports is data: the coordinator fetches a camera's snapshot only from the
host's own address and the endpoint's own port, and only a bounded JPEG; templates are
checked when reported and never run as format strings; every field is bounded. What the
board shows anyone is not more than it must: who holds a device node by program and pid
(admins see the command line, with what looks like a secret taken out), and a flash's
lease only to its requester, the lease's holder and admins.

In process, on SQLite and PostgreSQL; the camera's snapshot goes to real HTTP servers
standing in for internal services, a redirecting one, a huge one, a slow one, and to a
real exporter's camera behind its lease's gate.
"""
import base64
import contextlib
import http.server
import inspect
import json
import os
import socket
import subprocess
import threading
import time

import anyio
import pytest
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from pydantic import BaseModel

from conftest import SQLITE_ONLY, WAIT_S
from device_loop.coordinator import relays
from device_loop.coordinator.events import Broadcaster
from device_loop.coordinator.identity import issue_token
from device_loop.coordinator.web.pages import device_row
from device_loop.core import protocol
from device_loop.core.host import HostContext
from device_loop.core.model import ConfiguredResource
from device_loop.core.plugins import PluginSet
from device_loop.core.usage import commands, environment, fill
from device_loop.exporter.orphans import OrphanWatch
from device_loop.exporter.report import Reporter
from device_loop.plugins.uart import UartConfig
from lab_in_process import FakeExporter, device, in_process_lab
from test_flash_rules import IMAGE, board, upload
from test_mcp import agent
from test_video import gated_lab  # noqa: F401 (a fixture: a lab with tokens, a camera behind the gate)
from test_web import section

pytestmark = [pytest.mark.service, pytest.mark.anyio, pytest.mark.timeout(60)]

# the rules here run the same SQL on either database, which the store's own tests, the
# statement counts and the OpenAPI run check on PostgreSQL: SQLite only (docs/architecture.md, "Testing")
DATABASES = SQLITE_ONLY
SITE = "http://127.0.0.1"  # the in-process clients' base URL is SITE/api/v1
ADDRESS = "127.0.0.1"      # host-a's own address, as its exporter reports it
SECRET = "hunter2"
JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + bytes(200) + b"\xff\xd9"


# ---- real HTTP servers: a camera, and what a stolen exporter token points the coordinator at ----


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # the coordinator hung up on a huge or slow answer: that is the point


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # the body ends when the connection closes: no Content-Length needed

    def do_GET(self):
        self.server.asked.append(self.path)
        self.server.answer(self)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def serving(answer):
    """A real HTTP server on a free port of 127.0.0.1 answering every GET with
    ``answer(handler)``: (its port, the paths it was asked for)."""
    server = _Server((ADDRESS, 0), _Handler)
    server.answer, server.asked = answer, []
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server.server_address[1], server.asked
    finally:
        server.shutdown()
        server.server_close()


def send(status: int, body: bytes, content_type: str = "image/jpeg", **headers):
    def answer(handler):
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        for name, value in headers.items():
            handler.send_header(name, value)
        handler.end_headers()
        handler.wfile.write(body)
    return answer


def huge(handler):
    """A JPEG's start, then 9 MiB: more than a snapshot may be."""
    send(200, JPEG[:4])(handler)
    for _ in range(9):
        handler.wfile.write(bytes(1 << 20))


def dribbling(handler):
    """A JPEG a few bytes at a time: every read comes quickly, the whole takes 4 s."""
    send(200, JPEG[:4])(handler)
    for n in range(20):
        handler.wfile.write(JPEG[4 + n:5 + n])
        handler.wfile.flush()
        time.sleep(0.2)


def camera(port: int, **fields) -> dict:
    """A camera endpoint on host-a, as the video plugin reports one."""
    return {"kind": "video", "role": "http-stream", "host": ADDRESS, "port": port, "protocol": "http",
            "url": f"http://{ADDRESS}:{port}/",
            "params": {"stream": "stream.mjpg", "snapshot": "snapshot.jpg"}, **fields}


async def camera_lease(client, endpoint: dict, address: str | None = ADDRESS) -> dict:
    """Board b0 (a camera) on host-a, leased by alice, its camera service up at ``endpoint``."""
    api, extra = client(), ({"address": address} if address else {})
    exporter = FakeExporter(api, "host-a")
    assert (await exporter.beat([device("b0", kind="video")], **extra)).status_code == 200
    lease = (await api.post("/leases", json={"device": "b0"})).json()
    service = {"lease": lease["id"], "device": "b0", "identifier": "sim:b0", "kind": "video", "endpoints": [endpoint]}
    served = await exporter.beat([device("b0", kind="video")], [service], [lease["id"]], **extra)
    assert served.status_code == 200, served.text
    assert (await api.get(f"/leases/{lease['id']}")).json()["ready"]
    return lease


async def snapshot(client, lease: dict):
    """alice's agent asks for the camera's current frame (the MCP SDK's own client)."""
    async with Client(streamable_http_client(f"{SITE}/mcp", http_client=client())) as agent:
        return await agent.call_tool("camera_snapshot", {"lease_id": lease["id"]})


def everything_in(result) -> str:
    """All a tool's answer carries, as text (images decoded)."""
    parts = []
    for content in result.content:
        parts.append(getattr(content, "text", None) or "")
        if getattr(content, "data", None):
            parts.append(base64.b64decode(content.data).decode(errors="replace"))
    return "\n".join(parts)


@pytest.mark.usefixtures("database")
async def test_a_snapshot_comes_from_the_host_s_address_and_the_endpoint_s_port_only(tmp_path):
    with serving(send(200, SECRET.encode(), "text/plain")) as (inside, asked_inside), \
            serving(send(200, JPEG)) as (port, asked_camera):
        async with in_process_lab(tmp_path) as (client, rules, clock):
            # the endpoint's URL names a service only the coordinator reaches: it is not fetched
            lease = await camera_lease(client, camera(port, url=f"http://{ADDRESS}:{inside}/"))
            result = await snapshot(client, lease)
            assert not result.is_error, everything_in(result)
            assert base64.b64decode(result.content[0].data) == JPEG
            assert asked_inside == [] and asked_camera == ["/snapshot.jpg"]


@pytest.mark.usefixtures("database")
async def test_no_snapshot_from_a_host_that_did_not_say_its_address(tmp_path):
    with serving(send(200, JPEG)) as (port, asked):
        async with in_process_lab(tmp_path) as (client, rules, clock):
            lease = await camera_lease(client, camera(port), address=None)  # an exporter older than the check
            result = await snapshot(client, lease)
            assert result.is_error and "did not report its address" in everything_in(result)
            assert asked == []


@contextlib.contextmanager
def listening(host: str = ADDRESS):
    """A bare TCP listener nobody accepts on: (its port, whether anyone has connected)."""
    with socket.create_server((host, 0)) as listener:
        listener.setblocking(False)

        def connected() -> bool:
            try:
                listener.accept()[0].close()
            except BlockingIOError:
                return False
            return True
        yield listener.getsockname()[1], connected


@pytest.mark.usefixtures("database")
@pytest.mark.parametrize("own_host", [ADDRESS, "0.0.0.0", "localhost"])
async def test_no_request_goes_to_an_address_the_coordinator_owns(tmp_path, own_host):
    """An exporter on the coordinator's machine declares its camera at the coordinator's own
    port (a listener stands in for it): nothing connects there; other ports of the machine
    are the exporter's to serve."""
    with listening() as (own_port, connected), serving(send(200, JPEG)) as (camera_port, asked):
        private = ((own_host, own_port), ("db.invalid", camera_port))  # (a database elsewhere: not this camera)
        async with in_process_lab(tmp_path, private_addresses=private) as (client, rules, clock):
            result = await snapshot(client, await camera_lease(client, camera(own_port)))
            assert result.is_error and "an address the coordinator itself owns" in everything_in(result)
            assert not connected(), "no connection, let alone a request"
        async with in_process_lab(tmp_path, private_addresses=private) as (client, rules, clock):
            endpoint = camera(camera_port, host="localhost", url=f"http://localhost:{camera_port}/")
            result = await snapshot(client, await camera_lease(client, endpoint, address="localhost"))
            assert not result.is_error and asked == ["/snapshot.jpg"], everything_in(result)


def test_what_the_coordinator_owns():
    assert relays.private_addresses("0.0.0.0", 7420, "sqlite:////srv/lab.sqlite") == (("0.0.0.0", 7420),)
    assert relays.private_addresses("127.0.0.1", 7420, "postgresql://lab:pw@db.lab:5433/lab", ["[::1]:9100"]) == \
        (("127.0.0.1", 7420), ("db.lab", 5433), ("::1", 9100))
    assert relays.private_addresses("::", 1, "postgresql:///lab")[1] == ("127.0.0.1", 5432)
    for bad in ("db.lab", "db.lab:x", ":80", "db.lab:0", "db.lab:65536"):
        with pytest.raises(ValueError, match="HOST:PORT"):
            relays.private_addresses("127.0.0.1", 7420, "sqlite:///x", [bad])


@pytest.mark.usefixtures("database")
async def test_every_endpoint_is_at_the_host_s_own_address(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        exporter = FakeExporter(client(), "host-a")
        await exporter.beat([device("b0", kind="video")], address=ADDRESS)
        lease = (await client().post("/leases", json={"device": "b0"})).json()
        for host in ("10.1.2.3", "internal.example"):
            service = {"lease": lease["id"], "device": "b0", "identifier": "sim:b0", "kind": "video",
                       "endpoints": [camera(8080, host=host)]}
            refused = await exporter.beat([device("b0", kind="video")], [service], [lease["id"]], address=ADDRESS)
            assert refused.status_code == 422, refused.text
            assert f"own address {ADDRESS}" in refused.json()["message"] and host in refused.json()["message"]
        for address in ("user@evil.example", "evil.example/x", "evil.example:80", ""):
            assert (await exporter.beat([device("b0", kind="video")], address=address)).status_code == 422, address


HOSTILE = {  # what answers at the endpoint's port: (answer, what the refusal says)
    "an internal service": (send(200, f"the payroll database password is {SECRET}".encode(), "text/plain"),
                            "not image/jpeg"),
    "text labelled a JPEG": (send(200, f"db password: {SECRET}".encode()), "not a JPEG"),
    "a redirect": (None, "redirect"),  # to the internal service (below)
    "a huge answer": (huge, "8 MiB"),
    "a slow answer": (dribbling, "within 1 s"),
    "a compressed answer": (send(200, JPEG, **{"Content-Encoding": "gzip"}), "encoded"),
}


@pytest.mark.usefixtures("database")
@pytest.mark.parametrize("what", HOSTILE)
async def test_only_a_bounded_jpeg_reaches_the_agent(tmp_path, monkeypatch, what):
    timeout_s = 1.0
    monkeypatch.setattr(relays, "SNAPSHOT_TIMEOUT_S", timeout_s)
    answer, reason = HOSTILE[what]
    with serving(send(200, f"the payroll database password is {SECRET}".encode(), "text/plain")) as (inside, asked):
        if answer is None:
            answer = send(302, f"moved: {SECRET}".encode(), "text/plain", Location=f"http://{ADDRESS}:{inside}/")
        with serving(answer) as (port, _):
            async with in_process_lab(tmp_path) as (client, rules, clock):
                lease = await camera_lease(client, camera(port))
                async with Client(streamable_http_client(f"{SITE}/mcp", http_client=client())) as alice:
                    await alice.list_tools()  # the MCP route is loaded at its first call: not timed
                    started = time.monotonic()
                    result = await alice.call_tool("camera_snapshot", {"lease_id": lease["id"]})
                    took = time.monotonic() - started
                assert result.is_error, f"{what} reached the agent"
                said = everything_in(result)
                assert reason in said and SECRET not in said and "b0's camera" in said, said
                assert took < 3 * timeout_s, "a snapshot is bounded in time (the slow camera sends for 4 s)"
        assert asked == [], "a redirect is not followed"


@pytest.mark.timeout(120)
async def test_an_agent_sees_through_a_real_exporter_s_gate(gated_lab):
    coordinator, env = gated_lab  # its camera asks for the lease's secret
    assert [(h["name"], h["address"]) for h in coordinator.api("/hosts").json()] == [("host-a", ADDRESS)]
    async with agent(coordinator.url, env["DEVICE_LOOP_TOKEN"]) as alice:
        lease = (await alice.call_tool("reserve", {"device": "sim-board-0"})).structured_content
        with anyio.fail_after(WAIT_S):
            while not (await alice.call_tool("lease_status", {"lease_id": lease["id"]})).structured_content["ready"]:
                await anyio.sleep(0.05)
        shot = await alice.call_tool("camera_snapshot", {"lease_id": lease["id"]})
        assert not shot.is_error, everything_in(shot)
        assert base64.b64decode(shot.content[0].data).startswith(b"\xff\xd8\xff")


@pytest.mark.usefixtures("database")
@pytest.mark.parametrize("url, params", [
    ("http://127.0.0.1:{port}/../admin/", {"snapshot": "snapshot.jpg"}),
    ("http://127.0.0.1:{port}/", {"snapshot": "@evil.example/secret"}),
    ("http://127.0.0.1:{port}/", {"snapshot": "../../etc/passwd"}),
    ("http://127.0.0.1:{port}/", {"snapshot": "snapshot.jpg?x=http://internal/"}),
])
async def test_a_snapshot_path_is_a_plain_path(tmp_path, url, params):
    with serving(send(200, JPEG)) as (port, asked):
        async with in_process_lab(tmp_path) as (client, rules, clock):
            endpoint = camera(port, url=url.format(port=port), params={"stream": "stream.mjpg", **params})
            result = await snapshot(client, await camera_lease(client, endpoint))
            assert result.is_error and "path" in everything_in(result), everything_in(result)
            assert asked == []


# ---- who holds a device node -------------------------------------------------------------------


HOLDERS = [{"pid": 4242, "command": f"mysql --password={SECRET} -u root /dev/ttyUSB0"},
           {"pid": 4243,
            "command": f"/usr/bin/curl -H Authorization: Bearer {SECRET} https://bob:{SECRET}@db.example/x"}]


async def tokens_lab(client, rules) -> dict:
    """Tokens of alice, bob, an admin (root) and host-a's exporter: name -> a client with it."""
    specs = {"alice": {"username": "alice"}, "bob": {"username": "bob"}, "root": {"username": "root", "admin": True},
             "host-a": {"host": "host-a"}}
    return {name: client(token=(await issue_token(rules.store, rules.clock, **spec))["token"])
            for name, spec in specs.items()} | {"anyone": client(user="")}


@pytest.mark.usefixtures("database")
async def test_anyone_sees_how_many_hold_a_device_node_and_only_admins_see_which(tmp_path):
    async with in_process_lab(tmp_path, single_user=False) as (client, rules, clock):
        who = await tokens_lab(client, rules)
        await FakeExporter(who["host-a"], "host-a").beat([device("b0", busy_by=HOLDERS), device("b1")])
        hidden = ("4242", "4243", "mysql", "curl", SECRET, "--password")  # other people's processes: an admin's to see
        for viewer in ("anyone", "alice"):
            shown = await who[viewer].get("/devices/b0")
            assert shown.json()["busy_count"] == 2 and "busy_by" not in shown.json()
            listed = await who[viewer].get("/devices")
            assert [(d["busy_count"], "busy_by" in d) for d in listed.json()] == [(2, False), (0, False)]
            assert not [word for word in hidden if word in shown.text + listed.text]
            for page in ("/", "/devices/b0"):
                html = (await who[viewer].get(SITE + page)).text
                assert "b0" in html and "pid 4242" not in html and "<b>mysql</b>" not in html, page
                assert SECRET not in html and "--password" not in html, page
        async with Client(streamable_http_client(f"{SITE}/mcp", http_client=who["anyone"])) as agent:
            for tool, args in (("device_info", {"device": "b0"}), ("list_devices", {})):
                answer = await agent.call_tool(tool, args)
                said = json.dumps(answer.structured_content)
                assert not answer.is_error and not [word for word in hidden if word in said], tool

        stream = Broadcaster(rules.devices.list_devices, rules.life.notifier, device_row).stream(html=True)  # as the app's
        assert (await anext(stream)).startswith(b"retry: ")
        sent = (await anext(stream)).decode()
        assert sent.startswith("event: snapshot") and '"busy_count": 2' in sent
        assert '"program": "mysql"' not in sent and SECRET not in sent
        await stream.aclose()

        admin = (await who["root"].get("/devices/b0")).json()["busy_by"]
        assert admin == [{"pid": 4242, "program": "mysql", "command": "mysql --password=[redacted] -u root /dev/ttyUSB0",
                          "cgroup": ""},
                         {"pid": 4243, "program": "curl", "command": "/usr/bin/curl -H Authorization: Bearer [redacted] "
                                                                    "https://bob:[redacted]@db.example/x", "cgroup": ""}]


@pytest.mark.parametrize("command, shown", [
    ("picocom -b 115200 /dev/ttyUSB0", "picocom -b 115200 /dev/ttyUSB0"),
    ("minicom -D /dev/serial/by-id/usb-FTDI_FT232R_USB_UART_A50285BI-if00-port0",
     "minicom -D /dev/serial/by-id/usb-FTDI_FT232R_USB_UART_A50285BI-if00-port0"),
    ("java -Xmx2g -Djava.security.egd=file:/dev/./urandom -jar flasher-2.1.0.jar",
     "java -Xmx2g -Djava.security.egd=file:/dev/./urandom -jar flasher-2.1.0.jar"),
    ("mysql --password=hunter2 -u root", "mysql --password=[redacted] -u root"),
    ("mysql -u root -p hunter2", "mysql -u root -p [redacted]"),
    ("mysql -u root -phunter2", "mysql -u root -p[redacted]"),
    ("tool --token hunter2 --api-key=k3y --secret s --passphrase=x --auth u:p",
     "tool --token [redacted] --api-key=[redacted] --secret [redacted] --passphrase=[redacted] --auth [redacted]"),
    ("tool --password --verbose", "tool --password --verbose"),
    ("env PASSWORD=hunter2 DB_PASSWORD=x GITHUB_TOKEN=y AWS_SECRET_ACCESS_KEY=z HOME=/root sh",
     "env PASSWORD=[redacted] DB_PASSWORD=[redacted] GITHUB_TOKEN=[redacted] AWS_SECRET_ACCESS_KEY=[redacted] "
     "HOME=/root sh"),
    ("curl https://bob:hunter2@db.example/x --url=ftp://u:p@h/", "curl https://bob:[redacted]@db.example/x "
                                                                 "--url=ftp://u:[redacted]@h/"),
    ("curl -H Authorization: Bearer abc", "curl -H Authorization: Bearer [redacted]"),
    ("agent dl_Q2x9vT7mK1pLw8Zr4Yb6Nc3Hd5Fj0GeA", "agent [redacted]"),
    ("fetch 9223b0db9dc66fcd96eee1f51532da403fe81a0e /tmp/x", "fetch [redacted] /tmp/x"),
    ("sign --with=Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MA==", "sign --with=[redacted]"),
])
def test_command_lines_lose_what_looks_like_a_secret(command, shown):
    from device_loop.coordinator.holders import redact

    assert redact(command) == shown


# ---- templates and endpoint data ----------------------------------------------------------------


BAD_TEMPLATES = ["{", "}", "{}", "{0}", "{port.real.x}", "{host:d}", "{host!r}", "{params[x]}",
                 "{host.__class__.__mro__}", "nc {nope} {port}", "{{host}"]


def test_templates_are_filled_without_a_format_string():
    endpoint = {"kind": "x", "host": "10.0.0.7", "port": 4000, "url": "http://10.0.0.7:4000/",
                "params": {"serial": "S1"}}
    assert fill("adb -H {host} -P {port} -s {serial} --lease {lease} {{literal}} {url}", endpoint, "lease-1") == \
        "adb -H 10.0.0.7 -P 4000 -s S1 --lease lease-1 {literal} http://10.0.0.7:4000/"
    for template in BAD_TEMPLATES:  # (rows stored before templates were checked): never an error
        assert isinstance(fill(template, endpoint, "lease-1"), str)
    assert fill("{port.real.x} {host.__class__} {host:>99} {0} {", endpoint, "l") == \
        "{port.real.x} {host.__class__} {host:>99} {0} {", "no attribute, spec or index is followed"


@pytest.mark.usefixtures("database")
async def test_templates_are_checked_when_an_exporter_reports_them(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        exporter = FakeExporter(api, "host-a")
        await exporter.beat([device("b0")])
        lease = (await api.post("/leases", json={"device": "b0"})).json()

        async def report(**endpoint):
            uart = {"kind": "uart", "host": ADDRESS, "port": 4000, **endpoint}
            service = {"lease": lease["id"], "device": "b0", "identifier": "sim:b0", "kind": "uart",
                       "endpoints": [uart]}
            return await exporter.beat([device("b0")], [service], [lease["id"]])

        for template in BAD_TEMPLATES:
            for where in ({"command": template}, {"env": {"TARGET": template}}):
                refused = await report(**where)
                assert refused.status_code == 422, (where, refused.text)
                assert "field" in refused.json()["message"] or "lone" in refused.json()["message"], refused.text
        for env in ({"X; rm -rf ~; Y": "1"}, {"A B": "1"}, {"1X": "1"}):
            assert (await report(env=env)).status_code == 422, env  # `device-loop env` writes names into a shell
        for params in ({"a.b": "x"}, {"x": "y" * 300}, {f"k{n}": n for n in range(17)}):
            assert (await report(params=params)).status_code == 422, params
        good = await report(command="picocom -b {baud} telnet://{host}:{port} {{x}} {lease}", params={"baud": 115200},
                            env={"UART_ADDRESS": "{host}:{port}"})
        assert good.status_code == 200, good.text
        ready = (await api.get(f"/leases/{lease['id']}")).json()
        assert ready["commands"] == [f"picocom -b 115200 telnet://127.0.0.1:4000 {{x}} {lease['id']}"]
        assert environment(ready) == {"UART_ADDRESS": "127.0.0.1:4000"}


@pytest.mark.usefixtures("database")
async def test_what_an_exporter_reported_never_breaks_a_view(tmp_path):
    async with in_process_lab(tmp_path, single_user=False) as (client, rules, clock):
        who = await tokens_lab(client, rules)
        exporter = FakeExporter(who["host-a"], "host-a")
        await exporter.beat([device("b0")])
        lease = (await who["alice"].post("/leases", json={"device": "b0"})).json()
        # a camera without its params is a valid report; its page link is simply not there
        endpoints = [{"kind": "uart", "host": ADDRESS, "port": 4000},
                     {"kind": "video", "host": ADDRESS, "port": 4001, "protocol": "http", "url": "http://x:4001/"}]
        service = {"lease": lease["id"], "device": "b0", "identifier": "sim:b0", "kind": "uart", "endpoints": endpoints}
        assert (await exporter.beat([device("b0")], [service], [lease["id"]])).status_code == 200
        # and templates stored before they were checked (an older coordinator took them)
        stored = [{"kind": "uart", "host": ADDRESS, "port": 4000 + n, "command": t, "env": {"X": t}}
                  for n, t in enumerate(BAD_TEMPLATES)]
        async with rules.store.tx():
            await rules.hosts.hosts_sql.save_host({"name": "host-a", "services": [{**service, "endpoints": [
                *endpoints, *stored]}]}, new=False)
        for viewer, path in [("alice", f"/leases/{lease['id']}"), ("alice", "/leases"),
                             ("root", f"/leases/{lease['id']}"), ("alice", f"{SITE}/"),
                             ("alice", f"{SITE}/devices/b0"), ("root", f"{SITE}/devices/b0")]:
            answer = await who[viewer].get(path)
            assert answer.status_code == 200, (viewer, path, answer.text[-500:])
        shown = (await who["alice"].get(f"/leases/{lease['id']}")).json()
        unformatted = {"{0}", "{port.real.x}", "{host:d}", "{host!r}", "{host.__class__.__mro__}", "nc {nope} 4009"}
        assert unformatted <= set(shown["commands"]) and unformatted <= set(commands(shown))


# ---- bounds ---------------------------------------------------------------------------------------


BOUNDED = {"str", "list", "dict", "set", "frozenset", "tuple", "bytes"}


def _unbounded(schema, path: str) -> list[str]:
    """Where a pydantic core schema takes a string, list or dict of any length."""
    found = []
    if isinstance(schema, dict):
        if schema.get("type") in BOUNDED and "max_length" not in schema:
            found.append(path)
        for key, value in schema.items():
            found += _unbounded(value, f"{path}.{key}")
    elif isinstance(schema, list):
        for n, value in enumerate(schema):
            found += _unbounded(value, f"{path}[{n}]")
    return found


def test_every_field_of_the_protocol_is_bounded():
    models = [m for _, m in inspect.getmembers(protocol, inspect.isclass)
              if issubclass(m, BaseModel) and m.__module__ == protocol.__name__]
    assert {"Heartbeat", "DeviceReport", "EndpointReport", "DesiredState"} <= {m.__name__ for m in models}
    unbounded = [path for model in models for path in _unbounded(model.__pydantic_core_schema__, model.__name__)]
    assert unbounded == [], "a string, list or dict without a max_length"


def test_an_exporter_s_report_keeps_to_the_bounds(tmp_path):
    """What the exporter reads from /proc (who holds a node, and their command lines) is cut
    to the protocol's bounds, and it reports its own address."""
    master, slave = os.openpty()
    node = os.ttyname(slave)
    host = HostContext("host-a", tmp_path / "state", advertise_address="10.0.0.7", entries=[
        ConfiguredResource("jupiter", "riscv-sbc", (), "uart", UartConfig(path=node))])
    reporter = Reporter(host, PluginSet(enable=["uart"]), OrphanWatch(host.state_dir), 1.0, "boot-1")
    reporter.loaded = ["uart"]
    reporter.scan(set())  # who holds the node now was there first: none of those below
    long_argument = "x" * 3000
    holders = []
    try:
        with open(node, "rb") as tty:
            for _ in range(protocol.MAX_HOLDERS + 2):  # each waits for a line that never comes
                holders.append(subprocess.Popen(["sh", "-c", "read line", long_argument], stdin=tty))
        report = reporter.build([], set(), set(), recheck={"jupiter"})
    finally:
        for holder in holders:
            holder.kill()
            holder.wait()
        os.close(master)
        os.close(slave)
    (jupiter,) = report.devices
    assert len(jupiter.busy_by) == protocol.MAX_HOLDERS
    assert {len(h.command) for h in jupiter.busy_by} == {protocol.MAX_COMMAND_CHARS}
    assert report.address == "10.0.0.7"


@pytest.mark.usefixtures("database")
async def test_oversized_fields_of_a_report_are_refused(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        exporter = FakeExporter(client(), "host-a")
        for tags in (["x" * 65], ["x"] * 65, ["x" * (1 << 20)]):
            refused = await exporter.beat([{**device("b0"), "tags": tags}])
            assert refused.status_code == 422 and "tags" in refused.json()["message"], refused.text[:300]
        many = [{"pid": n, "command": "x"} for n in range(65)]
        assert (await exporter.beat([device("b0", busy_by=many)])).status_code == 422
        for plugins in ({"loaded": ["x" * 65]}, {"loaded": ["p"] * 257},
                        {"skipped": [{"name": "p", "reason": "r" * 2001}]}):
            assert (await exporter.beat([device("b0")], plugins=plugins)).status_code == 422, plugins
        assert (await exporter.beat([{**device("b0"), "tags": ["x" * 64] * 64}])).status_code == 200
        assert (await client("anyone").get("/devices/b0")).json()["tags"] == ["x" * 64] * 64


# ---- a flash's lease -----------------------------------------------------------------------------


EXPORTER_PATH = "/root/.local/share/device-loop/flash/b0.img"


async def alice_flashes_b0(client, rules):
    """A lab with tokens where alice leased b0 (host-a's) and asked to flash build-7 onto it:
    (the clients by name, host-a's exporter, her lease, the flash's answer)."""
    who = await tokens_lab(client, rules)
    exporter = FakeExporter(who["host-a"], "host-a")
    await exporter.beat([board()])
    await upload(who["alice"], "build-7", IMAGE, target="b0")
    lease = (await who["alice"].post("/leases", json={"device": "b0"})).json()
    return who, exporter, lease, await who["alice"].post(f"/leases/{lease['id']}/flash", json={"image": "build-7"})


@pytest.mark.usefixtures("database")
async def test_the_exporter_s_file_paths_are_shown_to_an_operation_s_holder_and_admins_only(tmp_path):
    async with in_process_lab(tmp_path, single_user=False) as (client, rules, clock):
        who, exporter, lease, made = await alice_flashes_b0(client, rules)
        op = made.json()
        said = f"[Errno 5] Input/output error: '{EXPORTER_PATH}' (see ~/.cache/x.log; 1/2 MB/s)"
        running = {"op": op["id"], "device": "b0", "kind": "flash", "state": "running", "phase": "writing",
                   "progress": {"done": 1, "total": None, "unit": "bytes", "detail": f"writing {EXPORTER_PATH}"},
                   "result": {"target": EXPORTER_PATH}}
        await exporter.beat([board()], operations=[running])
        assert EXPORTER_PATH not in (await who["bob"].get(f"/ops/{op['id']}")).text
        await exporter.beat([board()], operations=[{**running, "state": "failed", "message": said, "changed": True}])
        # (as a failed step leaves its message: in the device's log, and as its fault)
        async with rules.store.tx():
            await rules.life.note(await rules.devices.devices_sql.device("b0"), f"step 1/1 command failed: {said}", "exporter:host-a")

        for viewer, sees in [("anyone", False), ("bob", False), ("alice", True), ("root", True)]:
            ops = (await who[viewer].get("/devices/b0/operations")).json()
            assert (ops[0]["message"] == said) is sees and (EXPORTER_PATH in json.dumps(ops)) is sees, viewer
            if not sees:
                assert ops[0]["message"] == "[Errno 5] Input/output error: '[path]' (see [path]; 1/2 MB/s)"
                assert ops[0]["progress"]["detail"] == "writing [path]" and ops[0]["result"] == {"target": "[path]"}
            if viewer != "anyone":
                assert (EXPORTER_PATH in (await who[viewer].get(f"/ops/{op['id']}")).text) is sees, viewer
            # the device's own texts (a failed flash needs recovery) and its log: admins only
            admin = viewer == "root"
            shown = (await who[viewer].get("/devices/b0")).json()
            assert "Input/output error" in shown["recovery_reason"]
            assert (EXPORTER_PATH in shown["recovery_reason"]) is admin, viewer
            assert (EXPORTER_PATH in (await who[viewer].get("/devices/b0/log")).text) is admin, viewer
            assert EXPORTER_PATH not in (await who[viewer].get("/devices")).text
            page = (await who[viewer].get(f"{SITE}/devices/b0")).text  # (alice's: her lease's panel too)
            flashes = section(page, '<section class="flashes"')  # (its operations: as the API shows them)
            assert "Input/output error" in flashes and (EXPORTER_PATH in flashes) is sees, viewer
            assert sees or EXPORTER_PATH not in page, viewer


@pytest.mark.usefixtures("database")
async def test_a_flash_s_lease_is_shown_to_its_requester_its_holder_and_admins_only(tmp_path):
    async with in_process_lab(tmp_path, single_user=False) as (client, rules, clock):
        who, exporter, lease, made = await alice_flashes_b0(client, rules)
        assert made.status_code == 201 and made.json()["lease"] == lease["id"], made.text
        op = made.json()["id"]
        by_admin = (await who["root"].post(f"/leases/{lease['id']}/flash", json={"image": "build-7"})).json()
        assert by_admin["error"] == "flash_running"  # one at a time: the admin's view of alice's flash below

        for viewer, sees in [("anyone", False), ("bob", False), ("alice", True), ("root", True)]:
            expected = lease["id"] if sees else None
            if viewer != "anyone":
                assert (await who[viewer].get(f"/ops/{op}")).json()["lease"] == expected, viewer
                assert (await who[viewer].get(f"/ops/{op}", params={"wait": "0.1", "unless": "queued"})
                        ).json()["lease"] == expected, viewer
            flashes = await who[viewer].get("/devices/b0/flashes")
            assert [f["lease"] for f in flashes.json()] == [expected], viewer
            page = (await who[viewer].get(f"{SITE}/devices/b0")).text
            assert (lease["id"] in page) == (viewer == "alice"), viewer  # alice's own lease panel
        assert lease["id"] not in (await who["anyone"].get("/devices/b0")).text
