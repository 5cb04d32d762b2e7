"""The power plugin's backends against the real programs they drive: pdudaemon (its
localcmdline driver), ipmi_sim with ipmitool, sushy-emulator's fake driver, uhubctl (with
no hub here), commands of our own, and the simulated boards' switch file (a simulated board
itself, too); and against small HTTP servers of the tests' own: one that answers a byte at a
time, a Redfish service that names another host's URL. sushy-emulator's fake system changes
its power state a moment after a reset (``POWER_DELAY_S``), not its own 1 to 11 s."""
from __future__ import annotations

import base64
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from conftest import WAIT_S, wait_for
from device_loop.core.host import HostContext
from device_loop.core.ports import free_port, wait_port_open
from device_loop.plugin import POWER_KIND, ConfiguredResource, OperationError
from device_loop.plugins import power, sim
from device_loop.plugins.power import redfish
from device_loop.plugins.power import sim as power_sim
from device_loop.plugins.power.config import PowerConfig
from device_loop.plugins.sim import board as sim_board

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]

SECRET = "s3cr3t-Pa55-7Zq"  # a password that must appear in no message, argv or log


def switch_of(tmp_path, device="board0", **settings):
    """A host with one power entry of ``settings``, and its resource as discovery makes it."""
    entry = ConfiguredResource(device, "test-board", (), "power", PowerConfig.model_validate(settings))
    host = HostContext(name="h", state_dir=tmp_path / "state", entries=[entry])
    [resource] = power.devloop_discover(host)
    assert resource.kind == POWER_KIND and not resource.serves_lease
    return host, resource


def no_secret_in(host, *texts):
    for text in texts:
        assert SECRET not in text
    for path in host.state_dir.rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_text(errors="replace"), path


@pytest.fixture
def start(request):
    """Start a program in its own process group, killed (the whole group) at the test's end."""
    def started(argv, **kwargs):
        proc = subprocess.Popen(argv, start_new_session=True, stdin=subprocess.DEVNULL, **kwargs)

        def stop():
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(10)
        request.addfinalizer(stop)
        return proc
    return started


# ---- pdudaemon ------------------------------------------------------------------------------------------------

@pytest.fixture
def pdudaemon(tmp_path, start):
    """pdudaemon on a free port with PDU ``pdu01``, whose outlets are files: OUTLETS/N."""
    outlets = tmp_path / "outlets"
    outlets.mkdir()
    port = free_port("127.0.0.1")
    # localcmdline fills the outlet in with %: "%s" is the outlet, a literal % is %%
    config = {"daemon": {"hostname": "127.0.0.1", "port": port, "listener": "http"},
              "pdus": {"pdu01": {"driver": "localcmdline",
                                 "cmd_on": f"sh -c 'printf on%%s \"\" > {outlets}/%s'",
                                 "cmd_off": f"sh -c 'printf off%%s \"\" > {outlets}/%s'"}}}
    conf = tmp_path / "pdudaemon.conf"
    conf.write_text(json.dumps(config))
    log = open(tmp_path / "pdudaemon.log", "wb")
    start(["pdudaemon", "--conf", str(conf), "--loglevel", "DEBUG"], stdout=log, stderr=subprocess.STDOUT)
    assert wait_port_open("127.0.0.1", port, timeout=WAIT_S), (tmp_path / "pdudaemon.log").read_text()
    return port, outlets


def test_pdudaemon_switches_an_outlet_and_cannot_read_it_back(tmp_path, pdudaemon):
    port, outlets = pdudaemon
    host, resource = switch_of(tmp_path, backend="pdudaemon", port=port, pdu="pdu01", outlet=3)
    assert resource.config.off_time == 5.0 and resource.config.settings.host == "127.0.0.1"
    reading = power.devloop_power(host, resource, "on")
    assert reading.state is None and "not read back" in reading.detail
    assert (outlets / "3").read_text() == "on"
    power.devloop_power(host, resource, "off")
    assert (outlets / "3").read_text() == "off"
    status = power.devloop_power(host, resource, "status")
    assert status.state is None and "no status" in status.detail


