"""What a new user tripped on (issue 28), as they met it: real coordinator, exporter and CLI
processes. Ctrl-C on a queued wait gives its ticket back, and the hint a wait leaves follows
the same ticket; a listing claims no grant; a board its holder switched off says so; the
log fits a terminal and says why a device turned faulty; --help loads no command; plain
words for a wrong power argument and for settle; ./lab waits for another apt."""
import contextlib
import json
import os
import pty
import re
import select
import shlex
import socket
import signal
import subprocess
import sys
import termios
import textwrap
import threading
import time

import anyio
import click
import httpx2
import pytest
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client

from conftest import SRC, WAIT_S, Coordinator, wait_for
from helpers import Piped, reserve, run_cli, uart_exchange, wait_active, wait_state
from lab_in_process import FakeExporter, device

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]
BOB = {"X-Device-Loop-User": "bob"}


def read_until(stream, marker: bytes, timeout: float = 20) -> bytes:
    """What ``stream`` (a pipe) said until ``marker`` showed, read as it comes."""
    seen = b""
    deadline = time.monotonic() + timeout
    while marker not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"no {marker!r} within {timeout}s: {seen!r}"
        ready, _, _ = select.select([stream], [], [], left)
        if ready:
            chunk = os.read(stream.fileno(), 4096)
            assert chunk, f"it ended before {marker!r}: {seen!r}"
            seen += chunk
    return seen


def tickets(env, url) -> list[dict]:
    return json.loads(run_cli(env, url, "tickets", "--json").stdout)


@contextlib.contextmanager
def queued_wait(url: str, env, name: str):
    """``device-loop reserve NAME --queue --wait`` running; killed on the way out if it still runs."""
    waiting = Piped(["--coordinator", url, "reserve", name, "--queue", "--wait"], env)
    try:
        yield waiting
    finally:
        waiting.close()


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_on_a_queued_wait_cancels_its_ticket_and_the_device_is_taken_for_nobody(
        coordinator, exporter_factory, env, sig, code):
    exporter_factory()
    wait_state(coordinator, "sim-board-0", "idle")
    held = coordinator.api("/leases", "POST", json={"device": "sim-board-0"}, headers=BOB).json()
    with queued_wait(coordinator.url, env, "sim-board-0") as waiting:
        said = read_until(waiting.stderr, b"position 1")  # it waits, its ticket first in line
        ticket = re.search(rb"(tk-[0-9a-f]+): position 1", said).group(1).decode()
        waiting.send_signal(sig)
        assert waiting.wait(15) == code
        said += waiting.stderr.read()
    assert f"interrupted: {ticket} cancelled".encode() in said, said
    assert [(t["ticket"], t["state"]) for t in tickets(env, coordinator.url)] == [(ticket, "cancelled")]
    coordinator.api(f"/leases/{held['id']}/release", "POST", headers=BOB)
    wait_state(coordinator, "sim-board-0", "idle")  # reclaimed, and nobody's: no grant to a ticket gone
    assert coordinator.api("/devices/sim-board-0").json()["holder"] is None


def whole_request(client: socket.socket) -> bytes:
    """An HTTP request read from ``client`` up to the end of its body (its Content-Length),
    or what came before the client hung up."""
    data = b""
    while b"\r\n\r\n" not in data or len(data) < _request_length(data):
        chunk = client.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def _request_length(data: bytes) -> int:
    head, _, _ = data.partition(b"\r\n\r\n")
    length = re.search(rb"^content-length:\s*(\d+)\s*$", head, re.I | re.M)
    return len(head) + 4 + (int(length.group(1)) if length else 0)


