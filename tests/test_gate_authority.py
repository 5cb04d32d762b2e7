"""A gate does not outlive its authority, the exporter that started it: once that exporter
is gone (kill -9), the gate admits nobody new and cuts its live connections after a grace;
the next exporter start stops what the dead one left. The lab test runs a real coordinator
with tokens and a real exporter serving a UART through ser2net on a socat pty pair; the
others start real gate processes and end their lifeline by hand, as the kernel does when
the exporter dies."""
import json
import os
import signal
import socket
import socketserver
import threading
import time
from pathlib import Path

import pytest

from conftest import Coordinator, Exporter, lab_tokens, uart_device, wait_for
from device_loop.core.gate import GRACE_ENV, GRACE_S as DEFAULT_GRACE_S, connect_gated, gate_service, grace_s
from device_loop.core.host import HostContext
from device_loop.core.model import Endpoint, LeaseRef, Resource, Service
from device_loop.core.process import ProcessRegistry
from helpers import kill_spawned, pid_alive, raw_endpoint, recorded_pids, run_cli, spawned_by, wait_state

pytestmark = [pytest.mark.service, pytest.mark.timeout(90)]

GRACE_S = 1.5  # short, so that the tests see the cut soon
SECRET = "s3cret-of-lease-1"


def wait_cut(sock: socket.socket, within: float) -> None:
    """Return once the gate closed ``sock``; fail if it is still open after ``within`` seconds."""
    sock.settimeout(within)
    try:
        data = sock.recv(1)
    except ConnectionResetError:
        data = b""
    except TimeoutError:
        raise AssertionError(f"the live connection was not cut within {within:g}s") from None
    assert data == b"", f"the gate relayed {data!r} instead of cutting the connection"


def ready(coordinator: Coordinator, lease_id: str, auth: dict) -> dict | None:
    lease = coordinator.api(f"/leases/{lease_id}", params={"wait": 5, "unless": "pending"}, **auth).json()
    return lease if lease["ready"] else None


def gate_pids(state_dir) -> set[int]:
    return {pid for pid, record in recorded_pids(state_dir).items() if record["name"].startswith("gate-")}


def test_a_revoked_holder_loses_the_board_when_its_exporter_dies(tmp_path, env, pty_pair):
    env = {**env, GRACE_ENV: f"{GRACE_S:g}"}
    coordinator = Coordinator(tmp_path, env, extra=())
    tokens, token_file = lab_tokens(env, coordinator, tmp_path, "alice")
    root = json.loads(run_cli(env, coordinator.url, "admin", "token", "create", "root", "--admin", "--data-dir",
                              str(tmp_path / "coord"), "--json").stdout)["token"]
    alice = {"headers": {"Authorization": f"Bearer {tokens['alice']}"}}
    exporter = Exporter(tmp_path, env, coordinator.url, uart_device(pty_pair, raw=True), token_file=str(token_file))
    far = pty_pair.far(timeout=5)
    try:
        wait_state(coordinator, "jupiter", "idle")
        lease_id = coordinator.api("/leases", "POST", json={"device": "jupiter", "ttl_s": 600}, **alice).json()["id"]
        lease = wait_for(lambda: ready(coordinator, lease_id, alice), what="the lease ready")
        endpoint = raw_endpoint(lease)
        live = connect_gated(endpoint["host"], endpoint["port"], endpoint["secret"])
        live.sendall(b"BEFORE")
        assert far.read(6) == b"BEFORE"
        gates, old_boot = gate_pids(exporter.state_dir), spawned_by(exporter.state_dir)
        assert len(gates) == 2 and len(old_boot - gates) == 1, "two gates in front of one ser2net"

        exporter.stop(signal.SIGKILL)
        killed = time.monotonic()
        revoked = coordinator.api(f"/admin/leases/{lease_id}/revoke", "POST",
                                  headers={"Authorization": f"Bearer {root}"})
        assert revoked.status_code == 200 and revoked.json()["state"] == "revoked", revoked.text
        with pytest.raises(ConnectionRefusedError):
            connect_gated(endpoint["host"], endpoint["port"], endpoint["secret"], timeout=5).sendall(b"AFTER-REVOKE")

        wait_cut(live, GRACE_S + 10 - (time.monotonic() - killed))
        try:
            live.sendall(b"STILL-THERE")
        except OSError:
            pass
        far.timeout = 1
        assert far.read(100) == b"", "bytes reached the board after its exporter died and its lease was revoked"
        live.close()
        ser2net = old_boot - gates
        assert all(pid_alive(pid) for pid in ser2net), "services outlive a kill -9 of their exporter"

        exporter.start()
        wait_for(lambda: not any(pid_alive(pid) for pid in old_boot), what="the old boot's processes stopped")
        wait_for(lambda: spawned_by(exporter.state_dir) == set(), what="nothing running for the revoked lease")
        assert "stopped leftover ser2net" in exporter.output()

        wait_state(coordinator, "jupiter", "idle")  # and a plain stop (SIGTERM) still stops everything
        lease_id = coordinator.api("/leases", "POST", json={"device": "jupiter", "ttl_s": 600}, **alice).json()["id"]
        lease = wait_for(lambda: ready(coordinator, lease_id, alice), what="the new lease ready")
        endpoint = raw_endpoint(lease)
        live = connect_gated(endpoint["host"], endpoint["port"], endpoint["secret"])
        exporter.stop()
        assert spawned_by(exporter.state_dir) == set()
        wait_cut(live, 5)
    finally:
        far.close()
        exporter.stop()
        kill_spawned(exporter.state_dir)
        coordinator.stop()