def test_pdudaemon_refuses_an_unknown_pdu_and_a_stopped_daemon_is_a_clear_error(tmp_path, pdudaemon):
    port, outlets = pdudaemon
    host, resource = switch_of(tmp_path, backend="pdudaemon", port=port, pdu="pdu99", outlet=1)
    with pytest.raises(OperationError) as refused:
        power.devloop_power(host, resource, "on")
    assert "pdu99" in str(refused.value) and "Invalid request" in str(refused.value)
    assert refused.value.changed is False and not list(outlets.iterdir())

    host, resource = switch_of(tmp_path, backend="pdudaemon", port=free_port("127.0.0.1"), pdu="pdu01", outlet=1)
    with pytest.raises(OperationError) as down:
        power.devloop_power(host, resource, "off")
    assert "cannot reach pdudaemon" in str(down.value) and "is pdudaemon running" in str(down.value)
    assert down.value.changed is False


# ---- ipmi_sim and ipmitool ----------------------------------------------------------------------------------------

def udp_bound(port: int) -> bool:
    lines = Path("/proc/net/udp").read_text().splitlines()[1:]
    return any(int(line.split()[1].rsplit(":", 1)[1], 16) == port for line in lines)


@pytest.fixture
def bmc(tmp_path, start):
    """ipmi_sim on a free UDP port, user admin with password SECRET; its chassis power is
    kept in the file it returns (0 or 1)."""
    port = free_port("127.0.0.1")
    power_file = tmp_path / "chassis-power"
    power_file.write_text("0\n")
    control = tmp_path / "chassis-control"
    control.write_text(f"""#!/bin/sh
case "$1 $2" in
  "get power") printf 'power:%s\\n' "$(cat {power_file})" ;;
  "set power") printf '%s\\n' "$3" > {power_file} ;;
esac
""")
    control.chmod(0o755)
    lan = tmp_path / "lan.conf"
    lan.write_text(f"""name "bmc0"
set_working_mc 0x20
  startlan 1
    addr 127.0.0.1 {port}
    priv_limit admin
    allowed_auths_callback none md2 md5 straight
    allowed_auths_user none md2 md5 straight
    allowed_auths_operator none md2 md5 straight
    allowed_auths_admin none md2 md5 straight
    guid a123456789abcdefa123456789abcdef
  endlan
  chassis_control "{control}"
  user 2 true "admin" "{SECRET}" admin 10 none md2 md5 straight
""")
    emu = tmp_path / "bmc0.emu"
    emu.write_text("mc_setbmc 0x20\nmc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02\nmc_enable 0x20\n")
    state = tmp_path / "ipmi-state"
    state.mkdir()
    log = open(tmp_path / "ipmi_sim.log", "wb")
    start(["ipmi_sim", "-c", str(lan), "-f", str(emu), "-s", str(state), "-n"], stdout=log, stderr=subprocess.STDOUT)
    wait_for(lambda: udp_bound(port), what="ipmi_sim's port")
    return port, power_file


def test_ipmi_switches_through_the_bmc_and_reads_it_back(tmp_path, bmc):
    port, power_file = bmc
    password = tmp_path / "bmc-password"
    password.write_text(SECRET + "\n")
    host, resource = switch_of(tmp_path, backend="ipmi", host="127.0.0.1", port=port, user="admin",
                               password_file=str(password))
    assert power.devloop_health(host, resource).status == "ok"
    assert power.devloop_power(host, resource, "status").state == "off"
    on = power.devloop_power(host, resource, "on")
    assert on.state == "on" and power_file.read_text().strip() == "1", on
    assert power.devloop_power(host, resource, "status").state == "on"
    off = power.devloop_power(host, resource, "off")
    assert off.state == "off" and power_file.read_text().strip() == "0"
    no_secret_in(host, on.detail, off.detail)