class HeldProxy:
    """A TCP proxy to a local port that holds one direction of its first connection until
    ``release()``: its request (``hold="request"``: the coordinator has not seen it) or its
    answer (``"answer"``: the coordinator did it, the client has not heard). Later
    connections pass at once. ``held``: the first request came; ``answered``: the
    coordinator answered it. The first request is held whole (head and body: a request cut
    after its head could never be answered), and a connection to the coordinator is opened
    when its request goes on, as a client's would be: the coordinator closes a connection
    whose request head has not come within its head deadline (``--header-timeout``) of the
    connection's opening, and a request held longer than that is still answered when let through."""

    def __init__(self, port: int, hold: str):
        self.target, self.hold = port, hold
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.held, self.answered, self.released = threading.Event(), threading.Event(), threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        first = True
        with contextlib.suppress(OSError):
            while True:
                client = self.server.accept()[0]
                threading.Thread(target=self._carry, args=(client, first), daemon=True).start()
                first = False

    def _carry(self, client: socket.socket, first: bool) -> None:
        """One connection's request, to an upstream connection opened once it may go on; its
        answer pumped back on a thread of its own."""
        with contextlib.suppress(OSError):
            data = whole_request(client) if first else client.recv(65536)
            if not data:
                return
            if first:
                self.held.set()
                if self.hold == "request":
                    self.released.wait(30)
            upstream = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._answer, args=(upstream, client, first), daemon=True).start()
            while data:
                upstream.sendall(data)
                data = client.recv(65536)
            if not first:  # (the first request's client may be gone by then: it is still answered)
                upstream.shutdown(socket.SHUT_WR)

    def _answer(self, upstream: socket.socket, client: socket.socket, first: bool) -> None:
        with contextlib.suppress(OSError):
            while data := upstream.recv(65536):
                if first:
                    self.answered.set()
                    if self.hold == "answer":
                        self.released.wait(30)
                client.sendall(data)
            client.shutdown(socket.SHUT_WR)

    def release(self) -> None:
        self.released.set()

    def close(self) -> None:
        self.release()
        self.server.close()


@pytest.mark.parametrize("hold", ["request", "answer"])
def test_ctrl_c_before_the_reserve_answered_gives_back_what_it_made(coordinator, env, hold):
    exporter = FakeExporter(None, "host-a")
    report = exporter.report([device("q0")], heartbeat_s=60.0)
    assert coordinator.api("/hosts/host-a/heartbeat", "POST", json=report).status_code == 200
    coordinator.api("/leases", "POST", json={"device": "q0"}, headers=BOB)
    proxy = HeldProxy(coordinator.port, hold)
    try:
        with queued_wait(proxy.url, env, "q0") as waiting:
            assert proxy.held.wait(20), "the reserve never reached the proxy"
            if hold == "answer":  # the ticket is made; its requester has not heard of it
                assert proxy.answered.wait(20), "the coordinator did not answer the reserve"
            waiting.send_signal(signal.SIGINT)
            assert waiting.wait(15) == 130
            said = waiting.stderr.read()
        proxy.release()  # (a request held: it comes late, after the retry made its ticket, and is told so)
        assert proxy.answered.wait(20), "the first request, let through, was not answered"
        (ticket,) = tickets(env, coordinator.url)
        assert f"interrupted: {ticket['ticket']} cancelled".encode() in said, said
        assert ticket["state"] == "cancelled"
    finally:
        proxy.close()


