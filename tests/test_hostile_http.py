"""What a hostile HTTP client, or a hostile page in someone's browser, can make of the
coordinator (issue 17): bodies are bounded per route and refused before they are read; JSON
routes take only JSON; a page on another port of the same host is another origin; request
heads that never end and bodies that stop are cut; exporter text is shown as text.

Real coordinator processes wherever the kernel matters (memory, descriptors, sockets), and
Debian's Chromium for what a page can do; the rest in process."""
from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import os
import resource
import select
import socket
import threading
import time

import httpx2
import pytest

from conftest import Coordinator, lab_tokens, wait_for
from device_loop.core import PROTOCOL_VERSION
from device_loop.core.ports import free_port
from device_loop.core.protocol import (CandidateReport, DeviceReport, EndpointReport, Heartbeat, ResourceReport,
                                       ServiceReport)
from lab_in_process import FakeExporter, device, in_process_lab

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]
MiB = 1 << 20
JSON = {"Content-Type": "application/json"}


# ---- helpers: a raw HTTP client, an exporter's reports, a page of another origin ------------------


def read_answer(sock: socket.socket) -> tuple[int, dict, dict]:
    """(status, headers, JSON body) of the one answer on ``sock``."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed before an answer: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    while len(body) < int(headers.get("content-length", 0)):
        body += sock.recv(65536)
    return int(lines[0].split()[1]), headers, json.loads(body) if body else {}


def head(port: int, method: str, path: str, *headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def memory_kib(pid: int) -> dict[str, int]:
    """VmHWM (the most it ever held) and VmRSS (what it holds) of process ``pid``, in KiB."""
    status = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status").read().splitlines())
    return {key: int(status[key].split()[0]) for key in ("VmHWM", "VmRSS")}


class Host:
    """Reports an exporter's host over HTTP, as the exporter does (the trust mode takes them)."""

    def __init__(self, url: str, name: str = "host-a", token: str | None = None):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx2.Client(base_url=f"{url}/api/v1/hosts/{name}", headers={**headers, **JSON}, timeout=10)
        self.generation = 0

    def report(self, devices, services=(), applied=(), candidates=()) -> dict:
        self.generation += 1
        beat = Heartbeat(protocol=PROTOCOL_VERSION, version="test", boot_id="boot-1", generation=self.generation,
                         heartbeat_s=60, devices=list(devices), services=list(services), applied=list(applied),
                         candidates=list(candidates))
        answer = self.http.post("/heartbeat", content=beat.model_dump_json(by_alias=True))
        assert answer.status_code == 200, answer.text
        return answer.json()


def board(name: str, device_class: str = "sim-board", tags=(), **health) -> DeviceReport:
    """A board with a console, as an exporter reports it (``health``: its resource's health and reason)."""
    return DeviceReport(name=name, device_class=device_class, tags=list(tags), resources=[
        ResourceReport(kind="uart", plugin="sim", identifier=f"sim:{name}", **health)])


@contextlib.contextmanager
def page_elsewhere(html: str):
    """A web server on another port of 127.0.0.1 serving ``html`` at ``/``: its URL."""
    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = html.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def no_cors_posts(coordinator_url: str, posts: list[tuple[str, str | None]]) -> str:
    """A page that sends each (path, text body or None) as a no-cors POST, as any page may
    (text/plain, with the browser's cookies), then sets ``window.done``."""
    calls = ",\n".join(
        f"fetch({json.dumps(coordinator_url + path)}, {{method: 'POST', mode: 'no-cors', credentials: 'include'"
        + (f", headers: {{'Content-Type': 'text/plain'}}, body: {json.dumps(body)}" if body is not None else "")
        + "})" for path, body in posts)
    return f"<!doctype html><script>Promise.allSettled([\n{calls}]).then(() => {{ window.done = true; }});</script>"


def login_form(coordinator_url: str, token: str) -> str:
    """A page with a form that signs whoever opens it in to the lab with ``token`` (login CSRF)."""
    return (f'<!doctype html><iframe name="sink"></iframe><form method="post" action="{coordinator_url}/login" '
            f'target="sink"><input name="token" value="{token}"><input name="next" value="/"></form>'
            "<script>document.forms[0].submit();</script>")