# ---- real gate processes, whose lifeline the test ends ---------------------------------------


class EchoService(socketserver.ThreadingTCPServer):
    """A service behind a gate: echoes what it gets; ``accepted`` counts its connections.

    A line ``GET /...`` or ``HEAD /...`` is taken for an HTTP request: answered with its path
    (keep-alive), or with ``101`` if it asks for an upgrade, after which it echoes."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self):
        self.accepted = 0
        self.requests: list[str] = []
        super().__init__(("127.0.0.1", 0), self.Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    class Handler(socketserver.StreamRequestHandler):
        def handle(self):
            self.server.accepted += 1
            while line := self.rfile.readline():
                if not line.startswith((b"GET /", b"HEAD /")):
                    self.wfile.write(line)
                    continue
                head = line
                while (header := self.rfile.readline()) not in (b"\r\n", b""):
                    head += header
                path = line.split()[1].decode()
                self.server.requests.append(path)
                if b"\nupgrade:" in head.lower():
                    self.wfile.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
                else:
                    self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(path), path.encode()))

    @property
    def port(self) -> int:
        return self.server_address[1]


@pytest.fixture
def echo_service():
    service = EchoService()
    yield service
    service.shutdown()
    service.server_close()


@pytest.fixture
def host(tmp_path):
    host = HostContext(name="host-a", state_dir=tmp_path / "state")
    yield host
    host.processes.end_lifeline()
    kill_spawned(host.state_dir)


def start_gate(host: HostContext, service_port: int, protocol: str, grace: float, monkeypatch) -> tuple[dict, object]:
    """A real gate process in front of ``service_port``, as an exporter starts it: (its
    endpoint, its process)."""
    monkeypatch.setenv(GRACE_ENV, f"{grace:g}")
    url = f"http://127.0.0.1:{service_port}/" if protocol == "http" else None
    service = Service(endpoints=[Endpoint(kind="uart", host="127.0.0.1", port=service_port, protocol=protocol,
                                          url=url)])
    gate_service(host, Resource(device="jupiter", kind="uart", identifier="uart:jupiter"),
                 LeaseRef("lease-1", "alice", SECRET), service)
    (endpoint,), (proc,) = service.endpoints, service.processes
    return endpoint.to_json(), proc


def http_exchange(sock: socket.socket, path: str, upgrade: bool = False) -> bytes:
    """One request through an HTTP gate, its capability in the path: the answer's first
    line and head, or b"" if the connection was closed instead."""
    sock.sendall(f"GET /{SECRET}{path} HTTP/1.1\r\nHost: gate\r\n".encode()
                 + (b"Connection: Upgrade\r\nUpgrade: echo\r\n" if upgrade else b"") + b"\r\n")
    answer = b""
    while not answer.endswith(b"\r\n\r\n"):
        try:
            chunk = sock.recv(1)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            return answer
        answer += chunk
    return answer


def test_a_gate_cuts_its_live_connections_after_its_grace(host, echo_service, monkeypatch):
    endpoint, gate = start_gate(host, echo_service.port, "raw", GRACE_S, monkeypatch)
    live = connect_gated(endpoint["host"], endpoint["port"], SECRET, timeout=5)
    live.sendall(b"ping\n")
    assert live.recv(100) == b"ping\n"

    ended = time.monotonic()
    host.processes.end_lifeline()  # what the kernel does when the exporter dies
    with pytest.raises(ConnectionRefusedError, match="exporter of this endpoint stopped"):
        connect_gated(endpoint["host"], endpoint["port"], SECRET, timeout=5)
    wait_cut(live, GRACE_S + 10)
    assert time.monotonic() - ended >= GRACE_S, "the live connection was cut before its grace ran out"
    assert gate.wait(5), "the gate stayed on with nothing to do"
    assert echo_service.accepted == 1, "a connection made after the exporter was gone reached the service"
    assert "the exporter that started this gate is gone" in gate.output()


def test_an_http_gate_admits_no_request_once_its_exporter_is_gone(host, echo_service, monkeypatch):
    """The camera's and the viewer's kind of gate: a new connection gets a 503, a kept-alive
    one no further request; an upgraded connection (noVNC's websocket) is live, and goes on
    for the grace, until the next exporter start stops the gate."""
    endpoint, gate = start_gate(host, echo_service.port, "http", 60, monkeypatch)
    address = (endpoint["host"], endpoint["port"])
    kept, upgraded = socket.create_connection(address, timeout=5), socket.create_connection(address, timeout=5)
    assert http_exchange(kept, "/first").startswith(b"HTTP/1.1 200") and kept.recv(6) == b"/first"
    assert http_exchange(upgraded, "/websockify", upgrade=True).startswith(b"HTTP/1.1 101")

    host.processes.end_lifeline()
    with socket.create_connection(address, timeout=5) as fresh:
        assert http_exchange(fresh, "/new").startswith(b"HTTP/1.1 503")
        assert b"exporter of this endpoint stopped" in fresh.recv(200)
    assert http_exchange(kept, "/again") == b"", "a kept-alive connection took a request after the exporter was gone"
    assert echo_service.requests == ["/first", "/websockify"]

    upgraded.sendall(b"still live\n")  # within the grace
    assert upgraded.recv(100) == b"still live\n"
    stopped = ProcessRegistry(host.state_dir).stop_leftovers()  # as the next exporter start does
    assert [record["pid"] for record in stopped] == [gate.pid]
    wait_cut(upgraded, 5)
    assert not pid_alive(gate.pid)


def test_no_other_child_holds_the_lifeline(host, echo_service, monkeypatch):
    """Only the exporter holds the write end: a service process, a flash tool's run and the
    gate (which holds the read end) do not, or the end would never come."""
    _, gate = start_gate(host, echo_service.port, "raw", GRACE_S, monkeypatch)
    lifeline = os.readlink(f"/proc/self/fd/{host.processes.lifeline().fd}")
    sleeper = host.processes.spawn(["sleep", "30"], name="service", lease="lease-1")
    code, listing = host.run_to_end(["ls", "-l", "/proc/self/fd/"], name="flash-tool", timeout=10)
    assert code == 0 and lifeline not in listing

    def holders(writing: bool) -> set[int]:
        found = set()
        for pid in (os.getpid(), gate.pid, sleeper.pid):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    if os.readlink(f"/proc/{pid}/fd/{fd}") != lifeline:
                        continue
                    info = Path(f"/proc/{pid}/fdinfo/{fd}").read_text()
                except OSError:
                    continue
                flags = int(info.split("flags:")[1].split()[0], 8)
                if (flags & os.O_ACCMODE == os.O_WRONLY) == writing:
                    found.add(pid)
        return found

    assert holders(writing=True) == {os.getpid()}
    assert holders(writing=False) == {os.getpid(), gate.pid}
    host.processes.end_lifeline()
    assert gate.wait(5), "the gate did not end with its lifeline"
    sleeper.stop()


@pytest.mark.parametrize("text", ["soon", "nan", "-1", "61", "inf"])
def test_a_grace_that_is_not_a_few_seconds_is_refused_with_the_reason(text):
    with pytest.raises(ValueError, match=f"{GRACE_ENV} is '{text}': set it to a number of seconds from 0 to 60"):
        grace_s({GRACE_ENV: text})
    assert grace_s({GRACE_ENV: "2.5"}) == 2.5 and grace_s({}) == DEFAULT_GRACE_S