def test_a_request_the_proxy_holds_past_the_coordinator_s_head_deadline_is_answered_when_let_through(tmp_path, env):
    """The held proxy above opens its connection to the coordinator when the request goes on:
    one opened at its accept was closed by the coordinator's head deadline while it was held."""
    coordinator = Coordinator(tmp_path, env, extra=("--single-user", "--header-timeout", "1s"))
    proxy = HeldProxy(coordinator.port, "request")
    try:
        with socket.create_connection(("127.0.0.1", int(proxy.url.rsplit(":", 1)[1])), timeout=30) as client:
            client.sendall(b"GET /api/v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert proxy.held.wait(20), "the request never reached the proxy"
            with socket.create_connection(("127.0.0.1", coordinator.port), timeout=30) as silent:
                assert silent.recv(1) == b"", "the coordinator closes a connection that sends no head in time"
            proxy.release()  # (held past the deadline of any connection opened when it came)
            assert proxy.answered.wait(20), "the request, let through, was not answered"
            assert client.recv(64).startswith(b"HTTP/1.1 200 "), "its answer reaches the client"
    finally:
        proxy.close()
        coordinator.stop()


def test_ctrl_c_once_its_ticket_is_granted_releases_the_lease_the_wait_claimed(coordinator, env):
    exporter = FakeExporter(None, "host-a")  # its reports, sent by hand: a granted lease stays pending

    def beat(services=(), applied=()) -> None:
        report = exporter.report([device("q0")], list(services), list(applied), heartbeat_s=60.0)
        assert coordinator.api("/hosts/host-a/heartbeat", "POST", json=report).status_code == 200

    beat()
    held = coordinator.api("/leases", "POST", json={"device": "q0"}, headers=BOB).json()
    beat([{"lease": held["id"], "device": "q0", "identifier": "sim:q0", "kind": "uart",
           "endpoints": [{"kind": "uart", "host": "127.0.0.1", "port": 4000}]}], [held["id"]])
    with queued_wait(coordinator.url, env, "q0") as waiting:
        said = read_until(waiting.stderr, b"position 1")
        coordinator.api(f"/leases/{held['id']}/release", "POST", headers=BOB)
        beat()  # its services are gone: reclaimed, granted to alice's ticket, which the wait claims
        said += read_until(waiting.stderr, b": claimed")
        (lease,) = coordinator.api("/leases").json()
        assert (lease["device"], lease["state"]) == ("q0", "pending"), "its services never come up here"
        waiting.send_signal(signal.SIGINT)
        assert waiting.wait(15) == 130
        said += waiting.stderr.read()
    assert f"interrupted: {lease['id']} on q0 released".encode() in said, said
    assert coordinator.api(f"/leases/{lease['id']}").json()["state"] == "released"


def my_tickets_over_mcp(url: str) -> list[dict]:
    """``my_tickets`` as an agent of alice calls it (the trust mode: she says who she is)."""
    async def ask():
        http = httpx2.AsyncClient(headers={"X-Device-Loop-User": "alice"}, timeout=30)
        async with Client(streamable_http_client(f"{url}/mcp", http_client=http)) as agent:
            result = await agent.call_tool("my_tickets", {})
            assert not result.is_error, result.content
            return result.structured_content["tickets"]
    return anyio.run(ask)


def test_a_wait_that_times_out_says_how_to_follow_that_ticket_and_no_listing_claims_its_grant(
        coordinator, exporter_factory, env):
    exporter_factory()
    wait_state(coordinator, "sim-board-0", "idle")
    held = coordinator.api("/leases", "POST", json={"device": "sim-board-0"}, headers=BOB).json()
    timed_out = run_cli(env, coordinator.url, "reserve", "sim-board-0", "--queue", "--wait", "--timeout", "0.5s",
                        check=False)
    assert timed_out.returncode == 1, timed_out.stdout + timed_out.stderr
    hint = re.search(r"follow it with: (device-loop ticket tk-[0-9a-f]+ --wait)", timed_out.stderr)
    assert hint, timed_out.stderr
    (ticket,) = tickets(env, coordinator.url)
    assert ticket["state"] == "waiting" and ticket["ticket"] in hint.group(1)
    shown = run_cli(env, coordinator.url, "ticket", ticket["ticket"]).stdout  # as `reserve --queue` prints it too
    assert f"follow it with '{hint.group(1)}'" in shown and "reserve ..." not in shown, shown

    coordinator.api(f"/leases/{held['id']}/release", "POST", headers=BOB)
    wait_for(lambda: coordinator.api("/devices/sim-board-0").json()["holder"] == "alice",
             what="the device granted to alice's ticket")
    for _ in range(2):  # the CLI's listing and an agent's: a grant is seen, not claimed
        assert [t["state"] for t in tickets(env, coordinator.url)] == ["granted"]
        assert [t["state"] for t in my_tickets_over_mcp(coordinator.url)] == ["granted"]
    listed = run_cli(env, coordinator.url, "tickets").stdout  # what a person reads says to take it, and how
    assert "sim-board-0 held for you by 20" in listed and f"take it with device-loop ticket {ticket['ticket']}" \
        in listed, listed

    followed = run_cli(env, coordinator.url, *shlex.split(hint.group(1))[1:], "--json")  # the hint, as printed
    lease = json.loads(followed.stdout)
    assert (lease["device"], lease["state"], lease["ready"]) == ("sim-board-0", "active", True)
    assert [(t["ticket"], t["state"]) for t in tickets(env, coordinator.url)] == [(ticket["ticket"], "claimed")], \
        "the same ticket followed: no second one"


def powered(name: str, **more) -> dict:
    """A simulated board with a power switch (the sim backend) and a cool-down step."""
    return {"name": name, "class": "sim-board", **more,
            "resources": [{"plugin": "sim"}, {"plugin": "power", "backend": "sim"}],
            "steps": [{"step": "cooldown", "below": "45C", "timeout": "1m"}]}


def test_a_board_its_holder_switched_off_says_so_in_ls_and_exec_and_power_and_settle_speak_plainly(
        coordinator, exporter_factory, env):
    exporter_factory([powered("sim-board-0")])
    wait_state(coordinator, "sim-board-0", "idle")
    url = coordinator.url
    run_cli(env, url, "reserve", "sim-board-0", "--wait")
    assert run_cli(env, url, "exec", "sim-board-0", "--", "hostname").stdout.strip() == "sim-board-0"

    bogus = run_cli(env, url, "op", "run", "power", "sim-board-0", "--arg", "bogus=1", check=False)
    assert bogus.returncode == 1 and "power takes action (on, off, cycle or status)" in bogus.stderr, bogus.stderr
    assert "not bogus" in bogus.stderr and "Field required" not in bogus.stderr, bogus.stderr
    bare = run_cli(env, url, "op", "run", "power", "sim-board-0", check=False)
    assert bare.returncode == 1 and "args.action: missing: what to do with the device's power: 'on', 'off'" \
        in bare.stderr and "Field required" not in bare.stderr, bare.stderr
    settled = run_cli(env, url, "settle", "sim-board-0").stdout
    assert settled.startswith("sim-board-0: settle done: cooldown: ") and "settled" not in settled, settled

    run_cli(env, url, "power", "off", "sim-board-0")
    row = next(line for line in run_cli(env, url, "ls").stdout.splitlines() if line.startswith("sim-board-0"))
    assert "in_use (switched off)" in row, row
    failed = run_cli(env, url, "exec", "sim-board-0", "--", "hostname", check=False)
    assert failed.returncode == 75, "a command the lab kept from running (docs/architecture.md, Lab failures)"
    assert re.fullmatch(r"device-loop: sim-board-0 is switched off by alice at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ "
                        r"\(op-[0-9a-f]+\): switch it on with device-loop power on sim-board-0 \(once it is released, "
                        r"an admin does\)\n", failed.stderr), failed.stderr
    as_json = json.loads(run_cli(env, url, "exec", "sim-board-0", "--json", "--", "true", check=False).stdout)
    assert as_json["error"] == "switched_off"
    assert "switched off by alice" in json.loads(run_cli(env, url, "status", "sim-board-0", "--json").stdout)[
        "switched_off"]
    assert "  SWITCHED OFF: switched off by alice at " in run_cli(env, url, "status", "sim-board-0").stdout

    run_cli(env, url, "power", "on", "sim-board-0")
    row = next(line for line in run_cli(env, url, "ls").stdout.splitlines() if line.startswith("sim-board-0"))
    assert "switched off" not in row
    wait_for(lambda: run_cli(env, url, "exec", "sim-board-0", "--", "hostname", check=False).returncode == 0,
             what="the board booted again")

    # switched off, then given back: it says so; faulty, and its last holder's power on (the hint's) switches it on
    run_cli(env, url, "power", "off", "sim-board-0")
    released = run_cli(env, url, "release", "sim-board-0")
    assert "sim-board-0 is given back switched off, and is faulty until it is switched on (switched off by alice" \
        in released.stderr and "power on sim-board-0" in released.stderr, released.stderr
    wait_state(coordinator, "sim-board-0", "faulty")
    listed = run_cli(env, url, "ls").stdout.splitlines()
    assert max(len(line) for line in listed) <= 100, listed
    assert any(line.startswith("sim-board-0: faulty (switched off by alice at ") for line in listed), \
        "the state's whole reason, under the table"
    run_cli(env, url, "power", "on", "sim-board-0")  # (the trust mode of this lab: anyone may, as an admin)
    wait_state(coordinator, "sim-board-0", "idle")


def test_a_person_who_holds_no_lease_of_a_board_is_told_an_admin_switches_it(tmp_path, env):
    coordinator = Coordinator(tmp_path, env, extra=())  # a lab with tokens
    try:
        made = run_cli(env, coordinator.url, "admin", "token", "create", "root", "--admin", "--data-dir",
                       str(tmp_path / "coord"), "--json").stdout
        root = {"Authorization": f"Bearer {json.loads(made)['token']}"}
        tokens = {name: coordinator.api("/admin/tokens", "POST", json=spec, headers=root).json()["token"]
                  for name, spec in {"alice": {"user": "alice"}, "host-a": {"exporter_host": "host-a"}}.items()}
        report = FakeExporter(None, "host-a").report([device("q0")], heartbeat_s=60.0)
        assert coordinator.api("/hosts/host-a/heartbeat", "POST", json=report,
                               headers={"Authorization": f"Bearer {tokens['host-a']}"}).status_code == 200
        refused = run_cli({**env, "DEVICE_LOOP_TOKEN": tokens["alice"]}, coordinator.url, "power", "on", "q0",
                          check=False)
        assert refused.returncode == 1
        assert refused.stderr == ("device-loop: you hold no lease of q0, and only an admin switches a device nobody "
                                  "holds: ask one to run device-loop power on q0\n"), refused.stderr
    finally:
        coordinator.stop()


def terminal_run(env: dict, args: list[str], columns: int) -> str:
    """What the CLI prints on a terminal ``columns`` wide (a pty, as a person's)."""
    ours, theirs = pty.openpty()
    termios.tcsetwinsize(theirs, (40, columns))
    try:
        proc = Piped(args, {k: v for k, v in env.items() if k != "COLUMNS"}, stdin=theirs, stdout=theirs)
    finally:
        os.close(theirs)
    out = b""
    try:
        while True:
            try:
                chunk = os.read(ours, 4096)
            except OSError:  # (EIO: its side closed)
                break
            if not chunk:
                break
            out += chunk
        assert proc.wait(WAIT_S) == 0, proc.stderr.read()
    finally:
        proc.close()
        os.close(ours)
    return out.decode().replace("\r\n", "\n")


def test_the_log_fits_a_terminal_and_a_device_that_turns_faulty_says_why(coordinator, exporter_factory, env):
    exporter_factory([powered("sim-board-0")])
    wait_state(coordinator, "sim-board-0", "idle")
    lease = wait_active(coordinator, reserve(coordinator, "sim-board-0")["id"])
    (console,) = [e for e in lease["endpoints"] if e.get("role") == "console"]
    uart_exchange(console["host"], console["port"], b"hang\r", b"Kernel panic")  # the board hangs
    wait_for(lambda: coordinator.api("/devices/sim-board-0").json()["health"] == "failed",
             what="its health failing")
    coordinator.api(f"/leases/{lease['id']}/release", "POST")
    wait_state(coordinator, "sim-board-0", "faulty")  # after its cool-down step

    log = json.loads(run_cli(env, coordinator.url, "log", "sim-board-0", "--json").stdout)
    (faulty,) = [e for e in log if (e["from"], e["to"]) == ("reclaiming", "faulty")]
    assert "cooldown done" in faulty["cause"] and "console hung" in faulty["cause"], faulty["cause"]

    shown = terminal_run(env, ["--coordinator", coordinator.url, "log", "sim-board-0"], 100)
    lines = shown.rstrip("\n").split("\n")
    assert max(map(len, lines)) <= 100, shown
    assert lines[0].split() == ["TIME", "CHANGE", "BY", "CAUSE"]
    indent = lines[0].index("CAUSE")
    at = next(n for n, line in enumerate(lines) if "reclaiming -> faulty" in line)
    said = [lines[at][indent:]] + [line[indent:] for line in lines[at + 1:] if line[:indent].strip() == ""][:20]
    wrapped = textwrap.wrap(faulty["cause"], 100 - indent, break_on_hyphens=False)
    assert said[:len(wrapped)] == wrapped, "the cause whole, under its column"
    piped = run_cli(env, coordinator.url, "log", "sim-board-0").stdout.splitlines()
    assert len(piped) == len(log) + 1 and any(line.endswith(faulty["cause"]) for line in piped), \
        "piped: a line a change, nothing padded"


def test_help_lists_every_command_with_its_short_help_and_loads_none_of_them(env):
    heavy = ("device_loop.coordinator", "device_loop.exporter", "device_loop.client.runner", "device_loop.cli.jobs",
             "device_loop.cli.worker", "device_loop.cli.up", "scipy", "numpy", "pydantic", "starlette", "cv2",
             "uvicorn", "mcp")
    probe = ("import json, sys, contextlib, io; from device_loop.cli import main as m; sys.argv = ['device-loop', "
             "'--help']; out = io.StringIO()\nwith contextlib.redirect_stdout(out): m._run()\n"
             "print(json.dumps({'help': out.getvalue(), 'modules': sorted(sys.modules)}))")
    ran = subprocess.run([sys.executable, "-c", probe], env={**env, "COLUMNS": "80"}, capture_output=True, text=True,
                         timeout=60, check=True)
    answer = json.loads(ran.stdout)
    loaded = [name for name in answer["modules"] if name.startswith(heavy)]
    assert loaded == [], f"--help imported {len(loaded)} such modules: {loaded[:8]}..."

    from device_loop.cli.main import cli  # every command loaded, as click lists them
    formatter = click.HelpFormatter(width=78)
    click.Group.format_commands(cli, click.Context(cli, info_name="device-loop"), formatter)
    assert formatter.getvalue().strip() in answer["help"], answer["help"]
    assert "  ticket " in answer["help"] and "  worker " in answer["help"]


def test_the_readme_names_every_mcp_tool_and_counts_none():
    from device_loop.coordinator.calls import TOOLS

    readme = (SRC / "README.md").read_text()
    names = {name for call in TOOLS for name in (call.name, *call.aliases)}
    assert [name for name in sorted(names) if f"`{name}" not in readme] == []
    numbers = r"(\d+|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|(twenty|thirty|forty)(-\w+)?)"
    assert not re.search(rf"\b{numbers}\s+(MCP\s+)?tools\b", readme, re.I), "a count goes stale: the list says it"


APT_LOCK = "/var/lib/dpkg/lock-frontend"
HOLD_LOCK = """import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o640)
fcntl.lockf(fd, fcntl.LOCK_EX)  # as apt does (fcntl, not flock)
print("held", flush=True)
sys.stdin.read()  # until the test lets go
"""


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists(APT_LOCK), reason="./lab runs apt only as root")
def test_lab_waits_for_another_apt_that_holds_the_package_database_and_says_so(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "apt-get-calls"
    fake = bin_dir / "apt-get"  # (a test must not install: this one writes down how it was asked)
    fake.write_text(f"#!/bin/sh\necho \"$*\" >> {calls}\n")
    fake.chmod(0o755)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, APT_LOCK], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        lab = subprocess.Popen(["bash", "-c", ". ./lab && need_debian_packages no-such-command-here:some-package"],
                               cwd=SRC, env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        said = read_until(lab.stderr, b"to finish with the package database")
        assert f"(pid {holder.pid}) to finish".encode() in said and APT_LOCK.encode() in said, said
        assert lab.poll() is None and not calls.exists(), "no apt-get while another holds the lock"
        holder.stdin.close()  # the other apt is done
        assert holder.wait(10) == 0
        assert lab.wait(30) == 0, lab.stderr.read()
    finally:
        for proc in (holder, locals().get("lab")):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    asked = calls.read_text().splitlines()
    assert [line.split()[-1] for line in asked] == ["-qq", "some-package"], asked
    assert all("-o DPkg::Lock::Timeout=600" in line for line in asked), "and apt waits too, should another come"