def test_ipmi_says_the_bmc_refused_the_password_and_never_shows_it(tmp_path, bmc):
    port, power_file = bmc
    password = tmp_path / "bmc-password"
    password.write_text(SECRET + "-wrong\n")
    host, resource = switch_of(tmp_path, backend="ipmi", host="127.0.0.1", port=port, user="admin",
                               password_file=str(password))
    with pytest.raises(OperationError) as refused:
        power.devloop_power(host, resource, "on")
    assert str(refused.value) == (f"the BMC at 127.0.0.1:{port} refused user admin's password "
                                  "(ipmitool: Error: Unable to establish IPMI v2 / RMCP+ session)")
    assert refused.value.changed is False and power_file.read_text().strip() == "0"
    no_secret_in(host, str(refused.value))

    password.unlink()
    assert power.devloop_health(host, resource).status == "failed"
    with pytest.raises(OperationError) as missing:
        power.devloop_power(host, resource, "status")
    assert str(missing.value) == f"the BMC's password file {password} does not exist"
    assert missing.value.changed is False


# ---- sushy-emulator (Redfish) -------------------------------------------------------------------------------------

#: How long after a reset the fake system's PowerState changes: the fake driver's own delay is
#: 1 to 11 s at random (``FakeDriver.set_power_state``), which no setting of sushy-tools
#: shortens, so the emulator is started with that one delay set to this. The backend reads the
#: state every ``redfish.POLL_S``: it still finds the reset pending, and polls until it is done.
POWER_DELAY_S = 2 * redfish.POLL_S
#: sushy-emulator's own entry point (its ``sushy-emulator`` script), the fake driver's delay set
#: to ``POWER_DELAY_S`` (argv[1]) first.
SUSHY_EMULATOR = """import sys, time
from sushy_tools.emulator.main import main
from sushy_tools.emulator.resources.systems import fakedriver
delay_s = float(sys.argv.pop(1))
set_power_state = fakedriver.FakeDriver.set_power_state

def set_power_state_after_the_delay(self, identity, state):
    set_power_state(self, identity, state)
    system = self._get(identity)
    if system.get("pending_power"):
        self._update(system, pending_power={**system["pending_power"], "apply_time": time.time() + delay_s})

fakedriver.FakeDriver.set_power_state = set_power_state_after_the_delay
sys.argv[0] = "sushy-emulator"
sys.exit(main())
"""


def start_sushy(tmp_path, start, *options: str) -> str:
    port = free_port("127.0.0.1")
    # (its fake driver keeps its state in TMPDIR/sushy-emulator whatever the state dir: the run's folder)
    env = {**os.environ, "SUSHY_EMULATOR_STATE_DIR": str(tmp_path / "sushy"), "TMPDIR": str(tmp_path)}
    log = open(tmp_path / "sushy.log", "wb")
    start([sys.executable, "-c", SUSHY_EMULATOR, str(POWER_DELAY_S), "--fake", "-i", "127.0.0.1", "-p", str(port),
           *options], env=env, stdout=log, stderr=subprocess.STDOUT)
    assert wait_port_open("127.0.0.1", port, timeout=WAIT_S), (tmp_path / "sushy.log").read_text()
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def redfish(tmp_path, start):
    """sushy-emulator's fake driver on a free port, its state under tmp_path."""
    return start_sushy(tmp_path, start)


@pytest.fixture
def redfish_with_auth(tmp_path, start):
    """sushy-emulator's fake driver that wants user admin with password SECRET."""
    import bcrypt  # sushy-tools' own dependency: its auth file takes bcrypt digests alone
    users = tmp_path / "htpasswd"
    users.write_text(f"admin:{bcrypt.hashpw(SECRET.encode(), bcrypt.gensalt(rounds=4)).decode()}\n")
    config = tmp_path / "sushy.conf"
    config.write_text(f"SUSHY_EMULATOR_AUTH_FILE = {str(users)!r}\n")
    return start_sushy(tmp_path, start, "--config", str(config))


def test_redfish_resets_the_system_and_polls_its_power_state(tmp_path, redfish):
    host, resource = switch_of(tmp_path, backend="redfish", url=redfish, system="fake", timeout="25s")
    assert power.devloop_power(host, resource, "status").state == "off"  # the fake system starts off
    on = power.devloop_power(host, resource, "on")
    assert on.state == "on" and "PowerState reads On" in on.detail, on
    assert power.devloop_power(host, resource, "status").state == "on"
    off = power.devloop_power(host, resource, "off")
    assert off.state == "off" and "ForceOff" in off.detail, off
    assert power.devloop_power(host, resource, "status").state == "off"