def close_then_stop(context, coordinator: Coordinator) -> None:
    """Close the browser ``context``, then stop ``coordinator``: a lab's page open in it keeps a
    live-updates stream open, which held the coordinator's stop for its shutdown grace (3 s)."""
    try:
        context.close()
    finally:
        coordinator.stop()


def answers_to_page(page, url: str, coordinator: Coordinator) -> list[int]:
    """Open the no-cors page at ``url`` in ``page``: the statuses the coordinator answered it
    (its POSTs: a request the lab's own page still had under way, a GET of its live updates,
    may be answered after the listener is on)."""
    statuses = []

    def answered(response) -> None:
        if response.url.startswith(coordinator.url) and response.request.method == "POST":
            statuses.append(response.status)
    page.on("response", answered)
    page.goto(url)
    page.wait_for_function("window.done === true")
    page.remove_listener("response", answered)
    return statuses


# ---- 2. bodies: bounded, per route, refused before they are read -----------------------------------


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_an_anonymous_256_mib_login_is_refused_before_it_is_read(tmp_path, env, framing):
    coordinator = Coordinator(tmp_path, env)
    try:
        httpx2.post(f"{coordinator.url}/login", data={"token": "dl_warm-up"}, timeout=10)  # code paths loaded
        before = memory_kib(coordinator.popen.pid)
        size, piece = 256 * MiB, b"t" * MiB
        sock = socket.create_connection(("127.0.0.1", coordinator.port), timeout=30)
        framed = (f"Content-Length: {size}" if framing == "content-length" else "Transfer-Encoding: chunked")
        sock.sendall(head(coordinator.port, "POST", "/login", "Content-Type: application/x-www-form-urlencoded",
                          framed))

        def send_body():  # while the answer is read, as a client that does not wait for one would
            with contextlib.suppress(OSError):  # the coordinator answered and closed: what is left is not sent
                for _ in range(size // len(piece)):
                    sock.sendall(piece if framing == "content-length" else b"100000\r\n" + piece + b"\r\n")
                sock.sendall(b"" if framing == "content-length" else b"0\r\n\r\n")
        sender = threading.Thread(target=send_body, daemon=True)
        sender.start()
        status, headers, answer = read_answer(sock)
        sender.join(30)
        sock.close()
        after = memory_kib(coordinator.popen.pid)
    finally:
        coordinator.stop()
    grown = {key: (after[key] - before[key]) // 1024 for key in after}
    assert status == 413, f"answered {status} {answer}, having held {grown} MiB more"
    assert answer["error"] == "too_large" and "1 MiB" in answer["message"]
    assert grown["VmHWM"] < 16 and grown["VmRSS"] < 16, f"MiB more held: {grown} (256 MiB were sent)"


@pytest.mark.anyio
@pytest.mark.usefixtures("database")
async def test_every_reader_of_a_body_is_held_to_its_route_s_limit(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        await FakeExporter(api, "host-a").beat([device("b0")])
        big = json.dumps({"device": "b0", "pad": "x" * (2 * MiB)}).encode()

        def chunks(data: bytes):  # no Content-Length: counted as it comes
            async def gen():
                for start in range(0, len(data), 64 * 1024):
                    yield data[start:start + 64 * 1024]
            return gen()

        refused = [
            await api.post("/leases", content=big, headers=JSON),
            await api.post("/leases", content=chunks(big), headers=JSON),
            # a release reads no body: the Idempotency-Key's check hashes it
            await api.post("/leases/lease-x/release", content=big, headers={**JSON, "Idempotency-Key": "k1"}),
            await api.post("/hosts/host-a/heartbeat", content=b" " * (9 * MiB) + b"{}", headers=JSON),
            # the MCP SDK reads its own bodies (and answers a failing read with a 500)
            await api.post("http://127.0.0.1/mcp", content=chunks(big),
                           headers={**JSON, "Accept": "application/json, text/event-stream"}),
            await api.post("http://127.0.0.1/login", content=b"token=" + b"x" * (2 * MiB),
                           headers={"Content-Type": "application/x-www-form-urlencoded"}),
        ]
        for answer in refused:
            assert (answer.status_code, answer.json()["error"]) == (413, "too_large"), (answer.request.url,
                                                                                        answer.text)
        assert (await api.get("/leases")).json() == [], "nothing was reserved"
        # a heartbeat may be larger: a host of 1000 devices with their services is 2.3 MiB
        large = await api.post("/hosts/host-a/heartbeat", content=b" " * (3 * MiB) + b"{}", headers=JSON)
        assert large.status_code == 422, large.text


# ---- 3. a page of another origin: JSON only, same origin is scheme-less host AND port ---------------


@pytest.mark.anyio
@pytest.mark.usefixtures("database")
async def test_json_routes_take_only_json(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        exporter = FakeExporter(api, "host-a")
        await exporter.beat([device("b0"), device("b1")])
        body = json.dumps({"device": "b0"})
        for content_type in ("text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                             "multipart/form-data; boundary=x", None):
            answer = await api.post("/leases", content=body, headers={"Content-Type": content_type} if content_type
                                    else {})
            assert answer.status_code == 415, (content_type, answer.text)
            assert answer.json() == {"error": "unsupported_media_type", "message": "send the body as JSON, with "
                                     "the header 'Content-Type: application/json'"}
        assert (await api.get("/leases")).json() == [], "nothing was reserved"
        lease = await api.post("/leases", content=body, headers={"Content-Type": "application/json; charset=utf-8"})
        assert lease.status_code == 201, lease.text
        # a route without a body: a page's form or text/plain is refused, a bare POST is no body
        form = await api.post(f"/leases/{lease.json()['id']}/release", content=b"x=1",
                              headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert form.status_code == 415
        assert (await api.get("/leases")).json()[0]["state"] != "released"
        assert (await api.post(f"/leases/{lease.json()['id']}/release")).status_code == 200
        # the page's sign-in form takes a form, and only that
        assert (await api.post("http://127.0.0.1/login", content=b"token=x", headers={"Content-Type": "text/plain"})
                ).status_code == 415


@pytest.mark.anyio
@pytest.mark.usefixtures("database")
async def test_same_origin_is_the_same_host_and_port_whatever_the_scheme(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        await FakeExporter(api, "host-a").beat([device("b0")])

        async def drain(host: str, **headers) -> int:  # (an admin's call that changes nothing here)
            answer = await api.post("/admin/hosts/host-a/drain", json={"draining": False},
                                    headers={"Host": host, **headers})
            assert answer.status_code == 200 or answer.json()["error"] == "cross_site", answer.text
            return answer.status_code

        assert await drain("127.0.0.1:7602", Origin="http://127.0.0.1:7602") == 200, "the lab's own page"
        assert await drain("127.0.0.1:7602", Origin="http://127.0.0.1:7699") == 403, "another port: same site"
        assert await drain("127.0.0.1:7602", Origin="http://localhost:7602") == 403, "another host"
        assert await drain("127.0.0.1:7602", Origin="null") == 403, "a sandboxed frame, a file"
        assert await drain("127.0.0.1:7602", **{"Sec-Fetch-Site": "same-site"}) == 403, "no Origin, marked"
        assert await drain("127.0.0.1:7602", **{"Sec-Fetch-Site": "same-origin"}) == 200
        # behind a proxy that terminates TLS: the page is https, the coordinator sees http, the proxy keeps Host
        assert await drain("127.0.0.1", Origin="https://127.0.0.1") == 200
        assert await drain("127.0.0.1", Origin="https://127.0.0.1:443") == 200
        assert await drain("127.0.0.1", Origin="https://127.0.0.1:8443") == 403
        navigation = {"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}
        assert (await api.get("http://127.0.0.1/", headers=navigation)).status_code == 200, "a link to the board"
        form = await api.post("http://127.0.0.1/login", data={"token": "dl_x"},
                              headers={**navigation, "Origin": "http://127.0.0.1:7699"})
        assert form.status_code == 403, "a form of another port signs nobody in"


def test_a_page_on_another_port_changes_nothing_in_the_trust_mode(tmp_path, env, browser):
    """The probe: a page on another port of 127.0.0.1 sends no-cors text/plain POSTs and a form
    to ``device-loop up``'s coordinator."""
    coordinator = Coordinator(tmp_path, env)
    try:
        Host(coordinator.url).report([board("b0"), board("b1")])
        owner = {"X-Device-Loop-User": "alice"}
        lease = coordinator.api("/leases", "POST", json={"device": "b0"}, headers=owner).json()
        image = httpx2.post(f"{coordinator.url}/api/v1/images", params={"name": "build-1", "for": "b0"},
                            content=b"firmware", headers=owner, timeout=10)
        assert image.status_code == 201, image.text
        audit = coordinator.api("/admin/audit").json()
        posts = [("/api/v1/admin/images/gc", json.dumps({"unused_days": 0})),
                 ("/api/v1/admin/devices/b1/retire", json.dumps({"retired": True, "force": True})),
                 ("/api/v1/leases", json.dumps({"device": "b1", "ttl_s": 7 * 86400})),
                 (f"/api/v1/leases/{lease['id']}/release", None)]  # no body: only the origin rule stops it
        page = browser.new_context().new_page()
        with page_elsewhere(no_cors_posts(coordinator.url, posts)) as evil:
            statuses = answers_to_page(page, evil, coordinator)
        with page_elsewhere(login_form(coordinator.url, "dl_someone-else")) as evil:
            with page.expect_response(lambda r: r.url.endswith("/login")) as login:
                page.goto(evil)
        assert sorted(statuses) == [403] * len(posts) and login.value.status == 403
        assert coordinator.api("/admin/audit").json() == audit, "nothing was done"
        devices = {d["name"]: d for d in coordinator.api("/devices").json()}
        assert devices["b1"]["state"] != "retired" and devices["b1"]["holder"] is None
        assert devices["b0"]["holder"] == "alice"
        assert [i["name"] for i in coordinator.api("/images", headers=owner).json()] == ["build-1"]
        assert page.context.cookies(coordinator.url) == []
    finally:
        coordinator.stop()


def test_a_page_on_another_port_cannot_use_or_replace_a_signed_in_cookie(tmp_path, env, browser):
    """A lab with tokens: alice is signed in on the page; a page on another port posts with
    her cookie (which goes along: same site), and tries to sign her in as mallory."""
    coordinator = Coordinator(tmp_path, env, extra=())
    context = browser.new_context()
    try:
        tokens, token_file = lab_tokens(env, coordinator, tmp_path, "alice", "mallory")
        Host(coordinator.url, token=token_file.read_text()).report([board("b0")])
        page = context.new_page()
        page.goto(f"{coordinator.url}/")
        page.fill("input[name=token]", tokens["alice"])
        page.click("form.login button")
        page.wait_for_selector("text=Signed in as alice")
        signed_in = page.context.cookies(coordinator.url)
        alice = {"Authorization": f"Bearer {tokens['alice']}"}

        posts = [("/api/v1/leases", json.dumps({"device": "b0"})), ("/logout", None)]
        with page_elsewhere(no_cors_posts(coordinator.url, posts)) as evil:
            statuses = answers_to_page(page, evil, coordinator)
        with page_elsewhere(login_form(coordinator.url, tokens["mallory"])) as evil:
            with page.expect_response(lambda r: r.url.endswith("/login")) as login:
                page.goto(evil)
        assert sorted(statuses) == [403, 403] and login.value.status == 403
        assert page.context.cookies(coordinator.url) == signed_in, "still alice, signed in"
        assert httpx2.get(f"{coordinator.url}/api/v1/leases", headers=alice).json() == []
        assert httpx2.get(f"{coordinator.url}/api/v1/devices/b0").json()["holder"] is None
        page.goto(f"{coordinator.url}/")
        page.wait_for_selector("text=Signed in as alice")
    finally:
        close_then_stop(context, coordinator)


IMG = '<img src=x onerror="window.pwned=1;alert(1)">'  # (64 characters at most: a tag's, a class's)
SCRIPT = "<script>window.pwned=2;alert(2)</script>"
SVG = '"><svg onload=window.pwned=3;alert(3)>'
CODE = "javascript:window.pwned=4;alert(4)//"


def test_what_an_exporter_reports_is_shown_as_text_never_run_or_linked(tmp_path, env, browser):
    coordinator = Coordinator(tmp_path, env)
    context = browser.new_context()
    try:
        host = Host(coordinator.url)
        reported = [board("b0", device_class=IMG, tags=[SCRIPT, SVG]),
                    board("b1", health="failed", reason=IMG + SCRIPT + SVG)]
        finds = [CandidateReport(identifier=f"10.0.0.9:5555{SVG}", kind="adb", plugin="adb", label=IMG + SCRIPT)]
        host.report(reported, candidates=finds)
        page = context.new_page()
        dialogs = []
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        page.goto(f"{coordinator.url}/")
        owner = page.locator('meta[name="device-loop-user"]').get_attribute("content")
        lease = coordinator.api("/leases", "POST", json={"device": "b0"}, headers={"X-Device-Loop-User": owner})
        endpoints = [EndpointReport(kind=kind, host="127.0.0.1", port=4000, url=CODE, protocol="<b>p</b>",
                                    params={"stream": "stream.mjpg", "snapshot": "snapshot.jpg"})
                     for kind in ("uart", "video", "vnc-web")]
        service = ServiceReport(lease=lease.json()["id"], device="b0", identifier="sim:b0", kind="uart",
                                endpoints=endpoints)
        host.report(reported, [service], [lease.json()["id"]], finds)

        for path in ("/", "/devices/b0", "/devices/b1"):
            page.goto(f"{coordinator.url}{path}")
            page.wait_for_selector("#live.on")
            text = page.inner_text("main") if page.locator("main").count() else page.inner_text("body")
            assert IMG in text, f"{path}: the markup is shown as text"
            assert page.locator('a[href^="javascript:"]').count() == 0, path
            assert page.locator("img[src=x], svg").count() == 0, f"{path}: no element was made of it"
        page.goto(f"{coordinator.url}/")
        page.wait_for_selector('#mine [data-device="b0"] .endpoints')
        assert "127.0.0.1:4000" in page.inner_text("#mine"), "an endpoint whose URL is no http(s) one: its address"
        assert page.locator("#mine a.url, #mine .links a").count() == 0, "and no link (camera, screen)"
        page.wait_for_timeout(300)  # an onerror would have run by now
        assert page.evaluate("typeof window.pwned") == "undefined" and dialogs == []
    finally:
        close_then_stop(context, coordinator)


# ---- 7. slow clients: a deadline for the head, a gap limit for the body, descriptors --------------


class SlowClients:
    """``n`` connections that each send a request head a line at a time, one line each
    ``every`` seconds, and never end it; each notes when the coordinator closed it."""

    def __init__(self, port: int, n: int, every: float = 0.5):
        self.socks, self.opened, self.closed = [], [], {}
        for _ in range(n):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            sock.sendall(f"GET /api/v1/health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n".encode())
            self.socks.append(sock)
            self.opened.append(time.monotonic())
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._trickle, args=(every,), daemon=True)
        self.thread.start()

    def _trickle(self, every: float) -> None:
        next_line = time.monotonic()
        while not self.stop.is_set():
            open_ = [s for s in self.socks if s.fileno() not in self.closed]
            readable, _, _ = select.select(open_, [], [], 0.05) if open_ else ([], [], [])
            for sock in readable:  # the coordinator closed it (it never answers a head that does not end)
                with contextlib.suppress(OSError):
                    assert sock.recv(1024) == b""
                self.closed[sock.fileno()] = time.monotonic()
            if time.monotonic() >= next_line:
                next_line += every
                for sock in open_:
                    with contextlib.suppress(OSError):
                        sock.sendall(b"X-Still-Coming: 1\r\n")

    def all_closed(self) -> bool:
        return len(self.closed) == len(self.socks)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        for sock in self.socks:
            sock.close()


def test_slow_request_heads_are_cut_at_their_deadline_and_lock_nobody_out(tmp_path, env):
    deadline = 2.0  # (the slow heads send four lines within it)
    coordinator = Coordinator(tmp_path, env, extra=("--single-user", "--header-timeout", f"{deadline}s"))
    slow = SlowClients(coordinator.port, 200)
    try:
        asked = time.monotonic()
        assert httpx2.get(f"{coordinator.url}/api/v1/health", timeout=10).status_code == 200
        assert time.monotonic() - asked < deadline / 2, "answered at once, beside 200 slow heads"
        wait_for(slow.all_closed, deadline + 8, what="the slow connections closed")
        lived = [slow.closed[s.fileno()] - opened for s, opened in zip(slow.socks, slow.opened)]
        assert min(lived) > deadline * 0.9, "a line every half second kept none of them past the deadline"
        assert max(lived) < deadline + 6
    finally:
        slow.close()
        coordinator.stop()


def test_with_fewer_descriptors_than_slow_clients_a_request_is_answered_once_they_are_cut(tmp_path, env):
    deadline = 1.0
    coordinator = Coordinator(tmp_path, env, extra=("--single-user", "--header-timeout", f"{deadline}s"))
    pid = coordinator.popen.pid
    room = 40  # descriptors left for connections
    limit = len(os.listdir(f"/proc/{pid}/fd")) + room
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, limit))
    slow = SlowClients(coordinator.port, 2 * room + 20)  # connected all the same: they wait in the backlog
    try:
        asked = time.monotonic()
        answer = httpx2.get(f"{coordinator.url}/api/v1/health", timeout=40)
        assert answer.status_code == 200, "answered once the deadline freed descriptors"
        assert time.monotonic() - asked > deadline, "(it had to wait for them)"
        wait_for(slow.all_closed, what="every slow connection cut")
    finally:
        slow.close()
        coordinator.stop()


def test_the_coordinator_raises_its_descriptor_limit_to_the_hard_limit(tmp_path, env):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowered = min(256, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowered, hard))  # what its children inherit
    try:
        coordinator = Coordinator(tmp_path, env)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        limits = open(f"/proc/{coordinator.popen.pid}/limits").read()
        line = next(line for line in limits.splitlines() if line.startswith("Max open files"))
        assert line.split()[3:5] == [str(hard), str(hard)], line
    finally:
        coordinator.stop()


def test_a_body_that_stops_is_cut_and_a_slow_upload_that_moves_is_not(tmp_path, env):
    gap = 1.0
    coordinator = Coordinator(tmp_path, env, extra=("--single-user", "--body-timeout", f"{gap}s"))
    try:
        Host(coordinator.url).report([board("b0")])
        sock = socket.create_connection(("127.0.0.1", coordinator.port), timeout=10)
        sock.sendall(head(coordinator.port, "POST", "/api/v1/leases", "Content-Type: application/json",
                          "Content-Length: 100") + b'{"device": ')
        sent = time.monotonic()
        status, headers, answer = read_answer(sock)
        assert (status, answer["error"]) == (408, "body_timeout") and headers["connection"] == "close"
        assert gap * 0.9 < time.monotonic() - sent < gap + 3
        assert sock.recv(1) == b"", "and the connection is closed"
        sock.close()
        assert coordinator.api("/devices/b0").json()["holder"] is None

        data, pieces = os.urandom(64 * 1024), 5

        def moving():  # twice the gap in all, never a gap without a byte
            for _ in range(pieces):
                yield data
                time.sleep(gap * 0.4)
        upload = httpx2.post(f"{coordinator.url}/api/v1/images", params={"name": "slow-build", "for": "b0"},
                             content=moving(), timeout=30)
        assert upload.status_code == 201, upload.text
        assert upload.json()["sha256"] == hashlib.sha256(data * pieces).hexdigest()
    finally:
        coordinator.stop()