def test_redfish_refuses_a_reset_type_the_bmc_does_not_allow(tmp_path, redfish):
    host, resource = switch_of(tmp_path, backend="redfish", url=redfish, system="fake", off_reset_type="PowerCycle",
                               on_reset_type="PowerCycle")
    with pytest.raises(OperationError) as refused:
        power.devloop_power(host, resource, "on")
    message = str(refused.value)
    assert "does not allow reset type 'PowerCycle'" in message and "it allows: On, ForceOff" in message, message
    assert refused.value.changed is False

    host, resource = switch_of(tmp_path, backend="redfish", url=redfish, system="no-such-system")
    with pytest.raises(OperationError, match="has no system 'no-such-system'"):
        power.devloop_power(host, resource, "status")


def test_redfish_says_the_service_refused_the_credentials(tmp_path, redfish_with_auth):
    password = tmp_path / "bmc-password"
    password.write_text(SECRET + "\n")
    host, resource = switch_of(tmp_path, backend="redfish", url=redfish_with_auth, system="fake", user="admin",
                               password_file=str(password))
    assert power.devloop_power(host, resource, "status").state == "off"
    password.write_text("not-" + SECRET)
    with pytest.raises(OperationError) as refused:
        power.devloop_power(host, resource, "on")
    assert str(refused.value).startswith(f"the Redfish service at {redfish_with_auth} refused the credentials of "
                                         "user admin (HTTP 401")
    assert refused.value.changed is False
    no_secret_in(host, str(refused.value))

    host, resource = switch_of(tmp_path, backend="redfish", url=redfish_with_auth, system="fake")
    with pytest.raises(OperationError, match="refused to answer without credentials"):
        power.devloop_power(host, resource, "status")


# ---- HTTP servers of our own: slow ones, and a Redfish service naming another host ------------------------------

#: How often the slow server sends a byte: a few times within the backends' timeout of the test,
#: so that a timeout of each read alone (urllib's) would never end the call; the call's own does.
BYTE_EVERY_S = 0.25


@pytest.fixture
def slow_server(request):
    """A server on a free port that, to whatever it is asked, sends its status line and
    headers (``mode`` "body": at once, "headers": a byte every ``BYTE_EVERY_S``), then its
    body a byte every ``BYTE_EVERY_S``, until the client goes or the test ends."""
    stop = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)

    def serve(connection: socket.socket, mode: str):
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
        with connection:
            try:
                connection.settimeout(5)
                asked = b""
                while b"\r\n\r\n" not in asked:
                    data = connection.recv(4096)
                    if not data:
                        return
                    asked += data
                if mode == "body":
                    connection.sendall(head)
                    head = b""
                for byte in head + b" " * 1000:
                    if stop.wait(BYTE_EVERY_S):
                        return
                    connection.sendall(bytes([byte]))
            except OSError:
                return  # the client gave up

    def accept(mode: str):
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=serve, args=(connection, mode), daemon=True).start()

    def started(mode: str) -> int:
        thread = threading.Thread(target=accept, args=(mode,), daemon=True)
        thread.start()
        request.addfinalizer(lambda: (stop.set(), thread.join(5), listener.close()))
        return listener.getsockname()[1]
    return started


@pytest.mark.parametrize("mode", ["body", "headers"])
@pytest.mark.parametrize("backend", ["pdudaemon", "redfish"])
def test_a_server_answering_a_byte_at_a_time_is_given_up_at_the_timeout(tmp_path, slow_server, backend, mode):
    port = slow_server(mode)
    settings = ({"port": port, "pdu": "pdu01", "outlet": 1} if backend == "pdudaemon" else
                {"url": f"http://127.0.0.1:{port}", "system": "1"})
    timeout_s = 4 * BYTE_EVERY_S  # (a byte comes well within each read's share of it)
    host, resource = switch_of(tmp_path, backend=backend, timeout=f"{timeout_s:g}s", **settings)
    began = time.monotonic()
    with pytest.raises(OperationError) as late:
        power.devloop_power(host, resource, "on")
    took = time.monotonic() - began
    assert f"within {timeout_s:g}s" in str(late.value) and "did not answer" in str(late.value), late.value
    assert 0.95 * timeout_s <= took <= 1.6 * timeout_s, took
    if backend == "redfish":
        assert late.value.changed is False  # it was reading the system (a GET): nothing was switched


class FakeRedfish(http.server.ThreadingHTTPServer):
    """A Redfish service with one system, ``/redfish/v1/Systems/1``, whose reset action's
    target is ``target``; it records what it was asked (method, path, Authorization)."""

    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), FakeRedfishHandler)
        self.asked: list[tuple[str, str, str | None]] = []
        self.state = "Off"
        self.target = "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset"
        self.members = ["/redfish/v1/Systems/1"]
        self.redirects: dict[str, str] = {}  # a path: where it redirects to (307)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class FakeRedfishHandler(http.server.BaseHTTPRequestHandler):
    server: FakeRedfish

    def log_message(self, *args):
        pass

    def _answer(self, code: int, body: dict | None = None):
        data = json.dumps(body).encode() if body is not None else b""
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.server.asked.append(("GET", self.path, self.headers.get("Authorization")))
        if self.path in self.server.redirects:
            self.send_response(307)
            self.send_header("Location", self.server.redirects[self.path])
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/redfish/v1/Systems":
            self._answer(200, {"Members": [{"@odata.id": member} for member in self.server.members]})
        elif self.path == "/redfish/v1/Systems/1":
            self._answer(200, {"Id": "1", "Name": "board", "PowerState": self.server.state,
                               "Actions": {"#ComputerSystem.Reset": {
                                   "target": self.server.target,
                                   "ResetType@Redfish.AllowableValues": ["On", "ForceOff"]}}})
        else:
            self._answer(404, {})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        self.server.asked.append(("POST", self.path, self.headers.get("Authorization")))
        if self.path.endswith("/Actions/ComputerSystem.Reset"):
            self.server.state = "On" if body.get("ResetType") == "On" else "Off"
            self._answer(204)
        else:
            self._answer(404, {})


@pytest.fixture
def fake_redfish(request):
    """Start a ``FakeRedfish`` on a free port (each call, another), shut down at the test's end."""
    def started() -> FakeRedfish:
        server = FakeRedfish()
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()

        def stop():
            server.shutdown()
            server.server_close()
            thread.join(5)
        request.addfinalizer(stop)
        return server
    return started


def test_redfish_sends_nothing_to_a_url_of_another_host_the_service_names(tmp_path, fake_redfish):
    service, elsewhere = fake_redfish(), fake_redfish()
    password = tmp_path / "bmc-password"
    password.write_text(SECRET + "\n")
    host, resource = switch_of(tmp_path, backend="redfish", url=service.url, system="1", user="admin",
                               password_file=str(password), timeout="10s")
    credentials = "Basic " + base64.b64encode(f"admin:{SECRET}".encode()).decode()

    # the reset action's target on another host (another port is another service)
    service.target = f"{elsewhere.url}/redfish/v1/Systems/1/Actions/ComputerSystem.Reset"
    with pytest.raises(OperationError) as refused:
        power.devloop_power(host, resource, "on")
    assert f"refused to follow {service.target!r}" in str(refused.value), refused.value
    assert "nothing was sent to it" in str(refused.value) and refused.value.changed is False
    assert elsewhere.asked == [] and service.state == "Off"
    assert service.asked == [("GET", "/redfish/v1/Systems/1", credentials)]
    no_secret_in(host, str(refused.value))

    # a member of the Systems collection on another host, found by name
    host, by_name = switch_of(tmp_path, backend="redfish", url=service.url, system="board", user="admin",
                              password_file=str(password), timeout="10s")
    service.members = [f"{elsewhere.url}/redfish/v1/Systems/1", "//evil.example/redfish/v1/Systems/1"]
    with pytest.raises(OperationError, match="refused to follow 'http://127.0.0.1:"):
        power.devloop_power(host, by_name, "status")
    for ref in ("//127.0.0.1:1/x", f"https://127.0.0.1:{service.server_address[1]}/x",
                f"http://admin@127.0.0.1:{service.server_address[1]}/x", "redfish/v1/Systems/1",
                "/redfish/v1/Systems/1 x", 7):
        service.members = [ref]
        with pytest.raises(OperationError, match="refused to follow") as other:
            power.devloop_power(host, by_name, "status")
        assert other.value.changed is False
    assert elsewhere.asked == []

    # a redirect to another host is not followed; one to the service itself is
    host, redirected = switch_of(tmp_path, backend="redfish", url=service.url, system="2", user="admin",
                                 password_file=str(password), timeout="10s")
    service.redirects["/redfish/v1/Systems/2"] = f"{elsewhere.url}/redfish/v1/Systems/1"
    with pytest.raises(OperationError, match=f"refused to follow '{elsewhere.url}/redfish/v1/Systems/1'"):
        power.devloop_power(host, redirected, "status")
    service.redirects["/redfish/v1/Systems/2"] = "1"  # relative: /redfish/v1/Systems/1
    assert power.devloop_power(host, redirected, "status").state == "off"
    assert elsewhere.asked == []

    # an absolute URL of the configured service itself is followed, with the credentials
    service.target = f"{service.url}/redfish/v1/Systems/1/Actions/ComputerSystem.Reset"
    service.asked.clear()
    on = power.devloop_power(host, resource, "on")
    assert on.state == "on" and service.state == "On", on
    assert ("POST", "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset", credentials) in service.asked
    assert elsewhere.asked == []


# ---- uhubctl ------------------------------------------------------------------------------------------------------

def test_uhubctl_with_no_hub_says_so_at_once(tmp_path):
    timeout_s = 10
    host, resource = switch_of(tmp_path, backend="uhubctl", location="1-1", port=2, timeout=f"{timeout_s}s")
    assert power.devloop_health(host, resource).status == "ok"  # uhubctl is installed
    began = time.monotonic()
    for action in ("on", "status"):
        with pytest.raises(OperationError) as no_hub:
            power.devloop_power(host, resource, action)
        assert "no switchable hub at 1-1" in str(no_hub.value) and no_hub.value.changed is False
    assert time.monotonic() - began < timeout_s / 2, "not waited out"


# ---- commands -----------------------------------------------------------------------------------------------------

def test_commands_switch_and_their_status_reads_back(tmp_path):
    states = tmp_path / "states"
    states.mkdir()
    host, resource = switch_of(tmp_path, backend="command",
                               on=["sh", "-c", f"echo on > {states}/{{device}}"],
                               off=["sh", "-c", f"echo off > {states}/{{device}}"],
                               status=["sh", "-c", f"echo \"$(cat {states}/{{device}}) since now\""])
    assert power.devloop_health(host, resource).status == "ok"
    on = power.devloop_power(host, resource, "on")
    assert on.state == "on" and (states / "board0").read_text() == "on\n"
    assert power.devloop_power(host, resource, "off").state == "off"
    assert power.devloop_power(host, resource, "status").state == "off"

    host, resource = switch_of(tmp_path, backend="command", on=["true"], off=["false"])
    assert power.devloop_power(host, resource, "on").state is None
    assert power.devloop_power(host, resource, "status").state is None
    with pytest.raises(OperationError, match=r"false failed \(exit code 1\)"):
        power.devloop_power(host, resource, "off")

    host, resource = switch_of(tmp_path, backend="command", on=["no-such-switch-tool"], off=["true"])
    assert power.devloop_health(host, resource).status == "failed"


def test_a_command_that_hangs_is_killed_at_its_timeout(tmp_path):
    pid_file = tmp_path / "pid"
    hang_s = 60
    host, resource = switch_of(tmp_path, backend="command", timeout="1s", off=["true"],
                               on=["sh", "-c", f"echo $$ > {pid_file}; exec sleep {hang_s}"])
    began = time.monotonic()
    with pytest.raises(OperationError) as hung:
        power.devloop_power(host, resource, "on")
    assert str(hung.value) == "sh did not finish within 1s; killed it"
    assert time.monotonic() - began < hang_s / 6, "not left to run its course"
    pid = int(pid_file.read_text())
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


# ---- the simulated board's switch file ----------------------------------------------------------------------------

@pytest.fixture
def board_answers(request):
    """A stand-in for the simulated board: it answers each switch file of ``folder`` in
    ``SWITCH.state``, until the test ends."""
    stop = threading.Event()

    def answering(switch: Path):
        def answer():
            while not stop.wait(0.01):
                try:
                    said = switch.read_text()
                except FileNotFoundError:
                    continue
                state = switch.with_name(switch.name + ".state")
                if not state.exists() or state.read_text() != said:
                    state.write_text(said)
        thread = threading.Thread(target=answer, daemon=True)
        thread.start()
        request.addfinalizer(lambda: (stop.set(), thread.join(5)))
    return answering


def test_the_sim_switch_is_written_and_read_back_from_the_board(tmp_path, board_answers):
    host, resource = switch_of(tmp_path, backend="sim")
    switch = tmp_path / "state" / "sim" / "board0.power"
    assert power.devloop_power(host, resource, "status").state is None
    board_answers(switch)
    assert power.devloop_power(host, resource, "on").state == "on"
    assert switch.read_text() == "on\n"
    assert power.devloop_power(host, resource, "off").state == "off"
    assert power.devloop_power(host, resource, "status").state == "off"
    assert sorted(p.name for p in switch.parent.iterdir()) == ["board0.power", "board0.power.state"]


def test_a_sim_board_that_does_not_answer_is_an_error(tmp_path):
    switch = tmp_path / "elsewhere" / "switch"
    host, resource = switch_of(tmp_path, backend="sim", switch=str(switch), timeout="0.3s")
    with pytest.raises(OperationError, match="simulated board board0 did not switch on"):
        power.devloop_power(host, resource, "on")
    assert switch.read_text() == "on\n"


def test_the_sim_backends_default_switch_is_the_simulated_boards(tmp_path):
    """The power backend and the sim plugin (which may not import each other) agree on the
    switch file a board follows and the file it answers in."""
    for device in ("board0", "rv-2"):
        host, resource = switch_of(tmp_path, device=device, backend="sim")
        switch = power_sim.switch_path(host, resource)
        assert switch == sim.switch_path(host.state_dir, device) == host.state_dir / "sim" / f"{device}.power"
        assert switch == sim.SimConfig().switch(host.state_dir, device)
        assert power_sim.state_path(switch) == sim_board.state_path(switch)
        # the board's own default, beside its link STATE_DIR/sim/NAME
        assert switch == host.state_dir / "sim" / (device + ".power")


def test_the_sim_backend_switches_a_simulated_board(tmp_path):
    host, resource = switch_of(tmp_path, backend="sim", timeout="10s")
    link = host.state_dir / "sim" / "board0"
    board = sim_board.SimBoard("board0", link)
    try:
        assert board.switch == power_sim.switch_path(host, resource)
        assert board.powered and link.is_symlink()
        off = power.devloop_power(host, resource, "off")
        assert off.state == "off" and "switched off" in off.detail
        assert not board.powered and not link.exists()
        assert power.devloop_power(host, resource, "status").state == "off"
        on = power.devloop_power(host, resource, "on")
        assert on.state == "on" and board.powered
        wait_for(link.exists, what="the board's link after power-on")
        assert power.devloop_power(host, resource, "status").state == "on"
    finally:
        board.power_off()


def test_a_backend_is_asked_on_off_or_status_and_a_cycle_is_the_exporters(tmp_path):
    from device_loop.core.vocabulary import PowerAction
    assert power.ACTIONS == ("on", "off", "status")
    assert set(power.ACTIONS) == {a.value for a in PowerAction} - {PowerAction.CYCLE.value}
    host, resource = switch_of(tmp_path, backend="sim")
    with pytest.raises(OperationError, match="a power switch does on, off, status, not 'cycle'") as refused:
        power.devloop_power(host, resource, "cycle")
    assert refused.value.changed is False and not (host.state_dir / "sim").exists()
    assert power.devloop_power(host, resource, PowerAction.STATUS).state is None  # the exporter's enum is taken


# ---- the config ---------------------------------------------------------------------------------------------------

def refusal(**settings) -> str:
    with pytest.raises(ValidationError) as refused:
        PowerConfig.model_validate(settings)
    return str(refused.value)


def test_the_config_names_the_key_it_refuses(tmp_path):
    assert "pudu" in refusal(backend="pdudaemon", pdu="p", outlet=1, pudu="x")
    assert "'location' is a key of backend 'uhubctl', not of 'pdudaemon'" in refusal(
        backend="pdudaemon", pdu="p", outlet=1, location="1-1")
    assert "backend 'ipmi' needs 'password_file'" in refusal(backend="ipmi", host="bmc", user="admin")
    assert "backend 'command' needs 'off'" in refusal(backend="command", on=["true"])
    assert "backend" in refusal(pdu="p", outlet=1)
    assert "'user' and 'password_file' go together" in refusal(backend="redfish", url="http://bmc", system="1",
                                                               user="admin")
    assert "must not hold credentials" in refusal(backend="redfish", url="http://admin:pw@bmc", system="1")
    assert "outlet" in refusal(backend="pdudaemon", pdu="p", outlet=-1)
    assert "{device}" in refusal(backend="command", on=["x", "{image}"], off=["y"])
    assert "timeout" in refusal(backend="sim", timeout="soon")


def test_the_config_has_each_backends_defaults():
    def parsed(**settings):
        return PowerConfig.model_validate(settings).settings
    assert (parsed(backend="pdudaemon", pdu="p", outlet="A1").off_time, parsed(backend="sim").off_time,
            parsed(backend="uhubctl", location="1-1", port=1).off_time) == (5.0, 2.0, 2.0)
    ipmi = parsed(backend="ipmi", host="bmc", user="admin", password_file="/pw", off_time="10s")
    assert (ipmi.port, ipmi.interface, ipmi.cipher_suite, ipmi.off_time, ipmi.timeout, ipmi.console_timeout) == \
        (623, "lanplus", 3, 10.0, 30.0, 20.0)
    redfish = parsed(backend="redfish", url="https://bmc:8443/", system="/redfish/v1/Systems/1")
    assert (redfish.url, redfish.on_reset_type, redfish.off_reset_type, redfish.verify_tls, redfish.off_time) == \
        ("https://bmc:8443", "On", "ForceOff", True, 5.0)


def test_each_backend_s_keys_are_its_own_model_and_one_entry_of_the_registry():
    """(docs/architecture.md, "Power"): the config is a discriminated union on backend; each
    backend's model refuses the keys it does not declare, whatever another backend takes."""
    from device_loop.plugins.power.config import BACKENDS, COMMON
    assert set(BACKENDS) == {"pdudaemon", "uhubctl", "ipmi", "redfish", "command", "sim"}
    for name, module in BACKENDS.items():
        assert module.Keys.name() == name and callable(module.power), name
        assert isinstance(PowerConfig.model_validate({"backend": "sim"}).settings, BACKENDS["sim"].Keys)
    assert set(BACKENDS["sim"].Keys.model_fields) == {*COMMON, "switch"}
    assert set(BACKENDS["uhubctl"].Keys.model_fields) == {*COMMON, "location", "port"}
    # past the friendly check, the backend's own model refuses a key it does not declare
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        PowerConfig.model_validate({"settings": {"backend": "sim", "pdu": "p"}})
    with pytest.raises(ValidationError, match="settings.uhubctl.location"):
        PowerConfig.model_validate({"settings": {"backend": "uhubctl", "port": 1}})
    assert "unknown key 'swtich' of backend 'sim'; did you mean 'switch'?" in refusal(backend="sim", swtich="/x")
    assert "give the switch's backend" in refusal(switch="/x")


def test_a_password_file_is_checked_by_health_and_its_content_shows_nowhere(tmp_path):
    password = tmp_path / "pw"
    host, resource = switch_of(tmp_path, backend="redfish", url=f"http://127.0.0.1:{free_port('127.0.0.1')}",
                               system="1", user="admin", password_file=str(password))
    health = power.devloop_health(host, resource)
    assert health.status == "failed" and "does not exist" in health.reason
    password.write_text(SECRET)
    assert power.devloop_health(host, resource).status == "ok"
    with pytest.raises(OperationError) as down:
        power.devloop_power(host, resource, "on")
    assert "cannot reach the Redfish service" in str(down.value) and down.value.changed is False
    no_secret_in(host, str(down.value), repr(down.value))
